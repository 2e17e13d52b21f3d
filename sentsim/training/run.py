"""The driver side: claim the output folder, plan the steps, run `train_loop` on Ray Train (or inline),
export the final checkpoint and write the curves.

Ray Train: a TorchTrainer with `num_workers` DDP workers of `cpus_per_worker` CPUs each (fractions
allowed, so two workers fit a 2-core machine) and a GPU each when the cluster has them; the train
dataset is split between the workers, every other dataset is seen whole by each. Its runs live under
OUT/ray/<name>, so the same command with the same --out resumes from the latest checkpoint.
Inline: the same loop in this process, without Ray, checkpoints in OUT/checkpoint (OUT/checkpoint/<name> for
each stage of a trainer of several), resumed the same way (development, a machine without Ray, and tests).

The executor is not part of a run's identity, and a finished fit's export is the run's outcome, not the
executor's: `fit` keeps the same rule for every trainer (`check_state`). Neither executor reads the
other's checkpoints, so a run whose state another executor holds is finished there (the same settings and
budget: nothing trained, the export kept) or refused in one line, never trained again from step 0 beside it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from sentsim.errors import UsageError
from sentsim.training.common import counted, quiet_progress, use_gpu
from sentsim.training.settings import LoopSettings, rounded_threads, worker_threads

__all__ = ["EXECUTORS", "TrainingDiverged", "check_fit", "check_state", "claim_out", "discarding", "finished_run",
           "fit", "go_ahead", "mark_finished", "plan_steps", "quiet_progress", "release_out", "say_finished", "use_gpu",
           "write_curves"]

EXECUTORS = ("ray", "inline")


class TrainingDiverged(UsageError):
    """The loss stopped being finite; the message names the run and the step."""


_HELD_OUTS: dict = {}  # absolute --out -> the RunLease this process holds on it
_PENDING: dict = {}  # absolute --out -> the run.json text its claim writes once the run goes ahead (go_ahead)
# absolute --out -> what --force-new discards there once the run goes ahead (go_ahead): the state folders, and the
# trainer's discard of the earlier run's exports and reports
_DISCARDS: dict = {}
# absolute --out -> the folders its claim made (it, and any above it that were missing: a discriminator's
# OUT/_train): a new --out refused after its claim is not left behind as empty folders
_MADE: dict = {}


def claim_out(out_dir: Path, run_id: str, record: dict, force_new: bool, out_arg: str,
              state: tuple[str, ...] = ("ray", "checkpoint", "checkpoint.old"),
              unfingerprinted: tuple | Callable[[int], tuple] = (),
              earlier: Optional[Callable[[int, dict], Optional[tuple[str, dict]]]] = None,
              discard: Optional[Callable[[], None]] = None):
    """Take the output folder for this training: its lease first (one writer per --out, as for a
    sharded run: `storage.lease`; a second trainer exits 2 naming the holder), then refuse an --out
    that holds training state (`state`: names under it) of a run with other settings, unless
    --force-new, which discards that state, and the earlier run's exports (`discard`: the trainer's removal of
    its models and reports), once the run goes ahead (`go_ahead`), not when it is claimed: until then the
    claim's checks take the state as gone (`discarding`), and a run refused after its claim (a batch no row
    fills, workers the cluster cannot hold, a setting found wrong at fit time) leaves the earlier run whole,
    --force-new or not. This run's fingerprint and settings are recorded in OUT/run.json
    once the run goes ahead (`go_ahead`): before then OUT/run.json is the earlier run's, so a run refused
    after its claim leaves it as it was. Returns the claim, to be entered: `with claim_out(...):` holds the
    lease to the block's end, however it ends, so a caller's next command on this --out, in any process, is
    not refused as a second writer (a claim never entered is held until `release_out(out_dir)` or the process
    exits; a killed trainer's lease is taken over by the next one, which says so); a block that ends without
    an exception has gone ahead. A refusal names the recorded settings that differ, less `unfingerprinted` (or
    what it returns given the stored record's format: a format's fingerprint left out other parts)
    (flattened keys of `record`, e.g. `config.epochs`, that a run may change and still resume).

    `earlier(format, stored)`: the fingerprint this same run held when its record was written in an earlier
    run-record format (TRAINING_FORMAT; sentsim/run_formats.py), given that record, and what it was made of
    beyond today's settings (kept in the record as `fingerprinted_with`, so that a resumable setting changed
    since does not lose it); None where it held today's. A record of that format holding it is this run's: the
    run goes on under that fingerprint (the claim's `fingerprint`) and its record keeps its format."""
    import pyarrow.fs as pafs

    from sentsim.training.config import TRAINING_FORMAT
    from storage.lease import RunLease

    key = str(out_dir.absolute())
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_arg} is a file, not a folder")
    release_out(out_dir)  # an earlier training of this process into the same --out
    made = [p for p in (Path(key), *Path(key).parents) if not p.exists()]
    out_dir.mkdir(parents=True, exist_ok=True)
    if made:
        _MADE[key] = made
    lease = RunLease(pafs.LocalFileSystem(), key, out_arg).acquire()
    _HELD_OUTS[key] = lease
    try:
        run_file = out_dir / "run.json"
        state_dirs = [out_dir / n for n in state]
        fmt, kept = TRAINING_FORMAT, {}
        if force_new:
            _DISCARDS[key] = (state_dirs, discard)
        elif run_file.is_file() and any(d.exists() for d in state_dirs):
            try:
                stored = json.loads(run_file.read_text())
                prev = stored.get("fingerprint")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                stored, prev = {}, "unreadable"
            if prev != run_id:
                held = _held_format(stored, earlier, TRAINING_FORMAT)
                if held is None:
                    changed = _changed(stored, record, _ignored(unfingerprinted, stored))
                    raise UsageError(f"--out {out_arg} holds a run with other settings (fingerprint {prev}, now "
                                     f"{run_id}{changed}); use a new --out, or --force-new to discard it")
                run_id, (fmt, kept) = prev, held
        held_with = {"fingerprinted_with": kept} if kept else {}
        _PENDING[key] = json.dumps({"fingerprint": run_id, "format": fmt, **held_with, **record}, indent=2)
    except BaseException:
        release_out(out_dir)
        raise
    return ClaimedOut(out_dir, run_id, fmt)


def _held_format(stored: dict, earlier, current: int) -> Optional[tuple[int, dict]]:
    """(format, what its fingerprint was made of) of a run record whose fingerprint is this run's in that
    earlier format (claim_out's `earlier`), or None: then it is another run's."""
    version = stored.get("format", 1)
    if (earlier is None or not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < current
            or stored.get("fingerprint") is None):
        return None
    held = earlier(version, stored)
    return (version, held[1]) if held is not None and held[0] == stored["fingerprint"] else None


def go_ahead(path: Path) -> None:
    """The run that claimed the --out holding `path` (that folder, or one inside it: a fit's state) goes
    ahead (its refusals are behind it): with --force-new the earlier run is discarded now, its exports and then
    its state, and the run's record is written to OUT/run.json, before it changes anything else there. Once
    per claim; nothing where no claim of this process holds `path`."""
    from storage.fs import write_text_atomic

    for key in _claims_holding(path, _PENDING):
        _MADE.pop(key, None)
        state_dirs, discard = _DISCARDS.pop(key, ((), None))
        # exports first: a kill in between leaves state of the earlier settings, so a rerun without --force-new
        # is refused as another run, rather than accepted beside the earlier run's model and reports
        if discard is not None:
            discard()
        for d in state_dirs:
            if d.exists():
                shutil.rmtree(d)
        # last: a kill while discarding leaves the earlier run's record, never this run's over the earlier state
        write_text_atomic(str(Path(key) / "run.json"), _PENDING.pop(key))


def discarding(path: Path) -> bool:
    """Whether a --force-new claim of this process holding `path` discards the training state there once its
    run goes ahead (claim_out): until then that state is still on disk, and no check may take it for this run's
    (a finished fit, a step to resume from, a saved tokenizer)."""
    return bool(_claims_holding(path, _DISCARDS))


def _claims_holding(path: Path, claims: dict) -> list:
    """The --out keys of `claims` that are `path` or a folder above it."""
    p = Path(path).absolute()
    return [k for k in claims if p == Path(k) or Path(k) in p.parents]


class ClaimedOut:
    """A training --out this process holds (claim_out). Taken when claimed, not when entered, so that
    the refusals come before the caller's `with` block; given back when that block ends."""

    def __init__(self, out_dir: Path, fingerprint: str, fmt: int):
        self.out_dir = out_dir  # its lease is _HELD_OUTS', where release_out finds it
        self.fingerprint = fingerprint  # the one the run goes on under: today's, or the one its record holds
        self.format = fmt  # the run-record format that fingerprint was made in

    def __enter__(self) -> "ClaimedOut":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None:  # the run ended as it should, so it went ahead (a finished fit's no-op too)
                go_ahead(self.out_dir)
        finally:
            release_out(self.out_dir)


# what an encoder trainer (student, surrogate) writes into --out beside its models and state
REPORTS = ("summary.json", "curves", "eval.json", "eval.md")


def discard_exports(out_dir: Path, models) -> None:
    """--force-new: the discarded run's exported models and reports go with its state when the new run goes ahead
    (claim_out's `discard`), so that a new run stopped before its own export leaves no model or summary of the old
    one, taken for its own."""
    from sentsim.model_swap import remove_path

    for name in (*models, *REPORTS):
        remove_path(out_dir / name)


def _ignored(unfingerprinted, stored: dict) -> tuple:
    """claim_out's `unfingerprinted` for the format of the `stored` record (1 where it names none)."""
    if not callable(unfingerprinted):
        return tuple(unfingerprinted)
    version = stored.get("format", 1)
    return tuple(unfingerprinted(version if isinstance(version, int) and not isinstance(version, bool) else 1))


def _changed(stored: dict, record: dict, unfingerprinted: tuple) -> str:
    """': key: old -> new; ...' for a refused --out, or '' where run.json recorded no settings to compare."""
    from storage.store import what_changed

    # what mark_finished added (the model's hash, the summary) is the outcome of those settings, not one of them
    prev = {k: v for k, v in stored.items() if k not in ("fingerprint", "format", "fingerprinted_with", "finished")}
    # an input an earlier record format held as its path alone, which today's holds as {"path", its content}: the
    # same path is no change (the content keys it never held are `unfingerprinted` for that format)
    prev = {k: {"path": v} if isinstance(v, str) and isinstance(record.get(k), dict) and "path" in record[k] else v
            for k, v in prev.items()}
    if not prev:
        return ""
    changed = what_changed({"config": prev}, record, [], most=4, ignore=unfingerprinted)
    if changed.startswith("same config"):  # the settings match: what they name (corpus, data, backbone) changed
        return "; the same recorded settings, so the content of an input they name changed"
    return f"; {changed}"


def release_out(out_dir: Path) -> None:
    """Give up this process's lease on a training --out (claim_out takes it), and the record of a run that
    did not go ahead, unwritten, with the --out itself where the claim made it and nothing was written into it
    (a new --out refused after its claim is not left as an empty folder); safe to call twice."""
    key = str(Path(out_dir).absolute())
    _PENDING.pop(key, None)
    _DISCARDS.pop(key, None)  # --force-new's discard too: the earlier run stays whole
    lease = _HELD_OUTS.pop(key, None)
    if lease is not None:
        lease.release()
    for folder in _MADE.pop(key, []):  # a run that went ahead keeps them (go_ahead forgets them)
        try:
            folder.rmdir()  # only an empty one, deepest first: whatever else came to be there stays
        except OSError:
            break


def finished_run(out_dir: Path, run_id: str, record: dict, model: Path, ignore: tuple = ()) -> Optional[dict]:
    """What `mark_finished` recorded in OUT/run.json when this very run (fingerprint and every setting in
    `record`, the resumable ones included, less `ignore`: flattened keys such as `config.executor` that do not
    make a finished model another one) finished there and `model` is still the model it exported (by
    checkpoint_hash); None otherwise, and the run goes on (a resume, or a longer run) as before."""
    from sentsim.identity import checkpoint_hash

    try:
        prev = json.loads((out_dir / "run.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    done = prev.get("finished") if isinstance(prev, dict) else None
    if not isinstance(done, dict) or prev.get("fingerprint") != run_id or not model.exists():
        return None
    now = json.loads(json.dumps(record, default=str))
    if _without({k: prev.get(k) for k in record}, ignore) != _without(now, ignore):
        return None
    return done if done.get("model_hash") == checkpoint_hash(str(model)) else None


def _without(record: dict, keys: tuple) -> dict:
    """`record` (plain JSON) less the flattened `keys` ("config.executor": that key of its "config")."""
    record = json.loads(json.dumps(record))
    for key in keys:
        *parents, leaf = key.split(".")
        node = record
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return record


def mark_finished(out_dir: Path, model: Path, summary: dict) -> None:
    """Record in OUT/run.json, last and atomically, that the run claim_out recorded there finished, with
    its exported model's identity and summary: the same command again is a no-op (`finished_run`).
    a run's record is written again without it when the run goes ahead (go_ahead), so a run that trains again is
    not finished until it ends."""
    from sentsim.identity import checkpoint_hash
    from storage.fs import write_text_atomic

    go_ahead(out_dir)  # a run that ends here without training (its fits finished) still records its settings
    run_file = out_dir / "run.json"
    record = json.loads(run_file.read_text())
    record["finished"] = {"model_hash": checkpoint_hash(str(model)), "summary": summary}
    write_text_atomic(str(run_file), json.dumps(record, indent=2, default=str))


def say_finished(label: str, out_arg: str, what: str) -> None:
    """The one line a rerun of a finished training prints instead of training."""
    print(f"[{label}] --out {out_arg} already holds this finished {what}; nothing to do "
          "(--force-new trains it again)", flush=True)


def steps_per_epoch(n_rows: int, num_workers: int, batch_size: int, drop_last: bool) -> int:
    """Optimizer steps in one epoch: each worker's equal share in batches (a short last one unless drop_last)."""
    per_worker = n_rows // num_workers
    return per_worker // batch_size if drop_last else math.ceil(per_worker / batch_size)


def plan_steps(label: str, n_rows: int, *, num_workers: int, batch_size: int, epochs: int, max_steps: int,
               drop_last: bool) -> int:
    """Total optimizer steps: each worker gets n_rows // num_workers rows (an equal split)."""
    per_epoch = steps_per_epoch(n_rows, num_workers, batch_size, drop_last)
    if per_epoch < 1:
        raise UsageError(f"{label}: {n_rows} training rows cannot fill one batch of {batch_size} per worker "
                         f"({num_workers} worker(s)); lower --set batch_size=... or --num-workers")
    total = epochs * per_epoch
    return min(total, max_steps) if max_steps else total


def capped_note(label: str, n_rows: int, total_steps: int, *, num_workers: int, batch_size: int,
                drop_last: bool) -> str:
    """The note for a run whose max_steps ends it inside its first epoch: how many rows it sees ("" when it
    trains at least one whole epoch; an epoch's own shortfall is epoch_shortfall's to say)."""
    if total_steps >= steps_per_epoch(n_rows, num_workers, batch_size, drop_last):
        return ""
    seen = total_steps * num_workers * batch_size
    return (f"note: {label}: {counted(total_steps, 'step')} of {num_workers} x {batch_size} "
            f"{'sees' if total_steps == 1 else 'see'} {seen} of the {n_rows} training rows (a seeded random part of "
            "them; raise max_steps to see them all)")


def epoch_cap_note(label: str, max_steps: int, *, epochs: int, per_epoch: int, steps_key: str = "--max-steps",
                   epochs_key: str = "--epochs") -> str:
    """The note for a run whose max_steps asks for more steps than its epochs hold: the epochs end it ("" when
    max_steps is 0 or within them). Said on a fresh run and on a rerun that finds it finished, where a larger
    max_steps is otherwise "nothing to do" without a reason."""
    total = epochs * per_epoch
    if not max_steps or max_steps <= total:
        return ""
    return (f"note: {label}: {steps_key} {max_steps} is past the {counted(total, 'step')} its epochs hold "
            f"({counted(epochs, 'epoch')} x {counted(per_epoch, 'step')}), so it trains {total}; raise "
            f"{epochs_key} to train longer")


def epoch_shortfall(n_rows: int, num_workers: int, batch_size: int, drop_last: bool) -> str:
    """The tail of a trainer's note when an epoch does not reach every row: the workers take equal shares
    (the remainder of n_rows / num_workers waits), and with drop_last a share's last part batch is dropped.
    Which rows those are changes with each epoch's shuffle. Empty for an epoch no batch fills, which plan_steps
    refuses: a note before that refusal would explain a run that does not happen."""
    left = epoch_left_out(n_rows, num_workers, batch_size, drop_last)
    if not left or steps_per_epoch(n_rows, num_workers, batch_size, drop_last) < 1:
        return ""
    why = "do not fill a last batch" if drop_last else f"do not split evenly over {num_workers} workers"
    return f"; each epoch leaves out {left} of them (a reshuffled few that {why})"


def training_extent(total_steps: int, n_rows: int, *, num_workers: int, batch_size: int, drop_last: bool) -> dict:
    """What `total_steps` train, for a model card: the steps an epoch takes, the epochs they make (a fraction when
    the budget ends the run inside one), and the rows they read (a row read in each of two epochs counts twice)."""
    per_epoch = steps_per_epoch(n_rows, num_workers, batch_size, drop_last)
    full, rest = divmod(total_steps, per_epoch)
    epoch_rows = n_rows - epoch_left_out(n_rows, num_workers, batch_size, drop_last)
    read = full * epoch_rows + min(rest * num_workers * batch_size, epoch_rows)
    return {"steps": total_steps, "steps_per_epoch": per_epoch, "epochs_trained": round(total_steps / per_epoch, 4),
            "rows": n_rows, "rows_read": read}


def epoch_left_out(n_rows: int, num_workers: int, batch_size: int, drop_last: bool) -> int:
    """Rows an epoch does not reach: the remainder of the workers' equal shares, and with drop_last each
    share's short last batch (the count epoch_shortfall's note gives and a student's model card records)."""
    per_worker = n_rows // num_workers
    return n_rows - (per_worker // batch_size * batch_size if drop_last else per_worker) * num_workers


def fit(loop_config: dict, *, name: str, out_dir: Path, export: Callable[[Path], Path], datasets: Optional[dict] = None,
        executor: str = "ray", inline_dir: str = "checkpoint", hint: str = "lower --set lr=...",
        memory_hint: str = "lower --set batch_size=... or num_workers") -> dict:
    """Train, then export the final checkpoint with `export(checkpoint_dir) -> model_dir`. The only
    place sentsim builds a TorchTrainer.

    `out_dir`: where the training state lives (Ray: OUT/ray/<name>, inline: OUT/<inline_dir>, which is
    "checkpoint", or "checkpoint/<name>" for each stage of a trainer of several); made absolute here, since
    the Train workers run in their own working directory. `datasets`: for Ray, ray.data Datasets ("train" is
    split between the workers); inline, pyarrow Tables ("train" is batched by the loop, the others read
    through session.shard); none for a trainee that reads its own batches. Inline, nothing imports Ray.
    loop_config["loop"] is the run's `LoopSettings`, which also says the resources (num_workers,
    cpus_per_worker, use_gpu, checkpoints_to_keep, max_failures).
    Returns {"model", "history", "gpu", "result"} (result: rank 0's return value; a finished fit's adds
    "executor", that of the state it was found in, which may be the other one). Raises
    TrainingDiverged when the loss stopped being finite, and WorkerLost when a Ray worker of the training was
    killed for memory or died (`memory_hint`: the trainer's settings that lower a worker's memory).

    A fit whose export is a folder or file records it (`FitRecord`): called again with the same settings
    while that export is unchanged, it says so in one line and returns the record, without starting
    a trainer nor exporting again, so a finished model keeps its bytes and its identity. That holds whichever
    executor finished it and whichever is asked now; a state of the other executor's that this fit cannot
    take as finished is refused (`check_state`), before anything is trained or removed.
    """
    from sentsim.training.loop import HISTORY_FILE, inline_checkpoint, train_loop  # torch: worker-side, imported late

    settings: LoopSettings = loop_config["loop"]
    label = settings.label
    datasets = datasets or {}
    out_dir = Path(out_dir).absolute()
    record = FitRecord(out_dir, name, executor, loop_config)
    fresh = discarding(out_dir)  # --force-new: what the state holds goes at go_ahead, and is none of this fit's
    done = None if fresh else record.finished()
    if done is not None:
        if settings.verbose:
            print(f"[{label}] already trained to step {done['history'][-1].get('step')} with these settings; "
                  f"nothing to do ({done['model']} is kept)", flush=True)
        return done
    gpu = refuse_fit(settings, name=name, out_dir=out_dir, executor=executor, inline_dir=inline_dir, fresh=fresh)
    go_ahead(out_dir)  # from here on the run changes its state, and its run record says whose it is
    record.clear()
    t0 = time.perf_counter()
    if executor == "inline":
        rv = train_loop({**loop_config, "ray": False, "out": str(out_dir), "inline_dir": inline_dir,
                         "table": datasets.get("train"), "tables": datasets}) or {}
        ckpt = inline_checkpoint(out_dir, inline_dir)
        checkpoint = None if ckpt is None else nullcontext(str(ckpt))
    else:
        import ray.train
        from ray.train.torch import TorchTrainer

        loop_config = {**loop_config, "ray": True, "out": str(out_dir), "loop": replace(settings, use_gpu=gpu)}
        resources = {"CPU": settings.cpus_per_worker, **({"GPU": 1} if gpu else {})}
        trainer = TorchTrainer(
            train_loop,
            train_loop_config=loop_config,
            scaling_config=ray.train.ScalingConfig(num_workers=settings.num_workers, use_gpu=gpu,
                                                   resources_per_worker=resources),
            run_config=ray.train.RunConfig(
                name=name, storage_path=str(out_dir / "ray"),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=settings.checkpoints_to_keep),
                failure_config=ray.train.FailureConfig(max_failures=settings.max_failures or 0)),
            datasets=datasets,
            # only train is sharded; every worker sees the (capped) dev and test splits whole
            dataset_config=ray.train.DataConfig(datasets_to_split=[k for k in ("train",) if k in datasets]),
        )
        drop_unregistered_checkpoints(out_dir / "ray" / name)
        try:
            result = trainer.fit()
        except Exception as exc:
            from sentsim.lost_workers import WorkerLost, lost_worker, trainer_line

            lost = lost_worker(exc)
            if lost is None:
                raise
            # the machine's doing, not the training's: one line, the knobs that lower a worker's memory
            raise WorkerLost(trainer_line(label, lost, memory_hint), lost.text) from exc
        if result.checkpoint is not None:  # the one exported below, whatever the snapshot says
            drop_unregistered_checkpoints(out_dir / "ray" / name, also_keep=Path(result.checkpoint.path).name)
        if result.return_value is None:
            # rank 0's train_loop returns its summary whenever it ends; none means the workers were stopped:
            # Ray Train's own SIGINT handler aborts the run, and fit() returns what was checkpointed last. Taken
            # as the end, that checkpoint was exported and recorded as finished, so no rerun could resume it
            raise KeyboardInterrupt
        rv = result.return_value or {}
        checkpoint = None if result.checkpoint is None else result.checkpoint.as_directory()
        if settings.verbose:
            print(f"[{label}] Ray Train run finished in {time.perf_counter() - t0:.0f}s", flush=True)
    if rv.get("nan_step"):
        raise TrainingDiverged(f"{label}: the training loss became {rv['nan_value']} at step {rv['nan_step']}; {hint}")
    if checkpoint is None:
        raise RuntimeError(f"{label}: training ended without a checkpoint")
    with checkpoint as d:
        history = rv.get("history") or json.loads((Path(d) / HISTORY_FILE).read_text())
        model_dir = export(Path(d))
    out = {"model": model_dir, "history": history, "gpu": gpu, "result": rv}
    record.write(out)
    return out


def check_fit(loop_config: dict, *, name: str, out_dir: Path, executor: str, inline_dir: str = "checkpoint") -> bool:
    """fit's refusals (`refuse_fit`), said before a trainer writes anything of its own for this fit (the context
    trainer's tokenizer, the discriminator's vocabulary, a later stage's curves): none for a fit already finished
    with these settings on either executor (FitRecord), which fit then reports as finished. `loop_config` and
    the rest: as fit takes them. Returns whether the workers get a GPU."""
    out_dir = Path(out_dir).absolute()
    fresh = discarding(out_dir)
    if not fresh and FitRecord(out_dir, name, executor, loop_config).finished() is not None:
        return False
    return refuse_fit(loop_config["loop"], name=name, out_dir=out_dir, executor=executor, inline_dir=inline_dir,
                      fresh=fresh)


def refuse_fit(settings: LoopSettings, *, name: str, out_dir: Path, executor: str, inline_dir: str,
               fresh: bool = False) -> bool:
    """A fit's refusals, before it changes anything: a training state it cannot go on to (`check_state`; none
    when `fresh`: --force-new discards that state once the run goes ahead), and Ray workers the cluster cannot
    hold. Returns whether the workers get a GPU (Ray is started by then)."""
    if not fresh:
        check_state(settings.label, out_dir, name, executor, inline_dir, settings.total_steps)
    if executor == "inline":
        return False
    gpu = use_gpu(settings.use_gpu, settings.num_workers)
    check_workers_fit(settings.label, settings.num_workers, settings.cpus_per_worker, gpu)
    return gpu


def resumed_step(out_dir: Path, name: str, executor: str, inline_dir: str) -> Optional[int]:
    """The step of the checkpoint a fit into `out_dir` resumes from (inline: `inline_checkpoint`'s history; Ray
    Train: the latest checkpoint its manager's snapshot registers), or None: none there, or none this can read."""
    from sentsim.training.loop import HISTORY_FILE, inline_checkpoint

    try:
        if executor == "inline":
            ckpt = inline_checkpoint(out_dir, inline_dir)
            return None if ckpt is None else int(json.loads((ckpt / HISTORY_FILE).read_text())[-1]["step"])
        snapshot = out_dir / "ray" / name / "checkpoint_manager_snapshot.json"
        if not snapshot.is_file():
            return None
        latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result") or {}
        return int(latest["metrics"]["step"]) if latest.get("checkpoint_dir_name") else None
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def check_state(label: str, out_dir: Path, name: str, executor: str, inline_dir: str, total_steps: int) -> None:
    """Refuse, in one line, a fit of `total_steps` that the training state in its `out_dir` cannot go on to
    (once no finished fit of these settings was found in either executor's record, FitRecord). Each executor
    reads only its own state (Ray Train's run under ray/<name>, the inline checkpoint under `inline_dir`).
    A state past the budget, either executor's, is refused: resumed, it would train no step and export the
    longer run's weights under this run's budget (a model is not trained back). The other executor's state at
    any other step is refused naming the executor that continues it, unless this executor holds state of its
    own (an --out trained on both before this rule), which it resumes. So no run trains from step 0 beside the
    other executor's state, and no export replaces the model, or removes the state, of its longer run."""
    reached = resumed_step(out_dir, name, executor, inline_dir)
    if reached is not None and reached > total_steps:
        raise UsageError(f"{label}: the training state in {out_dir} is at step {reached}, past the "
                         f"{counted(total_steps, 'step')} this run plans, and a model is not trained back: ask for at "
                         f"least {reached} steps (max_steps or epochs), or --force-new to start over, or another --out")
    for other in EXECUTORS:
        step = None if other == executor else resumed_step(out_dir, name, other, inline_dir)
        if step is None:
            continue
        if step > total_steps:
            raise UsageError(f"{label}: the training state in {out_dir} (--executor {other}'s) is at step {step}, "
                             f"past the {counted(total_steps, 'step')} this run plans, and a model is not trained "
                             f"back: ask --executor {other} for at least {step} steps (max_steps or epochs), or "
                             "--force-new to start over, or another --out")
        if reached is None:
            raise UsageError(f"{label}: the training state in {out_dir} is at step {step} on --executor {other}, "
                             f"which --executor {executor} does not read: continue it with --executor {other}, or "
                             f"--force-new to start over on --executor {executor}")


def drop_unregistered_checkpoints(run_dir: Path, also_keep: Optional[str] = None) -> list:
    """Remove the checkpoint folders of a Ray Train run that its checkpoint manager does not list. A worker
    writes a checkpoint before the controller registers it, so a run killed or interrupted in between
    leaves one (a MiniLM surrogate's is 260 MB) that no resume reads and `checkpoints_to_keep` never
    counts. With no snapshot (nothing registered) the run starts over and every folder is such a one. A
    snapshot this cannot read leaves everything in place. Called with the --out's lease held, so no
    trainer of this run is writing. Returns the names removed."""
    if not run_dir.is_dir():
        return []
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    keep: set = set()
    if snapshot.exists():
        try:
            state = json.loads(snapshot.read_text())
            results = list(state.get("checkpoint_results") or []) + [state.get("latest_checkpoint_result") or {}]
            keep = {r["checkpoint_dir_name"] for r in results if r.get("checkpoint_dir_name")}
            keep |= {n for r in state.get("pending_training_results") or [] for n in
                     [(r.get("checkpoint_dir_name") if isinstance(r, dict) else None)] if n}
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            return []
        if not keep:
            return []
    keep.add(also_keep)
    dropped = []
    for d in sorted(run_dir.glob("checkpoint_*")):
        if d.is_dir() and d.name not in keep:
            shutil.rmtree(d, ignore_errors=True)
            dropped.append(d.name)
    return dropped


def check_workers_fit(label: str, num_workers: int, cpus_per_worker: float, gpu: bool) -> None:
    """Refuse workers the Ray cluster cannot hold all at once: Ray Train would wait for them for ever,
    retrying its worker group every minute with a traceback each time (and a Ctrl-C does not stop it). The
    sharded jobs refuse such resources the same way (sentsim.executor.check_resources)."""
    import ray

    have = ray.cluster_resources()
    for key, each, what in (("CPU", cpus_per_worker, "CPU"), ("GPU", 1.0 if gpu else 0.0, "GPU")):
        want = num_workers * each
        if want > 0 and want > have.get(key, 0) + 1e-9:
            raise UsageError(f"{label}: {num_workers} worker(s) of {each:g} {what} each ask for {want:g} {what}s but "
                             f"the Ray cluster has {have.get(key, 0):.3g}, and Ray Train would wait for them for "
                             "ever; lower --num-workers (num_workers in the config) or cpus_per_worker, or add nodes")


class FitRecord:
    """What a finished fit exported, kept beside its training state (OUT/ray/<name>.done.json, or in the
    inline checkpoint folder), so that --force-new and a new training discard it with that state: its
    settings (the loop config as fingerprinted, the trainee's build hook aside; the data's identity is
    the run's fingerprint, which claim_out keeps for that state), the export and its checkpoint_hash,
    and the history and result it returned. The fit's own budget and width are its LoopSettings'; the
    trainer's config beside them is taken without RESUMABLE_KEYS, so that another stage's budget (the
    surrogate's finetune.max_steps for its harvest stage) is no setting of this fit. A fit finished on either
    executor is found (`finished`): each executor's record lies in its own state folder, and holds the settings
    as a fit on that executor has them."""

    def __init__(self, out_dir: Path, name: str, executor: str, loop_config: dict):
        self.out_dir, self.name = out_dir, name
        self.path = self.where(executor)
        loop = loop_config["loop"]
        self.settings = self.fingerprint(executor, loop_config, loop)
        self.accepted = {}  # executor -> the settings its record may hold for this fit, this executor's first
        for e in (executor, *(x for x in EXECUTORS if x != executor)):
            config = as_executor(loop_config, e)
            loops = [loop]
            if loop.cpu_threads == worker_threads(loop.cpus_per_worker):
                # A fit recorded while the surrogate and student trainers rounded cpus_per_worker to threads
                # (1.5 -> 2) is still this fit: finished, it trains no further step, so its thread count no longer
                # changes its model, and taking it for another would only export the same checkpoint again
                loops.append(replace(loop, cpu_threads=rounded_threads(loop.cpus_per_worker)))
            # a fit recorded with the trainer's whole config (before its resumable keys were left out) is this fit
            self.accepted[e] = {self.fingerprint(e, config, lp, whole) for lp in loops for whole in (False, True)}

    def where(self, executor: str) -> Path:
        return self.out_dir / ("checkpoint" if executor == "inline" else "ray") / f"{self.name}.done.json"

    def fingerprint(self, executor: str, loop_config: dict, loop: LoopSettings, whole: bool = False) -> str:
        from sentsim.identity import fingerprint
        from sentsim.training.config import without_resumable

        # the trainer's config less RESUMABLE_KEYS; `whole`: all of it, as fits recorded before that was so
        return fingerprint(self.name, executor, {
            k: (loop.record() if k == "loop" else v if whole or not isinstance(v, dict) else without_resumable(v))
            for k, v in loop_config.items() if k != "build"})

    def finished(self) -> Optional[dict]:
        """The fit's return value when it finished with these settings, on this executor or the other, and its
        export is unchanged; this executor's record first."""
        for executor, accepted in self.accepted.items():
            done = self._finished(self.where(executor), accepted)
            if done is not None:  # with the executor whose state trained it: that state is the model's
                return {**done, "executor": executor}
        return None

    def _finished(self, path: Path, accepted: set) -> Optional[dict]:
        from sentsim.identity import checkpoint_hash

        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(rec, dict) or rec.get("settings") not in accepted or not rec.get("history"):
            return None
        model = self.out_dir / (rec.get("model") or "")  # kept relative: --out may have moved
        if not rec.get("model") or not model.exists() or checkpoint_hash(str(model)) != rec.get("model_hash"):
            return None
        return {"model": model, "history": rec["history"], "gpu": rec.get("gpu", False),
                "result": {**rec.get("result", {}), "history": rec["history"]}}

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def write(self, out: dict) -> None:
        """Kept only for an export that is a path (a trainer whose export is an object keeps its own record)."""
        from sentsim.identity import checkpoint_hash
        from storage.fs import write_text_atomic

        model = out["model"]
        if not isinstance(model, (str, Path)) or not Path(model).exists() or not self.path.parent.is_dir():
            return
        model = Path(model).absolute()
        rec = {"settings": self.settings, "model": os.path.relpath(model, self.out_dir),
               "model_hash": checkpoint_hash(str(model)), "history": out["history"], "gpu": out["gpu"],
               "result": {k: v for k, v in out["result"].items() if k != "history"}}
        write_text_atomic(str(self.path), json.dumps(rec, indent=1, default=str))


def as_executor(loop_config: dict, executor: str) -> dict:
    """`loop_config` as a fit on `executor` would have it: a trainer whose config section names its executor
    (the context trainer's `executor`) says the other one there; nothing else in it depends on the executor."""
    return {k: ({**v, "executor": executor} if isinstance(v, dict) and "executor" in v else v)
            for k, v in loop_config.items()}


def write_curves(history: list[dict], folder: Path, name: str, title: str,
                 panels: list[tuple[str, list[tuple[str, Optional[str]]], bool]]) -> None:
    """folder/name.json (the history) and folder/name.png: one panel per (y label, [(key, legend)],
    log scale); points without a value for a key are left out, and so is a panel with no values."""
    from storage.fs import write_text_atomic

    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(str(folder / f"{name}.json"), json.dumps(history, indent=2))
    series = []
    for ylabel, keys, log in panels:
        lines = [(legend, [(h["step"], h[k]) for h in history if isinstance(h.get(k), (int, float))])
                 for k, legend in keys]
        lines = [(legend, pts) for legend, pts in lines if pts]
        if lines:
            series.append((ylabel, lines, log))
    if not series:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 3.8), squeeze=False)
    for ax, (ylabel, lines, log) in zip(axes[0], series):
        for (legend, pts), marker in zip(lines, "osd^v"):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=legend)
        if log and all(p[1] > 0 for _, pts in lines for p in pts):
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if any(legend for legend, _ in lines):
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(folder / f"{name}.png", dpi=100)
    plt.close(fig)
