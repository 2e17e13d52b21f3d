"""bf16 only where it is native (sentsim/hardware.py): the detection, and what the trainer and scorer do with it."""

from __future__ import annotations

import pytest
import torch

from sentsim import hardware
from sentsim.context.config import ContextModelConfig, ContextTrainConfig, ScorerConfig
from sentsim.context.model import build_model, save_bundle
from sentsim.context.tokenizer import train_bpe

TINY = dict(vocab_size=300, d_model=32, encoder_layers=1, decoder_layers=1, attention_heads=2, ffn_dim=64,
            dropout=0.0, context_sentences=1, max_source_tokens=48, max_target_tokens=24)


def test_flags_decide_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv("SENTSIM_CPU_BF16", raising=False)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(hardware.platform, "system", lambda: "Linux")
    assert not hardware.cpu_bf16_native()
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert hardware.cpu_bf16_native()
    monkeypatch.setenv("SENTSIM_CPU_BF16", "0")
    assert not hardware.cpu_bf16_native()
    monkeypatch.setenv("SENTSIM_CPU_BF16", "1")
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset())
    assert hardware.cpu_bf16_native() and hardware.bf16_native("cpu")
    assert "bf16 native" in hardware.describe()


def test_this_machines_flags_are_read(monkeypatch):
    monkeypatch.delenv("SENTSIM_CPU_BF16", raising=False)
    flags = hardware.cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo here")
    assert "sse2" in flags or "fp" in flags  # x86 or Arm: a real flags line was parsed
    assert hardware.cpu_bf16_native() == bool(flags & hardware.BF16_CPU_FLAGS)


@pytest.fixture(scope="module")
def bundle(speech_corpus, tmp_path_factory):
    import pyarrow.dataset as ds

    texts = ds.dataset(str(speech_corpus / "sentences")).to_table(columns=["text"]).column("text").to_pylist()
    tok = train_bpe(texts[:2000], 300)
    cfg = ContextModelConfig(**TINY)
    out = tmp_path_factory.mktemp("hw") / "ctx"
    model = build_model(cfg, tok, seed=0)
    save_bundle(out, cfg, tok, {"shared": model}, {d: "shared" for d in ("fwd", "left", "right")})
    return out


@pytest.mark.parametrize("forced", ["0", "1"])
def test_scorer_autocast_follows_the_hardware(bundle, monkeypatch, forced):
    from sentsim.context.scorer import ContextItem, ContextScorer

    monkeypatch.setenv("SENTSIM_CPU_BF16", forced)
    sc = ContextScorer(str(bundle), ScorerConfig(device="cpu", torch_threads=1))
    assert sc.autocast_dtype == (torch.bfloat16 if forced == "1" else None)
    res = sc.score([ContextItem("The nation is strong.", "We met today.", "Taxes were cut.")])
    assert res.score.shape == (1,) and bool(torch.isfinite(torch.tensor(res.score)).all())
    # an explicit setting wins over the detection
    assert ContextScorer(str(bundle), ScorerConfig(device="cpu", autocast="off")).autocast_dtype is None


@pytest.mark.parametrize("forced,bf16", [("0", "auto"), ("1", "auto"), ("1", "off")])
def test_context_training_uses_bf16_only_where_native(speech_corpus, tmp_path, monkeypatch, capsys, forced, bf16):
    from sentsim.context.train import train_context

    monkeypatch.setenv("SENTSIM_CPU_BF16", forced)
    cfg = ContextTrainConfig.model_validate({
        "model": TINY, "direction": "right", "executor": "inline", "use_gpu": "no", "bf16": bf16, "torch_threads": 1,
        "max_steps": 2, "eval_every": 2, "checkpoint_every": 2, "heldout_percent": 20, "heldout_windows": 8,
        "batch_tokens": 512, "tokenizer_sentences": 2000})
    summary = train_context(str(speech_corpus), str(tmp_path / "m"), cfg)
    line = next(x for x in capsys.readouterr().out.splitlines() if "worker(s) on" in x)
    assert ("on cpu bf16;" in line) == (forced == "1" and bf16 == "auto"), line
    assert summary["runs"]["right"]["steps"] == 2


def test_target_token_budget_stops_training(speech_corpus, tmp_path):
    from sentsim.context.train import train_context

    cfg = ContextTrainConfig.model_validate({
        "model": TINY, "direction": "right", "executor": "inline", "use_gpu": "no", "torch_threads": 1,
        "max_steps": 1000, "max_target_tokens": 300, "eval_every": 1000, "checkpoint_every": 1000,
        "heldout_percent": 20, "heldout_windows": 8, "batch_tokens": 512, "tokenizer_sentences": 2000})
    run = train_context(str(speech_corpus), str(tmp_path / "m"), cfg)["runs"]["right"]
    assert 300 <= run["target_tokens_seen"] < 300 + 512 and run["steps"] < 1000


def test_a_harvest_resolves_its_scoring_format_once(monkeypatch):
    """What `scoring.autocast: auto` becomes for a harvest: this CPU's format for CPU scoring, the stored
    run's on a resume (said in one line), and left to the actors where the driver cannot see their GPUs."""
    from pydantic import ValidationError

    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.job import scoring_precision

    def cfg(**over):
        return HarvestConfig.model_validate({"corpus": "c", "index": "i", "context_models": ["m"], "out": "o", **over})

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SENTSIM_CPU_BF16", "0")
    assert scoring_precision(cfg(), None, False, "ray") == ("off", None)
    monkeypatch.setenv("SENTSIM_CPU_BF16", "1")
    assert scoring_precision(cfg(), None, False, "inline") == ("bf16", None)
    # resumed here, begun where bf16 was not native: fp32 still, and said
    fmt, note = scoring_precision(cfg(), {"scoring_precision": "off"}, False, "ray")
    assert fmt == "off" and "the format this run began in" in note and "would pick bf16" in note
    assert scoring_precision(cfg(), {"scoring_precision": "off"}, True, "ray") == ("bf16", None)  # --force-new
    fmt, note = scoring_precision(cfg(), {"fingerprint": "x"}, False, "ray")  # a run from before the key
    assert fmt == "bf16" and "does not record" in note
    # GPU actors that this driver cannot see: each actor resolves auto on its own GPU
    gpu = cfg(resources={"scoring": {"num_gpus": 1}})
    assert scoring_precision(gpu, None, False, "ray") == ("auto", None)
    assert scoring_precision(cfg(scoring={"autocast": "fp16"}), None, False, "ray") == ("fp16", None)
    with pytest.raises(ValidationError, match="scoring.device"):
        cfg(scoring={"device": "gpu"})
