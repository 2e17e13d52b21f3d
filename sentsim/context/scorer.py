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

from sentsim.context.config import DIRECTIONS, ScorerConfig
from sentsim.context.model import ContextModel, load_bundle
from sentsim.context.windows import build_example
from sentsim.errors import UsageError
from sentsim.hardware import resolve_autocast

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
        budget = self.config.batch_tokens
        dev = self.device
        pad_id = self.tokenizer.pad_id
        bos = self.tokenizer.bos_id
        # 1. unique sources
        src_index: dict[tuple, int] = {}
        srcs: list = []
        job_src = []
        for _, _, ex in jobs:
            key = (tuple(ex.src), tuple(ex.src_slots))
            j = src_index.get(key)
            if j is None:
                j = src_index[key] = len(srcs)
                srcs.append(ex)
            job_src.append(j)
        stats["encoder_rows"] += len(srcs)
        stats["decoder_rows"] += len(jobs)
        # 2. encoder batches, sorted by length, under the token budget
        order = sorted(range(len(srcs)), key=lambda j: len(srcs[j].src))
        loc = [None] * len(srcs)  # unique source -> (encoder batch, row)
        enc_out: list = []
        batch: list[int] = []

        def flush_enc(rows):
            L = len(srcs[rows[-1]].src)
            x = torch.full((len(rows), L), pad_id, dtype=torch.long)
            sl = torch.zeros((len(rows), L), dtype=torch.long)
            mask = torch.zeros((len(rows), L), dtype=torch.long)
            for r, j in enumerate(rows):
                e = srcs[j]
                x[r, :len(e.src)] = torch.tensor(e.src)
                sl[r, :len(e.src)] = torch.tensor(e.src_slots)
                mask[r, :len(e.src)] = 1
            with self._autocast():
                h = model.encode(x.to(dev), sl.to(dev), mask.to(dev))
            b = len(enc_out)
            enc_out.append((h, mask.to(dev)))
            for r, j in enumerate(rows):
                loc[j] = (b, r)
            stats["encoder_real_tokens"] += int(mask.sum())
            stats["encoder_padded_tokens"] += mask.numel()
            stats["real_tokens"] += int(mask.sum())
            stats["padded_tokens"] += mask.numel()

        for j in order:
            L = len(srcs[j].src)
            if batch and (len(batch) + 1) * L > budget:
                flush_enc(batch)
                batch = []
            batch.append(j)
        if batch:
            flush_enc(batch)
        # 3. decoder jobs sorted by (target length, source length), batched under the budget
        jorder = sorted(range(len(jobs)), key=lambda q: (len(jobs[q][2].tgt), len(srcs[job_src[q]].src)))
        cur: list[int] = []
        max_t = max_s = 0

        def flush_dec(qs):
            T = max(len(jobs[q][2].tgt) for q in qs)
            dec_in = torch.full((len(qs), T), pad_id, dtype=torch.long)
            dec_sl = torch.zeros((len(qs), T), dtype=torch.long)
            labels = torch.full((len(qs), T), -100, dtype=torch.long)
            for r, q in enumerate(qs):
                e = jobs[q][2]
                t = len(e.tgt)
                dec_in[r, 0] = bos
                dec_in[r, 1:t] = torch.tensor(e.tgt[:-1], dtype=torch.long)
                dec_sl[r, 1:t] = torch.tensor(e.tgt_slots[:-1], dtype=torch.long)
                labels[r, :t] = torch.tensor(e.tgt, dtype=torch.long)
            # gather the shared encoder outputs
            S = max(len(srcs[job_src[q]].src) for q in qs)
            groups = defaultdict(list)
            for r, q in enumerate(qs):
                b, row = loc[job_src[q]]
                groups[b].append((r, row))
            parts_h, parts_m, pos = [], [], []
            for b, lst in groups.items():
                h, m = enc_out[b]
                rows = torch.tensor([row for _, row in lst], device=dev)
                hb, mb = h.index_select(0, rows), m.index_select(0, rows)
                if hb.shape[1] < S:
                    hb = F.pad(hb, (0, 0, 0, S - hb.shape[1]))
                    mb = F.pad(mb, (0, S - mb.shape[1]))
                parts_h.append(hb[:, :S])
                parts_m.append(mb[:, :S])
                pos.extend(r for r, _ in lst)
            h = torch.cat(parts_h) if len(parts_h) > 1 else parts_h[0]
            m = torch.cat(parts_m) if len(parts_m) > 1 else parts_m[0]
            if len(parts_h) > 1 or pos != list(range(len(qs))):
                inv = torch.empty(len(qs), dtype=torch.long)
                inv[torch.tensor(pos)] = torch.arange(len(qs))
                inv = inv.to(dev)
                h, m = h.index_select(0, inv), m.index_select(0, inv)
            with self._autocast():
                logits = model.decode(h, m, dec_in.to(dev), dec_sl.to(dev))
            lab = labels.to(dev)
            tok_lp = -F.cross_entropy(logits.float().transpose(1, 2), lab, ignore_index=-100, reduction="none")
            sums = tok_lp.masked_fill(lab < 0, 0.0).sum(1).double().cpu().numpy()
            for r, q in enumerate(qs):
                i, d, _ = jobs[q]
                lp_sum[d][i] = sums[r]
            real = int((labels >= 0).sum())
            stats["decoder_real_tokens"] += real
            stats["decoder_padded_tokens"] += labels.numel()
            stats["real_tokens"] += real
            stats["padded_tokens"] += labels.numel()
            stats["target_tokens"] += real
            stats["decoder_batches"] += 1

        for q in jorder:
            t, s = len(jobs[q][2].tgt), len(srcs[job_src[q]].src)
            nt, ns = max(max_t, t), max(max_s, s)
            if cur and (len(cur) + 1) * (nt + ns) > budget:
                flush_dec(cur)
                cur, nt, ns = [], t, s
            cur.append(q)
            max_t, max_s = nt, ns
        if cur:
            flush_dec(cur)
