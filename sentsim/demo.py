"""`make demo`: the whole chain on the bundled sample corpus, with small models, on a laptop CPU.

corpus -> verify -> index -> discriminator -> context models -> harvest -> surrogate -> eval sts
-> student. Each step runs the `sentsim` command a user types, in its own process, from the
current directory with the relative paths a user would give: the demo only chains the commands
and keeps every model tiny. The STS evaluation runs when the shared data (../shared/data/sts) or
`--sts DIR` is there, and is skipped with a note otherwise.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "corpus" / "sample" / "us_speeches_sample.jsonl.gz"
SHARED_STS = ROOT.parent / "shared" / "data" / "sts"


def step(title: str, argv: list[str]) -> None:
    """Run `sentsim ARGV` as its own process; stop the demo with its exit code when it fails."""
    print(f"\n$ sentsim {' '.join(argv)}", flush=True)
    t0 = time.time()
    rc, interrupted = run_step([sys.executable, "-m", "sentsim.cli", *argv])
    if interrupted:
        print(f"demo: interrupted during step '{title}'; run the demo again to go on from there",
              file=sys.stderr)
        sys.exit(130)
    if rc != 0:
        print(f"demo: step '{title}' failed with exit code {rc}", file=sys.stderr)
        sys.exit(rc)
    print(f"  ({title}: {time.time() - t0:.1f}s)", flush=True)


def run_step(argv: list[str]) -> tuple[int, bool]:
    """Run one step to its end and return its exit code and whether a Ctrl-C came meanwhile. A Ctrl-C at the
    terminal reaches the step too (one process group), which stops in its own way: its lease released, Ray left,
    "interrupted" said. So the demo only notes it and waits; subprocess.call would SIGKILL the step a quarter
    second in and print the demo's own traceback."""
    seen: list[int] = []
    before = signal.getsignal(signal.SIGINT)
    if before is not signal.SIG_IGN:  # a demo started with Ctrl-C ignored (in the background) passes that on
        signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        rc = subprocess.Popen(argv).wait()
    finally:
        signal.signal(signal.SIGINT, before)
    if rc < 0:  # the step was ended by a signal: the shell's way of saying so
        rc = 128 - rc
    return rc, bool(seen) or rc == 130


def show_pairs(harvest: str) -> None:
    """The least and most similar harvested pairs, read through the run's completion markers. A run that
    cannot be shown stops the demo with the reader's one line and exit code 2, as a failed step does."""
    from sentsim.errors import UsageError
    from storage.reader import RunReader

    try:  # a text score is named here, not sorted as text and then refused by the number format below
        t = RunReader(harvest).read_table("pairs", columns=["score", "kind", "s1", "s2"], numeric=["score"]).to_pandas()
    except UsageError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        sys.exit(UsageError.exit_code)
    show = t[t.score.notna()].sort_values("score")
    print("\nleast and most similar harvested pairs:")
    for _, r in list(show.head(2).iterrows()) + list(show.tail(2).iterrows()):
        print(f"  {r.score:+.3f}  [{r.kind}] {r.s1[:60]!r} ~ {r.s2[:60]!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    ap.add_argument("--sts", default=os.path.relpath(SHARED_STS),
                    help="STS data folder for `eval sts` (default ../shared/data/sts)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t_all = time.time()
    out = args.out  # relative on purpose: every command must resolve it the way a user's shell does
    corpus, index, disc, ctx, harvest, surrogate, student = (
        f"{out}/{n}" for n in ("corpus", "index", "discriminator", "context", "harvest", "surrogate", "student"))
    step("corpus", ["corpus", "build", os.path.relpath(SAMPLE), "--out", corpus, "--set", "docs_per_unit=4"])
    step("verify", ["store", "verify", corpus])
    step("index", ["index", "build", "--corpus", corpus, "--out", index])
    step("discriminator", ["train", "discriminator", "--corpus", corpus, "--out", disc,
                           "--set", "train.max_steps=150", "--set", "model.embed_dim=64", "--set", "model.hidden=64"])
    step("context models", ["train", "context", "--corpus", corpus, "--out", ctx, "--direction", "all",
                            "--set", "max_steps=150", "--set", "model.vocab_size=2000", "--set", "model.d_model=64",
                            "--set", "model.encoder_layers=1", "--set", "model.decoder_layers=1",
                            "--set", "model.ffn_dim=128", "--set", "eval_every=150", "--set", "warmup_steps=20",
                            "--set", "heldout_percent=15", "--set", "heldout_windows=64"])
    step("harvest", ["harvest", "--corpus", corpus, "--index", index, "--discriminator", disc,
                     "--context-models", ctx, "--out", harvest,
                     "--set", "anchors.n=24", "--set", "anchors.per_unit=4", "--set", "contexts.size=16",
                     "--set", "contexts.retrieve_chunks=300", "--set", "rank.n_anchors=1000"])
    show_pairs(harvest)
    # The surrogate (003 §3.4) from the bundled all-MiniLM-L6-v2: one epoch (the default) over the harvest's
    # ~90 train pairs, 6 steps of 16, evaluated on dev/test at its start and end.
    step("surrogate", ["train", "surrogate", "--data", harvest, "--out", surrogate, "--set", "batch_size=16"])
    if Path(args.sts).is_dir():
        step("eval sts", ["eval", "sts", "--model", f"{surrogate}/model", "--data", args.sts, "--tasks", "STSb"])
    else:
        print(f"\n(eval sts skipped: no STS data at {args.sts}; pass --sts DIR)")
    # One student objective: RankEncoder (004) on the harvest's rank-vector targets, one epoch (the default):
    # 8 full batches of 16 of its ~140 sentence rows.
    step("student", ["train", "student", "--objective", "rankencoder", "--data", harvest, "--out", student,
                     "--set", "batch_size=16", "--set", "log_every=2"])
    print(f"\ndemo: done in {time.time() - t_all:.0f}s; outputs under {out}/ "
          f"(harvest report: {harvest}/report.png)")


if __name__ == "__main__":
    main()
