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
  * encoder outputs are shared: items whose source sequence is identical (for p(s|c): every sentence
    scored against the same context) are encoded once;
  * sources are sorted by length and batched under a token budget; decoder jobs are sorted by target
    length and batched under the same budget (padded decoder + encoder tokens);
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

from sentsim.context.batching import HostToDevice, collate_targets, plan_batches
from sentsim.context.config import DIRECTIONS, ScorerConfig
from sentsim.context.example_arrays import ExampleArrays, TextTable, build_examples, context_columns
from sentsim.context.flops import decoder_flops, encoder_flops, model_shape
from sentsim.context.model import ContextModel, load_bundle
from sentsim.errors import UsageError
from sentsim.hardware import prefer_shape_free_attention, resolve_autocast

TERMS = ("disc", "fwd", "left", "right")
# Batch plans (`batching.plan_batches`): groups are cut where they pad least, and a batch that fits the token
# budget but is more than MAX_PADDING padding is cut again, while each part keeps 1/MIN_BATCH_SHARE of the
# budget in real tokens (issue 38: <= 10% padding; on a GPU a batch far below its budget costs more in
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


def combine_terms(values: dict, on: dict, lam: dict):
    """Eq. 3: S = sum of λ_t · term_t over the enabled terms t in TERMS, each term an array over items.

    A term that is NaN for an item (unscored, or a discriminator that was not run) is left out of
    that item's sum and listed in its dropped terms; an item with no term at all gets S = NaN.
    `sentsim remix` calls this on a harvest's stored terms, so a remix reproduces S exactly.
    """
    n = len(next(iter(values.values())))
    total = np.zeros(n)
    used = np.zeros(n, dtype=np.int64)
    dropped = [[] for _ in range(n)]
    for t in TERMS:
        if not on[t] or lam[t] == 0.0:
            continue
        v = np.asarray(values[t], dtype=np.float64)
        ok = np.isfinite(v)
        total = total + np.where(ok, lam[t] * np.where(ok, v, 0.0), 0.0)
        used += ok
        for i in np.flatnonzero(~ok):
            dropped[i].append(t)
    score = np.where(used > 0, total, np.nan)
    return score, [tuple(x) for x in dropped]


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
        self._tok_cache: dict[str, list[int]] = {}
        # batch plans (`batching.plan_batches`); a bench may change them on the instance
        self.max_padding, self.min_batch_share = MAX_PADDING, MIN_BATCH_SHARE
        # sums over every score() call: items, seconds, matrix FLOPs (sentsim.context.flops), real and padded tokens
        self.totals: dict[str, float] = {}

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
                self._tok_cache[t] = ids

    def _autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # ------------------------------------------------------------------------------------------ scoring

    def score(self, items: Sequence[Union[ContextItem, tuple]]) -> ScoreResult:
        t0 = time.perf_counter()
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
        """The log-probability sum of each job's target (`ExampleArrays`) under one model: each distinct
        source through the encoder once, its states packed into one [source tokens, H] tensor; then the
        decoder over batches planned on source and target length together (`batching.plan_batches`),
        each row's encoder states gathered from the packed tensor in one index. Nothing is read back from
        the device until every batch has been queued: the host builds the next batch while the device
        runs this one."""
        budget = self.batch_tokens
        dev = self.device
        pad_id, bos = self.tokenizer.pad_id, self.tokenizer.bos_id
        shape = model_shape(model)
        src, tgt = ex.src, ex.tgt
        plan_args = dict(max_padding=self.max_padding, min_tokens=budget // self.min_batch_share)
        # what a padded position of a decoder row costs, source against target: per layer 4d^2 for the
        # cross-attention keys and values of a source position, 12d^2 + 4df for a target position
        # (sentsim.context.flops; ~1 : 7 at f = 4d)
        dec_weights = (1.0, (12 * shape.d ** 2 + 4 * shape.d * shape.ffn_dec) / (4 * shape.d ** 2))
        stats["encoder_rows"] += len(src)
        stats["decoder_rows"] += len(ex)
        if not len(ex):
            return np.zeros(0)
        # 1. encoder batches, alike in length; each source's states land at packed[start[j]:start[j] + len]
        plan = plan_batches(src.lengths, np.zeros(len(src), np.int64), budget, weights=(1.0, 0.0), **plan_args)
        in_order = np.concatenate(plan)
        start = np.empty(len(src), dtype=np.int64)
        start[in_order] = np.cumsum(src.lengths[in_order]) - src.lengths[in_order]
        n_packed = int(src.lengths.sum())
        packed = None  # [n_packed + 1, H]: the last row stays zero, the states of a decoder row's padding
        at = 0
        for rows in plan:
            sl = src.lengths[rows]
            width = int(sl.max())
            tokens, slots, real = src.take(rows, width, pad_id)
            t = self.h2d({"src": tokens, "slots": slots, "mask": real, "real": np.flatnonzero(real)})
            with self._autocast():
                h = model.encode(t["src"], t["slots"], t["mask"])
            if packed is None:
                packed = torch.zeros(n_packed + 1, h.shape[-1], dtype=h.dtype, device=dev)
            n_real = int(sl.sum())
            packed[at:at + n_real] = h.reshape(-1, h.shape[-1]).index_select(0, t["real"])
            at += n_real
            n_padded = len(rows) * width
            stats["flops"] += encoder_flops(shape, len(rows), width)
            stats["encoder_real_tokens"] += n_real
            stats["encoder_padded_tokens"] += n_padded
            stats["real_tokens"] += n_real
            stats["padded_tokens"] += n_padded
            stats["encoder_batches"] += 1
        # 2. decoder batches over (source length, target length)
        sums = torch.zeros(len(ex), dtype=torch.float64, device=dev)
        job_src_len = src.lengths[ex.job_src]
        for rows in plan_batches(job_src_len, tgt.lengths, budget, weights=dec_weights, **plan_args):
            batch = collate_targets(tgt, rows, pad_id, bos)
            labels = batch["labels"]
            T = labels.shape[1]
            pos = np.flatnonzero(labels.reshape(-1) >= 0)  # the scored positions, row by row
            sl = job_src_len[rows]
            S = int(sl.max())
            real = np.arange(S) < sl[:, None]
            gather = np.where(real, start[ex.job_src[rows]][:, None] + np.arange(S), n_packed)
            t = self.h2d({"dec_in": batch["dec_in"], "dec_slots": batch["dec_slots"],
                          "targets": labels.reshape(-1)[pos], "pos": pos, "row": pos // T,
                          "gather": gather, "mask": real, "out": rows})
            h = packed.index_select(0, t["gather"].reshape(-1)).view(len(rows), S, -1)
            with self._autocast():
                hidden = model.decoder_states(h, t["mask"], t["dec_in"], t["dec_slots"])
                logits = model.project(hidden.reshape(-1, hidden.shape[-1]).index_select(0, t["pos"]))
            tok_lp = -F.cross_entropy(logits.float(), t["targets"], reduction="none")
            row_sums = torch.zeros(len(rows), dtype=torch.float64, device=dev).index_add_(0, t["row"], tok_lp.double())
            sums.index_copy_(0, t["out"], row_sums)
            n_real = len(pos)
            stats["flops"] += decoder_flops(shape, len(rows), S, T, n_real)
            stats["decoder_real_tokens"] += n_real
            stats["decoder_padded_tokens"] += labels.size
            stats["real_tokens"] += n_real
            stats["padded_tokens"] += labels.size
            stats["target_tokens"] += n_real
            stats["decoder_batches"] += 1
        return sums.cpu().numpy()  # the one read back
