"""Rebuild the reference teacher from the shared corpora into the user cache (`make reference`).

    python bench/reference_teacher.py [--data ../shared/data] [--cache ~/.cache/sentsim]
                                      [--milestones 150000,250000,400000,1000000] [--threads N]
                                      [--train-on PREFIX[,PREFIX...]] [--seed N] [--discriminator]

Steps, each a real `sentsim` command and each resumable (run it again after a kill and it goes on):
  1. `sentsim corpus build` of every shared corpus (Wikipedia slice, Gutenberg, speeches) into
     CACHE/reference/corpus;
  2. `sentsim index build` (TF-IDF bigrams) over its chunks into CACHE/reference/index;
  3. `sentsim train context --config configs/reference_context.yaml` into CACHE/reference/context-enwiki,
     stopping at each milestone of target tokens; the bundle at each milestone is copied to
     CACHE/reference/snapshots-enwiki/tokens-N (the curve of issue 15 scores them).
  4. with --discriminator: `sentsim train discriminator --config configs/reference_discriminator.yaml`
     into CACHE/reference/discriminator, then `sentsim cache build` (its rep cache over every corpus
     sentence, 003 §3.3) into CACHE/reference/rep_cache, for harvests that screen contexts with it.
CACHE/reference/DONE-enwiki.json is written last, with the seconds each step took when it ran (a step
skipped later keeps its time) and the trainer's cumulative training seconds at each milestone, which
add up across resumed runs. A milestone below where the working model has already trained (a milestone
list changed after training went past it) is not snapshotted, and said: the snapshot would be the later
model under the earlier name. An existing discriminator trained from other settings than
--discriminator-config is refused, not reused. `configs/teacher.yaml`
points at these folders.

The context model trains on the documents whose doc_id starts with one of the config's
`doc_id_prefixes`: `enwiki`, the Wikipedia slice, chosen on STS-B dev
(docs/experiments/2026-11-24-wikipedia-only.md). The folders carry the prefixes (context-enwiki/,
snapshots-enwiki/, DONE-enwiki.json), so `--train-on all` (every document: context/, snapshots/,
DONE.json) or `--train-on P1,P2` builds another teacher beside it. Corpus and index are always the whole
shared corpora, which retrieval uses. Training on enwiki is the same stream as on a corpus of the
Wikipedia file alone (Wikipedia is the first input, so its documents keep their keys and slices).
`--seed N` trains another seed of the same recipe (its data order and the warm start's new parameters)
into folders that carry it (context-enwiki-seedN/, snapshots-enwiki-seedN/, DONE-enwiki-seedN.json):
seed-to-seed spread is the yardstick for every dev difference between teachers
(docs/experiments/2026-11-25-seeds.md).

Determinism: the same seed, corpus files and thread count give the same model; a resumed run rebuilds the same
data stream and passes over the batches it already trained on, so it goes on where it stopped.

Time on a 2-core AVX2 EPYC (fp32): corpus ~3 min, index ~5 min, context model 100-169 target
tokens/s with 2 threads, so 1.6-3 hours for 1M target tokens; on a 2-core EPYC with avx512_bf16 about
220 target tokens/s, 1.3 hours. The recipe pins fp32 (`bf16: off`), so that the model does not depend
on the CPU's flags: bf16 was 1.29x faster there, and on STS-B dev 4.8 points under fp32 on one seed
and level on another (docs/experiments/2026-11-24-bf16-cpu.md, docs/experiments/2026-11-25-seeds.md). The
torch thread count changes the arithmetic too: the same seed rebuilds the same model bit for bit only
with the same --threads (0 is every core, which differs between machines; DONE json records it as
trained_threads). Another seed to 150K target tokens: 1,295 s of training on one thread beside a CI
run (fp32); with --discriminator, about 15-30 minutes more for the discriminator (874 s of fitting
beside one other job, 2026-11-25) and 8-11 for its rep cache (3.4 GB), which every unit encodes on one
thread so that it is the same bits anywhere.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ("enwiki_2014slice_docs.jsonl.gz", "gutenberg_docs.jsonl.gz", "us_speeches_docs.jsonl.gz")
CONFIG = ROOT / "configs" / "reference_context.yaml"
DISCRIMINATOR_CONFIG = ROOT / "configs" / "reference_discriminator.yaml"


def cache_root(arg: str | None) -> Path:
    from sentsim.config import user_cache

    return (Path(arg).expanduser() if arg else user_cache()).resolve() / "reference"


def train_prefixes(train_on: str) -> list[str]:
    """--train-on: "" = configs/reference_context.yaml's doc_id_prefixes, "all" = every document."""
    if train_on.strip() == "all":
        return []
    if train_on.strip():
        return [x.strip() for x in train_on.split(",") if x.strip()]
    return recipe().doc_id_prefixes


@functools.cache
def recipe():
    """configs/reference_context.yaml, read and validated by the schema `sentsim train context` uses."""
    sys.path.insert(0, str(ROOT))
    from sentsim.config import load_config
    from sentsim.context.config import ContextTrainConfig

    return load_config(ContextTrainConfig, str(CONFIG))


def training_seconds(bundle: Path) -> float:
    """The trainer's own count of training seconds in a bundle, summed over its runs: it adds up across
    resumed invocations, where a wall clock around one invocation would not."""
    summary = json.loads((bundle / "train_summary.json").read_text())
    return round(sum(r.get("train_seconds", 0.0) for r in summary.get("runs", {}).values()), 1)


def trained_steps(bundle: Path, key: str) -> dict:
    """A bundle's training steps summed over its runs, from its train_summary.json, by format (key
    `precision_steps`: fp32 / bf16) or by torch thread count (`threads_steps`); a bundle trained before
    its trainer recorded the key counts its steps as "unrecorded"."""
    summary = json.loads((bundle / "train_summary.json").read_text())
    out: dict = {}
    for r in summary.get("runs", {}).values():
        for k, n in (r.get(key) or {"unrecorded": r.get("steps", 0)}).items():
            out[k] = out.get(k, 0) + n
    return out


def training_position(work: Path) -> tuple[int, int | None]:
    """(target tokens a working bundle's training has reached, the budget its last finished run stopped
    for), from its last checkpoint and its train_summary.json; (0, None) before any training. A run
    killed after a finished one has a checkpoint further on than the summary, and a resumed run starts
    from the checkpoint, so the furthest of the two is where training stands."""
    reached, stopped_for = 0, None
    summary = work / "train_summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        reached = max((r.get("target_tokens_seen", 0) for r in s.get("runs", {}).values()), default=0)
        stopped_for = (s.get("config") or {}).get("max_target_tokens")
    for history in work.glob("runs/*/checkpoint/history.json"):
        points = json.loads(history.read_text())
        at = points[-1].get("target_tokens_seen", 0) if points else 0
        if at > reached:
            reached, stopped_for = at, None  # trained on since the summary was written
    return reached, stopped_for


def recipe_format() -> str | None:
    """The format the recipe pins for training (configs/reference_context.yaml's bf16), None if it leaves
    it to the CPU (auto)."""
    return {"off": "fp32"}.get(recipe().bf16)


def seed_arg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed (a whole number >= 0)")
    return int(text)


def check_discriminator_recipe(folder: Path, config_file: str) -> None:
    """An exported discriminator is kept across runs; refuse one trained from other settings than
    --discriminator-config names, instead of screening with it silently."""
    from sentsim.config import load_config
    from sentsim.discriminator.train import DiscriminatorJob
    from sentsim.errors import UsageError

    try:
        job = load_config(DiscriminatorJob, config_file)
    except UsageError as exc:
        raise SystemExit(f"reference: {exc}") from None
    trained = json.loads((folder / "config.json").read_text())
    wanted = json.loads(json.dumps({"model": job.model.model_dump(), "train": job.train.model_dump()}))
    changed = sorted(f"{part}.{key}" for part in ("model", "train") for key in wanted[part]
                     if trained.get(part, {}).get(key) != wanted[part][key])
    if changed:
        raise SystemExit(f"reference: {folder} was trained with other settings than {config_file} "
                         f"({', '.join(changed)}); move that folder away (and rep_cache/ beside it) to retrain")


def sentsim(*args: str) -> None:
    cmd = [sys.executable, "-m", "sentsim.cli", *args]
    print("$ sentsim " + " ".join(args), flush=True)
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc != 0:
        raise SystemExit(f"reference: `sentsim {' '.join(args[:2])}` exited {rc}; run `make reference` again to resume")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--cache", default=None, help="cache folder (default: SENTSIM_CACHE or ~/.cache/sentsim)")
    ap.add_argument("--milestones", default="150000,250000,400000,1000000",
                    help="target-token counts at which the bundle is snapshotted; training stops at the last")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for training (0 = every core; 1 beside other work); the rep cache is "
                         "built on one thread whatever this says")
    ap.add_argument("--discriminator", action="store_true",
                    help="also train the coherence discriminator into CACHE/reference/discriminator and build "
                         "its rep cache over every corpus sentence into CACHE/reference/rep_cache (003 §3.3)")
    ap.add_argument("--discriminator-config", default=str(DISCRIMINATOR_CONFIG), metavar="FILE",
                    help="the discriminator's settings (default: configs/reference_discriminator.yaml)")
    ap.add_argument("--train-on", default="", metavar="PREFIXES",
                    help="train the context model on the documents whose doc_id starts with one of these "
                         "comma-separated prefixes, or on `all` of them (default: the config's doc_id_prefixes)")
    ap.add_argument("--seed", type=seed_arg, default=None, metavar="N",
                    help="train another seed of the recipe into folders named -seedN (default: the config's seed)")
    args = ap.parse_args(argv)
    ref = cache_root(args.cache)
    prefixes = train_prefixes(args.train_on)
    # the folders say what the model read, so another choice never meets this one's training state
    suffix = "".join(f"-{''.join(c if c.isalnum() else '_' for c in x)}" for x in prefixes)
    train_set = ["--set", "doc_id_prefixes=[" + ", ".join(json.dumps(x) for x in prefixes) + "]"]
    seed = recipe().seed if args.seed is None else args.seed
    if seed != recipe().seed:  # the recipe's own seed keeps the folder names every figure was measured in
        suffix += f"-seed{seed}"
    train_set += ["--set", f"seed={seed}"]
    ref.mkdir(parents=True, exist_ok=True)
    inputs = [Path(args.data) / "corpus" / name for name in CORPORA]
    missing = [str(p) for p in inputs if not p.is_file()]
    if missing:
        raise SystemExit(f"reference: missing corpus files: {', '.join(missing)} (is ../shared beside the checkout?)")
    done = ref / f"DONE{suffix}.json"
    # each step's time when it ran: a later run that skips a step keeps the time it took before
    times: dict = json.loads(done.read_text()).get("times", {}) if done.is_file() else {}
    times = {k: v for k, v in times.items() if v != 0.0}  # files of earlier versions wrote 0.0 for a skipped step

    t0 = time.perf_counter()
    if not (ref / "corpus" / "_COMPLETE").exists():
        # units of up to 2 MB of input (about 250 Wikipedia articles): 16 documents per unit, the default,
        # would give ~5,000 units of 250 sentences each, where the per-unit cost dominates
        sentsim("corpus", "build", *map(str, inputs), "--out", str(ref / "corpus"),
                "--set", "docs_per_unit=100000", "--force-new")
        times["corpus_s"] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    if not (ref / "index" / "index.json").exists():  # the index manifest is written last
        sentsim("index", "build", "--corpus", str(ref / "corpus"), "--out", str(ref / "index"))
        times["index_s"] = round(time.perf_counter() - t0, 1)

    milestones = sorted(int(m) for m in args.milestones.split(",") if m.strip())
    # cumulative training seconds at each milestone, read from the snapshot itself
    times["training_s"] = {}
    trained_in, threads, pinned, skipped = {}, {}, recipe_format(), []
    for m in milestones:
        snap = ref / f"snapshots{suffix}" / f"tokens-{m}"
        if (snap / "context.json").exists():
            times["training_s"][str(m)] = training_seconds(snap)
            trained_in[str(m)] = formats = trained_steps(snap, "precision_steps")
            threads[str(m)] = trained_steps(snap, "threads_steps")
            other = {k: n for k, n in formats.items() if pinned and k not in (pinned, "unrecorded")}
            if other:  # e.g. kept from before the recipe pinned fp32, trained in bf16 where the CPU had it
                print(f"reference: warning: the kept {snap} trained "
                      f"{', '.join(f'{n:,} steps in {k}' for k, n in other.items())}, but the recipe trains "
                      f"{pinned} ({CONFIG.name}); move {snap.parent} and {ref / f'context{suffix}'} away to "
                      "rebuild it", file=sys.stderr, flush=True)
            continue
        reached, stopped_for = training_position(ref / f"context{suffix}")
        if reached >= m and stopped_for != m:
            # the trainer would stop at once and the copy would be a later model named as this milestone's
            print(f"reference: warning: no snapshot at {m:,} target tokens: {ref / f'context{suffix}'} has "
                  f"trained to {reached:,} already (snapshots are taken on the way; move it and "
                  f"{snap.parent} away to rebuild with this milestone)", file=sys.stderr, flush=True)
            skipped.append(m)
            continue
        sentsim("train", "context", "--corpus", str(ref / "corpus"), "--out", str(ref / f"context{suffix}"),
                "--config", str(CONFIG),
                "--set", f"max_target_tokens={m}", "--set", f"torch_threads={args.threads}", *train_set)
        times["training_s"][str(m)] = training_seconds(ref / f"context{suffix}")
        trained_in[str(m)] = trained_steps(ref / f"context{suffix}", "precision_steps")
        threads[str(m)] = trained_steps(ref / f"context{suffix}", "threads_steps")
        tmp = snap.with_name(snap.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for src in (ref / f"context{suffix}").iterdir():  # the bundle, without the training state (runs/, tokenizer/)
            if src.name not in ("runs", "tokenizer", "run.json"):
                (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp / src.name)
        tmp.rename(snap)  # a snapshot folder exists only once it is whole
        print(f"reference: snapshot at {m:,} target tokens -> {snap}", flush=True)
    if args.discriminator:
        # the discriminator and its cache are the same for every context model: no suffix on their folders
        t0 = time.perf_counter()
        if (ref / "discriminator" / "config.json").exists():  # written once the model is exported
            check_discriminator_recipe(ref / "discriminator", args.discriminator_config)
        else:
            sentsim("train", "discriminator", "--corpus", str(ref / "corpus"), "--out", str(ref / "discriminator"),
                    "--config", args.discriminator_config)
            times["discriminator_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        if not (ref / "rep_cache" / "_COMPLETE").exists():
            sentsim("cache", "build", "--corpus", str(ref / "corpus"), "--discriminator", str(ref / "discriminator"),
                    "--out", str(ref / "rep_cache"), "--executor", "inline")
            times["rep_cache_s"] = round(time.perf_counter() - t0, 1)
        print(f"reference: screen with --set discriminator={ref / 'discriminator'} "
              f"--set contexts.rep_cache={ref / 'rep_cache'}", flush=True)
    # trained_in: each snapshot's training steps by format (fp32 / bf16), as its trainer recorded them;
    # trained_threads: by torch thread count. A rebuild gives the same model only with the same seed, format
    # and thread count (--threads; 0 is every core, so it differs between machines)
    # milestones: the snapshots there are (a milestone the model had trained past is left out, and said)
    done.write_text(json.dumps({"milestones": [m for m in milestones if m not in skipped], "train_on": prefixes,
                                "seed": seed, "times": times, "trained_in": trained_in,
                                "trained_threads": threads}, indent=1))
    print(json.dumps({"reference": str(ref), **times}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
