"""sentsim store compact DIR [--target-mb 128]"""

from __future__ import annotations

import math

from sentsim.errors import UsageError

COMMAND = ("store", "compact")
HELP = ("rewrite a complete run's per-unit shards into files of about --target-mb each; resumable, "
        "readers see the same rows before and after")


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="DIR", help="a complete run directory (local path or s3://...)")
    p.add_argument("--target-mb", type=float, default=None, metavar="MB",
                   help="target size of each compacted file in MB (default: the size the run is compacted, or "
                        "was being compacted, to; 128 for a first compaction); another size recompacts a "
                        "compacted run to it")


def run(args) -> int:
    from sentsim.out_paths import refuse_another_kind, refuse_relative_in_job
    from storage.compact import compact_run

    refuse_relative_in_job(args.run_dir, "DIR")  # compacted in place
    refuse_another_kind(args.run_dir, "store compact")
    target = None
    if args.target_mb is not None:
        if not (math.isfinite(args.target_mb) and args.target_mb > 0):  # float() reads "inf" and "nan" too
            raise UsageError(f"--target-mb must be positive and finite (a size in MB), got {args.target_mb:g}")
        target = max(1, int(args.target_mb * (1 << 20)))
    r = compact_run(args.run_dir, target_bytes=target)
    files = ", ".join(f"{t} {n}" for t, n in sorted(r.get("files", {}).items()))
    moved = len(r.get("moved") or [])
    replaced = r.get("replaced") or 0
    print(f"{args.run_dir}: {r['status']} ({files} file(s); {r.get('removed', 0)} per-unit shard(s) removed"
          + (f"; {replaced} earlier compacted file(s) replaced" if replaced else "")
          + (f"; {moved} file(s) no marker names moved to _foreign/" if moved else "")
          + f"); target {r['target_bytes'] / (1 << 20):.3g} MB a file"
          + ("; pass --target-mb to compact to another size" if r["status"] == "already compacted" else ""))
    return 0
