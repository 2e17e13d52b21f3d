"""`make demo`: the pipeline on the bundled sample corpus, small enough for a laptop CPU.

Each step is the same entry point a user calls (`sentsim ...`); the demo only chains them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sentsim.cli import main as sentsim

SAMPLE = Path(__file__).resolve().parent.parent / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"


def step(title: str, argv: list[str]) -> None:
    print(f"\n$ sentsim {' '.join(argv)}", flush=True)
    t0 = time.time()
    rc = sentsim(argv)
    if rc != 0:
        print(f"demo: step '{title}' failed with exit code {rc}", file=sys.stderr)
        sys.exit(rc)
    print(f"  ({title}: {time.time() - t0:.1f}s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="demo_out")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    corpus = out / "corpus"
    step("corpus", ["corpus", "build", str(SAMPLE), "--out", str(corpus), "--set", "docs_per_unit=4"])
    step("verify", ["store", "verify", str(corpus)])
    m = json.loads((corpus / "manifest.json").read_text())
    print("\nmanifest counts:", json.dumps(m["counts"]))
    import pyarrow.dataset as ds

    sample = ds.dataset(str(corpus / "sentences")).head(3).to_pylist()
    for row in sample:
        print(f"  {row['sentence_id']:>8} {row['doc_id']:<32} {row['text'][:70]}")


if __name__ == "__main__":
    main()
