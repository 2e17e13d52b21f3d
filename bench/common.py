"""Helpers shared by the benchmarks: machine description, peak memory of a process tree, medians."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import threading
import time
from typing import List

import psutil


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = psutil.virtual_memory().total / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python {platform.python_version()}; "
            f"load average at the end of the run {load} (other jobs were sharing the machine when this is above ~2)")


class PeakRSS:
    """Sample the summed RSS of a process and all its descendants (Ray workers included) at 20 Hz."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                procs = [self.proc] + self.proc.children(recursive=True)
                total = 0
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peak = max(self.peak, total)
            except psutil.Error:
                pass
            time.sleep(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def run_measured(cmd: List[str], env=None) -> tuple[float, int, str]:
    """Run a command; return (wall seconds, peak RSS bytes of its process tree, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakRSS(proc.pid) as mon:
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {err[-2000:]}")
    return wall, mon.peak, out


def alternated_children(script: str, modes: List[str], runs: int, *args: str) -> dict:
    """{mode: [the JSON each child printed last]}: `python script --measure MODE *args` in a fresh process,
    `runs` rounds of every mode in turn, so that a change in the machine's load falls on each mode alike."""
    import json
    import sys

    out = {m: [] for m in modes}
    for _ in range(runs):
        for mode in modes:
            r = subprocess.run([sys.executable, script, "--measure", mode, *args], capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"{mode} failed:\n{r.stderr[-3000:]}")
            out[mode].append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def median(xs):
    return statistics.median(xs)


def append_results(path, lines: List[str]) -> None:
    """Append a Markdown section to a results file (runs accumulate; BENCHMARKS.md quotes them) and echo it."""
    from pathlib import Path

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    with open(out, "a") as fh:
        fh.write(text)
    print(text, end="")


def write_json_result(path, result: dict) -> None:
    """Write a bench's result as indented JSON (the file BENCHMARKS.md quotes) and print it on one line, the
    last line of the bench's output."""
    import json
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


def bootstrap(pred, gold, n=1000, seed=0):
    """Spearman x 100 of pred against gold, its 95% bootstrap interval (n resamples), pairs used."""
    import numpy as np
    from scipy.stats import spearmanr

    rng = np.random.default_rng(seed)
    ok = np.isfinite(pred)
    pred, gold = pred[ok], gold[ok]
    stats = []
    for _ in range(n):
        i = rng.integers(0, len(pred), len(pred))
        stats.append(spearmanr(pred[i], gold[i]).statistic * 100)
    # a resample with constant predictions has no Spearman (nan): leave it out of the interval
    return (spearmanr(pred, gold).statistic * 100, np.nanpercentile(stats, 2.5), np.nanpercentile(stats, 97.5),
            int(ok.sum()))


def paired_bootstrap(a, b, gold, n=2000, seed=0):
    """Spearman x 100 of a minus that of b against the same gold, with its 95% paired bootstrap
    interval (the same resampled pairs for both): (difference, low, high)."""
    import numpy as np
    from scipy.stats import spearmanr

    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(n):
        i = rng.integers(0, len(gold), len(gold))
        diffs.append((spearmanr(a[i], gold[i]).statistic - spearmanr(b[i], gold[i]).statistic) * 100)
    return ((spearmanr(a, gold).statistic - spearmanr(b, gold).statistic) * 100,
            np.nanpercentile(diffs, 2.5), np.nanpercentile(diffs, 97.5))


def print_paired(first: str, second: str, a, b, gold) -> None:
    """Print the paired bootstrap of a's Spearman minus b's against gold, and how far the two agree pair by
    pair (the check for a change that should not move scores: bf16 against fp32 scoring, say)."""
    import numpy as np
    from scipy.stats import spearmanr

    d, lo, hi = paired_bootstrap(a, b, gold)
    print(f"{first} - {second} on {len(gold)} pairs both scored: {d:+.2f} [{lo:+.1f}, {hi:+.1f}] "
          "(Spearman x 100, 95% paired bootstrap, 2,000 resamples)")
    print(f"agreement of the two points' pair scores: Spearman {spearmanr(a, b).statistic:.4f}, "
          f"max |difference| {np.abs(a - b).max():.2g} (sd of the first's scores {a.std():.2g})")


def pyplot(script: str):
    """matplotlib's pyplot on the Agg backend, or None (with a note) where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{script}: matplotlib is not installed (make install does it); no plot drawn")
        return None
    return plt


def sample_corpus_and_bpe(work, vocab_size: int, corpus: str = "", tokenizer: str = "") -> tuple[str, str]:
    """(corpus run, tokenizer folder): the given ones, or the bundled sample built under `work` and a BPE of
    `vocab_size` trained on its training documents."""
    from pathlib import Path

    from sentsim.context.tokenizer import train_bpe  # the caller has put the repository on sys.path

    root = Path(__file__).resolve().parents[1]
    from sentsim.context.windows import iter_documents

    if not corpus:
        from sentsim.corpus_job import build_corpus

        corpus = str(Path(work) / "corpus")
        build_corpus([str(root / "corpus" / "sample" / "us_speeches_sample.jsonl.gz")], corpus,
                     overrides=["docs_per_unit=4"], executor="inline", quiet=True)
    if not tokenizer:
        tokenizer = str(Path(work) / "bpe")
        sentences = (s for d in iter_documents(corpus, 5.0, "train", order_seed=0) for s in d)
        train_bpe(sentences, vocab_size).save(tokenizer)
    return corpus, tokenizer
