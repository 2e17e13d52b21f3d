"""sentsim store verify DIR"""

from __future__ import annotations

import sys

COMMAND = ("store", "verify")
HELP = "re-read every shard of a run against its manifest (rows, schema, checksum); exit 1 naming each bad shard"


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="DIR", help="run directory (local path or s3://...)")


def run(args) -> int:
    from storage.verify import verify_store

    problems = verify_store(args.run_dir)
    if problems:
        for line in problems:
            print(f"BAD  {line}", file=sys.stderr)
        print(f"{args.run_dir}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.run_dir}: OK")
    return 0
