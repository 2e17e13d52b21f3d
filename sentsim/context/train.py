"""Training of the context models (paper §3.2.2) on windows streamed from the corpus Parquet.

`train_context(corpus, out, config)`:
  1. tokenizer: byte-level BPE trained on the corpus' training documents (or the warm-start checkpoint's
     WordPiece, or `tokenizer_from`);
  2. one training run per model: with `model.layout=shared` (or a single direction) one run; with
     `layout=separate` and `direction=all` three runs, one per direction. Each run is the shared loop of
     sentsim.training with `ContextTrainee` (Ray Train, DDP over `num_workers`, fractional CPUs per
     worker, GPU + bf16 autocast when present; or the same loop in-process with `executor=inline`);
  3. Adam(lr 1e-4, betas 0.9/0.999) with warm-up and an inverse-sqrt / linear / constant schedule
     (transformers'); warm-start additions at lr * new_params_lr_scale;
  4. batches: endless token-budget batches streamed from this worker's share of the training documents:
     the corpus slices in a seeded order, and inside a slice its (document, sentence) windows shuffled,
     so that every stretch of the stream samples the whole slice (`train_windows`);
  5. every `eval_every` steps rank 0 measures, on held-out documents and per direction, the token
     log-likelihood, perplexity and the **context-use gap** (held-out loss with the sources shuffled
     across examples minus the loss with the true sources, nats/token), and writes a checkpoint (also
     every `checkpoint_every`); `max_seconds` stops every worker together;
  6. a killed run resumes from its last checkpoint (model, optimiser, schedule, step, tokens seen) when
     started again with the same `--out`; the data stream is rebuilt with the same seed and the batches
     already trained on are passed over, so it goes on where it stopped. Other
     settings against the same --out are refused (--force-new discards the earlier run);
  7. the final bundle (tokenizer.json, context.json, models/<name>/) is written to `out` (replacing any
     bundle there whole: sentsim.context.model.save_bundle), with
     runs/<name>/history.json and train_summary.json; run.json then records the run as finished, and
     the same command again is a no-op that says so (the bundle keeps its bytes and its identity), with
     either executor: the executor is no setting of the run, and a run's state on the other executor (which
     neither reads) is refused in one line, never trained again beside it (sentsim.training.run.fit).

Training state lives in `out/runs/<name>/` (ray/<name>/ for Ray Train, checkpoint/ inline) in the
shared loop's checkpoint format: model/ (safetensors), state.pt (read with torch.load(weights_only=True)),
history.json.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from sentsim.context import compiled
from sentsim.context.batching import BATCH_KEYS, HostToDevice, collate, token_batches
from sentsim.context.config import DIRECTIONS, ContextTrainConfig
from sentsim.context.flops import model_shape, training_flops
from sentsim.context.model import (
    ContextModel,
    build_model,
    init_cross_attention_from_self,
    new_parameter_names,
    save_bundle,
    warm_start_tokenizer,
)
from sentsim.context.stream import micro_batches_of
from sentsim.context.tokenizer import ContextTokenizer, train_bpe
from sentsim.context.windows import (
    Example,
    among,
    build_example,
    few_documents,
    iter_documents,
    iter_slices,
    mix_seed,
    no_training_windows,
)
from sentsim.errors import UsageError
from sentsim.hardware import prefer_shape_free_attention
from sentsim.training.loop import Trainee
from sentsim.training.settings import LoopSettings

# --------------------------------------------------------------------------------------------------- data


def prepare_tokenizer(cfg: ContextTrainConfig, corpus: str, tokenizer_from: str = "") -> ContextTokenizer:
    if cfg.model.arch == "warm_start" or cfg.model.pretrained_path:
        return warm_start_tokenizer(cfg.model)
    if tokenizer_from:
        return ContextTokenizer.load(tokenizer_from)

    def texts():
        n = 0
        # a mix of every source, not the first source's first documents
        for doc in iter_documents(corpus, cfg.heldout_percent, "train", order_seed=cfg.seed,
                                  doc_prefixes=cfg.doc_id_prefixes):
            for s in doc:
                yield s
                n += 1
                if n >= cfg.tokenizer_sentences:
                    return

    return train_bpe(texts(), cfg.model.vocab_size)


def _examples_at(enc: list, i: int, tok: ContextTokenizer, cfg: ContextTrainConfig, directions) -> Iterator[Example]:
    """The examples, one per direction, whose target is sentence i of the tokenised sentences `enc`."""
    mc = cfg.model
    k = mc.context_sentences
    if len(enc[i]) < cfg.min_sentence_tokens:
        return
    left, right = enc[max(0, i - k):i], enc[i + 1:i + 1 + k]
    for d in directions:
        ex = build_example(tok.ids, k, d, left, enc[i], right, mc.max_source_tokens, mc.max_target_tokens)
        if ex is not None:
            yield ex


def _examples_of_doc(doc, tok, cfg: ContextTrainConfig, directions) -> Iterator[Example]:
    enc = tok.encode(doc)
    for i in range(len(doc)):
        yield from _examples_at(enc, i, tok, cfg, directions)


def _examples_of_window(doc, i: int, tok, cfg: ContextTrainConfig, directions) -> Iterator[Example]:
    """Sentence i of `doc` with its k neighbours each side: only those sentences are tokenised."""
    lo = max(0, i - cfg.model.context_sentences)
    enc = tok.encode(doc[lo:i + cfg.model.context_sentences + 1])
    yield from _examples_at(enc, i - lo, tok, cfg, directions)


# Slices of the training stream: each is one scan of the corpus and is held in memory while its windows
# are handed out (1/8 of the shared corpora's text: ~32 MB). Fewer, larger slices spread the few long
# books over more documents: a 1/64 slice of them held 3 books making 59% of its sentences.
TRAIN_SLICES = 8


def train_windows(corpus: str, cfg: ContextTrainConfig, rank: int, world: int, seed: int, epoch: int,
                  slices: int = TRAIN_SLICES) -> Iterator[tuple[list[str], int]]:
    """One pass over this worker's training sentences as (document, sentence index) windows: the
    corpus' slices in a seeded order, and inside a slice every window in a seeded permutation.

    Windows, not documents, are shuffled: a CPU run trains on a fraction of one slice, and with whole
    documents one long book filled the shuffle buffer several times over (in 96-100 of every 100 of
    the reference stream's first 600 batches most windows came from one Gutenberg novel;
    docs/experiments/2026-11-23-window-stream.md). Shuffled windows make any
    stretch of the stream a sample of the whole slice, each source in its share of sentences."""
    order = mix_seed(seed, epoch)
    for part, docs in iter_slices(corpus, cfg.heldout_percent, "train", rank, world, order, slices,
                                  cfg.doc_id_prefixes):
        units = [(d, i) for d, doc in enumerate(docs) for i in range(len(doc))]
        random.Random(mix_seed(order, part)).shuffle(units)
        for d, i in units:
            yield docs[d], i


def train_batches(corpus: str, tok: ContextTokenizer, cfg: ContextTrainConfig, directions, rank: int, world: int,
                  seed: int) -> Iterator[dict]:
    """Endless stream of collated batches from this worker's shard of the training documents; the same
    for the same seed (a resume rebuilds it and passes over the batches already trained on)."""
    rng = random.Random(mix_seed(seed, rank))
    epoch = 0
    while True:
        buf: list[Example] = []
        produced = 0
        for doc, i in train_windows(corpus, cfg, rank, world, seed, epoch):
            for ex in _examples_of_window(doc, i, tok, cfg, directions):
                buf.append(ex)
                produced += 1
            # the buffer is a random sample already; it is sorted by length to cut padding
            if len(buf) >= cfg.shuffle_buffer:
                for b in token_batches(buf, cfg.batch_tokens, rng):
                    yield collate(b, tok.pad_id, tok.bos_id)
                buf = []
        if buf:
            for b in token_batches(buf, cfg.batch_tokens, rng):
                yield collate(b, tok.pad_id, tok.bos_id)
        if produced == 0:
            raise no_training_windows(corpus, cfg, rank, world)
        epoch += 1


def heldout_examples(corpus: str, tok: ContextTokenizer, cfg: ContextTrainConfig, directions) -> dict:
    """Per direction, up to `heldout_windows` examples from the held-out documents (fixed sample)."""
    pool = _heldout_pool(corpus, tok, cfg, directions, cfg.heldout_windows * 20)
    rng = random.Random(1234)
    return {d: rng.sample(exs, min(len(exs), cfg.heldout_windows)) for d, exs in pool.items()}


def _heldout_pool(corpus: str, tok: ContextTokenizer, cfg: ContextTrainConfig, directions, cap: int) -> dict:
    """Up to `cap` held-out examples per direction, refused in one line when a direction has fewer than 2:
    called on the driver before any worker starts (with cap 2), so a corpus too small for a held-out set
    is said before training, not raised inside a Ray Train worker that its failure policy retries."""
    pool = {d: [] for d in directions}
    # from every source trained on (8 slices: each is a scan, and held-out documents are few); fixed, whatever the seed
    for doc in iter_documents(corpus, cfg.heldout_percent, "heldout", order_seed=0, slices=8,
                              doc_prefixes=cfg.doc_id_prefixes):
        for d in directions:
            if len(pool[d]) < cap:
                pool[d].extend(_examples_of_doc(doc, tok, cfg, [d]))
        if all(len(v) >= cap for v in pool.values()):
            break
    for d, exs in pool.items():
        if len(exs) < 2:
            if cfg.doc_id_prefixes and next(iter_documents(corpus, cfg.heldout_percent, "all", slices=8,
                                                           doc_prefixes=cfg.doc_id_prefixes), None) is None:
                raise UsageError(f"{corpus}: no document has a doc_id starting with any of doc_id_prefixes "
                                 f"{cfg.doc_id_prefixes}; set the prefixes its documents have, or [] for every one")
            more = ("use a larger corpus" if cfg.heldout_percent >= 25
                    else "raise heldout_percent or use a larger corpus")
            raise UsageError(f"{corpus}: fewer than 2 held-out windows{among(cfg)} for direction {d!r}; {more}"
                             f"{few_documents(corpus, cfg)}")
    return pool


# --------------------------------------------------------------------------------------------- evaluation


def token_loss(model: ContextModel, batch: dict, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of a batch's target tokens (on the device the batch is on; see `to_device`), in fp32
    over the target positions only."""
    hidden = model.decoder_states(model.encode(batch["src"], batch["src_slots"], batch["src_mask"]),
                                  batch["src_mask"], batch["dec_in"], batch["dec_slots"])
    logits = model.project(hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch["positions"]))
    return torch.nn.functional.cross_entropy(logits.float(), batch["targets"], reduction=reduction)


def to_device(batch: dict, device, h2d: Optional[HostToDevice] = None) -> dict:
    """A collated batch (numpy or torch CPU arrays) on `device` as int64 tensors, with the flat positions of
    its target tokens and their ids, found on the host: a boolean mask taken on the device would make the
    host wait for it every step."""
    return to_device_all([batch], device, h2d)[0]


def to_device_all(batches: list, device, h2d: Optional[HostToDevice] = None) -> list:
    """`to_device` for a step's micro-batches, in one host-to-device copy."""
    arrays = {}
    for i, batch in enumerate(batches):
        one = {k: np.asarray(v) for k, v in batch.items() if k in BATCH_KEYS}
        labels = one["labels"].reshape(-1)
        one["positions"] = np.flatnonzero(labels >= 0)
        one["targets"] = labels[one["positions"]]
        arrays.update({(i, k): v for k, v in one.items()})
    moved = (h2d or HostToDevice(device))(arrays)
    out = [{} for _ in batches]
    for (i, k), v in moved.items():
        out[i][k] = v
    return out


def _loss_sum(model, exs, tok, budget, device, autocast) -> tuple[float, int]:
    total, n = 0.0, 0
    for b in token_batches(exs, budget):
        t = to_device(collate(b, tok.pad_id, tok.bos_id), device)
        with autocast():
            loss = token_loss(model, t, reduction="sum")
        total += float(loss)
        n += int((t["labels"] >= 0).sum())
    return total, n


def evaluate(model: ContextModel, heldout: dict, tok: ContextTokenizer, budget: int, device=torch.device("cpu"),
             autocast=nullcontext) -> dict:
    """Per direction: held-out loss (nats/token), token log-likelihood, perplexity, and the context-use gap
    = loss with every example's source taken from another example (a derangement) - loss with its own."""
    was = model.training
    model.eval()
    out = {}
    with torch.inference_mode():
        for d, exs in heldout.items():
            s, n = _loss_sum(model, exs, tok, budget, device, autocast)
            perm = list(range(len(exs)))
            random.Random(99).shuffle(perm)
            shifted = perm[1:] + perm[:1]  # perm[i] gets the source of shifted[i] != perm[i]
            src_of = dict(zip(perm, shifted))
            shuf = [Example(exs[src_of[i]].src, exs[src_of[i]].src_slots, e.tgt, e.tgt_slots)
                    for i, e in enumerate(exs)]
            s2, n2 = _loss_sum(model, shuf, tok, budget, device, autocast)
            loss, loss_sh = s / max(n, 1), s2 / max(n2, 1)
            out[d] = {"loss": loss, "token_loglik": -loss, "perplexity": math.exp(min(loss, 50.0)),
                      "shuffled_loss": loss_sh, "context_gap": loss_sh - loss, "tokens": n, "windows": len(exs)}
    model.train(was)
    return out


# ------------------------------------------------------------------------------------- the shared loop


def param_groups(model: ContextModel, cfg: ContextTrainConfig) -> list[dict]:
    """Pretrained weights at `lr`, warm-start additions at `lr * new_params_lr_scale`. The group layout is
    fixed by the config, so a resumed optimiser state always matches."""
    new = new_parameter_names(model)
    groups = {False: [], True: []}
    for n, p in model.named_parameters():
        if p.requires_grad:
            groups[n in new].append(p)
    out = [{"params": groups[False], "lr": cfg.lr}]
    if new:
        out.append({"params": groups[True], "lr": cfg.lr * cfg.new_params_lr_scale})
    return [g for g in out if g["params"]]


class ContextTrainee(Trainee):
    """One context model in the shared loop: a step is the mean token cross-entropy of a token-budget
    batch (or of a bucketed step's micro-batches together); evaluation is held-out loss, perplexity and
    context-use gap per direction (rank 0)."""

    def __init__(self, model: ContextModel, cfg: ContextTrainConfig, tok: ContextTokenizer, corpus: str,
                 directions: list[str], heldout: Optional[dict], tokenizer_dir: str = ""):
        super().__init__()
        self.model = model
        self.cfg, self.tok, self.corpus, self.directions, self.heldout = cfg, tok, corpus, directions, heldout
        self.tokenizer_dir = tokenizer_dir  # the stream's worker processes load the tokenizer from it
        self.stream = None
        self.shape = model_shape(model) if model is not None else None
        self.padded_tokens_seen = 0
        self.flops = 0.0
        self.h2d: Optional[HostToDevice] = None  # pinned buffers, made on the first step's device
        # without sentence positions the sentence-position table gets no gradient
        self.find_unused_parameters = not cfg.model.sentence_position_embeddings
        self.world = 1
        self.tokens_seen = 0
        self.target_tokens_seen = 0
        # compile: the step's loss (model, vocabulary projection, cross-entropy) as one graph for every shape
        self.loss = compiled.dynamic(token_loss) if cfg.compile else token_loss

    def param_groups(self, lr: float) -> list[dict]:
        return param_groups(self.model, self.cfg)

    def batches(self, session, epoch: int, skip: int):
        self.world = session.world
        # endless and deterministic for the seed: a resumed run rebuilds it and passes over the batches
        # already trained on (re-seeding instead re-read the corpus from its first document)
        if self.cfg.batching == "bucketed":
            from sentsim.context.stream import stream_for

            self.close()  # the loop closes each epoch's source; this also covers a source it left open
            self.stream = stream_for(self.corpus, self.tokenizer_dir, self.cfg, self.directions, session.rank,
                                     session.world, self.cfg.seed, skip, session.device.type)
            return self.stream
        stream = train_batches(self.corpus, self.tok, self.cfg, self.directions, session.rank, session.world,
                               seed=self.cfg.seed)
        return itertools.islice(stream, skip, None)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()

    def forward(self, batch: dict, device):
        """The mean token cross-entropy of a step: one batch, or the micro-batches of a bucketed step
        (their summed losses over their target tokens: the loss of the same examples in one batch)."""
        parts = micro_batches_of(batch)
        step_tgt = 0
        for part in parts:
            # counted on the host (a bucketed batch carries its counts): no device sync
            n_tgt = part["n_tgt"] if "n_tgt" in part else int((part["labels"] >= 0).sum())
            n_src = part["n_src"] if "n_src" in part else int(part["src_mask"].sum())
            (B, S), T = part["src"].shape, part["labels"].shape[1]
            self.tokens_seen += (n_src + n_tgt) * self.world
            self.target_tokens_seen += n_tgt * self.world
            self.padded_tokens_seen += B * (S + T) * self.world
            self.flops += training_flops(self.shape, B, S, T, n_tgt, self.cfg.freeze_encoder) * self.world
            step_tgt += n_tgt
        if self.h2d is None:
            self.h2d = HostToDevice(device)
            prefer_shape_free_attention(device)
        on_device = to_device_all(parts, device, self.h2d)
        if len(on_device) == 1:  # the batch's own mean, bit for bit as before micro-batches
            loss = self.loss(self.model, on_device[0])
        else:
            loss = sum(self.loss(self.model, b, reduction="sum") for b in on_device) / max(step_tgt, 1)
        return loss, self.counters()

    def counters(self) -> dict:
        """What a history point records of the stream: tokens trained on, the padded tokens and matrix FLOPs
        they cost (sentsim.context.flops), and the seconds the trainer waited for a batch (this worker)."""
        return {"tokens_seen": self.tokens_seen, "target_tokens_seen": self.target_tokens_seen,
                "padded_tokens_seen": self.padded_tokens_seen, "train_flops": self.flops,
                "data_wait_s": round(self.stream.wait_seconds, 2) if self.stream is not None else None}

    def save(self, folder: Path) -> None:
        self.model.save(folder / "model")

    def extra_state(self) -> dict:
        return {"tokens_seen": self.tokens_seen, "target_tokens_seen": self.target_tokens_seen,
                "padded_tokens_seen": self.padded_tokens_seen, "train_flops": self.flops}

    def load_extra_state(self, state: dict) -> None:
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.target_tokens_seen = int(state.get("target_tokens_seen", 0))
        self.padded_tokens_seen = int(state.get("padded_tokens_seen", 0))
        self.flops = float(state.get("train_flops", 0.0))

    def evaluate(self, device, autocast) -> dict:
        if self.heldout is None:
            return {}
        return {"eval": evaluate(self.model, self.heldout, self.tok, self.cfg.batch_tokens, device, autocast)}

    def describe(self, point: dict) -> str:
        ev = point.get("eval") or {}
        return f" tokens {point.get('tokens_seen', 0):,}" + "".join(
            f" | {d} loss {e['loss']:.3f} gap {e['context_gap']:+.4f}" for d, e in ev.items())

    def result(self) -> dict:
        return {"tokens_seen": self.tokens_seen, "target_tokens_seen": self.target_tokens_seen}

    def budget_spent(self) -> bool:
        return bool(self.cfg.max_target_tokens) and self.target_tokens_seen >= self.cfg.max_target_tokens


def build_trainee(config: dict, session, ckpt: Optional[Path]) -> ContextTrainee:
    """On the worker: the model from the checkpoint (resume) or built fresh; rank 0 also samples the
    held-out windows."""
    cfg = ContextTrainConfig.model_validate(config["cfg"])
    tok = ContextTokenizer.load(config["tokenizer_dir"])
    if ckpt is not None:
        model = ContextModel.load(ckpt / "model", cfg.model, tok)
    else:
        model = build_model(cfg.model, tok, seed=cfg.seed)
        if cfg.cross_attention_from_self():
            init_cross_attention_from_self(model)
    model.use_attention(cfg.attention)
    if cfg.freeze_encoder:
        model.freeze_encoder()
    directions = config["directions"]
    heldout = heldout_examples(config["corpus"], tok, cfg, directions) if session.rank == 0 else None
    return ContextTrainee(model, cfg, tok, config["corpus"], directions, heldout, config["tokenizer_dir"])


# ------------------------------------------------------------------------------------------- driver

# settings a resumed run may change (how long and how wide, not what is trained): left out of the fingerprint
RESUMABLE = ("max_steps", "max_seconds", "eval_every", "checkpoint_every", "num_workers", "cpus_per_worker", "use_gpu",
             "torch_threads", "executor", "heldout_windows", "bf16", "max_target_tokens", "data_workers", "log_every",
             "compile", "attention")
# settings added after runs were trained, with the value those runs had: counted in the fingerprint only when
# set to another, so a run from before the setting existed still resumes with it. A run from before
# `batching` (or `micro_batches`) resumed under today's default is refused naming the key, e.g.
# --set batching=buffer
ADDED_LATER = {"doc_id_prefixes": [], "batching": "buffer", "bucket_batches": 256, "micro_batches": 1,
               "pack_tokens": 0}


def run_fingerprint(cfg: ContextTrainConfig, corpus_id: str, tokenizer_from: str) -> str:
    """What a run trains (its config less RESUMABLE, its corpus and tokenizer): another fingerprint at the
    same --out is refused. A setting in ADDED_LATER left at its default is left out, as in older runs."""
    from sentsim.config import without_added_later
    from sentsim.identity import fingerprint

    what = without_added_later({k: v for k, v in cfg.model_dump().items() if k not in RESUMABLE}, ADDED_LATER)
    if what.get("batching") != "bucketed":  # bucket_batches and micro_batches are the bucketed stream's alone
        what.pop("bucket_batches", None)
        what.pop("micro_batches", None)
    return fingerprint("context", what, corpus_id, tokenizer_from)


def _refuse_legacy_resume(out: Path, cfg: ContextTrainConfig, force_new: bool, out_arg: str) -> None:
    """A run trained before `batching` existed read the legacy stream, and one before `micro_batches` one
    micro-batch a step: resumed with today's defaults it would be refused as another run, so say how to
    resume it."""
    run_file = out / "run.json"
    if force_new or cfg.batching == "buffer" or not run_file.is_file() or not (out / "runs").exists():
        return
    try:
        before = json.loads(run_file.read_text()).get("config") or {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # claim_out words a broken record
    if "batching" not in before:
        raise UsageError(f"--out {out_arg} holds a run trained before `batching` existed, on the legacy stream; "
                         "resume it with --set batching=buffer (or --force-new to start over)")
    if before.get("batching") == "bucketed" and "micro_batches" not in before and cfg.micro_batches != 1:
        raise UsageError(f"--out {out_arg} holds a run trained before `micro_batches` existed, one micro-batch a "
                         "step; resume it with --set micro_batches=1 (or --force-new to start over)")


def trains_on_gpu(cfg: ContextTrainConfig) -> bool:
    """Whether the training workers get a GPU (use_gpu auto: inline, this machine's CUDA; on Ray, a GPU per
    worker in the cluster). A GPU asked for where there is none is refused here, before any work."""
    if cfg.use_gpu == "no":
        return False
    if cfg.executor == "inline":
        have = torch.cuda.is_available()
        where = "this machine has no CUDA device"
    else:
        import ray

        have = ray.cluster_resources().get("GPU", 0) >= cfg.num_workers
        where = f"the Ray cluster has fewer than {cfg.num_workers} GPU(s)"
    if cfg.use_gpu == "yes" and not have:
        raise UsageError(f"use_gpu=yes, but {where}; set use_gpu=auto or no")
    return have


def _absolute_paths(cfg: ContextTrainConfig) -> ContextTrainConfig:
    """Checkpoint paths in the config, made absolute on the driver: the Train workers read them from
    their own working directory."""
    from sentsim.runtime import absolute_local

    m = cfg.model
    paths = {k: absolute_local(getattr(m, k)) for k in ("warm_start_path", "pretrained_path") if getattr(m, k)}
    return cfg.model_copy(update={"model": m.model_copy(update=paths)}) if paths else cfg


def steps_by(history: list, key: str) -> dict:
    """value -> training steps run with it, from a run's history points (each says the `key`, e.g. the
    format or the thread count, of the steps since the point before it); steps from before points
    recorded it count as "unrecorded"."""
    out, prev = {}, 0
    for h in history:
        n = h.get("step", 0) - prev
        if n > 0:
            k = str(h.get(key, "unrecorded"))
            out[k] = out.get(k, 0) + n
        prev = max(prev, h.get("step", 0))
    return out


def train_context(corpus: str, out: str, config: Optional[ContextTrainConfig] = None, tokenizer_from: str = "",
                  address: Optional[str] = None, force_new: bool = False) -> dict:
    """Train the context model(s) and write the bundle to `out`. Returns a summary (also `out/train_summary.json`).
    The --out lease is held no longer than the call: a caller's next command on `out`, in any process, is not
    refused as a second writer."""
    return _train_context(corpus, out, config, tokenizer_from, address, force_new)


def _train_context(corpus: str, out: str, config: Optional[ContextTrainConfig], tokenizer_from: str,
                   address: Optional[str], force_new: bool) -> dict:
    from sentsim.runtime import absolute_local
    from sentsim.training.run import claim_out, finished_run, quiet_progress, say_finished

    out_arg = out
    corpus, out, tokenizer_from = (absolute_local(p) if p else p for p in (corpus, out, tokenizer_from))
    cfg = _absolute_paths(config or ContextTrainConfig())
    out_p = Path(out)
    t0 = time.perf_counter()
    try:
        from sentsim.identity import corpus_fingerprint

        corpus_id = corpus_fingerprint(corpus)
    except UsageError:
        from storage import ShardStore

        # refused before --out is claimed, so nothing is left there: a folder that does not exist, and a corpus
        # whose manifest the fingerprint refused (one not finished)
        if "://" not in corpus and not Path(corpus).exists():
            raise UsageError(f"{corpus}: not a corpus directory (no such directory)") from None
        if ShardStore(corpus).read_manifest() is not None:
            raise
        corpus_id = corpus  # no manifest: the parts are checked when read
    if cfg.executor == "ray":  # started before the fingerprint: whether the workers get GPUs sets batch_tokens
        from sentsim.runtime import init_ray

        quiet_progress()
        init_ray(address)
    gpu = trains_on_gpu(cfg)
    if cfg.attention == "flex" and not gpu:
        raise UsageError("attention=flex trains on a GPU only (FlexAttention has no backward pass on a CPU); "
                         "set attention=sdpa")
    cfg = cfg.model_copy(update={"batch_tokens": cfg.resolved_batch_tokens(gpu)})
    run_id = run_fingerprint(cfg, corpus_id, tokenizer_from)
    _refuse_legacy_resume(out_p, cfg, force_new, out_arg)
    record = {"config": cfg.model_dump(), "corpus": corpus, "tokenizer_from": tokenizer_from}
    # a finished bundle is the run's outcome, whichever executor trained it or is asked for it now
    done = None if force_new else finished_run(out_p, run_id, record, out_p, ignore=("config.executor",))
    if done is not None:
        say_finished("context", out_arg, f"bundle (fingerprint {run_id})")
        return done["summary"]
    with claim_out(out_p, run_id, record, force_new, out_arg, state=("runs", "tokenizer"),
                   unfingerprinted=tuple(f"config.{k}" for k in RESUMABLE), discard=lambda: _discard_bundle(out_p)):
        return _train_claimed(out_p, cfg, corpus, tokenizer_from, force_new, t0)


def _discard_bundle(out_p: Path) -> None:
    """--force-new, once the new run goes ahead: the discarded bundle's model files go with its runs, not stay
    beside the new run's."""
    from sentsim.model_swap import discard_in_place

    discard_in_place(out_p, "context.json")


def run_directions(cfg: ContextTrainConfig) -> dict:
    """The training runs of `cfg`, each with its directions: one shared model, or one model per direction."""
    dirs = list(DIRECTIONS) if cfg.direction == "all" else [cfg.direction]
    if cfg.direction == "all" and cfg.model.layout == "shared":
        return {"shared": dirs}
    return {d: [d] for d in dirs}


def _train_claimed(out_p: Path, cfg: ContextTrainConfig, corpus: str, tokenizer_from: str, force_new: bool,
                   t0: float) -> dict:
    """_train_context's part under the --out lease: the tokenizer, the fits, the bundle and its summary."""
    from sentsim.training.run import check_fit, fit, go_ahead, mark_finished
    from storage.fs import write_text_atomic  # the reports: a kill while writing one leaves the last, whole

    tok_dir = out_p / "tokenizer"
    # --force-new: the tokenizer there is the discarded run's, which goes when this run goes ahead
    resumed = not force_new and (tok_dir / "tokenizer.json").is_file()
    # resuming: keep the tokenizer the checkpoints were trained with; one that does not read is this run's
    # state, which only --force-new discards
    redo = "it is this run's saved tokenizer: --force-new starts the run over, or use another --out"
    tok = ContextTokenizer.load(tok_dir, redo) if resumed else prepare_tokenizer(cfg, corpus, tokenizer_from)
    if (cfg.model.arch == "bart" and not cfg.model.pretrained_path and tok.vocab_size > cfg.model.vocab_size
            and not tokenizer_from):
        raise UsageError(f"tokenizer has {tok.vocab_size} tokens, more than model.vocab_size={cfg.model.vocab_size}")
    if tokenizer_from and not resumed and tok.vocab_size != cfg.model.vocab_size:
        # the models are built to the tokenizer's size; context.json's vocab_size is that one, and its
        # model_config keeps the config's as given
        print(f"note: --tokenizer-from {tokenizer_from}: its {tok.vocab_size:,} tokens size the models' vocabulary; "
              f"model.vocab_size ({cfg.model.vocab_size:,}) is not used", flush=True)
    dirs = list(DIRECTIONS) if cfg.direction == "all" else [cfg.direction]
    _heldout_pool(corpus, tok, cfg, dirs, cap=2)
    runs = run_directions(cfg)
    configs = {name: {"build": build_trainee, "loop": LoopSettings.for_context(cfg, name), "cfg": cfg.model_dump(),
                      "corpus": str(corpus), "directions": rdirs, "tokenizer_dir": str(tok_dir)}
               for name, rdirs in runs.items()}
    for name, config in configs.items():  # each fit's refusals, before the run writes anything: OUT stays as it was
        check_fit(config, name=name, out_dir=out_p / "runs" / name, executor=cfg.executor)
    go_ahead(out_p)
    if not resumed:
        # saved once the inputs passed: a saved tokenizer is training state, and with it at --out the
        # command these errors ask for (other settings) would be refused as another run
        tok.save(tok_dir)
    summary = {"corpus": str(corpus), "config": cfg.model_dump(), "runs": {}}
    models, by_dir = {}, {}
    for name, rdirs in runs.items():
        run_dir = out_p / "runs" / name
        run = fit(configs[name], name=name, out_dir=run_dir, executor=cfg.executor,
                  hint="lower --set lr=... or raise warmup_steps",
                  memory_hint="lower --set batch_tokens=... or num_workers",
                  export=lambda d: ContextModel.load(d / "model", cfg.model, tok))
        models[name] = run["model"]
        for d in rdirs:
            by_dir[d] = name
        hist = run["history"]
        write_text_atomic(str(run_dir / "history.json"), json.dumps(hist, indent=1))
        evals = [h for h in hist if h.get("eval")]
        last = hist[-1] if hist else {}
        summary["runs"][name] = {
            "directions": rdirs, "steps": last.get("step", 0), "tokens_seen": last.get("tokens_seen", 0),
            "target_tokens_seen": last.get("target_tokens_seen", 0), "train_seconds": last.get("time_s", 0.0),
            # CPU seconds of the training process (rank 0), which pauses and a shared CPU do not inflate
            "train_cpu_seconds": last.get("cpu_s"),
            "initial_eval": evals[0]["eval"] if evals else None, "final_eval": evals[-1]["eval"] if evals else None,
            "parameters": models[name].n_parameters(),
            # steps by the format they ran in (bf16 / fp32) and by torch thread count, from the history: more
            # than one key, a mixed run (either changes the arithmetic, so a rebuild must match both to match)
            "precision_steps": steps_by(hist, "precision"), "threads_steps": steps_by(hist, "threads"),
        }
    summary["wall_seconds"] = time.perf_counter() - t0
    save_bundle(out_p, cfg.model, tok, models, by_dir, extra={"trained": {
        "corpus": str(corpus), "runs": {k: {kk: vv for kk, vv in v.items() if kk != "initial_eval"}
                                        for k, v in summary["runs"].items()}}})
    write_text_atomic(str(out_p / "train_summary.json"), json.dumps(summary, indent=1))
    mark_finished(out_p, out_p, summary)
    return summary
