"""sentsim store verify DIR"""

from __future__ import annotations

import sys

COMMAND = ("store", "verify")
HELP = ("re-read every shard of a run against its manifest (rows, schema, checksum), and the manifest against its own "
        "checksum; exit 1 naming each bad shard; "
        "an intact run not yet finished is OK (incomplete: ...)")


def add_arguments(p) -> None:
    p.add_argument("run_dir", metavar="DIR", help="run directory (local path or s3://...)")


def run(args) -> int:
    from sentsim.out_paths import refuse_another_kind
    from storage.verify import unread_nested_runs, verify_run

    refuse_another_kind(args.run_dir, "store verify")
    notes: list = []
    problems, unfinished = verify_run(args.run_dir, notes)
    for line in notes:
        print(line)
    for name in unread_nested_runs(args.run_dir):  # checked all the same: a later run may read it again
        print(f"{args.run_dir.rstrip('/')}/{name}: not read by this run (kept from an earlier run in this folder)")
    for line in missing_pool_runs(args.run_dir):
        print(line)
    if problems:
        for line in problems:
            print(f"BAD  {line}", file=sys.stderr)
        print(f"{args.run_dir}: {len(problems)} problem(s)" + (f"; {unfinished}" if unfinished else ""),
              file=sys.stderr)
        return 1
    # a run stopped by --max-units (or killed) is not damaged: what it holds checks out, and it resumes
    print(f"{args.run_dir}: OK" + (f" ({unfinished})" if unfinished else ""))
    return 0


# what reads each run a pool harvest records, for the note on one that is gone
_POOL_RUNS = {"pool_vectors": ("vectors_fingerprint", "`sentsim remix` reads it, and the same harvest command "
                                "rebuilds it"),
              "pool_ranks": ("ranks_fingerprint", "a relabel reads it, and the same harvest command "
                                              "rebuilds it")}


def missing_pool_runs(run_dir: str) -> list:
    """A note for each run a finished pool harvest recorded (its vectors, its rank targets) that is no longer in
    its folder: the harvest's own rows stay whole without them, so it is not a problem, but what reads them will
    refuse or redo work, which the user deleting them to save space should know."""
    from storage import ShardStore, StoreError

    root = run_dir.rstrip("/")
    try:
        store = ShardStore(root)
        # untrusted: an edited manifest is named by verify_run, and the notes on its runs are still worth giving
        manifest = store.read_manifest(trusted=False) or {}
        if not store.is_complete():
            return []
        pool = manifest.get("pool") or {}
        lines = []
        for name, (key, what) in _POOL_RUNS.items():
            sub = ShardStore(f"{root}/{name}")
            # only whether a run is there: one with a broken or edited manifest is there (verify_run names it)
            if isinstance(pool, dict) and pool.get(key) and not sub.has_manifest() and not sub.lost_manifest():
                lines.append(f"{root}/{name}: not there (deleted?); this harvest's rows are whole without it, but "
                             f"{what}")
        return lines
    except StoreError:  # verify_run names what is wrong with the manifest
        return []
