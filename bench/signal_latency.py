"""How long a signal waits for its Python handler during a pool harvest's clustering (sentsim.harvest.clusters).

Python runs a handler in the main thread between bytecodes, so a SIGTERM that comes during one long native call
(released_on_sigterm's lease release, or Ray's handler once Ray runs) waits until that call returns. A child
process clusters N enwiki sentences (the setup a pool harvest runs before its first unit) with a SIGUSR1 handler
that notes the time and where it ran; this process sends it SIGUSR1 every 50 ms. A signal's wait is from the
first one sent after the previous handler ran to the handler that took it; the longest waits are printed with
the call they waited for (the frame the handler ran in, the one that made the call). On a busy machine a wait
includes time the child was not scheduled at all.

    python bench/signal_latency.py --n 300000 --size 256 [--levels 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENWIKI = ROOT.parent / "shared" / "data" / "corpus" / "enwiki_2014slice_docs.jsonl.gz"
EVERY_S = 0.05


def child(n: int, size: int, levels: int) -> None:
    import traceback

    sys.path.insert(0, str(ROOT))
    texts: list[str] = []
    with gzip.open(ENWIKI, "rt") as f:
        for line in f:
            for p in json.loads(line)["paragraphs"]:
                texts += [s for s in re.split(r"(?<=[.!?])\s+", p) if len(s) > 20]
            if len(texts) >= n:
                break
    texts = texts[:n]
    import scipy.sparse  # noqa: F401  imported before the clock starts
    import sklearn.cluster  # noqa: F401

    from sentsim.harvest.clusters import balanced_clusters

    seen: list[float] = []
    where: list[str] = []

    def noted(signum, frame):
        seen.append(time.monotonic())
        where.append(" < ".join(f"{_shown(fs.filename)}:{fs.lineno} {fs.name}"
                                for fs in traceback.extract_stack(frame, limit=3)[::-1]))

    signal.signal(signal.SIGUSR1, noted)
    print("ready", flush=True)
    t0 = time.monotonic()
    balanced_clusters(texts, size, 0, levels=levels)
    t1 = time.monotonic()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print(json.dumps({"t0": t0, "t1": t1, "seen": seen, "where": where}), flush=True)


def _shown(path: str) -> str:
    """A source file as the results name it: within the checkout or site-packages."""
    root = str(ROOT) + os.sep
    return path[len(root):] if path.startswith(root) else path.split("site-packages/")[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="sentences to cluster")
    ap.add_argument("--size", type=int, default=256, help="cluster size (partners.cluster_size)")
    ap.add_argument("--levels", type=int, default=1, choices=(1, 2), help="partners.cluster_levels")
    ap.add_argument("--top", type=int, default=5, help="longest waits to print")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.n, args.size, args.levels)
        return
    p = subprocess.Popen([sys.executable, __file__, "--child", "--n", str(args.n), "--size", str(args.size),
                          "--levels", str(args.levels)], stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != "ready":
        sys.exit(f"the child did not start: exit {p.wait()}")
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(p.stdout.read()))  # the result may outgrow a pipe
    reader.start()
    sent = []
    while p.poll() is None:
        sent.append(time.monotonic())
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            break
        time.sleep(EVERY_S)
    reader.join()
    out = json.loads(got[0].strip().splitlines()[-1])
    t0, t1 = out["t0"], out["t1"]
    sent = [s for s in sent if t0 <= s <= t1]
    waits, i = [], 0
    for handled, frame in zip(out["seen"], out["where"]):
        first = None
        while i < len(sent) and sent[i] <= handled:
            first = sent[i] if first is None else first
            i += 1
        if first is not None:
            waits.append((handled - first, first - t0, frame))
    print(f"{args.n:,} sentences, clusters of {args.size}, {args.levels} level(s): {t1 - t0:.1f} s, "
          f"{len(waits)} signals handled")
    for wait, at, frame in sorted(waits, reverse=True)[:args.top]:
        print(f"  waited {wait:.2f} s (sent at {at:.1f} s) for: {frame}")


if __name__ == "__main__":
    main()
