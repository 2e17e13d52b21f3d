"""What checking every read against its marker costs: `storage.open_run` against plain pyarrow on the same files.

    .venv/bin/python bench/read_check.py [--corpus DIR] [--runs 7] [--baseline CHECKOUT] [--out FILE.md]

The run read is the reference corpus (`make reference`'s CACHE/reference/corpus: every shared corpus, built
here with `sentsim corpus build` when it is not there yet), or any run given as --corpus. Each timing is the
median of --runs fresh processes, so no run finds the previous one's footers or page cache state in Python:

  plain       pyarrow.parquet.read_table over the files the markers name (no marker read, no check)
  reader      open_run(DIR).read_table(table): markers read, each file's size checked (one listing a
              folder), each file's footer row count checked as it is opened
  reader.files  open_run(DIR).files(table) alone: the markers and the size check, no data read
  footers     the footer check a reader does for files it hands to other readers (dataset, ray_dataset,
              file_uris): open_run(DIR).file_uris(table)

The ratio reader / plain is what a checked read costs against an unchecked one, in the same run.
`--baseline CHECKOUT` (e.g. a `git worktree` of a commit before the check) also times that checkout's
`open_run(DIR).read_table(table)` in the same interleaved rounds, as `reader (baseline)`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "corpus"
CORPORA = ("enwiki_2014slice_docs.jsonl.gz", "gutenberg_docs.jsonl.gz", "us_speeches_docs.jsonl.gz")

# One timing, run in a fresh interpreter: prints {"seconds": s, "rows": n}.
PROBE = r"""
import json, sys, time
sys.path.insert(0, {root!r})
import pyarrow.parquet as pq
from storage import open_run
run_dir, table, what = sys.argv[1:4]
if what == "plain":
    paths = open_run(run_dir).files(table)          # the file list, outside the timing
    t0 = time.perf_counter()
    import pyarrow as pa
    rows = pa.concat_tables([pq.read_table(p) for p in paths]).num_rows
elif what == "reader":
    t0 = time.perf_counter()
    rows = open_run(run_dir).read_table(table).num_rows
elif what == "reader.files":
    t0 = time.perf_counter()
    rows = len(open_run(run_dir).files(table))
else:
    t0 = time.perf_counter()
    rows = len(open_run(run_dir).file_uris(table))
print(json.dumps({{"seconds": time.perf_counter() - t0, "rows": rows}}))
"""


def reference_corpus(cache: Path) -> Path:
    corpus = cache / "reference" / "corpus"
    if not (corpus / "_COMPLETE").exists():
        sentsim = Path(sys.executable).parent / "sentsim"
        subprocess.run([str(sentsim), "corpus", "build", *(str(DATA / c) for c in CORPORA), "--out", str(corpus)],
                       check=True)
    return corpus


def time_one(run_dir: Path, table: str, what: str, root: Path = ROOT) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(root)), str(run_dir), table, what],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="", help="a run folder (default: the reference corpus, built if missing)")
    ap.add_argument("--table", default="sentences")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline", default="", help="another checkout whose reader to time beside this one's")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "read_check.md"))
    args = ap.parse_args()
    cache = Path(os.environ.get("SENTSIM_CACHE", Path.home() / ".cache" / "sentsim"))
    run_dir = Path(args.corpus) if args.corpus else reference_corpus(cache)
    from storage import open_run

    reader = open_run(str(run_dir))
    n_files = len(reader.files(args.table))
    rows = reader.rows(args.table)
    modes = ("plain", "reader", "reader.files", "footers") + (("reader (baseline)",) if args.baseline else ())
    seconds = {m: [] for m in modes}
    for _ in range(args.runs):  # interleaved, so a load change on the machine falls on every mode alike
        for m in modes:
            root = (Path(args.baseline), "reader") if m == "reader (baseline)" else (ROOT, m)
            seconds[m].append(time_one(run_dir, args.table, root[1], root[0])["seconds"])
    med = {m: median(v) for m, v in seconds.items()}
    lines = ["# Checked reads (bench/read_check.py)", "",
             f"Command: `.venv/bin/python bench/read_check.py --runs {args.runs}"
             + (f" --corpus {args.corpus}" if args.corpus else "")
             + (f" --baseline {args.baseline}" if args.baseline else "") + "`  ",
             f"Run: {run_dir.name if args.corpus else 'the reference corpus'}, table `{args.table}`: "
             f"{rows:,} rows in {n_files} files.  ",
             f"Machine: {machine()}.  ", f"Median of {args.runs} fresh processes each, interleaved.", "",
             "| read | median s | min | max | against plain |", "|---|---:|---:|---:|---:|"]
    for m in modes:
        lines.append(f"| {m} | {med[m]:.4f} | {min(seconds[m]):.4f} | {max(seconds[m]):.4f} | "
                     f"{med[m] / med['plain']:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
