"""sentsim store compact DIR [--target-mb 128]"""

from __future__ import annotations

import math

from sentsim.errors import UsageError

COMMAND = ("store", "compact")
HELP = ("rewrite a complete run's per-unit shards (and those of the runs inside it, such as a pool harvest's "
        "pool_vectors/ and pool_ranks/) into files of about --target-mb each; resumable, "
        "readers see the same rows before and after")


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="DIR", help="a complete run directory (local path or s3://...)")
    p.add_argument("--target-mb", type=float, default=None, metavar="MB",
                   help="target size of each compacted file in MB (default: the size the run is compacted, or "
                        "was being compacted, to; 128 for a first compaction); another size recompacts a "
                        "compacted run to it")


def run(args) -> int:
    from sentsim.out_paths import refuse_another_kind, refuse_relative_in_job
    from storage import ShardStore
    from storage.compact import compact_run
    from storage.store import NESTED_RUNS

    refuse_relative_in_job(args.run_dir, "DIR")  # compacted in place
    refuse_another_kind(args.run_dir, "store compact")
    target = None
    if args.target_mb is not None:
        if not (math.isfinite(args.target_mb) and args.target_mb > 0):  # float() reads "inf" and "nan" too
            raise UsageError(f"--target-mb must be positive and finite (a size in MB), got {args.target_mb:g}")
        target = max(1, int(args.target_mb * (1 << 20)))
    given = target is not None
    report(args.run_dir, compact_run(args.run_dir, target_bytes=target), given)
    # A pool harvest's sentence vectors and rank targets (and a run's representation cache) are runs of their
    # own inside it, often its largest part: compacting the run compacts them too, as verifying it verifies them.
    for name in NESTED_RUNS:
        inner = f"{args.run_dir.rstrip('/')}/{name}"
        store = ShardStore(inner)
        if store.read_manifest() is None:
            continue
        if not store.is_complete():  # nothing of the finished run reads it (a ranks pass begun after it finished)
            print(f"{inner}: left as it is ({store.incomplete_note() or 'not complete'})")
            continue
        report(inner, compact_run(inner, target_bytes=target), given)
    return 0


def report(run_dir: str, r: dict, target_given: bool = False) -> None:
    """One line of what compaction did; the hint to compact to another size only where no --target-mb was given
    (given, the run was already at that size)."""
    files = ", ".join(f"{t} {n}" for t, n in sorted(r.get("files", {}).items()))
    moved = len(r.get("moved") or [])
    replaced = r.get("replaced") or 0
    print(f"{run_dir}: {r['status']} ({files} file(s); {r.get('removed', 0)} per-unit shard(s) removed"
          + (f"; {replaced} earlier compacted file(s) replaced" if replaced else "")
          + (f"; {moved} file(s) no marker names moved to _foreign/" if moved else "")
          + f"); target {r['target_bytes'] / (1 << 20):.3g} MB a file"
          + ("; pass --target-mb to compact to another size" if r["status"] == "already compacted"
             and not target_given else ""))
