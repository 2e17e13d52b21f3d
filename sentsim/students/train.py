"""`train_student`: validate the inputs on the driver, train one objective through the shared loop
(sentsim.training: Ray Train, or inline in-process for development and tests), export a
sentence-transformers folder.

Shared with the surrogate: the driver's steps (`StudentRun` is a sentsim.training.driver.EncoderDriver),
the encoder helpers of sentsim.training.encoders (backbone checks, pooling, the dev metric), and
of sentsim.training.encoder_models the Siamese encoder's construction (`build_model`), checkpoint format
(`save_hf`), export (`export_model`: Transformer + the config's Pooling) and dev predictions (`predict`); the
STS evaluator (sentsim.evaluation) is the end-of-run hook. What differs per objective lives in its own
module (rankencoder.py, rse.py, paser.py, ...), registered by name in students/objectives.py: each is a
Trainee of the shared loop that also declares its data, its encoder and its scorers
(students.common.Objective); nothing here names one.

OUT/ holds model/ (the student; plus rank_anchors.json or relations.json for the inference
scorers; its card README.md and sentsim_model.json; swapped in whole by sentsim.model_swap),
summary.json (config, data counts, history, skips), curves/<objective>.json and .png, run.json,
ray/ (Ray Train checkpoints; a rerun with the same --out resumes) or checkpoint/ (inline,
resumed the same way), and eval.json/eval.md with --eval-sts.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Optional

from sentsim.config import without_added_later
from sentsim.errors import UsageError
from sentsim.students.common import Harvest
from sentsim.students.config import StudentConfig
from sentsim.students.objectives import names as objective_names
from sentsim.students.objectives import objective_class
from sentsim.training.config import TRAINING_FORMAT
from sentsim.training.driver import EncoderDriver
from sentsim.training.run import (
    TrainingDiverged,
    capped_note,
    epoch_cap_note,
    epoch_left_out,
    epoch_shortfall,
    fit,
    plan_steps,
    steps_per_epoch,
    training_extent,
)
from sentsim.training.settings import LoopSettings

__all__ = ["StudentRun", "TrainingDiverged", "evaluate_student", "train_student"]


# ----------------------------------------------------------------------------- driver: data

# the workers' spec: these entries are the trainer's, the rest an objective's own (Prepared.for_workers)
WORKER_KEYS = frozenset({"counts", "skips", "dev", "table", "backbone", "total_steps"})


def prepare_data(cfg: StudentConfig, data: Optional[str], backbone_path: str) -> tuple[dict, Optional[dict]]:
    """Everything the workers need, checked here so that a bad input fails before Ray starts: the harvest's
    dev pairs (the dev metric) and the objective's own table (`Objective.prepare`); and the harvest by its
    content (`harvest_content`; None without --data)."""
    from sentsim.students import data as D

    objective = objective_class(cfg.objective)
    root = D.harvest_root(data) if data else None
    manifest = D.read_manifest(root) if root else {}
    if root is not None:
        from sentsim.surrogate.data import incomplete_harvest_note

        note = incomplete_harvest_note(root, "the units written")
        if note:
            print(note)
    dev = None
    if root is not None and root.files("pairs", required=False):  # a bad pairs table is refused, not skipped
        dev = D.scored_pairs(root, "dev")
        dev = dev.slice(0, cfg.eval_max_pairs) if dev.num_rows >= 2 else None
    if root is None and objective.needs_data:
        raise UsageError(f"--objective {cfg.objective} needs --data HARVEST_DIR ({objective.needs_data})")
    prepared = objective.prepare(cfg, Harvest(data, root, manifest, backbone_path))
    table = prepared.table
    if table.num_rows < 2:
        raise UsageError(f"{cfg.objective}: only {table.num_rows} training row(s); need at least 2 for a batch")
    taken = WORKER_KEYS & set(prepared.for_workers)
    if taken:  # they would overwrite the trainer's own entries of the workers' spec
        raise ValueError(f"{cfg.objective}: Prepared.for_workers may not use the trainer's keys {sorted(taken)}")
    spec = {"counts": prepared.counts, "skips": prepared.skips, **prepared.for_workers}
    spec["dev"] = None if dev is None else {"s1": dev["s1"].to_pylist(), "s2": dev["s2"].to_pylist(),
                                            "score": dev["score"].to_numpy().tolist()}
    spec["table"] = table
    return spec, D.harvest_content(root) if root is not None else None


# ----------------------------------------------------------------------------- worker


def build_objective(cfg: StudentConfig, backbone: str, init: str, spec: dict):
    """(objective, tokenizer) on the worker: the registered objective's `build` (its encoder and its own
    parts) from `backbone`."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    obj = objective_class(cfg.objective).build(cfg, backbone, init, spec)
    return obj, obj.tok


def build_trainee(config: dict, session, ckpt):
    """The shared loop's build hook: the objective from the checkpoint (resume) or the backbone."""
    cfg = StudentConfig.model_validate(config["cfg"])
    spec = config["spec"]
    if ckpt is not None:
        obj, _ = build_objective(cfg, str(ckpt / "model"), "pretrained", spec)
        obj.load_extras(ckpt)
    else:
        obj, _ = build_objective(cfg, spec["backbone"], cfg.init, spec)
    obj.dev = spec.get("dev")
    return obj


# ----------------------------------------------------------------------------- driver


def _export(ckpt_dir: Path, out: Path, cfg: StudentConfig, card: dict, extent: dict) -> Path:
    from sentsim.training.encoder_models import export_model
    from sentsim.training.model_card import final_metrics

    def side_files(folder: Path) -> None:  # its inference scorers' files; a decoder is not kept
        for extra in objective_class(cfg.objective).side_files:
            if (ckpt_dir / extra).is_file():
                shutil.copy(ckpt_dir / extra, folder / extra)

    training = {**extent, "epochs": cfg.epochs, "final": final_metrics(ckpt_dir)}
    return export_model(ckpt_dir / "model", out / "model", "siamese", cfg.max_seq_length,
                        card={**card, "training": training}, extras=side_files, pooling=cfg.pooling)


def student_card(cfg: StudentConfig, bb: dict, data: Optional[str], spec: dict, n_rows: int, left: int,
                 workers: int) -> dict:
    """What the student's model card says it is (sentsim.training.model_card); `workers`: those it trained on."""
    from sentsim.students import data as D
    from sentsim.students.objectives import registered
    from sentsim.training.model_card import base_model, harvest_data

    rows = {"trained": n_rows, "unit": f"{cfg.objective} training rows"}
    if left:
        rows["left out of each epoch (a short last batch)"] = left
    for k, v in spec["counts"].items():
        for k2, v2 in (v.items() if isinstance(v, dict) else [("", v)]):
            rows[f"{k} {k2}".strip()] = v2
    for k, v in spec["skips"].items():
        rows[f"skipped ({k})"] = v.get("count") if isinstance(v, dict) else v
    dumped = cfg.model_dump()
    keys = ("init", "epochs", "batch_size", "lr", "warmup_ratio", "weight_decay", "max_seq_length", "pooling",
            "max_steps", "num_workers", "seed")
    settings = {k: dumped[k] for k in keys}
    settings["num_workers"] = workers  # inline, one whatever the config says
    settings.update({f"{cfg.objective}.{k}": v for k, v in (dumped.get(cfg.objective) or {}).items()})
    summary = {r.name: r.summary for r in registered()}.get(cfg.objective, "")
    return {"kind": "student", "title": f"sentsim student ({cfg.objective})",
            "summary": f"A student sentence encoder trained by sentsim with the {cfg.objective} objective "
                       f"({summary}); sentence similarity is the cosine of its "
                       f"{'mean-pooled' if cfg.pooling == 'mean' else '[CLS]'} vectors.",
            "base_model": base_model(bb, cfg.init), "rows": rows, "settings": settings,
            "data": harvest_data(data, D.read_manifest(D.harvest_root(data))) if data else None,
            "objective": {"name": cfg.objective, "description": summary}}


class StudentRun(EncoderDriver):
    """The student's steps of the encoder driver: the objective's checks and data, then one fit."""

    kind = "student"

    panels = [("train loss", [("train_loss", None)], False),
              ("dev Spearman x100 vs harvested scores", [("dev_spearman", None)], False)]

    def guarded(self) -> dict:
        inputs = {}
        for name in objective_names():  # every objective's, used or not: a path --out would overwrite stays refused
            inputs.update(objective_class(name).input_paths(self.cfg))
        return inputs

    def prepare(self, bb: dict) -> None:
        from storage.fs import input_sha256

        cfg, eval_sts = self.cfg, self.inputs["--eval-sts"]
        if eval_sts:
            from sentsim.evaluation.datasets import discover_tasks

            discover_tasks(eval_sts)  # fails now, not after training
        objective = objective_class(cfg.objective)
        objective.check(cfg, self.inputs["--backbone"], bb["path"])
        self.spec, self.data_content = prepare_data(cfg, self.inputs["--data"], bb["path"])
        section = getattr(cfg, cfg.objective, None)
        # each data file the objective reads, by its bytes (read and checked by its prepare just now)
        self.files = {f"{cfg.objective}.{k}": (path, input_sha256(path)) for k in objective.data_files
                      for path in [getattr(section, k)] if path}
        self.table = self.spec.pop("table")
        n_rows = self.table.num_rows
        self.drop_last = objective.full_batches
        short = epoch_shortfall(n_rows, self.workers, cfg.batch_size, drop_last=self.drop_last)
        if short:
            print(f"note: {n_rows} {cfg.objective} training rows" + short)
        self.total = plan_steps(cfg.objective, n_rows, num_workers=self.workers, batch_size=cfg.batch_size,
                                epochs=cfg.epochs, max_steps=cfg.max_steps, drop_last=self.drop_last)
        capped = capped_note(f"student {cfg.objective}", n_rows, self.total, num_workers=self.workers,
                             batch_size=cfg.batch_size, drop_last=self.drop_last)
        capped = capped or epoch_cap_note(
            f"student {cfg.objective}", cfg.max_steps, epochs=cfg.epochs,
            per_epoch=steps_per_epoch(n_rows, self.workers, cfg.batch_size, self.drop_last))
        if capped:
            print(capped)

    def settings(self, what: dict) -> dict:
        """`what` less the keys added to the config or an objective's section after runs were made while they
        hold those runs' value (Section.ADDED_LATER), so the runs keep their fingerprints."""
        what = without_added_later(what, type(self.cfg).ADDED_LATER)
        for name in objective_names():
            if isinstance(what.get(name), dict):
                what[name] = without_added_later(what[name], type(getattr(self.cfg, name)).ADDED_LATER)
        return what

    def identity(self, what: dict) -> tuple:
        # the data by its content: the harvest (harvest_content) and the objective's data files, whose paths
        # leave its section
        what = self.settings(what)
        name = self.cfg.objective
        if isinstance(what.get(name), dict):
            what[name] = {k: v for k, v in what[name].items() if k not in objective_class(name).data_files}
        return "student", what, self.bb, self.data_content, {k: sha for k, (_, sha) in self.files.items()}, \
            self.spec["counts"]

    def fingerprint_in_format(self, version: int, stored: dict) -> tuple[str, dict] | None:
        """Format 1 (sentsim/run_formats.py): the config less its top-level RESUMABLE_KEYS, the harvest by
        --data as given and the objective's data files by their paths in the config, with the counts."""
        from sentsim.identity import fingerprint
        from sentsim.training.config import RESUMABLE_KEYS

        if version != 1:
            return None
        what = self.settings({k: v for k, v in self.cfg.model_dump().items() if k not in RESUMABLE_KEYS})
        return fingerprint("student", what, self.bb, self.inputs["--data"], self.spec["counts"]), {}

    def unfingerprinted(self, version: int = TRAINING_FORMAT) -> tuple:
        if version < 2:  # format 1 knew its data by paths, and recorded nothing of their content
            return super().unfingerprinted(version) + ("data.harvest", "data.pairs_sha256", "data.sentences_sha256",
                                                       "files")
        name = self.cfg.objective
        paths = [f"config.{name}.{k}" for k in objective_class(name).data_files]
        return super().unfingerprinted(version) + ("data.path", *paths, *(f"files.{k}.path" for k in self.files))

    def record(self) -> dict:
        data = self.inputs["--data"]
        files = {"files": {k: {"path": str(p), "sha256": sha} for k, (p, sha) in self.files.items()}}
        return {"config": self.cfg.model_dump(), "backbone": self.bb,
                "data": {"path": data, **self.data_content} if data else None, **(files if self.files else {}),
                "counts": self.spec["counts"]}

    def train(self) -> dict:
        cfg, spec, table, total, out_dir = self.cfg, self.spec, self.table, self.total, self.out
        n_rows = table.num_rows
        extent = training_extent(total, n_rows, num_workers=self.workers, batch_size=cfg.batch_size,
                                 drop_last=self.drop_last)
        # an epoch's left-out rows are news only where an epoch ends: a run inside its first reads none of them
        left = epoch_left_out(n_rows, self.workers, cfg.batch_size, self.drop_last) \
            if total >= extent["steps_per_epoch"] else 0
        card = student_card(cfg, self.bb, self.inputs["--data"], spec, n_rows, left, self.workers)
        spec.update(backbone=self.bb["path"], total_steps=total)
        loop = LoopSettings.from_section(cfg, label=f"student {cfg.objective}", total_steps=total,
                                         verbose=self.verbose, drop_last=self.drop_last,
                                         shuffle_buffer=max(cfg.batch_size * 4, 1000))
        datasets = {"train": table if self.executor == "inline" else seeded_ray_dataset(table, cfg.seed)}
        run = fit({"build": build_trainee, "loop": loop, "cfg": self.workers_config(), "spec": spec},
                  name=cfg.objective, out_dir=out_dir, datasets=datasets, executor=self.executor,
                  export=lambda d: _export(d, out_dir, cfg, card, extent))
        history, model_dir, rv = run["history"], run["model"], run["result"]
        self.model_dir = model_dir
        self.curves(history, cfg.objective, f"student {cfg.objective} ({cfg.init})")
        losses = [h["train_loss"] for h in history if h.get("train_loss") is not None]
        return {"objective": cfg.objective, "model": str(model_dir), "rows": n_rows,
                "total_steps": total, "gpu": run["gpu"], "seconds": round(time.perf_counter() - self.t0, 1),
                "counts": spec["counts"], "skips": spec["skips"],
                "empty_filter_batches": rv.get("empty_filter_batches"),
                "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                "loss_points": len(losses), "history": history}

    def workers_config(self) -> dict:
        """The config the workers build from, and the fit's record holds: without the paths of the objective's
        data files (read on the driver, into the training table), so that one moved or copied is the same fit,
        a finished one a no-op; with them for a run that goes on under a format-1 fingerprint, whose fits were
        recorded so."""
        dump = self.cfg.model_dump()
        if self.record_format < TRAINING_FORMAT:
            return dump
        name = self.cfg.objective
        return {**dump, name: {k: None if k in objective_class(name).data_files else v
                               for k, v in dump[name].items()}} if isinstance(dump.get(name), dict) else dump

    def finish(self, summary: dict) -> None:
        eval_sts = self.inputs["--eval-sts"]
        if eval_sts:
            summary["eval"] = evaluate_student(self.cfg, str(self.model_dir), eval_sts, self.out)


def seeded_ray_dataset(table, seed: int):
    """The student's rows as a ray.data Dataset, in an order seeded by `seed`.

    Ray's shuffle is a local buffer of a few batches: without a permutation first, every epoch (and a
    run capped below one) would walk the table in harvest order, anchor by anchor. The inline loop
    permutes each epoch itself."""
    import numpy as np
    import pyarrow as pa
    import ray.data

    return ray.data.from_arrow(table.take(pa.array(np.random.default_rng(seed).permutation(table.num_rows))))


def train_student(cfg: StudentConfig, *, data: Optional[str], backbone: str, out: str, address: Optional[str] = None,
                  executor: str = "ray", force_new: bool = False, eval_sts: Optional[str] = None,
                  verbose: bool = True) -> dict:
    """Validate, train, export; returns the run summary (also OUT/summary.json)."""
    return StudentRun(cfg, inputs={"--data": data, "--backbone": backbone, "--eval-sts": eval_sts}, out=out,
                      address=address, executor=executor, force_new=force_new, verbose=verbose).run()


def evaluate_student(cfg: StudentConfig, model_dir: str, sts_dir: str, out_dir: Path) -> dict:
    """The surrogate's evaluation hook for students: the STS suite by cosine, plus the objective's
    own inference rule (`Objective.scorers`: Eq. 7 for RankEncoder, relational similarity for RSE)."""
    from sentsim.evaluation import discover_tasks, evaluate, load_model_scorer, to_markdown

    tasks, missing = discover_tasks(sts_dir)
    if missing:  # the console's average line names no tasks: a part of the suite must not pass for all of it
        print(f"note: --eval-sts {sts_dir}: averages over {len(tasks)} of the suite's {len(tasks) + len(missing)} "
              f"tasks ({', '.join(missing)} not found)")
    reports = {"cosine": evaluate(load_model_scorer(model_dir), tasks, missing)}
    for name, scorer in objective_class(cfg.objective).scorers(cfg, model_dir).items():
        reports[name] = evaluate(scorer, tasks, missing)
    from sentsim.training.model_card import record_sts

    record_sts(Path(model_dir), reports["cosine"])  # the card's STS section, as `sentsim eval sts` writes it
    from storage.fs import write_text_atomic

    # each whole or not at all: a kill while writing leaves the last evaluation, never half a new one
    write_text_atomic(str(out_dir / "eval.json"), json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=2))
    write_text_atomic(str(out_dir / "eval.md"), "\n".join(to_markdown(r, k) for k, r in reports.items()))
    return {k: r.average for k, r in reports.items()}
