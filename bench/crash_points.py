"""Kill a real `sentsim` command at each of its durable steps and count the rows readers see.

Every commit in the shard store is one durable step in `storage.fs`: a rename into place
(`durable_replace`: shards, markers, manifests, compacted files, their moves) or the deletion of a
file (`delete_durable`). The command runs in a child process whose two step functions are wrapped
so that the process SIGKILLs itself just before step k (the step never happens), for k = 0, 1, ...
until the command finishes. After each kill the script records the rows the run's markers vouch for,
what `storage.RunReader` reads, what a plain pyarrow read of DIR/<table> reads, then reruns the
command and records the rows again.

    python bench/crash_points.py                  # both tables below, into bench/results/crash_points.md

- compaction: `sentsim store compact` of the bundled sample corpus (3,772 sentences, 481 chunks, 5
  units), then a second compaction after unit 2 was redone with other bytes (one sentence fewer).
- unit commits: `sentsim corpus build` killed at every step of unit 2 (its two shards, its marker).

tests/storage/test_store_compact.py and tests/storage/test_store.py run the same functions and assert on them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"
CORPUS_KEYS = {"sentences": "sentence_id", "chunks": "chunk_id"}

# The child: wrap the two durable steps, then run the sentsim command line in this process.
KILL_HOOK = r"""
import json, os, signal, sys
import storage.fs as sfs
at, match, root = int(os.environ.get("KILL_AT", "-1")), os.environ.get("KILL_MATCH"), os.environ["KILL_ROOT"]
steps = [0]
def step(what):
    if steps[0] == at or (match and match in what):
        print("KILLED before: " + what, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    steps[0] += 1
real_replace, real_delete = sfs.durable_replace, sfs.delete_durable
def durable_replace(src, dst):
    step("rename into " + os.path.relpath(dst, root))
    real_replace(src, dst)
def delete_durable(fs, path):
    step("delete " + os.path.relpath(path, root))
    real_delete(fs, path)
sfs.durable_replace, sfs.delete_durable = durable_replace, delete_durable
from sentsim.cli import main
code = main(json.loads(os.environ["KILL_ARGV"]))
print("STEPS %d" % steps[0], flush=True)
sys.exit(code)
"""


def run_killed(argv: List[str], root: Path, at: Optional[int] = None, match: Optional[str] = None) -> dict:
    """Run `sentsim ARGV` in a child killed just before durable step `at` (or the first step whose
    description contains `match`). Returns {"killed": the step or None, "steps": count when it
    finished, "rc", "stderr"}."""
    env = dict(os.environ, KILL_ARGV=json.dumps([str(a) for a in argv]), KILL_ROOT=str(root))
    env.pop("KILL_AT", None)
    env.pop("KILL_MATCH", None)
    if at is not None:
        env["KILL_AT"] = str(at)
    if match is not None:
        env["KILL_MATCH"] = match
    p = subprocess.run([sys.executable, "-c", KILL_HOOK], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    killed = next((line[len("KILLED before: "):] for line in p.stdout.splitlines()
                   if line.startswith("KILLED before: ")), None)
    steps = next((int(line.split()[1]) for line in p.stdout.splitlines() if line.startswith("STEPS ")), None)
    return {"killed": killed, "steps": steps, "rc": p.returncode, "stderr": p.stderr}


# ---- what a reader sees ---------------------------------------------------------------------------
def committed(run: Path, table: str):
    """The rows the run's valid markers vouch for, unit by unit (RunReader.unit_table reads a unit's rows
    whether they sit in its shard or in a compacted file, even where the table readers refuse)."""
    import pyarrow as pa

    from storage import RunReader

    r = RunReader(str(run))
    parts = [r.unit_table(u, table) for u in r.units() if table in r.units()[u]["files"]]
    return pa.concat_tables(parts) if parts else None


def reader_rows(run: Path, table: str):
    """(rows, table) RunReader reads, or (the one-line refusal, None)."""
    from storage import RunReader, StoreError

    try:
        t = RunReader(str(run)).read_table(table)
    except StoreError:
        return "refused", None
    return t.num_rows, t


def plain_rows(run: Path, table: str) -> int:
    """Rows a plain reader of DIR/<table> sees (pyarrow.dataset, as pandas and ray.data list files)."""
    import pyarrow.dataset as pads

    d = run / table
    return pads.dataset(str(d), format="parquet").count_rows() if d.is_dir() else 0


def same_rows(a, b, key: str) -> bool:
    return a is not None and b is not None and a.sort_by(key).equals(b.sort_by(key))


# ---- compaction -------------------------------------------------------------------------------------
def build_sample(out: Path) -> Path:
    from sentsim.corpus_job import build_corpus

    build_corpus([str(SAMPLE)], str(out), overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    return out


def redo_unit_with_other_bytes(run: Path, unit: int = 2) -> None:
    """What a resumed job whose redo is not bit-identical leaves: unit `unit`'s marker lost, then the unit
    written again with other rows (its last sentence fewer; its chunks as before)."""
    from storage import RunReader, ShardStore

    r = RunReader(str(run))
    tables = {t: r.unit_table(unit, t) for t in CORPUS_KEYS}
    tables["sentences"] = tables["sentences"].slice(0, tables["sentences"].num_rows - 1)
    extra = r.units()[unit].get("extra", {})
    store = ShardStore(str(run))
    (run / "_units" / f"{unit:05d}.json").unlink()
    store.write_unit(unit, tables, r.fingerprint, extra)


def compaction_crash_points(base: Path, work: Path, target_bytes: int, prepare: Optional[Callable] = None,
                            label: str = "first compaction") -> List[Dict]:
    """Kill `sentsim store compact` before each of its durable steps, on a copy of `base` each time."""
    argv_target = ["--target-mb", f"{target_bytes / (1 << 20):.6f}"]
    rows: List[Dict] = []
    k = 0
    while True:
        run = work / f"k{k:03d}"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(base, run)
        if prepare:
            prepare(run)
        want = {t: committed(run, t) for t in CORPUS_KEYS}
        res = run_killed(["store", "compact", str(run), *argv_target], run, at=k)
        if res["killed"] is None:  # the command finished: every step has been tried
            assert res["rc"] == 0, res["stderr"]
            shutil.rmtree(run)
            break
        row = {"scenario": label, "step": k, "killed before": res["killed"]}
        for t, key in CORPUS_KEYS.items():
            n, got = reader_rows(run, t)
            row[f"{t} committed"] = want[t].num_rows
            row[f"{t} RunReader"] = n
            row[f"{t} RunReader exact"] = same_rows(got, want[t], key) if got is not None else None
            row[f"{t} plain"] = plain_rows(run, t)
        again = subprocess.run([shutil.which("sentsim") or "sentsim", "store", "compact", str(run), *argv_target],
                               capture_output=True, text=True, cwd=ROOT)
        row["rerun rc"] = again.returncode
        from storage import verify_store

        row["verify after rerun"] = verify_store(str(run)) or "OK"
        for t, key in CORPUS_KEYS.items():
            n, got = reader_rows(run, t)
            row[f"{t} after rerun"] = n
            row[f"{t} after rerun exact"] = same_rows(got, want[t], key)
            row[f"{t} plain after rerun"] = plain_rows(run, t)
        rows.append(row)
        shutil.rmtree(run)
        k += 1
    return rows


# ---- unit commits ---------------------------------------------------------------------------------------
def unit_write_crash_points(work: Path, unit: int = 2) -> List[Dict]:
    """Kill `sentsim corpus build` before each durable step of unit `unit` (each shard's rename, the
    marker's), and just after them; check what readers see, resume, check again."""
    from storage import RunReader, verify_store

    clean = build_sample(work / "clean")
    want = {t: RunReader(str(clean)).read_table(t) for t in CORPUS_KEYS}
    points = [f"sentences/part-{unit:05d}.parquet", f"chunks/part-{unit:05d}.parquet", f"_units/{unit:05d}.json",
              f"sentences/part-{unit + 1:05d}.parquet"]
    rows = []
    for point in points:
        run = work / "run"
        shutil.rmtree(run, ignore_errors=True)
        argv = ["corpus", "build", str(SAMPLE), "--out", str(run), "--executor", "inline", "--set", "docs_per_unit=4"]
        res = run_killed(argv, run, match=point)
        reader = RunReader(str(run))
        units = sorted(reader.units())
        broken = {u: reader.check_unit(u) for u in units if reader.check_unit(u) is not None}
        row = {"killed before": res["killed"], "units with a marker": units, "marked units whose files fail": broken,
               "unit files on disk": sorted(p.name for t in CORPUS_KEYS for p in (run / t).glob(f"*{unit:05d}*"))}
        for t in CORPUS_KEYS:
            row[f"{t} RunReader"] = reader.read_table(t).num_rows if units else 0
            row[f"{t} markers"] = reader.rows(t)
            row[f"{t} plain"] = plain_rows(run, t)
        row["verify"] = verify_store(str(run))
        again = subprocess.run([shutil.which("sentsim") or "sentsim", *argv], capture_output=True, text=True, cwd=ROOT)
        row["resume rc"] = again.returncode
        row["resume verify"] = verify_store(str(run)) or "OK"
        for t, key in CORPUS_KEYS.items():
            got = RunReader(str(run)).read_table(t)
            row[f"{t} after resume"] = got.num_rows
            row[f"{t} after resume exact"] = same_rows(got, want[t], key)
        rows.append(row)
    return rows


# ---- report -----------------------------------------------------------------------------------------------
def compaction_table(rows: List[Dict]) -> str:
    out = ["| scenario | killed before step | sentences: committed / RunReader / plain DIR/sentences | after rerun "
           "(RunReader / plain) | chunks: committed / RunReader / plain | after rerun | verify after rerun |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        def mark(ok) -> str:
            return "" if ok in (True, None) else " WRONG"

        s = [f"{r[f'{t} committed']} / {r[f'{t} RunReader']}{mark(r[f'{t} RunReader exact'])} / {r[f'{t} plain']}"
             for t in CORPUS_KEYS]
        a = [f"{r[f'{t} after rerun']}{mark(r[f'{t} after rerun exact'])} / {r[f'{t} plain after rerun']}"
             for t in CORPUS_KEYS]
        out.append(f"| {r['scenario']} | {r['step']}: {r['killed before']} | {s[0]} | {a[0]} | {s[1]} | {a[1]} | "
                   f"{r['verify after rerun'] if r['verify after rerun'] == 'OK' else 'problems'} |")
    return "\n".join(out)


def unit_table(rows: List[Dict]) -> str:
    out = ["| killed before | units with a marker | sentences: RunReader / markers / plain | after resume | verify "
           "after resume |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['killed before']} | {r['units with a marker']} | {r['sentences RunReader']} / "
                   f"{r['sentences markers']} / {r['sentences plain']} | {r['sentences after resume']}"
                   f"{'' if r['sentences after resume exact'] else ' WRONG'} | {r['resume verify']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/sentsim-crash-points")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "crash_points.md"))
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    base = build_sample(work / "base")
    target = 100_000  # about 2 units of sentences a file: 3 sentences files, 1 chunks file
    rows = compaction_crash_points(base, work / "c1", target)
    compacted = work / "compacted"
    shutil.copytree(base, compacted)
    subprocess.run([shutil.which("sentsim") or "sentsim", "store", "compact", str(compacted), "--target-mb",
                    f"{target / (1 << 20):.6f}"], check=True, capture_output=True)
    rows += compaction_crash_points(compacted, work / "c2", target, prepare=redo_unit_with_other_bytes,
                                    label="second, after unit 2 was redone")
    units = unit_write_crash_points(work / "u")
    text = ("# Crash points (bench/crash_points.py)\n\n"
            "Rows each reader sees after a SIGKILL just before each durable step, and after rerunning the "
            "command. 'plain' is pyarrow.dataset over DIR/<table> (what pandas, ray.data and `datasets` list).\n\n"
            "## sentsim store compact\n\n" + compaction_table(rows) + "\n\n## sentsim corpus build, unit 2\n\n"
            + unit_table(units) + "\n")
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
