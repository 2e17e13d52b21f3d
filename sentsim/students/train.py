"""`train_student`: validate the inputs on the driver, train one objective through the shared loop
(sentsim.training: Ray Train, or inline in-process for development and tests), export a
sentence-transformers folder.

Shared with the surrogate (sentsim.surrogate): backbone checks and construction (`check_backbone`,
`build_model`, `resolve_backbone`), checkpoint format (`save_hf`), export (`export_model`: Transformer +
mean Pooling), the dev metric (sentsim.surrogate.trainee), and the STS evaluator (sentsim.evaluation)
as the end-of-run hook. What differs per objective lives in rankencoder.py, rse.py and paser.py, side
by side; each objective is a Trainee of the shared loop (students.common.Objective).

OUT/ holds model/ (the student; plus rank_anchors.json or relations.json for the inference
scorers), summary.json (config, data counts, history, skips), curves/<objective>.json and .png,
run.json, ray/ (Ray Train checkpoints; a rerun with the same --out resumes) or checkpoint/ (inline,
resumed the same way), and eval.json/eval.md with --eval-sts.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Optional

from sentsim.errors import UsageError
from sentsim.identity import fingerprint
from sentsim.students.config import StudentConfig
from sentsim.training.config import RESUMABLE_KEYS
from sentsim.training.run import (
    TrainingDiverged,
    claim_out,
    epoch_shortfall,
    fit,
    loop_settings,
    plan_steps,
    quiet_progress,
    write_curves,
)

__all__ = ["TrainingDiverged", "evaluate_student", "train_student"]


# ----------------------------------------------------------------------------- driver: data


def prepare_data(cfg: StudentConfig, data: Optional[str], mask_token: str = "[MASK]") -> dict:
    """Everything the workers need, checked here so that a bad input fails before Ray starts."""
    from sentsim.students import data as D

    if cfg.objective == "rse" and cfg.rse.grad_cache_chunk and cfg.num_workers > 1:
        raise UsageError("rse.grad_cache_chunk with num_workers > 1 is not supported (gradient caching runs its own "
                         "backward passes, which DDP cannot synchronise); use one worker or grad_cache_chunk=0")

    root = D.harvest_root(data) if data else None
    manifest = D.read_manifest(root) if root else {}
    if root is not None:
        from sentsim.surrogate.data import incomplete_harvest_note

        note = incomplete_harvest_note(root, "the units written")
        if note:
            print(note)
    spec: dict = {"counts": {}, "skips": {}}
    dev = None
    if root is not None and root.files("pairs", required=False):  # a bad pairs table is refused, not skipped
        dev = D.scored_pairs(root, "dev")
        dev = dev.slice(0, cfg.eval_max_pairs) if dev.num_rows >= 2 else None
    if cfg.objective == "rankencoder":
        if root is None:
            raise UsageError("--objective rankencoder needs --data HARVEST_DIR (its rank vectors)")
        table, n_anchors = D.rank_sentences(root, manifest)
        if "base_vector" in table.column_names:  # rank.storage=vectors: workers read the run's anchor matrix
            spec["rank_vectors"] = {"data": str(root), "fingerprint": manifest.get("fingerprint")}
        rc = cfg.rankencoder
        anchors = None
        if rc.check_sentences > 0 or rc.base_encoder:
            ids, texts = D.check_anchor_set(root, manifest, table, rc.check_sentences, rc.base_encoder)
            anchors = ([int(i) for i in ids], list(texts))
        else:
            try:
                ids, texts = D.recover_anchors(manifest, root)
                anchors = ([int(i) for i in ids], list(texts))
            except UsageError as exc:
                spec["skips"]["anchors"] = str(exc)
        spec.update(anchors=anchors, n_anchors=n_anchors)
        if rc.score_weight > 0:
            from sentsim.surrogate.data import keep_split, training_note

            run, carve, left_out = D.harvest_pairs(root)
            pairs = keep_split(run, "train", carve)
            if pairs.num_rows == 0:
                raise UsageError(f"--data {data}: rankencoder.score_weight > 0 but no scored train pairs")
            print(training_note(pairs.num_rows, run.num_rows, "pairs for the score loss", left_out))
            spec["pairs"] = {"s1": pairs["s1"].to_pylist(), "s2": pairs["s2"].to_pylist(),
                             "score": pairs["score"].to_numpy().tolist()}
            spec["counts"]["score_pairs"] = pairs.num_rows
        spec["counts"]["sentences"] = table.num_rows
    elif cfg.objective == "rse":
        table, relations, counts = D.rse_triples(root, cfg)
        spec.update(relations=relations)
        spec["counts"].update(triples=table.num_rows, per_relation=counts)
        if cfg.rse.inference_weights:
            unknown = [r for r in cfg.rse.inference_weights if r not in relations]
            if unknown:
                raise UsageError(f"rse.inference_weights: unknown relation(s) {', '.join(unknown)}; "
                                 f"training has {', '.join(relations)}")
    else:
        if root is None:
            raise UsageError("--objective paser needs --data HARVEST_DIR (its sentences)")
        texts = D.read_table(root, "sentences", ["text"])["text"].to_pylist()
        table, info = D.paser_examples(texts, mask_token, cfg.paser.top_k, cfg.paser.max_phrase_words)
        from sentsim.surrogate.data import training_note

        print(training_note(info["sentences"], len(texts), "sentences",
                            {"repeated texts": info["repeated"], "without a RAKE phrase": info["skipped_no_phrase"]}))
        spec["counts"]["sentences"] = info["sentences"]
        spec["skips"]["no_phrase"] = {"count": info["skipped_no_phrase"], "examples": info["skipped_examples"]}
    if table.num_rows < 2:
        raise UsageError(f"{cfg.objective}: only {table.num_rows} training row(s); need at least 2 for a batch")
    spec["dev"] = None if dev is None else {"s1": dev["s1"].to_pylist(), "s2": dev["s2"].to_pylist(),
                                            "score": dev["score"].to_numpy().tolist()}
    spec["table"] = table
    return spec


# ----------------------------------------------------------------------------- worker


def build_objective(cfg: StudentConfig, backbone: str, init: str, spec: dict):
    """(objective, tokenizer) on the worker: the encoder via the surrogate's `build_model`, plus the
    objective's own parts."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentsim.surrogate.models import SiameseSurrogate, build_model, resolve_backbone

    if cfg.objective == "paser":
        import torch
        from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

        from sentsim.students.paser import PaSeRObjective

        p = resolve_backbone(backbone)
        tok = AutoTokenizer.from_pretrained(str(p))
        if tok.mask_token is None:
            raise UsageError(f"--backbone {backbone}: its tokenizer has no mask token; PaSeR needs one")
        torch.manual_seed(cfg.seed)
        if init == "scratch":
            s = cfg.scratch
            mlm = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=s.hidden_size,
                                             num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads,
                                             intermediate_size=s.intermediate_size,
                                             pad_token_id=tok.pad_token_id or 0))
        else:
            mlm = AutoModelForMaskedLM.from_pretrained(str(p))  # the MLM head is new if the checkpoint lacks it
        head = getattr(mlm, "cls", None) or getattr(mlm, "lm_head", None)
        if head is None:
            raise UsageError(f"--backbone {backbone}: no masked-LM head class for {type(mlm).__name__}")
        model = SiameseSurrogate(mlm.base_model)
        return PaSeRObjective(model, tok, cfg, head), tok
    model, tok = build_model("siamese", backbone, init, cfg.scratch.model_dump(), cfg.seed)
    if cfg.objective == "rankencoder":
        from sentsim.students.rankencoder import RankEncoderObjective

        obj = RankEncoderObjective(model, tok, cfg, spec.get("pairs"), spec.get("rank_vectors"))
        if spec.get("anchors"):
            obj.anchors = spec["anchors"]
        return obj, tok
    from sentsim.students.rse import RSEObjective

    return RSEObjective(model, tok, cfg, spec["relations"], model.encoder.config.hidden_size), tok


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


def _export(ckpt_dir: Path, out: Path, cfg: StudentConfig) -> Path:
    from sentsim.surrogate.models import export_model

    model_dir = out / "model"
    export_model(ckpt_dir / "model", model_dir, "siamese", cfg.max_seq_length)
    for extra in ("rank_anchors.json", "relations.json"):  # inference scorers' side files; the decoder is not kept
        if (ckpt_dir / extra).is_file():
            shutil.copy(ckpt_dir / extra, model_dir / extra)
    return model_dir


def train_student(cfg: StudentConfig, *, data: Optional[str], backbone: str, out: str, address: Optional[str] = None,
                  executor: str = "ray", force_new: bool = False, eval_sts: Optional[str] = None,
                  verbose: bool = True) -> dict:
    """Validate, train, export; returns the run summary (also OUT/summary.json)."""
    from sentsim.out_paths import check_out
    from sentsim.runtime import absolute_local
    from sentsim.surrogate.models import check_backbone

    check_out(out, {"--data": data, "--backbone": backbone, "--eval-sts": eval_sts, "--triples": cfg.rse.triples,
                    "rankencoder.base_encoder": cfg.rankencoder.base_encoder}, local="a model and its training state")
    data, backbone, out, eval_sts = (absolute_local(p) for p in (data, backbone, out, eval_sts))

    if executor not in ("ray", "inline"):
        raise UsageError(f"unknown executor {executor!r} (ray or inline)")
    bb = check_backbone(backbone, cfg.init)
    if eval_sts:
        from sentsim.evaluation.datasets import discover_tasks

        discover_tasks(eval_sts)  # fails now, not after training
    mask_token = "[MASK]"
    if cfg.objective == "paser":
        from transformers import AutoTokenizer

        mask_token = AutoTokenizer.from_pretrained(bb["path"]).mask_token
        if mask_token is None:
            raise UsageError(f"--backbone {backbone}: its tokenizer has no mask token; PaSeR needs one")
    spec = prepare_data(cfg, data, mask_token)
    table = spec.pop("table")
    n_rows = table.num_rows
    workers = cfg.num_workers if executor == "ray" else 1
    short = epoch_shortfall(n_rows, workers, cfg.batch_size, drop_last=True)
    if short:
        print(f"note: {n_rows} {cfg.objective} training rows" + short)
    # drop_last: InfoNCE wants full batches
    total = plan_steps(cfg.objective, n_rows, num_workers=cfg.num_workers, batch_size=cfg.batch_size,
                       epochs=cfg.epochs, max_steps=cfg.max_steps, drop_last=True)
    out_dir = Path(out)
    what = {k: v for k, v in cfg.model_dump().items() if k not in RESUMABLE_KEYS}
    run_id = fingerprint("student", what, bb, data, spec["counts"])
    claim_out(out_dir, run_id, {"config": cfg.model_dump(), "backbone": bb, "data": data, "counts": spec["counts"]},
              force_new, out)
    spec.update(backbone=bb["path"], total_steps=total)
    loop = loop_settings(cfg, label=f"student {cfg.objective}", total_steps=total, verbose=verbose, drop_last=True,
                         shuffle_buffer=max(cfg.batch_size * 4, 1000))
    quiet_progress()
    t0 = time.perf_counter()
    if executor == "inline":
        datasets = {"train": table}
    else:
        import ray.data

        from sentsim.runtime import init_ray

        init_ray(address)
        datasets = {"train": ray.data.from_arrow(table)}
    run = fit({"build": build_trainee, "loop": loop, "cfg": cfg.model_dump(), "spec": spec}, name=cfg.objective,
              out_dir=out_dir, datasets=datasets, executor=executor, export=lambda d: _export(d, out_dir, cfg))
    history, model_dir, rv = run["history"], run["model"], run["result"]
    write_curves(history, out_dir / "curves", cfg.objective, f"student {cfg.objective} ({cfg.init})", [
        ("train loss", [("train_loss", None)], False),
        ("dev Spearman x100 vs harvested scores", [("dev_spearman", None)], False)])
    losses = [h["train_loss"] for h in history if h.get("train_loss") is not None]
    summary = {"fingerprint": run_id, "objective": cfg.objective, "model": str(model_dir), "rows": n_rows,
               "total_steps": total, "gpu": run["gpu"], "seconds": round(time.perf_counter() - t0, 1),
               "counts": spec["counts"], "skips": spec["skips"], "empty_filter_batches": rv.get("empty_filter_batches"),
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "loss_points": len(losses),
               "history": history}
    if eval_sts:
        summary["eval"] = evaluate_student(cfg, str(model_dir), eval_sts, out_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def evaluate_student(cfg: StudentConfig, model_dir: str, sts_dir: str, out_dir: Path) -> dict:
    """The surrogate's evaluation hook for students: the STS suite by cosine, plus the objective's
    own inference rule (Eq. 7 for RankEncoder, relational similarity for RSE)."""
    from sentsim.evaluation import discover_tasks, evaluate, load_model_scorer, to_markdown

    tasks, missing = discover_tasks(sts_dir)
    reports = {"cosine": evaluate(load_model_scorer(model_dir), tasks, missing)}
    if cfg.objective == "rankencoder" and Path(model_dir, "rank_anchors.json").is_file():
        from sentsim.students.rankencoder import RankEncoderScorer

        reports["rankencoder-eq7"] = evaluate(RankEncoderScorer(model_dir, cfg.rankencoder.lambda_inf), tasks, missing)
    if cfg.objective == "rse":
        from sentsim.students.rse import RelationalScorer

        reports["relational"] = evaluate(RelationalScorer(model_dir), tasks, missing)
    (out_dir / "eval.json").write_text(json.dumps({k: r.to_dict() for k, r in reports.items()}, indent=2))
    (out_dir / "eval.md").write_text("\n".join(to_markdown(r, k) for k, r in reports.items()))
    return {k: r.average for k, r in reports.items()}
