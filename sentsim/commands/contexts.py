"""sentsim contexts --corpus DIR --index DIR [--discriminator DIR] [--sentences FILE] --out DIR"""

from __future__ import annotations

from sentsim.config import add_config_arguments, add_run_arguments

COMMAND = ("contexts",)
HELP = "build each sentence's diverse context set C_s (retrieve, screen, select) into resumable shards"


def add_arguments(p) -> None:
    p.add_argument("--corpus", metavar="DIR", help="corpus run directory")
    p.add_argument("--index", metavar="DIR", help="retrieval index directory")
    p.add_argument("--discriminator", metavar="DIR",
                   help="discriminator directory (omit to rank by retrieval score; contexts.mode=screened only)")
    p.add_argument("--sentences", metavar="FILE",
                   help="sentences to screen, one per line, or a pairs file as --pairs of `sentsim harvest` "
                        "reads it (TSV, STS-B, CSV with a header or named .csv, JSON lines, Parquet, gzip): both "
                        "sentences of each pair")
    p.add_argument("--out", metavar="DIR", help="output run directory")
    add_run_arguments(p, passes="the rep cache it builds first with --discriminator is one")
    add_config_arguments(p)


def run(args) -> int:
    from sentsim.config import load_config, run_exit_code
    from sentsim.screening.contexts_job import ScreenConfig, screen_contexts

    cfg = load_config(ScreenConfig, args.config, args.overrides,
                      flags={"corpus": "--corpus", "index": "--index", "out": "--out"},
                      corpus=args.corpus, index=args.index, discriminator=args.discriminator,
                      sentences=args.sentences, out=args.out)
    m = screen_contexts(cfg, executor=args.executor, force_new=args.force_new, address=args.address,
                        max_units=args.max_units)
    c = m["counts"]
    print(f"contexts: {c['sentences']:,} sentences screened, {c['shortfalls']:,} with fewer than "
          f"{cfg.contexts.size:,} contexts -> {cfg.out}")
    return run_exit_code(m, args.max_units, args.force_new)
