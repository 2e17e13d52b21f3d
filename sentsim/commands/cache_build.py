"""sentsim cache build --corpus DIR --discriminator DIR --out DIR"""

from __future__ import annotations

from sentsim.config import add_config_arguments, add_run_arguments

COMMAND = ("cache", "build")
HELP = "encode every corpus sentence once with the discriminator (003 §3.3 rep cache) into resumable shards"


def add_arguments(p) -> None:
    p.add_argument("--corpus", metavar="DIR", help="corpus run directory")
    p.add_argument("--discriminator", metavar="DIR", help="discriminator directory")
    p.add_argument("--out", metavar="DIR", help="output run directory (then pass it as contexts.rep_cache)")
    add_run_arguments(p)
    add_config_arguments(p)


def run(args) -> int:
    from sentsim.config import load_config, run_exit_code
    from sentsim.screening.cache_job import RepCacheConfig, build_rep_cache

    flags = {"corpus": "--corpus", "discriminator": "--discriminator", "out": "--out"}
    cfg = load_config(RepCacheConfig, args.config, args.overrides, flags=flags, corpus=args.corpus,
                      discriminator=args.discriminator, out=args.out)
    m = build_rep_cache(cfg, executor=args.executor, force_new=args.force_new, address=args.address,
                        max_units=args.max_units)
    c = m["counts"]
    print(f"rep cache: {c['sentences']:,} sentences, {c['centres']:,} windows in "
          f"{m['completed_units']}/{m['planned_units']} units -> {cfg.out}")
    return run_exit_code(m, args.max_units, args.force_new)
