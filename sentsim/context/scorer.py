"""`ContextScorer`: teacher-forced log-probabilities of the three directions and Eq. 3 (paper §3.3).

For every (sentence, context) item it returns, per direction d in {fwd, left, right},

    logprob_sum[d]   = log p(target_d | source_d)        (sum over the target's tokens and its </s>)
    n_tokens[d]      = number of scored target tokens    (>= 1 whenever the direction is present)
    logprob[d]       = logprob_sum[d] / n_tokens[d]      (the length-normalised terms of Eq. 3)

and the combined score

    S(s, c) = λ1·log p_disc + λ2·logprob[fwd] + λ3·logprob[left] + λ4·logprob[right]      (Eq. 3)

with the Table 8 ablations as config switches. A term that cannot be computed for an item (no
discriminator value given, an empty sentence, an empty left or right context at a document edge, or no
model for that direction) is *dropped with its λ*: it contributes nothing and is recorded in
`ScoreResult.dropped`. An item with no term left scores NaN.

Efficiency:
  * one teacher-forced decoder pass per (item, direction);
  * encoder outputs are shared: items whose source is made of the same texts (for p(s|c): every sentence
    scored against the same context) are encoded once;
  * the host side is numpy over the whole call (`example_arrays`): each distinct text tokenised once, every
    example built by gathers, no loop over (item, direction); the call's examples and batch plans go to
    the device in one copy and each batch is cut there;
  * sources are batched under a token budget, decoder jobs under the same budget (padded decoder + encoder
    tokens), each batch alike in length: groups are cut where they pad least, to <= MAX_PADDING padding;
  * `torch.inference_mode`, and bf16 autocast where bf16 is native (GPUs, CPUs with avx512_bf16 or AMX;
    `autocast: auto`), fp32 elsewhere; fp16 on request.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

from sentsim.context import compiled
from sentsim.context.batching import HostToDevice, padded_index, plan_batches
from sentsim.context.config import DIRECTIONS, TERMS, ScorerConfig
from sentsim.context.example_arrays import ExampleArrays, TextTable, build_examples, context_columns
from sentsim.context.flops import decoder_flops, encoder_flops, model_shape
from sentsim.context.model import ContextModel, load_bundle
from sentsim.errors import UsageError
from sentsim.hardware import prefer_shape_free_attention, resolve_autocast

# Batch plans (`batching.plan_batches`): groups are cut where they pad least, and a batch that fits the token
# budget but is more than MAX_PADDING padding is cut again, while each part keeps 1/MIN_BATCH_SHARE of the
# budget in real tokens (<= 10% padding; on a GPU a batch far below its budget costs more in
# kernel launches than in arithmetic). bench/results/scoring_host.md measures both on a harvest's units.
MAX_PADDING = 0.10
MIN_BATCH_SHARE = 16
Context = Union[str, Sequence[str], None]


@dataclass
class ContextItem:
    sentence: str
    left: Context = ()
    right: Context = ()
    log_p_disc: Optional[float] = None  # log p(y=1 | s, c<, c>) from the discriminator, when available


@dataclass
class ScoreResult:
    score: np.ndarray  # S(s, c), Eq. 3
    logprob: dict  # direction -> length-normalised log-prob (NaN where missing)
    logprob_sum: dict
    n_tokens: dict
    truncated: dict  # direction -> tokens cut from source + target of that item
    dropped: list  # per item: tuple of Eq. 3 terms dropped because they could not be computed
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.score)

    def as_dict(self) -> dict:
        return {
            "score": self.score, "logprob": self.logprob, "logprob_sum": self.logprob_sum,
            "n_tokens": self.n_tokens, "truncated": self.truncated, "dropped": self.dropped, "stats": self.stats,
        }


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"scoring.device={name}, but this machine has no CUDA device; set scoring.device=auto or cpu")
    return torch.device(name)


def eq3_sum(values: dict, on: dict, lam: dict) -> np.ndarray:
    """Eq. 3: S = sum of λ_t · term_t over the enabled terms t in TERMS, each term an array (of any shape) over
    items. A term that is NaN for an item is left out of that item's sum; an item with no term at all gets S = NaN.
    A term that is off, or weighed 0, need not be in `values`."""
    total = np.zeros(np.shape(next(iter(values.values()))))
    used = np.zeros(total.shape, dtype=bool)
    for t in _weighed(on, lam):
        v = np.asarray(values[t], dtype=np.float64)
        ok = np.isfinite(v)
        total = total + np.where(ok, lam[t] * np.where(ok, v, 0.0), 0.0)
        used |= ok
    return np.where(used, total, np.nan)


def combine_terms(values: dict, on: dict, lam: dict):
    """Eq. 3's S (`eq3_sum`) for items in a row, and each item's dropped terms: those enabled, weighed and NaN
    for it (unscored, or a discriminator that was not run). `sentsim remix` sums a harvest's stored terms with
    `eq3_sum` too, so a remix reproduces S exactly."""
    n = len(next(iter(values.values())))
    dropped = [[] for _ in range(n)]
    for t in _weighed(on, lam):
        for i in np.flatnonzero(~np.isfinite(np.asarray(values[t], dtype=np.float64))):
            dropped[i].append(t)
    return eq3_sum(values, on, lam), [tuple(x) for x in dropped]


def _weighed(on: dict, lam: dict) -> list:
    return [t for t in TERMS if on.get(t) and lam[t] != 0.0]


class ContextScorer:
    """Scores (sentence, context) items with the context models in one or more bundle directories.

    `models` may be a bundle directory, a list of them (e.g. three single-direction runs), or an
    already-loaded `(cfg, tokenizer, {direction: ContextModel})` triple. All must share one tokenizer and
    window config; a mismatch is refused."""

    def __init__(self, models, config: Optional[ScorerConfig] = None):
        self.config = config or ScorerConfig()
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        self.device = _resolve_device(self.config.device)
        self.batch_tokens = self.config.resolved_batch_tokens(self.device.type == "cuda")
        self.h2d = HostToDevice(self.device)
        prefer_shape_free_attention(self.device)
        if isinstance(models, tuple) and len(models) == 3 and isinstance(models[2], dict):
            self.model_config, self.tokenizer, by_dir = models
        else:
            paths = [models] if isinstance(models, (str, Path)) else list(models)
            if not paths:
                raise UsageError("ContextScorer needs at least one context-model directory")
            self.model_config, self.tokenizer, by_dir = load_bundle(paths[0])
            for p in paths[1:]:
                _, _, more = load_bundle(p, expect=self.model_config, expect_tokenizer_sha256=self.tokenizer.sha256)
                for d, m in more.items():
                    if d in by_dir:
                        raise UsageError(f"{p}: direction {d!r} is provided by more than one model directory")
                    by_dir[d] = m
        self.models: dict[str, ContextModel] = by_dir
        for m in {id(m): m for m in by_dir.values()}.values():
            m.to(self.device).eval()
        # auto: bf16 where it is native (GPUs, CPUs with avx512_bf16 / AMX; sentsim.hardware), else fp32
        self.precision = resolve_autocast(self.config.autocast, self.device.type)
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self._tok_cache: dict[str, np.ndarray] = {}  # text -> its token ids
        # batch plans (`batching.plan_batches`); a bench may change them on the instance
        self.max_padding, self.min_batch_share = MAX_PADDING, MIN_BATCH_SHARE
        # sums over every score() call: items, seconds, matrix FLOPs (sentsim.context.flops), real and padded tokens
        self.totals: dict[str, float] = {}
        # the model's two calls of a batch; compile: one graph each for every batch shape
        wrap = compiled.dynamic if self.config.compile else (lambda fn: fn)
        self.encode_states, self.target_logprobs = wrap(encode_states), wrap(target_logprobs)

    # ------------------------------------------------------------------------------------------ helpers

    @property
    def directions(self) -> tuple[str, ...]:
        return tuple(d for d in DIRECTIONS if d in self.models)

    def active_directions(self) -> list[str]:
        on, lam = self.config.enabled(), self.config.weights()
        out = []
        for d in DIRECTIONS:
            if d not in self.models:
                continue
            if self.config.skip_disabled and (not on[d] or lam[d] == 0.0):
                continue
            out.append(d)
        return out

    def _encode_texts(self, texts) -> None:
        if len(self._tok_cache) > 500_000:  # bound memory across calls; never mid-call
            self._tok_cache.clear()
        todo = [t for t in dict.fromkeys(texts) if t not in self._tok_cache]
        if todo:
            for t, ids in zip(todo, self.tokenizer.encode(todo)):
                self._tok_cache[t] = np.array(ids, dtype=np.int32)

    def _autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # ------------------------------------------------------------------------------------------ scoring

    def score(self, items: Sequence[Union[ContextItem, tuple]]) -> ScoreResult:
        t0 = time.perf_counter()
        items = items if isinstance(items, (list, tuple)) else list(items)
        n = len(items)
        mc = self.model_config
        k = mc.context_sentences
        table, centre, left, right, disc = self._layout(items)
        lp_sum = {d: np.full(n, np.nan) for d in DIRECTIONS}
        n_tok = {d: np.zeros(n, dtype=np.int64) for d in DIRECTIONS}
        trunc = {d: np.zeros(n, dtype=np.int64) for d in DIRECTIONS}
        stats = defaultdict(float)
        # jobs grouped by model object: a shared model serves all directions in one schedule
        dirs_of: dict[int, list[str]] = defaultdict(list)
        model_of: dict[int, ContextModel] = {}
        for d in self.active_directions():
            model_of[id(self.models[d])] = self.models[d]
            dirs_of[id(self.models[d])].append(d)
        with torch.inference_mode():
            for mid, dirs in dirs_of.items():
                ex = build_examples(table, self.tokenizer.ids, k, dirs, centre, left, right,
                                    mc.max_source_tokens, mc.max_target_tokens)
                stats["fallback_examples"] += ex.fallbacks
                out = self._run_jobs(model_of[mid], ex, stats)
                for j, d in enumerate(dirs):
                    mine = ex.direction == j
                    rows = ex.item[mine]
                    lp_sum[d][rows] = out[mine]
                    n_tok[d][rows] = ex.tgt.lengths[mine]
                    trunc[d][rows] = ex.src_truncated[mine] + ex.tgt_truncated[mine]

        logprob = {}
        for d in DIRECTIONS:
            with np.errstate(invalid="ignore", divide="ignore"):
                logprob[d] = np.where(n_tok[d] > 0, lp_sum[d] / np.maximum(n_tok[d], 1), np.nan)
        score, dropped = self.combine(logprob, disc)
        stats["items"] = n
        stats["seconds"] = time.perf_counter() - t0
        for d in DIRECTIONS:
            stats[f"truncated_items_{d}"] = int((trunc[d] > 0).sum())
        pad = stats.get("padded_tokens", 0.0)
        stats["padding_fraction"] = (1.0 - stats.get("real_tokens", 0.0) / pad) if pad else 0.0
        for key in ("items", "seconds", "flops", "real_tokens", "padded_tokens"):
            self.totals[key] = self.totals.get(key, 0.0) + stats.get(key, 0.0)
        return ScoreResult(score, logprob, lp_sum, n_tok, trunc, dropped, dict(stats))

    def _layout(self, items) -> tuple:
        """(the call's `TextTable`, each item's sentence [n], left and right context sentences [n, k] as text
        ids, its discriminator values). The one loop over items: text ids only, no tokens."""
        text_id: dict[str, int] = {}
        get = text_id.get
        centre = np.empty(len(items), dtype=np.int64)
        sides = {"left": ([], []), "right": ([], [])}  # (item, text id) of each context sentence given
        disc = []

        def add(i: int, ctx, into: tuple) -> None:
            for t in ((ctx,) if isinstance(ctx, str) else ctx):
                if t:
                    c = get(t)
                    if c is None:
                        c = text_id[t] = len(text_id)
                    into[0].append(i)
                    into[1].append(c)

        for i, it in enumerate(items):
            if not isinstance(it, ContextItem):
                it = ContextItem(*it)
            s = it.sentence or ""
            c = get(s)
            if c is None:
                c = text_id[s] = len(text_id)
            centre[i] = c
            if it.left:
                add(i, it.left, sides["left"])
            if it.right:
                add(i, it.right, sides["right"])
            disc.append(it.log_p_disc)
        texts = list(text_id)
        self._encode_texts(texts)
        tc = self._tok_cache
        table = TextTable([tc[t] for t in texts], self.tokenizer.ids)
        # a context sentence counts if it has a non-blank character and a token (as build_example); the sentence
        # itself always does (an empty one has no fwd target)
        usable = np.fromiter((bool(t.strip()) for t in texts), bool, len(texts)) & (table.lengths[:len(texts)] > 0)
        k = self.model_config.context_sentences
        cols = []
        for side, (item, text) in sides.items():
            item, text = np.asarray(item, dtype=np.int64), np.asarray(text, dtype=np.int64)
            keep = usable[text]
            cols.append(context_columns(item[keep], text[keep], len(items), k, side, table.null))
        return table, centre, cols[0], cols[1], disc

    def combine(self, logprob: dict, log_p_disc: Sequence[Optional[float]]):
        """Eq. 3 from per-direction length-normalised log-probs; returns (S, dropped-terms per item)."""
        disc = np.array([np.nan if v is None else float(v) for v in log_p_disc], dtype=np.float64)
        n = len(disc)
        values = {"disc": disc, **{d: logprob.get(d, np.full(n, np.nan)) for d in DIRECTIONS}}
        return combine_terms(values, self.config.enabled(), self.config.weights())

    def score_matrix(self, sentences: Sequence[str], contexts: Sequence[tuple], log_p_disc=None) -> ScoreResult:
        """Every sentence against every context (left, right): the harvest's access pattern. The result's
        arrays are flat in row-major order (sentence-major); reshape to (len(sentences), len(contexts))."""
        items = []
        for i, s in enumerate(sentences):
            for j, (lc, rc) in enumerate(contexts):
                disc = None if log_p_disc is None else log_p_disc[i][j]
                items.append(ContextItem(s, lc, rc, disc))
        return self.score(items)

    # ------------------------------------------------------------------------------------------ batches

    def _run_jobs(self, model: ContextModel, ex: ExampleArrays, stats: dict) -> np.ndarray:
        """The log-probability sum of each job's target (`ExampleArrays`) under one model.

        The host plans every batch of the call first (numpy: distinct sources through the encoder in
        batches alike in length, then decoder batches planned on source and target length together,
        `batching.plan_batches`) and sends the call's examples and plans to the device in one copy; each
        batch is then cut from them on the device (`batching.padded_index`), so a batch costs the host
        a few kernel launches besides the model's. Encoder states stay on the device in one buffer,
        batch after batch, and each decoder row gathers its source's from there. Nothing is read back
        until every batch has been queued."""
        stats["encoder_rows"] += len(ex.src)
        stats["decoder_rows"] += len(ex)
        if not len(ex):
            return np.zeros(0)
        shape = model_shape(model)
        plan = self._plan_jobs(ex, shape)
        states = self._encode_batches(model, plan, shape, stats)
        return self._decode_batches(model, plan, states, len(ex), shape, stats)

    def _plan_jobs(self, ex: ExampleArrays, shape) -> "_JobPlan":
        """Every encoder and decoder batch of the call, planned on the host and copied to the device once."""
        budget = self.batch_tokens
        src, tgt = ex.src, ex.tgt
        plan_args = dict(max_padding=self.max_padding, min_tokens=budget // self.min_batch_share)
        # what a padded position of a decoder row costs, source against target: per layer 4d^2 for the
        # cross-attention keys and values of a source position, 12d^2 + 4df for a target position
        # (sentsim.context.flops; ~1 : 7 at f = 4d)
        dec_weights = (1.0, (12 * shape.d ** 2 + 4 * shape.d * shape.ffn_dec) / (4 * shape.d ** 2))
        enc = _Plan(plan_batches(src.lengths, np.zeros(len(src), np.int64), budget, weights=(1.0, 0.0),
                                 **plan_args))
        enc_len = src.lengths[enc.rows]
        enc_width = np.maximum.reduceat(enc_len, enc.starts)
        # the encoder buffer holds batch after batch, [rows x width] each, then one zero row (padding)
        enc_base = np.cumsum(enc.sizes * enc_width) - enc.sizes * enc_width
        state_at = np.empty(len(src), dtype=np.int64)  # where each distinct source's states begin
        state_at[enc.rows] = np.repeat(enc_base, enc.sizes) + enc.local * np.repeat(enc_width, enc.sizes)

        job_src_len = src.lengths[ex.job_src]
        dec = _Plan(plan_batches(job_src_len, tgt.lengths, budget, weights=dec_weights, **plan_args))
        dec_len, dec_src_len = tgt.lengths[dec.rows], job_src_len[dec.rows]
        dec_T = np.maximum.reduceat(dec_len, dec.starts)
        dec_S = np.maximum.reduceat(dec_src_len, dec.starts)
        # the scored positions of each decoder batch, row by row (r * T + j), their rows and target ids
        n_real = int(dec_len.sum())
        first = np.cumsum(dec_len) - dec_len
        within = np.arange(n_real) - np.repeat(first, dec_len)
        pos = np.repeat(dec.local * np.repeat(dec_T, dec.sizes), dec_len) + within
        targets = tgt.tokens[np.repeat(tgt.offsets[dec.rows], dec_len) + within]
        tok_cut = np.concatenate([[0], np.cumsum(np.add.reduceat(dec_len, dec.starts))])

        # the flat stores end with the elements that padding points at
        pad_id, bos_id = self.tokenizer.pad_id, self.tokenizer.bos_id
        width = int(max(enc_width.max(), dec_T.max(), dec_S.max()))
        t = self.h2d({
            "src": np.concatenate([src.tokens, [pad_id]]), "src_slots": np.concatenate([src.slots, [0]]),
            "tgt": np.concatenate([tgt.tokens, [pad_id, bos_id]]), "tgt_slots": np.concatenate([tgt.slots, [0, 0]]),
            "enc_off": src.offsets[enc.rows], "enc_len": enc_len,
            "dec_off": tgt.offsets[dec.rows], "dec_len": dec_len, "dec_rows": dec.rows,
            "dec_state_at": state_at[ex.job_src[dec.rows]], "dec_src_len": dec_src_len,
            "pos": pos, "row": np.repeat(dec.local, dec_len), "targets": targets,
            "positions": np.arange(width)})
        return _JobPlan(enc, enc_len, enc_width, enc_base, int((enc.sizes * enc_width).sum()), dec, dec_T, dec_S,
                        tok_cut, len(src.tokens), len(tgt.tokens), t)

    def _encode_batches(self, model: ContextModel, plan: "_JobPlan", shape, stats: dict) -> torch.Tensor:
        """The encoder states of every distinct source, batch after batch in one buffer on the device."""
        t, ar = plan.t, plan.t["positions"]
        states = None
        for b, (lo, hi) in enumerate(plan.enc.bounds()):
            W = int(plan.enc_width[b])
            at, real = padded_index(t["enc_off"][lo:hi], t["enc_len"][lo:hi], ar[:W], plan.n_src_tok)
            with self._autocast():
                h = self.encode_states(model, t["src"][at], t["src_slots"][at], real.long())
            if states is None:
                states = torch.zeros(plan.n_buf + 1, h.shape[-1], dtype=h.dtype, device=self.device)
            base = int(plan.enc_base[b])
            states[base:base + (hi - lo) * W] = h.reshape(-1, h.shape[-1])
            real_tok, n_padded = int(plan.enc_len[lo:hi].sum()), (hi - lo) * W
            stats["flops"] += encoder_flops(shape, hi - lo, W)
            stats["encoder_real_tokens"] += real_tok
            stats["encoder_padded_tokens"] += n_padded
            stats["real_tokens"] += real_tok
            stats["padded_tokens"] += n_padded
            stats["encoder_batches"] += 1
        return states

    def _decode_batches(self, model: ContextModel, plan: "_JobPlan", states: torch.Tensor, n_jobs: int, shape,
                        stats: dict) -> np.ndarray:
        """Each job's target log-probability sum, decoder batch after decoder batch; read back once."""
        t, ar, dev = plan.t, plan.t["positions"], self.device
        sums = torch.zeros(n_jobs, dtype=torch.float64, device=dev)
        for b, (lo, hi) in enumerate(plan.dec.bounds()):
            T, S, B = int(plan.dec_T[b]), int(plan.dec_S[b]), hi - lo
            # decoder input = <bos> + target[:-1], padded; its slots alike (the <bos> and padding slots are 0)
            at, _ = padded_index(t["dec_off"][lo:hi], t["dec_len"][lo:hi], ar[:T], plan.n_tgt_tok, shift=1)
            at[:, 0] = plan.n_tgt_tok + 1
            gather, src_real = padded_index(t["dec_state_at"][lo:hi], t["dec_src_len"][lo:hi], ar[:S], plan.n_buf)
            a, z = int(plan.tok_cut[b]), int(plan.tok_cut[b + 1])
            with self._autocast():
                tok_lp = self.target_logprobs(model, states[gather], src_real.long(), t["tgt"][at],
                                              t["tgt_slots"][at], t["pos"][a:z], t["targets"][a:z])
            row_sums = torch.zeros(B, dtype=torch.float64, device=dev).index_add_(0, t["row"][a:z], tok_lp.double())
            sums.index_copy_(0, t["dec_rows"][lo:hi], row_sums)
            real_tok = z - a
            stats["flops"] += decoder_flops(shape, B, S, T, real_tok)
            stats["decoder_real_tokens"] += real_tok
            stats["decoder_padded_tokens"] += B * T
            stats["real_tokens"] += real_tok
            stats["padded_tokens"] += B * T
            stats["target_tokens"] += real_tok
            stats["decoder_batches"] += 1
        return sums.cpu().numpy()  # the one read back


def encode_states(model: ContextModel, src: torch.Tensor, src_slots: torch.Tensor, src_mask: torch.Tensor):
    """The encoder's last hidden states [B, S, H] of a padded source batch."""
    return model.encode(src, src_slots, src_mask)


def target_logprobs(model: ContextModel, enc: torch.Tensor, src_mask: torch.Tensor, dec_in: torch.Tensor,
                    dec_slots: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p of each scored target token (fp32), given the encoder states: the decoder, then the vocabulary
    projection at the scored `positions` (flat, row by row) only."""
    hidden = model.decoder_states(enc, src_mask, dec_in, dec_slots)
    logits = model.project(hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions))
    return -F.cross_entropy(logits.float(), targets, reduction="none")


@dataclass
class _JobPlan:
    """One call's batches (`ContextScorer._plan_jobs`): the encoder and decoder plans, the encoder buffer's
    layout (each batch's width and first row, n_buf rows in all), each decoder batch's target and source
    widths and its first scored token, the flat stores' sizes and the arrays on the device (`t`)."""

    enc: "_Plan"
    enc_len: np.ndarray
    enc_width: np.ndarray
    enc_base: np.ndarray
    n_buf: int
    dec: "_Plan"
    dec_T: np.ndarray
    dec_S: np.ndarray
    tok_cut: np.ndarray
    n_src_tok: int
    n_tgt_tok: int
    t: dict


class _Plan:
    """A batch plan (`plan_batches`) as flat arrays: the rows batch after batch, each batch's size and
    first place, and each row's place in its batch."""

    def __init__(self, batches: list):
        self.sizes = np.fromiter(map(len, batches), np.int64, len(batches))
        self.rows = np.concatenate(batches)
        self.starts = np.cumsum(self.sizes) - self.sizes
        self.local = np.arange(len(self.rows)) - np.repeat(self.starts, self.sizes)

    def bounds(self):
        return zip(self.starts.tolist(), (self.starts + self.sizes).tolist())
