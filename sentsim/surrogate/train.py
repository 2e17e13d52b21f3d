"""Surrogate training: validate the inputs on the driver, then one run per stage through the shared loop
(sentsim.training): on Ray Train (TorchTrainer, DDP over `num_workers`, data streamed by ray.data), or
inline (--executor inline: this process as the one worker, the data read into pyarrow Tables, no Ray).

`SurrogateRun` is the surrogate's sentsim.training.driver.EncoderDriver. Stages: "harvest" (fit the
harvested Origin scores, paper section 3.4) and optionally "finetune-sts" (continue on STS-B train with
L2, section 4.1). What is the surrogate's own: the
harvest checks (data.py), the step and the dev/test metric (trainee.py), the export to a
sentence-transformers or CrossEncoder folder (sentsim.training.encoder_models) and the curves' panels.

OUT/ holds model/ (and model-sts/; each with its card README.md, swapped in whole by sentsim.model_swap),
curves/<stage>.json and .png, run.json, summary.json and ray/<stage> (Ray Train checkpoints) or
checkpoint/<stage> (inline): running the same command again with the same --out resumes from the latest
checkpoint (model, optimizer, scheduler, step and curves), and a finished stage is not redone, whichever
executor asks for it. The executor is not part of the run's identity (sentsim.training.driver): a stage's
state on the other executor is not read, so it is finished there or refused, as the student's is.
"""

from __future__ import annotations

from pathlib import Path

from sentsim.errors import UsageError
from sentsim.surrogate.config import SurrogateConfig
from sentsim.training.config import TRAINING_FORMAT
from sentsim.training.driver import EncoderDriver
from sentsim.training.run import (
    TrainingDiverged,
    capped_note,
    check_fit,
    epoch_cap_note,
    epoch_shortfall,
    fit,
    plan_steps,
    steps_per_epoch,
    training_extent,
)
from sentsim.training.settings import LoopSettings

__all__ = ["SurrogateRun", "TrainingDiverged", "train_surrogate"]


FINETUNE_LOSS = "cosine_regression"
LOSSES = {"cosine_regression": "L2 between the predicted similarity and the target (paper section 3.4)",
          "cosent": "CoSENT: the order of the predicted similarities against the targets' order"}
PREDICTS = {"siamese": "the cosine of the two mean-pooled sentence vectors",
            "cross": "a regression head on [CLS] s1 [SEP] s2 (identity activation)"}


def stage_card(name: str, cfg: SurrogateConfig, spec: dict, base: dict, data: dict, rows: dict,
               workers: int) -> dict:
    """What the stage's model card says it is (sentsim.training.model_card); `workers`: those it trained on."""
    settings = {k: spec[k] for k in ("epochs", "batch_size", "lr", "max_steps")}
    settings.update({k: getattr(cfg, k) for k in ("arch", "warmup_ratio", "weight_decay", "max_seq_length")})
    settings.update(num_workers=workers, seed=cfg.seed)
    loss = spec.get("loss", cfg.loss)  # the fine-tune stage's own, when it differs
    settings["loss"] = loss
    return {"kind": "surrogate", "title": f"sentsim surrogate ({cfg.arch}, {name} stage)",
            "summary": f"A surrogate of the Origin teacher (paper section 3.4): it predicts a pair's similarity as "
                       f"{PREDICTS[cfg.arch]}, trained to reproduce the teacher's scores.",
            "base_model": base, "data": data, "rows": rows, "settings": settings,
            "objective": {"name": loss, "description": LOSSES.get(loss, "")}}


class SurrogateRun(EncoderDriver):
    """The surrogate's steps of the encoder driver: the harvest and STS-B checks, then its stages."""

    kind = "surrogate"

    models = ("model", "model-sts")
    panels = [("dev L2 (mean squared error vs targets)", [("dev_l2", None)], True),
              # teacher scores; STS gold when fine-tuning
              ("Spearman x100 vs targets", [("dev_spearman", "dev"), ("test_spearman", "test")], False)]

    def check_inputs(self) -> None:
        from sentsim.surrogate.data import inspect_harvest

        data, finetune_sts = self.inputs["--data"], self.inputs["--finetune-sts"]
        if not data and not finetune_sts:
            raise UsageError("give --data HARVEST_DIR, --finetune-sts STSB_DIR, or both")
        # every check that can fail does so here, before Ray or any worker starts
        self.harvest = inspect_harvest(data) if data else None
        for warning in self.harvest.loss_warnings(self.cfg.loss) if self.harvest else []:
            print(warning)

    def prepare(self, bb: dict) -> None:
        cfg, harvest, finetune_sts = self.cfg, self.harvest, self.inputs["--finetune-sts"]
        if finetune_sts:
            from sentsim.evaluation.datasets import locate_task
            from sentsim.surrogate.data import stsb_content

            if locate_task(Path(finetune_sts), "STSb-train") is None:
                raise UsageError(f"--finetune-sts {finetune_sts}: no sts-train.csv there (STS-B folder expected)")
        # what the fine-tune stage reads, by its bytes: the folder moved or copied is the same data
        self.sts = stsb_content(finetune_sts) if finetune_sts else None
        note = harvest.incomplete_note() if harvest else None
        if note:
            print(note)
        if harvest:
            print(harvest.training_note() + epoch_shortfall(harvest.scored["train"], self.workers,
                                                            cfg.batch_size, drop_last=False))

    def identity(self, what: dict) -> tuple:
        return what, self.harvest.identity() if self.harvest else None, self.bb, self.sts

    def fingerprint_in_format(self, version: int, stored: dict) -> tuple[str, dict] | None:
        """Format 1 (sentsim/run_formats.py): the config less its top-level RESUMABLE_KEYS only, so with the
        fine-tune stage's budget as the run was first fingerprinted with it (its record's config, then the
        `fingerprinted_with` that keeps it), the harvest by its path and counts (`HarvestInfo.summary`), and
        --finetune-sts by its path as given."""
        from sentsim.identity import fingerprint
        from sentsim.run_formats import spelt_as_stored
        from sentsim.training.config import RESUMABLE_KEYS, resumable_paths

        if version != 1:
            return None
        dump = self.cfg.model_dump()
        nested = [k for k in resumable_paths(dump) if "." in k]
        kept = stored.get("fingerprinted_with")
        if not isinstance(kept, dict):
            kept = {"config": _picked(stored.get("config"), nested)}
        what = spelt_as_stored({k: v for k, v in dump.items() if k not in RESUMABLE_KEYS}, kept, nested)
        return fingerprint(what, self.harvest.summary() if self.harvest else None, self.bb,
                           self.inputs["--finetune-sts"]), kept

    def unfingerprinted(self, version: int = TRAINING_FORMAT) -> tuple:
        if version < 2:  # format 1 knew its inputs by their paths, and recorded nothing of their content
            return super().unfingerprinted(version) + ("data.harvest", "data.pairs_sha256", "finetune_sts.sha256")
        # the harvest and the STS-B files are known by their content
        return super().unfingerprinted(version) + ("data.root", "data.files", "finetune_sts.path")

    def record(self) -> dict:
        sts = self.inputs["--finetune-sts"]
        return {"config": self.cfg.model_dump(), "backbone": self.bb,
                "data": {**self.harvest.summary(), **self.harvest.identity()} if self.harvest else None,
                "finetune_sts": {"path": str(sts), "sha256": self.sts} if sts else None}

    def train(self) -> dict:
        from sentsim.surrogate.data import harvest_datasets, harvest_tables, stsb_datasets, stsb_tables
        from sentsim.training.model_card import base_model, harvest_data

        cfg, harvest, bb, finetune_sts = self.cfg, self.harvest, self.bb, self.inputs["--finetune-sts"]
        inline = self.executor == "inline"  # tables in this process; ray.data datasets for Ray Train
        stages = []  # (name, datasets, training rows, spec, card) of each stage, planned before either trains
        current_backbone, current_init = self.inputs["--backbone"], cfg.init
        base = base_model(bb, cfg.init)
        if harvest:
            spec = {"backbone": bb["path"], "init": cfg.init, "epochs": cfg.epochs, "batch_size": cfg.batch_size,
                    "lr": cfg.lr, "eval_every": cfg.eval_every, "max_steps": cfg.max_steps}
            rows = {"trained": harvest.scored["train"], "total": harvest.rows, "unit": "pairs",
                    "left_out": harvest.left_out, "dev_pairs": harvest.scored["dev"],
                    "test_pairs": harvest.scored["test"]}
            card = stage_card("harvest", cfg, spec, base, harvest_data(harvest.root, harvest.manifest), rows,
                              self.workers)
            datasets = (harvest_tables(harvest, cfg.eval_max_pairs) if inline
                        else harvest_datasets(harvest, cfg.eval_max_pairs, cfg.seed))
            stages.append(("harvest", datasets, harvest.scored["train"], spec, card))
            current_backbone, current_init = str(self.out / "model"), "pretrained"
            base = {"name": None, "path": str(current_backbone), "model_type": bb["model_type"], "init": "pretrained"}
        if finetune_sts:
            ds, counts = (stsb_tables if inline else stsb_datasets)(finetune_sts)
            ft = cfg.finetune
            spec = {"backbone": str(current_backbone), "init": current_init, "epochs": ft.epochs,
                    "batch_size": ft.batch_size, "lr": ft.lr, "eval_every": ft.eval_every, "max_steps": ft.max_steps}
            if cfg.loss != FINETUNE_LOSS:
                # 003 §4.1 fine-tunes with L2 on gold scores / 5; --loss is the harvest stage's (only a spec
                # that differs names it, so that a finished default run keeps its identity)
                spec["loss"] = FINETUNE_LOSS
            rows = {"trained": counts["train"], "total": counts["train"], "unit": "pairs", "dev_pairs": counts["dev"],
                    "test_pairs": counts["test"]}
            data = {"kind": "STS-B train", "path": str(finetune_sts),
                    "targets": "gold scores / 5 (cosine's scale; §4.1 gives the L2 objective)"}
            stages.append(("finetune-sts", ds, counts["train"], spec,
                           stage_card("finetune-sts", cfg, spec, base, data, rows, self.workers)))
        plans = [self.plan(name, n_train, spec) for name, _, n_train, spec, _ in stages]
        for (name, _, _, spec, _), (_, loop) in zip(stages, plans):  # each stage with its own spec
            # every stage's refusals before the first trains or writes its curves: a refused run changes nothing
            check_fit(self.fit_config(loop, spec), name=name, out_dir=self.out, executor=self.executor,
                      inline_dir=f"checkpoint/{name}")
        return {"stages": [self.stage(*stage, *plan) for stage, plan in zip(stages, plans)]}

    def plan(self, name: str, n_train: int, spec: dict) -> tuple[int, LoopSettings]:
        """A stage's steps (refused when no batch fills) and loop settings; its note when capped."""
        cfg = self.cfg
        total = plan_steps(f"stage {name}", n_train, num_workers=self.workers, batch_size=spec["batch_size"],
                           epochs=spec["epochs"], max_steps=spec["max_steps"], drop_last=False)
        note = capped_note(f"surrogate {name}", n_train, total, num_workers=self.workers,
                           batch_size=spec["batch_size"], drop_last=False)
        keys = {"steps_key": "finetune.max_steps", "epochs_key": "--set finetune.epochs=..."} \
            if name == "finetune-sts" else {}
        note = note or epoch_cap_note(f"surrogate {name}", spec["max_steps"], epochs=spec["epochs"],
                                      per_epoch=steps_per_epoch(n_train, self.workers, spec["batch_size"], False),
                                      **keys)
        if note:
            print(note, flush=True)
        loop = LoopSettings.from_section(cfg, label=f"surrogate {name}", total_steps=total, epochs=spec["epochs"],
                                         batch_size=spec["batch_size"], lr=spec["lr"], eval_every=spec["eval_every"],
                                         shuffle_buffer=cfg.shuffle_buffer)
        return total, loop

    def fit_config(self, loop: LoopSettings, spec: dict) -> dict:
        """A stage's loop config, as `fit` takes it (and as its refusals are checked before either stage trains)."""
        from sentsim.surrogate.trainee import build_trainee

        return {"build": build_trainee, "loop": loop, "cfg": self.cfg.model_dump(), "stage": spec}

    def stage(self, name: str, datasets: dict, n_train: int, spec: dict, card: dict, total: int,
              loop: LoopSettings) -> dict:
        """Train one stage (on Ray Train, or inline) and export its model; returns the stage summary."""
        from sentsim.training.encoder_models import export_model
        from sentsim.training.model_card import final_metrics

        cfg, out = self.cfg, self.out
        model_dir = out / ("model" if name == "harvest" else "model-sts")
        extent = training_extent(total, n_train, num_workers=self.workers, batch_size=spec["batch_size"],
                                 drop_last=False)
        run = fit(self.fit_config(loop, spec), name=name,
                  out_dir=out, datasets=datasets, executor=self.executor, inline_dir=f"checkpoint/{name}",
                  hint="training stopped (check the scores' scale, or lower --set lr=...)",
                  export=lambda d: export_model(d / "model", model_dir, cfg.arch, cfg.max_seq_length, card={
                      **card, "training": {**extent, "epochs": spec["epochs"], "final": final_metrics(d)}}))
        history = run["history"]
        self.curves(history, name, f"surrogate ({cfg.arch}, {spec['init']}) - {name}")
        return {"stage": name, "model": str(model_dir), "train_pairs": n_train, "total_steps": total,
                "gpu": run["gpu"], "first": history[0], "last": history[-1]}


def _picked(config, keys: list) -> dict:
    """The dotted `keys` of a stored config that it holds, as a config of those alone."""
    out: dict = {}
    for key in keys:
        *parents, leaf = key.split(".")
        here, there = out, config
        for p in parents:
            there = there.get(p) if isinstance(there, dict) else None
            here = here.setdefault(p, {})
        if isinstance(there, dict) and leaf in there:
            here[leaf] = there[leaf]
    return out


def train_surrogate(cfg: SurrogateConfig, *, data: str | None, backbone: str, out: str,
                    finetune_sts: str | None = None, address: str | None = None, executor: str = "ray",
                    force_new: bool = False) -> dict:
    """Validate every input, then run the stages (`executor`: "ray", or "inline": this process, no Ray).
    Returns the run summary (also OUT/summary.json)."""
    return SurrogateRun(cfg, inputs={"--data": data, "--backbone": backbone, "--finetune-sts": finetune_sts},
                        out=out, address=address, executor=executor, force_new=force_new).run()
