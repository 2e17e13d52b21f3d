"""sentsim store compact DIR [--target-mb 128]"""

from __future__ import annotations

import math

from sentsim.errors import UsageError

COMMAND = ("store", "compact")
HELP = ("rewrite a complete run's per-unit shards into files of about --target-mb each; resumable, "
        "readers see the same rows before and after")


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="DIR", help="a complete run directory (local path or s3://...)")
    p.add_argument("--target-mb", type=float, default=128.0, metavar="MB",
                   help="target size of each compacted file in MB (default 128)")


def run(args) -> int:
    from sentsim.out_paths import refuse_another_kind, refuse_relative_in_job
    from storage.compact import compact_run

    refuse_relative_in_job(args.run_dir, "DIR")  # compacted in place
    refuse_another_kind(args.run_dir, "store compact")
    if not (math.isfinite(args.target_mb) and args.target_mb > 0):  # float() reads "inf" and "nan" too
        raise UsageError(f"--target-mb must be positive and finite (a size in MB), got {args.target_mb:g}")
    r = compact_run(args.run_dir, target_bytes=max(1, int(args.target_mb * (1 << 20))))
    files = ", ".join(f"{t} {n}" for t, n in sorted(r.get("files", {}).items()))
    moved = len(r.get("moved") or [])
    print(f"{args.run_dir}: {r['status']} ({files} file(s); {r.get('removed', 0)} per-unit shard(s) removed"
          + (f"; {moved} file(s) no marker names moved to _foreign/" if moved else "") + ")")
    return 0
