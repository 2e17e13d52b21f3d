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

from sentsim.context.batching import HostToDevice, collate_np, padded, plan_batches
from sentsim.context.config import DIRECTIONS, ScorerConfig
from sentsim.context.flops import decoder_flops, encoder_flops, model_shape
from sentsim.context.model import ContextModel, load_bundle
from sentsim.context.windows import build_example
from sentsim.errors import UsageError
from sentsim.hardware import prefer_shape_free_attention, resolve_autocast

TERMS = ("disc", "fwd", "left", "right")
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


def _as_list(ctx: Context) -> list[str]:
    if ctx is None:
        return []
    if isinstance(ctx, str):
        return [ctx] if ctx.strip() else []
    return [c for c in ctx if c and c.strip()]


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
        norm: list[ContextItem] = []
        for it in items:
            if not isinstance(it, ContextItem):
                it = ContextItem(*it)
            norm.append(ContextItem(it.sentence or "", _as_list(it.left), _as_list(it.right), it.log_p_disc))
        n = len(norm)
        self._encode_texts([t for it in norm for t in (it.sentence, *it.left, *it.right)])
        mc = self.model_config
        k = mc.context_sentences
        ids = self.tokenizer.ids
        tc = self._tok_cache

        lp_sum = {d: np.full(n, np.nan) for d in DIRECTIONS}
        n_tok = {d: np.zeros(n, dtype=np.int64) for d in DIRECTIONS}
        trunc = {d: np.zeros(n, dtype=np.int64) for d in DIRECTIONS}
        stats = defaultdict(float)
        active = self.active_directions()
        # jobs grouped by model object: a shared model serves all directions in one schedule
        by_model: dict[int, list] = defaultdict(list)
        model_of: dict[int, ContextModel] = {}
        for d in active:
            m = self.models[d]
            model_of[id(m)] = m
            for i, it in enumerate(norm):
                ex = build_example(ids, k, d, [tc[x] for x in it.left], tc[it.sentence], [tc[x] for x in it.right],
                                   mc.max_source_tokens, mc.max_target_tokens)
                if ex is None:
                    continue
                trunc[d][i] = ex.src_truncated + ex.tgt_truncated
                n_tok[d][i] = len(ex.tgt)
                by_model[id(m)].append((i, d, ex))
        with torch.inference_mode():
            for mid, jobs in by_model.items():
                self._run_jobs(model_of[mid], jobs, lp_sum, stats)

        logprob = {}
        for d in DIRECTIONS:
            with np.errstate(invalid="ignore", divide="ignore"):
                logprob[d] = np.where(n_tok[d] > 0, lp_sum[d] / np.maximum(n_tok[d], 1), np.nan)
        score, dropped = self.combine(logprob, [it.log_p_disc for it in norm])
        stats["items"] = n
        stats["seconds"] = time.perf_counter() - t0
        for d in DIRECTIONS:
            stats[f"truncated_items_{d}"] = int((trunc[d] > 0).sum())
        pad = stats.get("padded_tokens", 0.0)
        stats["padding_fraction"] = (1.0 - stats.get("real_tokens", 0.0) / pad) if pad else 0.0
        for k in ("items", "seconds", "flops", "real_tokens", "padded_tokens"):
            self.totals[k] = self.totals.get(k, 0.0) + stats.get(k, 0.0)
        return ScoreResult(score, logprob, lp_sum, n_tok, trunc, dropped, dict(stats))

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

    def _run_jobs(self, model: ContextModel, jobs: list, lp_sum: dict, stats: dict) -> None:
        """Score the (item, direction, Example) jobs of one model: each distinct source through the encoder
        once (sorted by length, batched under the token budget), then the decoder over batches planned on
        source and target length together (`batching.plan_batches`), gathering each row's encoder states.
        Nothing is read back from the device until every batch has been queued: the host builds the next
        batch while the device runs this one."""
        budget = self.batch_tokens
        dev = self.device
        pad_id, bos = self.tokenizer.pad_id, self.tokenizer.bos_id
        shape = model_shape(model)
        # 1. distinct sources
        src_index: dict[tuple, int] = {}
        srcs: list = []
        job_src = np.empty(len(jobs), dtype=np.int64)
        for q, (_, _, ex) in enumerate(jobs):
            key = (tuple(ex.src), tuple(ex.src_slots))
            j = src_index.get(key)
            if j is None:
                j = src_index[key] = len(srcs)
                srcs.append(ex)
            job_src[q] = j
        stats["encoder_rows"] += len(srcs)
        stats["decoder_rows"] += len(jobs)
        # 2. encoder batches: sorted by length, so each is padded to within a token or two
        src_len = np.fromiter((len(e.src) for e in srcs), np.int64, len(srcs))
        order = np.argsort(src_len, kind="stable")
        enc_out: list = []  # per encoder batch: (states [b, L, H], mask [b, L])
        loc_batch = np.empty(len(srcs), dtype=np.int64)  # distinct source -> (encoder batch, row)
        loc_row = np.empty(len(srcs), dtype=np.int64)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * int(src_len[order[end]]) <= budget:
                end += 1
            rows = order[start:end]
            sl = src_len[rows]
            width = int(sl.max())
            arrays = {"src": padded([srcs[j].src for j in rows], sl, width, pad_id),
                      "slots": padded([srcs[j].src_slots for j in rows], sl, width, 0),
                      "mask": (np.arange(width) < sl[:, None]).astype(np.int32)}
            t = self.h2d(arrays)
            with self._autocast():
                h = model.encode(t["src"], t["slots"], t["mask"])
            loc_batch[rows] = len(enc_out)
            loc_row[rows] = np.arange(len(rows))
            enc_out.append((h, t["mask"]))
            real, n_padded = int(sl.sum()), len(rows) * width
            stats["flops"] += encoder_flops(shape, len(rows), width)
            stats["encoder_real_tokens"] += real
            stats["encoder_padded_tokens"] += n_padded
            stats["real_tokens"] += real
            stats["padded_tokens"] += n_padded
            start = end
        # 3. decoder batches over (source length, target length)
        tgt_len = np.fromiter((len(ex.tgt) for _, _, ex in jobs), np.int64, len(jobs))
        sums = torch.zeros(len(jobs), dtype=torch.float64, device=dev)
        for rows in plan_batches(src_len[job_src], tgt_len, budget):
            exs = [jobs[q][2] for q in rows]
            batch = collate_np(exs, pad_id, bos)
            labels = batch["labels"]
            T = labels.shape[1]
            pos = np.flatnonzero(labels.reshape(-1) >= 0)  # the scored positions, row by row
            S = int(src_len[job_src[rows]].max())
            # each row's encoder states: rows of the same encoder batch taken together, padded to S
            eb = loc_batch[job_src[rows]]
            groups = np.unique(eb)
            perm = np.concatenate([np.flatnonzero(eb == b) for b in groups])  # batch row of each gathered row
            t = self.h2d({"dec_in": batch["dec_in"], "dec_slots": batch["dec_slots"],
                                  "targets": labels.reshape(-1)[pos], "pos": pos, "row": pos // T,
                                  "enc_rows": loc_row[job_src[rows]][perm], "inverse": np.argsort(perm),
                                  "out": rows})
            parts_h, parts_m, at = [], [], 0
            for b in groups:
                n = int((eb == b).sum())
                h, m = enc_out[b]
                idx = t["enc_rows"][at:at + n]
                at += n
                hb, mb = h.index_select(0, idx), m.index_select(0, idx)
                if hb.shape[1] < S:
                    hb = F.pad(hb, (0, 0, 0, S - hb.shape[1]))
                    mb = F.pad(mb, (0, S - mb.shape[1]))
                parts_h.append(hb[:, :S])
                parts_m.append(mb[:, :S])
            h = torch.cat(parts_h).index_select(0, t["inverse"])
            m = torch.cat(parts_m).index_select(0, t["inverse"])
            with self._autocast():
                hidden = model.decoder_states(h, m, t["dec_in"], t["dec_slots"])
                logits = model.project(hidden.reshape(-1, hidden.shape[-1]).index_select(0, t["pos"]))
            tok_lp = -F.cross_entropy(logits.float(), t["targets"], reduction="none")
            row_sums = torch.zeros(len(rows), dtype=torch.float64, device=dev).index_add_(0, t["row"], tok_lp.double())
            sums.index_copy_(0, t["out"], row_sums)
            real = len(pos)
            stats["flops"] += decoder_flops(shape, len(rows), S, T, real)
            stats["decoder_real_tokens"] += real
            stats["decoder_padded_tokens"] += labels.size
            stats["real_tokens"] += real
            stats["padded_tokens"] += labels.size
            stats["target_tokens"] += real
            stats["decoder_batches"] += 1
        out = sums.cpu().numpy()  # the one read back
        for q, (i, d, _) in enumerate(jobs):
            lp_sum[d][i] = out[q]
