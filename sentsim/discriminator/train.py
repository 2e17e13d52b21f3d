"""`sentsim train discriminator`: the shared training loop (sentsim.training) over the corpus windows, on Ray
Train or inline (--executor inline: this process as the one worker, no Ray).

Every worker reads the corpus and the saved vocabulary itself (paths, not data, travel in the
config), takes every world_size-th training window, and trains the same model under DDP (gloo
on CPU) when there are several workers. Rank 0 evaluates held-out windows (whole held-out
documents; the window tail when the corpus has one document) and reports accuracy and AUC,
overall and per negative type. A checkpoint holds model.safetensors plus the loop's state.pt and
history.json; OUT gets model.safetensors, vocab.json and config.json (metrics and history), replacing any
model there in place (sentsim.model_swap.replace_in_place, config.json its commit file): a kill at any
moment leaves the old model or the new one, whole, and until the export the old one stays usable. The --out
lease (OUT/_train/_LEASE) is held through the export, so no second writer starts while the model is written.

The training state lives in OUT/_train and stays there beside the exported model, as the other trainers keep
theirs (sentsim.training.driver): Ray Train's checkpoints in _train/ray/discriminator, an inline run's in
_train/checkpoint, with the run's record (run.json), vocabulary and initial embeddings. The same command again
on a finished model is a no-op; a larger --max-steps or more epochs resume from the last checkpoint. The
executor is not part of the run's identity: a finished model is the same model whichever executor is asked
for it again, and the state of the other executor, which neither reads, is refused in one line rather than
trained beside (sentsim.training.run.check_state, as for every trainer); the export keeps only the
state of the executor that trained the model.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Optional

import numpy as np
from pydantic import Field

from sentsim.config import Section, Seed
from sentsim.discriminator.model import ModelConfig
from sentsim.errors import UsageError
from sentsim.identity import fingerprint
from sentsim.training.loop import Trainee


class TrainConfig(Section):
    epochs: int = Field(1, ge=1)
    # Steps per worker; None runs the epochs out.
    max_steps: Optional[int] = Field(None, ge=1)
    # Windows per step; each window gives one positive and one negative.
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    # Paper 003 §3.2.1: half of the replacements from the same document, half random.
    same_doc_frac: float = Field(0.5, ge=0.0, le=1.0)
    heldout_frac: float = Field(0.1, gt=0.0, lt=1.0)
    max_heldout_windows: int = Field(2000, ge=1)
    max_train_windows: Optional[int] = Field(None, ge=1)
    eval_every: Optional[int] = Field(None, ge=1)
    num_workers: int = Field(1, ge=1)
    cpus_per_worker: float = Field(1.0, gt=0)
    seed: Seed = 0


class DiscriminatorJob(Section):
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()


# ---------------------------------------------------------------- worker side


def _load_worker_data(corpus: str, vocab_path: str, mcfg: ModelConfig, tcfg: TrainConfig):
    from corpus.view import SentenceTable
    from sentsim.discriminator.data import doc_ranges, split_heldout, window_centres
    from sentsim.discriminator.vocab import Vocab

    st = SentenceTable.load(corpus)
    vocab = Vocab.load(vocab_path)
    toks = [vocab.encode(t, mcfg.max_tokens) for t in st.texts]
    centres = window_centres(st.ids, mcfg.window)
    train_c, held_c, how = split_heldout(st.ids, centres, tcfg.heldout_frac, tcfg.seed)
    rng = np.random.default_rng(tcfg.seed + 1)
    if tcfg.max_train_windows and len(train_c) > tcfg.max_train_windows:
        train_c = np.sort(rng.choice(train_c, tcfg.max_train_windows, replace=False))
    if len(held_c) > tcfg.max_heldout_windows:
        held_c = np.sort(rng.choice(held_c, tcfg.max_heldout_windows, replace=False))
    starts, ends, _ = doc_ranges(st.ids)
    return dict(ids=st.ids, toks=toks, train=train_c, held=held_c, split=how, starts=starts, ends=ends, vocab=vocab)


def _run_batch(model, data, centres, negatives, window):
    import torch

    from sentsim.discriminator.data import batch_windows
    from sentsim.discriminator.model import pad_batch

    uniq, L, C, R, y = batch_windows(centres, negatives, window)
    tok, lens = pad_batch([data["toks"][p] for p in uniq])
    logits = model(tok, lens, torch.from_numpy(L), torch.from_numpy(C), torch.from_numpy(R))
    return logits, torch.from_numpy(y)


def evaluate(model, data, window: int, same_doc_frac: float, seed: int, batch: int = 128) -> dict:
    import torch
    from sklearn.metrics import roc_auc_score

    from corpus.documents import doc_key_of
    from sentsim.discriminator.data import sample_negatives

    held = data["held"]
    rng = np.random.default_rng(seed + 12345)
    negs = sample_negatives(held, data["ids"], data["starts"], data["ends"], same_doc_frac, rng)
    # which negatives came from the same document (for the per-type AUC)
    same = doc_key_of(data["ids"][negs]) == doc_key_of(data["ids"][held])
    was_training = model.training
    model.eval()
    pos, neg = [], []
    with torch.inference_mode():
        for lo in range(0, len(held), batch):
            logits, _ = _run_batch(model, data, held[lo:lo + batch], negs[lo:lo + batch], window)
            p = torch.sigmoid(logits).numpy()
            B = len(held[lo:lo + batch])
            pos.append(p[:B])
            neg.append(p[B:])
    model.train(was_training)
    pos, neg = np.concatenate(pos), np.concatenate(neg)
    y = np.concatenate([np.ones_like(pos), np.zeros_like(neg)])
    s = np.concatenate([pos, neg])
    out = {
        "heldout_windows": int(len(held)),
        "heldout_accuracy": float(((s > 0.5) == (y > 0.5)).mean()),
        "heldout_auc": float(roc_auc_score(y, s)),
    }
    for name, m in (("same_doc", same), ("random", ~same)):
        if m.any():
            yy = np.concatenate([np.ones(m.sum()), np.zeros(m.sum())])
            out[f"heldout_auc_{name}"] = float(roc_auc_score(yy, np.concatenate([pos[m], neg[m]])))
    return out


class DiscriminatorTrainee(Trainee):
    """The discriminator in the shared loop: a step is BCE over a batch of windows (each with one
    positive and one negative); evaluation is held-out accuracy and AUC, overall and per negative type."""

    def __init__(self, model, data: dict, mcfg: ModelConfig, tcfg: TrainConfig):
        super().__init__()
        import torch

        self.model = model
        self.data, self.mcfg, self.tcfg = data, mcfg, tcfg
        self.loss_fn = torch.nn.BCEWithLogitsLoss()
        self.world = 1

    def batches(self, session, epoch: int, skip: int):
        """Every rank gets the same number of windows (DDP needs equal steps), shuffled per epoch;
        each batch's negatives come from its own seed, so a resumed epoch skips without sampling."""
        from sentsim.discriminator.data import sample_negatives

        self.world = session.world
        per = len(self.data["train"]) // session.world
        mine = self.data["train"][session.rank::session.world][:per]
        order = np.random.default_rng([self.tcfg.seed, epoch, session.rank]).permutation(mine)
        bs = self.tcfg.batch_size
        for i, lo in enumerate(range(0, per, bs)):
            if i < skip:
                continue
            c = order[lo:lo + bs]
            rng = np.random.default_rng([self.tcfg.seed, epoch, session.rank, i])
            d = self.data
            yield c, sample_negatives(c, d["ids"], d["starts"], d["ends"], self.tcfg.same_doc_frac, rng)

    def forward(self, batch, device):
        centres, negatives = batch
        logits, y = _run_batch(self.model, self.data, centres, negatives, self.mcfg.window)
        return self.loss_fn(logits.float(), y.float()), {}

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()},
                  str(folder / "model.safetensors"))

    def evaluate(self, device, autocast) -> dict:
        return {**evaluate(self.model, self.data, self.mcfg.window, self.tcfg.same_doc_frac, self.tcfg.seed),
                "heldout_split": self.data["split"], "train_windows": int(len(self.data["train"])),
                "world_size": self.world}

    def note(self) -> str:
        return f"{len(self.data['train'])} training and {len(self.data['held'])} held-out windows"


def build_trainee(config: dict, session, ckpt: Optional[Path]) -> DiscriminatorTrainee:
    """On the worker: read the corpus and vocabulary (paths travel, not data); the weights from the
    checkpoint (resume), or fresh with the driver's LSA embeddings."""
    import torch
    from safetensors.torch import load_file

    from sentsim.discriminator.model import CoherenceModel

    mcfg = ModelConfig.model_validate(config["model"])
    tcfg = TrainConfig.model_validate(config["train"])
    data = _load_worker_data(config["corpus"], config["vocab_path"], mcfg, tcfg)
    if len(data["train"]) < session.world:
        raise UsageError(f"{len(data['train'])} training windows cannot feed {session.world} workers")
    torch.manual_seed(tcfg.seed)  # the same initial weights on every rank
    model = CoherenceModel(len(data["vocab"]), mcfg)
    if ckpt is not None:
        model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
    elif config.get("embed_init_path"):
        init = np.load(config["embed_init_path"], allow_pickle=False)
        with torch.no_grad():
            model.encoder.embed.weight.copy_(torch.from_numpy(init))
    trainee = DiscriminatorTrainee(model, data, mcfg, tcfg)
    trainee.world = session.world
    return trainee


# ---------------------------------------------------------------- driver side

# train settings a resumed run may change (how long and how wide): left out of the run's fingerprint
RESUMABLE_TRAIN_KEYS = ("epochs", "max_steps", "eval_every", "num_workers", "cpus_per_worker")


# train settings that leave a finished model as it is: how wide it ran and how often it evaluated. Unlike
# epochs and max_steps they train no further step, so a finished model asked for with other values of them
# is the same model (the inline executor's num_workers is 1 whatever was asked)
WIDTH_KEYS = ("eval_every", "num_workers", "cpus_per_worker")


def finished_model(out: Path, job: DiscriminatorJob, corpus_fp: str, run_id: str) -> Optional[dict]:
    """The metrics of the model a finished run of this job on this corpus left in `out` (its config.json,
    written last, says what it was trained with), or None: then it is trained (again), or its run resumed.

    The training state kept beside it (OUT/_train) must say that its run (`run_id`) finished with this very
    model (sentsim.training.run.mark_finished): without that, a run is under way or was killed, and goes on.
    A model whose state is gone (exported before the state was kept, or removed since) is its config.json's."""
    from sentsim.model_swap import staged_beside

    if staged_beside(out).exists():
        return None  # an export is under way, or was cut short and is completed under the lease
    done = exported_model(out, job, corpus_fp)
    if done is None or ((out / "_train").exists() and not _state_finished(out / "_train", run_id, out)):
        return None
    return done


def exported_model(out: Path, job: DiscriminatorJob, corpus_fp: str) -> Optional[dict]:
    """The metrics of the model in `out` when it is whole (every file its listing names, at its size) and its
    config.json says it is this job's on this corpus (the width keys aside), or None."""
    import json

    from sentsim.discriminator.io import FORMAT
    from sentsim.model_swap import sealed_info

    if sealed_info(out) is None:  # a file cut short or lost: the run re-exports it from its state
        return None
    try:
        cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT or cfg.get("corpus_fingerprint") != corpus_fp:
        return None
    same = lambda d: {k: v for k, v in d.items() if k not in WIDTH_KEYS}  # noqa: E731
    this = json.loads(job.model_dump_json())
    if cfg.get("model") != this["model"] or same(cfg.get("train") or {}) != same(this["train"]):
        return None
    return cfg.get("metrics") or {}


def _state_finished(state: Path, run_id: str, out: Path) -> bool:
    """Whether OUT/_train/run.json records that the run `run_id` finished there with the model now in `out`
    (by checkpoint_hash), as mark_finished wrote it after the export. A run that goes ahead writes run.json
    again without that record (go_ahead), so a longer run started since, killed or under way, is not finished."""
    import json

    from sentsim.identity import checkpoint_hash

    try:
        rec = json.loads((state / "run.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    done = rec.get("finished") if isinstance(rec, dict) else None
    return (isinstance(done, dict) and rec.get("fingerprint") == run_id
            and done.get("model_hash") == checkpoint_hash(str(out)))


def _vocab_and_init(st, job: DiscriminatorJob, state: Path, init_path: Optional[Path]):
    """The vocabulary (saved in the training state: OUT/vocab.json only with the model it belongs to), and the
    LSA embeddings the weights start from at `init_path` (`embed_init_path`; None for random ones), made once
    for the run (the path's name holds its fingerprint: a run of other settings killed before its first
    checkpoint left its own, which goes)."""
    from sentsim.discriminator.vocab import Vocab

    vocab = Vocab.build(st.texts, job.model.vocab_size, job.model.min_count)
    if len(vocab) <= 3:
        vocab = Vocab.build(st.texts, job.model.vocab_size, 1)
    vocab.save(state / "vocab.json")
    if init_path is None:
        return vocab
    from sentsim.discriminator.embed_init import lsa_embeddings

    if not init_path.is_file():
        for other in state.glob("embed_init*.npy"):
            other.unlink()
        emb = lsa_embeddings([vocab.encode(t, job.model.max_tokens) for t in st.texts], len(vocab),
                             job.model.embed_dim, seed=job.train.seed)
        np.save(init_path, emb, allow_pickle=False)
    return vocab


def embed_init_path(job: DiscriminatorJob, state: Path, run_id: str) -> Optional[Path]:
    """Where the run's LSA initial embeddings are kept in its state (named by its fingerprint, so that another
    run's are never taken for its own), or None: model.embed_init is not "lsa"."""
    return state / f"embed_init-{run_id}.npy" if job.model.embed_init == "lsa" else None


def train_discriminator(corpus: str | Path, out: str | Path, job: DiscriminatorJob | None = None,
                        address: str | None = None, force_new: bool = False, executor: str = "ray") -> dict:
    """Build the vocabulary, train through the shared loop (`executor`: "ray", Ray Train; or "inline", this
    process as the one worker, whatever train.num_workers says, without importing Ray), save model + vocab +
    config into `out` (`export_model`). Training state lives in OUT/_train, and stays there after the export:
    a rerun with the same --out resumes from its latest checkpoint, a finished model's with a larger
    --max-steps or more epochs too; the same command again on the finished model is a no-op that says so and
    returns its metrics, so the model keeps its bytes and its identity."""
    return _train_discriminator(corpus, out, job, address, force_new, executor)


def _train_discriminator(corpus: str | Path, out: str | Path, job: DiscriminatorJob | None, address: str | None,
                         force_new: bool, executor: str) -> dict:
    from corpus.view import SentenceTable
    from sentsim.discriminator.data import window_centres
    from sentsim.identity import corpus_fingerprint
    from sentsim.model_swap import discard_in_place, finish_in_place, sealed_info, staged_beside
    from sentsim.out_paths import check_out
    from sentsim.runtime import absolute_local, attach_before_writing, init_ray  # Ray imported only when called
    from sentsim.training.run import (
        EXECUTORS,
        check_fit,
        claim_out,
        fit,
        go_ahead,
        mark_finished,
        plan_steps,
        quiet_progress,
        say_finished,
    )
    from sentsim.training.settings import LoopSettings

    if executor not in EXECUTORS:
        raise UsageError(f"unknown executor {executor!r} (ray or inline)")
    job = job or DiscriminatorJob()
    if executor == "inline":  # this process is the one worker: planned, trained and recorded as one
        job = job.model_copy(update={"train": job.train.model_copy(update={"num_workers": 1})})
    check_out(out, {"--corpus": corpus}, local="a model and its training state", writes="discriminator")
    out_arg = str(out)
    corpus, out = absolute_local(str(corpus)), Path(absolute_local(str(out)))  # corpus may be s3://...
    corpus_fp = corpus_fingerprint(corpus)
    st = SentenceTable.load(corpus)
    if len(st) == 0:
        raise UsageError(f"{corpus}: the corpus has no sentences")
    n_windows = len(window_centres(st.ids, job.model.window))
    if n_windows < 2:
        raise UsageError(
            f"{corpus}: only {n_windows} window(s) of {2 * job.model.window + 1} consecutive sentences of one "
            f"document; the discriminator needs at least 2 (lower model.window or add documents)"
        )
    tc = job.train
    what = {"model": job.model.model_dump(),
            "train": {k: v for k, v in tc.model_dump().items() if k not in RESUMABLE_TRAIN_KEYS}}
    run_id = fingerprint("discriminator", what, corpus_fp)
    done = None if force_new else finished_model(out, job, corpus_fp, run_id)
    if done is not None:
        say_finished("discriminator", out_arg, f"model (fingerprint {run_id})")
        return done
    if executor == "ray":  # a cluster that turns this driver away is refused before OUT/_train is written
        attach_before_writing(address)
    state = out / "_train"
    if "_train" in (sealed_info(staged_beside(out)) or {}).get("scratch_removed", []):
        # sealed by an export that removed the whole state, the lease's folder too: completed before it is taken
        finish_in_place(out, "config.json")

    def discard() -> None:  # --force-new, once the new run goes ahead: the discarded run's model goes with its state
        discard_in_place(out, "config.json")
        (state / "model.safetensors").unlink(missing_ok=True)  # its last weights too

    with claim_out(state, run_id, {"job": job.model_dump(), "corpus": str(corpus)}, force_new, out_arg,
                   unfingerprinted=tuple(f"job.train.{k}" for k in RESUMABLE_TRAIN_KEYS), discard=discard):
        # an export a kill cut short is completed by the one writer the lease lets in, not beside a live export
        finish_in_place(out, "config.json")
        # this job's model, exported whole (config.json, written last, names its settings, the budget included),
        # is its finished run's, whatever its state says since: a run killed after the export and before
        # mark_finished, or a longer run killed before its own export, which this shorter job does not take on
        done = None if force_new else exported_model(out, job, corpus_fp)
        if done is not None:
            mark_finished(state, out, done)
            say_finished("discriminator", out_arg, f"model (fingerprint {run_id})")
            return done

        # the training windows, as each worker will split them (same seed, same rule): the plan's step count
        from sentsim.discriminator.data import split_heldout

        ids = st.ids
        train_c, _, _ = split_heldout(ids, window_centres(ids, job.model.window), tc.heldout_frac, tc.seed)
        n_train = min(len(train_c), tc.max_train_windows or len(train_c))
        per_epoch = plan_steps("discriminator", n_train, num_workers=tc.num_workers, batch_size=tc.batch_size,
                               epochs=1, max_steps=0, drop_last=False)
        total = tc.max_steps or per_epoch * tc.epochs
        loop = LoopSettings.for_discriminator(tc, total_steps=total, epochs=math.ceil(total / per_epoch))
        quiet_progress()
        if executor == "ray":
            init_ray(address)
        init_path = embed_init_path(job, state, run_id)
        config = {"build": build_trainee, "loop": loop, "corpus": str(corpus), "vocab_path": str(state / "vocab.json"),
                  "model": job.model.model_dump(), "train": tc.model_dump(),
                  "embed_init_path": str(init_path) if init_path else None}
        # fit's refusals before the vocabulary is written into the state: a refused run leaves OUT as it was
        check_fit(config, name="discriminator", out_dir=state, executor=executor, inline_dir=INLINE_DIR)
        go_ahead(state)
        vocab = _vocab_and_init(st, job, state, init_path)
        del st, ids
        t0 = time.perf_counter()
        run = fit(config, name="discriminator", out_dir=state, executor=executor, inline_dir=INLINE_DIR,
                  hint="lower --set train.lr=...",
                  memory_hint="lower --set train.batch_size=... or train.num_workers",
                  export=lambda d: shutil.copy(d / "model.safetensors", state / "model.safetensors"))
        history = run["history"]
        final = dict(history[-1])
        final["fit_seconds"] = round(time.perf_counter() - t0, 2)
        # under the lease: no second writer starts while the model is written into OUT
        # the executor whose state the model came from: a fit found finished in the other executor's record
        # keeps that state (and the export removes this one's, if any)
        export_model(out, state, job, corpus_fp, vocab, final, history, executor=run.get("executor", executor))
        mark_finished(state, out, final)  # last: the same command again is a no-op (finished_model)
    return final


# where the inline executor keeps its checkpoints under OUT/_train (fit's out_dir; Ray Train's run is ray/discriminator)
INLINE_DIR = "checkpoint"
# what each executor keeps under OUT/_train: its checkpoints and fit record (the inline checkpoint's swap
# folders included)
EXECUTOR_STATE = {"ray": ("ray",), "inline": (INLINE_DIR, f"{INLINE_DIR}.old", f"{INLINE_DIR}.tmp")}


def export_model(out: Path, state: Path, job: DiscriminatorJob, corpus_fp: str, vocab, final: dict,
                 history: list, executor: Optional[str] = None) -> None:
    """Replace the model in OUT by the trained one in `state` (OUT/_train: its weights and vocabulary), so
    that a kill at any moment leaves OUT's old model or the new one, whole. The state stays, for a longer
    run to resume; with `executor` (the one that trained the model) the other executor's checkpoints there go
    once the model is in place, so that no later run resumes a state the model did not come from."""
    from sentsim.discriminator.io import FORMAT, save_config
    from sentsim.model_swap import replace_in_place

    def write(folder: Path) -> None:
        shutil.copyfile(state / "model.safetensors", folder / "model.safetensors")
        shutil.copyfile(state / "vocab.json", folder / "vocab.json")
        save_config(folder, job, corpus_fp, vocab, final, history)

    other = [f"{state.name}/{n}" for e, names in EXECUTOR_STATE.items() if executor and e != executor for n in names]
    replace_in_place(out, "config.json", write, {"format": FORMAT}, scratch_removed=other)
