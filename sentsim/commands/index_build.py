"""`sentsim index build --corpus DIR --out DIR [--backend sklearn]`."""

from __future__ import annotations

import json
from pathlib import Path

from sentsim.config import add_config_arguments, load_config
from sentsim.errors import UsageError

COMMAND = ("index", "build")
HELP = "build a TF-IDF n-gram retrieval index over the corpus chunks (sharded, saved to --out)"


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True, metavar="DIR", help="corpus directory (sentences/, chunks/, manifest.json)")
    parser.add_argument("--out", required=True, metavar="DIR", help="index directory to write")
    parser.add_argument("--backend", choices=["sklearn", "lucene"], default=None,
                        help="retrieval backend (default: the config's, sklearn)")
    parser.add_argument("--shards", type=int, default=None, metavar="N", help="number of index shards (n_shards)")
    add_config_arguments(parser)


def run(args) -> int:
    from sentsim.retrieval import IndexConfig, build_index

    if not Path(args.corpus).is_dir():
        raise UsageError(f"--corpus {args.corpus}: no such directory")
    cfg = load_config(IndexConfig, args.config, args.overrides, backend=args.backend, n_shards=args.shards)
    manifest = build_index(args.corpus, args.out, cfg)
    summary = {k: manifest[k] for k in ("backend", "n_chunks", "vocab_size", "build_seconds", "size_bytes", "corpus_fingerprint")}
    summary["n_shards"] = len(manifest["shards"])
    print(json.dumps(summary))
    return 0
