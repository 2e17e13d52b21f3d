"""A finished fit's record fingerprints its loop settings, so `LoopSettings.record()` must give, for every
trainer, the dict that trainer built before the settings were typed: the dicts below are those, spelt as they
were. A change here changes the fingerprint of every finished training run of that trainer."""

from __future__ import annotations

import math

import pytest

from sentsim.training.settings import LoopSettings


def _section_dict(cfg, *, label, total_steps, verbose=True, **over) -> dict:
    keys = ("epochs", "batch_size", "lr", "weight_decay", "max_grad_norm", "eval_every", "seed", "use_gpu", "bf16",
            "num_workers", "cpus_per_worker", "checkpoints_to_keep")
    loop = {k: getattr(cfg, k) for k in keys}
    # the thread count was rounded (1.5 -> 2) before worker_threads; a fit recorded so is still recognised
    # (test_a_fit_recorded_with_the_rounded_thread_count_is_still_finished)
    loop.update(label=label, total_steps=total_steps, verbose=verbose, log_every=getattr(cfg, "log_every", None),
                cpu_threads=max(1, math.floor(cfg.cpus_per_worker)), drop_last=False, shuffle_buffer=0,
                optimizer="adamw", schedule="linear", warmup_steps=int(cfg.warmup_ratio * total_steps))
    loop.update(over)
    return loop


@pytest.mark.parametrize("sets", [{}, {"lr": 3e-4, "batch_size": 7, "cpus_per_worker": 1.5, "warmup_ratio": 0.25,
                                       "bf16": False, "use_gpu": True, "eval_every": 11}])
def test_surrogate_and_student_settings_record_as_before(sets):
    from sentsim.students.config import StudentSettings
    from sentsim.surrogate.config import SurrogateConfig

    for cfg in (SurrogateConfig.model_validate(sets), StudentSettings.model_validate(sets)):
        got = LoopSettings.from_section(cfg, label="x", total_steps=40).record()
        assert got == _section_dict(cfg, label="x", total_steps=40)
        over = {"epochs": 3, "lr": 1e-5, "max_seconds": 9.0}
        got = LoopSettings.from_section(cfg, label="y", total_steps=5, verbose=False, **over).record()
        assert got == _section_dict(cfg, label="y", total_steps=5, verbose=False, **over)


@pytest.mark.parametrize("sets", [{}, {"lr": 1e-4, "beta2": 0.98, "use_gpu": "no", "bf16": "off", "log_every": 0,
                                       "max_seconds": 60.0, "torch_threads": 2, "checkpoint_every": 50}])
def test_context_settings_record_as_before(sets):
    from sentsim.context.config import ContextTrainConfig

    cfg = ContextTrainConfig.model_validate(sets)
    before = {
        "label": "context fwd", "verbose": True, "total_steps": cfg.max_steps, "epochs": 1, "seed": cfg.seed,
        "batch_size": None, "drop_last": False, "shuffle_buffer": 0,
        "optimizer": "adam", "lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "weight_decay": cfg.weight_decay,
        "schedule": cfg.schedule, "warmup_steps": cfg.warmup_steps, "max_grad_norm": cfg.grad_clip,
        "eval_every": cfg.eval_every, "checkpoint_every": cfg.checkpoint_every, "log_every": cfg.log_every or None,
        "max_seconds": cfg.max_seconds, "bf16": cfg.bf16 == "auto", "cpu_bf16": True,
        "cpu_threads": cfg.torch_threads, "use_gpu": {"auto": None, "yes": True, "no": False}[cfg.use_gpu],
        "num_workers": cfg.num_workers, "cpus_per_worker": cfg.cpus_per_worker, "checkpoints_to_keep": 2,
        "max_failures": 2,
    }
    record = LoopSettings.for_context(cfg, "fwd").record()
    # optional settings left unset were never in the dict; set ones were, with these values
    assert record == {k: v for k, v in before.items() if v is not None or k not in
                      ("betas", "checkpoint_every", "max_seconds", "cpu_bf16", "max_failures", "sync_every")}


@pytest.mark.parametrize("sets", [{}, {"lr": 0.01, "eval_every": 7, "cpus_per_worker": 0.5, "batch_size": 16}])
def test_discriminator_settings_record_as_before(sets):
    from sentsim.discriminator.train import TrainConfig

    tc = TrainConfig.model_validate(sets)
    total = 120
    before = {
        "label": "discriminator", "verbose": True, "total_steps": total, "epochs": 4,
        "seed": tc.seed, "batch_size": tc.batch_size, "drop_last": False, "shuffle_buffer": 0,
        "optimizer": "adamw", "lr": tc.lr, "betas": (0.9, 0.999), "weight_decay": tc.weight_decay,
        "schedule": "cosine", "warmup_steps": int(0.1 * total), "max_grad_norm": tc.grad_clip,
        "eval_every": tc.eval_every or total, "log_every": None, "bf16": False, "use_gpu": False,
        "cpu_threads": max(1, int(tc.cpus_per_worker)), "num_workers": tc.num_workers,
        "cpus_per_worker": tc.cpus_per_worker, "checkpoints_to_keep": 2,
    }
    assert LoopSettings.for_discriminator(tc, total_steps=total, epochs=4).record() == before


@pytest.mark.parametrize("cpus", [0.25, 0.5, 1.0, 1.5, 1.99, 2.0, 2.5, 3.7])
def test_every_trainer_runs_the_whole_cpus_of_its_share_as_threads(cpus):
    """One rule for a CPU worker's torch threads, in every trainer that derives them: the whole CPUs Ray gives
    it, at least 1, so that workers never run more threads than the CPUs they hold (1.5 each: 1, not 2)."""
    from sentsim.discriminator.train import TrainConfig
    from sentsim.students.config import StudentSettings
    from sentsim.surrogate.config import SurrogateConfig

    got = {LoopSettings.from_section(SurrogateConfig.model_validate({"cpus_per_worker": cpus}), label="s",
                                     total_steps=4).cpu_threads,
           LoopSettings.from_section(StudentSettings.model_validate({"cpus_per_worker": cpus}), label="t",
                                     total_steps=4).cpu_threads,
           LoopSettings.for_discriminator(TrainConfig.model_validate({"cpus_per_worker": cpus}), total_steps=4,
                                          epochs=1).cpu_threads}
    assert got == {max(1, math.floor(cpus))} and max(got) <= max(1.0, cpus)


def test_a_fit_recorded_with_the_rounded_thread_count_is_still_finished(tmp_path):
    """A surrogate or student fit at 1.5 CPUs a worker was recorded with 2 threads: run again, it is still the
    finished fit (nothing to do), not exported again; a fit of other settings is not."""
    from dataclasses import replace

    from sentsim.surrogate.config import SurrogateConfig
    from sentsim.training.run import FitRecord

    loop = LoopSettings.from_section(SurrogateConfig.model_validate({"cpus_per_worker": 1.5}), label="x", total_steps=4)
    assert loop.cpu_threads == 1
    (tmp_path / "checkpoint").mkdir()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    FitRecord(tmp_path, "x", "inline", {"loop": replace(loop, cpu_threads=2), "cfg": {}}).write(
        {"model": model, "history": [{"step": 4}], "gpu": False, "result": {}})
    assert FitRecord(tmp_path, "x", "inline", {"loop": loop, "cfg": {}}).finished()["history"] == [{"step": 4}]
    assert FitRecord(tmp_path, "x", "inline", {"loop": replace(loop, lr=0.5), "cfg": {}}).finished() is None
