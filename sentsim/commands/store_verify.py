"""sentsim store verify DIR"""

from __future__ import annotations

import sys

COMMAND = ("store", "verify")
HELP = ("re-read every shard of a run against its manifest (rows, schema, checksum); exit 1 naming each bad shard; "
        "an intact run not yet finished is OK (incomplete: ...)")


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="DIR", help="run directory (local path or s3://...)")


def run(args) -> int:
    from sentsim.out_paths import refuse_another_kind
    from storage.verify import unread_nested_runs, verify_run

    refuse_another_kind(args.run_dir, "store verify")
    problems, unfinished = verify_run(args.run_dir)
    for name in unread_nested_runs(args.run_dir):  # checked all the same: a later run may read it again
        print(f"{args.run_dir.rstrip('/')}/{name}: not read by this run (kept from an earlier run in this folder)")
    if problems:
        for line in problems:
            print(f"BAD  {line}", file=sys.stderr)
        print(f"{args.run_dir}: {len(problems)} problem(s)" + (f"; {unfinished}" if unfinished else ""),
              file=sys.stderr)
        return 1
    # a run stopped by --max-units (or killed) is not damaged: what it holds checks out, and it resumes
    print(f"{args.run_dir}: OK" + (f" ({unfinished})" if unfinished else ""))
    return 0
