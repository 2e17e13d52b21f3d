"""sentsim corpus build INPUT... --out DIR"""

from __future__ import annotations

import json
import os

from sentsim.config import add_config_arguments, add_run_arguments, whole_number

COMMAND = ("corpus", "build")
HELP = "split documents (JSONL[.gz], text, Parquet) into sentence and chunk Parquet shards; resumable"


def add_arguments(p) -> None:
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="input files, read in the order given")
    p.add_argument("--out", required=True, help="run directory (local path or s3://...)")
    p.add_argument("--on-error", choices=["fail", "skip"], default=None,
                   help="bad documents: stop (exit 2) or skip and count (default: the config's on_error, fail)")
    p.add_argument("--chunk-size", type=whole_number("sentences"), default=None, metavar="N",
                   help="sentences per chunk (default 8)")
    add_run_arguments(p)
    add_config_arguments(p)


def run(args) -> int:
    from sentsim.config import run_exit_code
    from sentsim.corpus_job import build_corpus
    from sentsim.errors import UsageError

    for path in args.inputs:  # a device or pipe (/dev/null, <(...)) exists but is not read as a file of documents
        if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):
            raise UsageError(f"{path}: not a regular file (a device, pipe or socket); pass a file of documents")
    overrides = list(args.overrides)
    if args.on_error:
        overrides.append(f"on_error={args.on_error}")
    if args.chunk_size is not None:
        overrides.append(f"chunk.size={args.chunk_size}")
    manifest = build_corpus(
        args.inputs, args.out, overrides=overrides, config_path=args.config,
        executor=args.executor, force_new=args.force_new, address=args.address, max_units=args.max_units,
    )
    c = manifest["counts"]
    sk = manifest["skipped_documents"]["count"]
    print(
        f"corpus: {c['documents']:,} documents, {c['sentences']:,} sentences, {c['chunks']:,} chunks "
        f"in {manifest['completed_units']} shards -> {args.out}"
    )
    print(f"        {sk} documents skipped, {c['truncated_sentences']} sentences truncated, "
          f"fingerprint {manifest['fingerprint']}")
    return run_exit_code(manifest, args.max_units, args.force_new)


def summary_json(manifest: dict) -> str:
    return json.dumps(manifest["counts"], indent=2)
