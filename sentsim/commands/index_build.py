"""`sentsim index build --corpus DIR --out DIR [--backend sklearn] [--num-workers N]`.

`--num-workers 1` (the default) builds in this process, without Ray. With N >= 2 the sklearn backend
counts n-grams and writes shards in N Ray tasks (on --address, RAY_ADDRESS or a local Ray) and
writes the same index; the lucene backend indexes with N Anserini threads.

Run again into an index it built, whole, with the same corpus and config, it says so in one line and
writes nothing (the number of workers changes no index). A whole index of another config or corpus there
is refused, as every command refuses a run of other settings at its --out, unless --force-new replaces it;
a damaged one is built again.
"""

from __future__ import annotations

import json
import sys

from sentsim.config import add_config_arguments, load_config, whole_number
from sentsim.errors import UsageError

COMMAND = ("index", "build")
HELP = "build a TF-IDF n-gram retrieval index over the corpus chunks (sharded, saved to --out)"


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True, metavar="DIR",
                        help="corpus directory (sentences/, chunks/, manifest.json)")
    parser.add_argument("--out", required=True, metavar="DIR", help="index directory to write")
    parser.add_argument("--backend", choices=["sklearn", "lucene"], default=None,
                        help="retrieval backend (default: the config's, sklearn)")
    parser.add_argument("--shards", type=whole_number("shards"), default=None, metavar="N",
                        help="number of index shards (n_shards; the sklearn backend's)")
    parser.add_argument("--num-workers", "--workers", dest="workers", type=whole_number("workers"), default=1,
                        metavar="N",
                        help="parallel build: N Ray tasks (sklearn) or N indexing threads (lucene); "
                             "1 (default) builds in this process without Ray")
    parser.add_argument("--force-new", action="store_true",
                        help="replace an index of another config or corpus at --out")
    add_config_arguments(parser)


def run(args) -> int:
    from sentsim.retrieval import IndexConfig, already_built, build_index, other_index

    cfg = load_config(IndexConfig, args.config, args.overrides, backend=args.backend, n_shards=args.shards)
    done = already_built(args.corpus, args.out, cfg)
    if done is not None:  # before Ray: a rerun starts nothing
        print(f"--out {args.out} already holds this finished index (fingerprint {done['fingerprint']}); "
              "nothing to do (another config or corpus needs --force-new)", flush=True)
        return 0
    refuse_unused_by_lucene(cfg)  # after the no-op: an index built before the check reruns as it did
    other = None if args.force_new else other_index(args.corpus, args.out)
    if other is not None:
        raise UsageError(f"--out {args.out} holds an index built for {other}; give another --out, or --force-new "
                         "to replace it")
    if cfg.backend == "sklearn" and args.workers > 1:
        from sentsim.runtime import init_ray

        init_ray(args.address)
    elif args.address:
        how = "the lucene backend indexes with threads" if cfg.backend == "lucene" else "one worker builds here"
        print(f"note: --address is not used ({how}); the sklearn backend builds on Ray with --num-workers 2 or more",
              file=sys.stderr, flush=True)
    manifest = build_index(args.corpus, args.out, cfg, workers=args.workers)
    summary = {k: manifest[k] for k in ("backend", "similarity", "n_chunks", "vocab_size", "build_seconds",
                                        "build_workers", "size_bytes", "corpus_fingerprint")}
    summary["n_shards"] = len(manifest["shards"])
    print(json.dumps(summary))
    return 0


# the sklearn backend's settings that a Lucene index has no use for: it indexes every term of every chunk, as one
# index searched whole, and weighs terms by its own similarity
_SKLEARN_ONLY = {"n_shards": 1, "min_df": 1, "max_df": 1.0, "max_features": None, "sublinear_tf": True}


def refuse_unused_by_lucene(cfg) -> None:
    """A lucene build given a setting it would ignore is refused here, in the command, not in the schema: an
    index built before this check with such a value keeps opening."""
    if cfg.backend != "lucene":
        return
    unused = [f"{k}={getattr(cfg, k)}" for k, default in _SKLEARN_ONLY.items() if getattr(cfg, k) != default]
    if unused:
        it = "it" if len(unused) == 1 else "them"
        raise UsageError(f"{', '.join(unused)}: the lucene backend would ignore {it} (it builds one index of every "
                         f"term, searched whole; its build threads are --num-workers); leave {it} at the default, or "
                         "use --backend sklearn")
