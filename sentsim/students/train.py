"""`train_student`: validate the inputs on the driver, train one objective on Ray Train (or inline,
in-process, for development and tests), export a sentence-transformers folder.

Shared with the surrogate (sentsim.surrogate): backbone checks and construction (`check_backbone`,
`build_model`, `resolve_backbone`), checkpoint format (`save_hf`), export (`export_model`: Transformer +
mean Pooling), the dev metric (`predict`, `_metrics`), `quiet_progress`, and the STS evaluator
(sentsim.evaluation) as the end-of-run hook. What differs per objective lives in rankencoder.py,
rse.py and paser.py, side by side.

OUT/ holds model/ (the student; plus rank_anchors.json or relations.json for the inference
scorers), summary.json (config, data counts, history, skips), ray/ (Ray Train checkpoints; a rerun
with the same --out resumes) or checkpoint/ (inline), and eval.json/eval.md with --eval-sts.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import numpy as np
import pyarrow as pa

from sentsim.config import fingerprint
from sentsim.errors import UsageError
from sentsim.students.config import StudentConfig

RESUMABLE_KEYS = ("epochs", "max_steps", "eval_every", "log_every", "num_workers", "cpus_per_worker", "use_gpu",
                  "checkpoints_to_keep")


class TrainingDiverged(UsageError):
    """The loss stopped being finite."""


# ----------------------------------------------------------------------------- driver: data


def prepare_data(cfg: StudentConfig, data: Optional[str], mask_token: str = "[MASK]") -> dict:
    """Everything the workers need, checked here so that a bad input fails before Ray starts."""
    from sentsim.students import data as D

    if cfg.objective == "rse" and cfg.rse.grad_cache_chunk and cfg.num_workers > 1:
        raise UsageError("rse.grad_cache_chunk with num_workers > 1 is not supported (gradient caching runs its own "
                         "backward passes, which DDP cannot synchronise); use one worker or grad_cache_chunk=0")

    root = D.harvest_root(data) if data else None
    manifest = D.read_manifest(root) if root else {}
    spec: dict = {"counts": {}, "skips": {}}
    dev = None
    if root is not None:
        try:
            dev = D.scored_pairs(root, "dev")
            dev = dev.slice(0, cfg.eval_max_pairs) if dev.num_rows >= 2 else None
        except UsageError:
            dev = None
    if cfg.objective == "rankencoder":
        if root is None:
            raise UsageError("--objective rankencoder needs --data HARVEST_DIR (its rank vectors)")
        table, n_anchors = D.rank_sentences(root, manifest)
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
            pairs = D.scored_pairs(root, "train")
            if pairs.num_rows == 0:
                raise UsageError(f"--data {data}: rankencoder.score_weight > 0 but no scored train pairs")
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
            mlm = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=s.hidden_size, num_hidden_layers=s.num_layers,
                                             num_attention_heads=s.num_heads, intermediate_size=s.intermediate_size,
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

        obj = RankEncoderObjective(model, tok, cfg, spec.get("pairs"))
        if spec.get("anchors"):
            obj.anchors = spec["anchors"]
        return obj, tok
    from sentsim.students.rse import RSEObjective

    return RSEObjective(model, tok, cfg, spec["relations"], model.encoder.config.hidden_size), tok


def _inline_batches(table: pa.Table, batch_size: int, seed: int, epoch: int):
    order = np.random.default_rng(seed + epoch).permutation(table.num_rows)
    for i in range(0, len(order) - batch_size + 1, batch_size):  # drop_last: InfoNCE wants full batches
        yield table.take(pa.array(order[i:i + batch_size])).to_pydict()


def student_loop(config: dict):
    """The training loop; on Ray Train workers (config['ray']) or in-process. Returns rank 0's summary."""
    import os

    import torch

    from sentsim.surrogate.train import _metrics, predict, quiet_progress

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quiet_progress()
    cfg = StudentConfig.model_validate(config["cfg"])
    spec = config["spec"]
    ray_mode = config["ray"]
    if ray_mode:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        device = ray.train.torch.get_device()
        ckpt = ray.train.get_checkpoint()
    else:
        rank, world = 0, 1
        device = torch.device("cuda" if torch.cuda.is_available() and cfg.use_gpu is not False else "cpu")
        ckpt_dir = Path(config["out"]) / "checkpoint"
        ckpt = ckpt_dir if (ckpt_dir / "state.pt").is_file() else None
    if device.type == "cpu" and config.get("cpu_threads"):
        torch.set_num_threads(config["cpu_threads"])
    torch.manual_seed(cfg.seed + rank)

    state, history = None, []
    if ckpt is not None:
        ctxm = ckpt.as_directory() if ray_mode else nullcontext(str(ckpt))
        with ctxm as d:
            obj, tok = build_objective(cfg, str(Path(d) / "model"), "pretrained", spec)
            state = torch.load(Path(d) / "state.pt", map_location="cpu", weights_only=False)
            obj.load_extras(Path(d))
            if "objective_extra" in state:
                obj.load_state_dict(state["objective_extra"], strict=False)
            history = json.loads((Path(d) / "history.json").read_text())
    else:
        obj, tok = build_objective(cfg, spec["backbone"], cfg.init, spec)
    obj.to(device)
    obj.train()
    wrapped = obj
    if ray_mode and world > 1:
        # DDP over the whole objective; relation rows or the MLM head may sit out a step
        wrapped = ray.train.torch.prepare_model(obj, parallel_strategy_kwargs={"find_unused_parameters": True})
    groups = obj.param_groups(cfg.lr)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    total = spec["total_steps"]
    warm = max(1, int(cfg.warmup_ratio * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (total - s) / max(1, total - warm)) if cfg.warmup_ratio
        else max(0.0, (total - s) / total))  # linear decay, as SimCSE; warm-up only when asked
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    step = state["step"] if state else 0
    epoch0 = state["epoch"] if state else 0
    skip = state["batches_in_epoch"] if state else 0
    if state and hasattr(obj, "empty_filter_batches"):
        obj.empty_filter_batches = state.get("empty_filter_batches", 0)
    dev = spec.get("dev")

    def evaluate() -> dict:
        if not dev:
            return {}
        pred = predict(obj.model, tok, "siamese", dev["s1"], dev["s2"], cfg.max_seq_length, 64, device, nullcontext)
        return _metrics(pred, np.asarray(dev["score"]), "dev")

    def save(folder: Path, epoch: int, in_epoch: int) -> None:
        obj.save_encoder(folder / "model")
        obj.save_extras(folder)
        extra = {k: v for k, v in obj.state_dict().items() if not k.startswith("model.")}
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": step, "epoch": epoch,
                    "batches_in_epoch": in_epoch, "objective_extra": extra,
                    "empty_filter_batches": getattr(obj, "empty_filter_batches", 0)}, folder / "state.pt")
        (folder / "history.json").write_text(json.dumps(history))

    def checkpoint(point: dict, epoch: int, in_epoch: int) -> None:
        if ray_mode:
            if rank != 0:
                ray.train.report({}, checkpoint=None)
                return
            with tempfile.TemporaryDirectory() as tmp:
                save(Path(tmp), epoch, in_epoch)
                ray.train.report(point, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        else:
            tmp = ckpt_dir.with_name("checkpoint.tmp")
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            save(tmp, epoch, in_epoch)
            if ckpt_dir.exists():
                shutil.rmtree(ckpt_dir)
            tmp.rename(ckpt_dir)

    if step == 0 and rank == 0 and not history:
        history.append({"step": 0, "train_loss": None, **evaluate()})
    t0 = time.perf_counter()
    running, n_running, last_metrics = 0.0, 0, {}
    epoch = epoch0
    last_saved = step if state else -1
    for epoch in range(epoch0, cfg.epochs):
        if step >= total:
            break
        if ray_mode:
            batches = ray.train.get_dataset_shard("train").iter_batches(
                batch_size=cfg.batch_size, batch_format="numpy", drop_last=True,
                local_shuffle_buffer_size=max(cfg.batch_size * 4, 1000), local_shuffle_seed=cfg.seed + epoch)
        else:
            batches = _inline_batches(spec["table"], cfg.batch_size, cfg.seed, epoch)
        in_epoch = 0
        for batch in batches:
            if in_epoch < skip:
                in_epoch += 1
                continue
            opt.zero_grad(set_to_none=True)  # before step(): gradient caching accumulates inside it
            loss, metrics = wrapped(batch, device)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"{cfg.objective}: the training loss became {float(loss)} at step {step + 1}; "
                                       "lower --set lr=...")
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in groups for p in g["params"]], cfg.max_grad_norm)
            opt.step()
            sched.step()
            step += 1
            in_epoch += 1
            running += float(loss.detach())
            n_running += 1
            last_metrics = metrics
            if step % cfg.log_every == 0 or step >= total or step % cfg.eval_every == 0:
                point = {"step": step, "epoch": epoch, "train_loss": running / n_running, **metrics,
                         "time_s": round(time.perf_counter() - t0, 2)}
                if step % cfg.eval_every == 0 or step >= total:
                    if rank == 0:
                        point.update(evaluate())
                    history.append(point)
                    checkpoint(point, epoch, in_epoch)
                    last_saved = step
                elif rank == 0:
                    history.append(point)
                if rank == 0 and config.get("verbose", True):
                    extra = " ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, float))
                    print(f"[student {cfg.objective}] step {step}/{total} loss {point['train_loss']:.4g} {extra}", flush=True)
                running, n_running = 0.0, 0
            if step >= total:
                break
        skip = 0
    if last_saved != step:
        point = {"step": step, "epoch": epoch, "train_loss": running / n_running if n_running else None, **last_metrics}
        if rank == 0:
            point.update(evaluate())
        history.append(point)
        checkpoint(point, epoch, 0)
    if rank != 0:
        return None
    return {"history": history, "step": step, "empty_filter_batches": getattr(obj, "empty_filter_batches", None)}


# ----------------------------------------------------------------------------- driver


def _use_gpu(cfg: StudentConfig) -> bool:
    import ray

    if cfg.use_gpu is not None:
        return cfg.use_gpu
    return ray.cluster_resources().get("GPU", 0) >= cfg.num_workers


def _export(ckpt_dir: Path, out: Path, cfg: StudentConfig) -> Path:
    from sentsim.surrogate.models import export_model

    model_dir = out / "model"
    export_model(ckpt_dir / "model", model_dir, "siamese", cfg.max_seq_length)
    for extra in ("rank_anchors.json", "relations.json"):  # inference scorers' side files; the decoder is not kept
        if (ckpt_dir / extra).is_file():
            shutil.copy(ckpt_dir / extra, model_dir / extra)
    return model_dir


def train_student(cfg: StudentConfig, *, data: Optional[str], backbone: str, out: str, address: Optional[str] = None,
                  executor: str = "ray", restart: bool = False, eval_sts: Optional[str] = None,
                  verbose: bool = True) -> dict:
    """Validate, train, export; returns the run summary (also OUT/summary.json)."""
    from sentsim.surrogate.models import check_backbone
    from sentsim.surrogate.train import quiet_progress

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
    rows_per_worker = n_rows // cfg.num_workers
    steps_per_epoch = rows_per_worker // cfg.batch_size
    if steps_per_epoch < 1:
        raise UsageError(f"{n_rows} training rows cannot fill one batch of {cfg.batch_size} per worker "
                         f"({cfg.num_workers} worker(s)); lower --set batch_size=...")
    total = cfg.epochs * steps_per_epoch
    if cfg.max_steps:
        total = min(total, cfg.max_steps)
    out_dir = Path(out)
    what = {k: v for k, v in cfg.model_dump().items() if k not in RESUMABLE_KEYS}
    run_id = fingerprint("student", what, bb, data, spec["counts"])
    run_file = out_dir / "run.json"
    state_dirs = [out_dir / "ray", out_dir / "checkpoint"]
    if restart:
        for d in state_dirs:
            if d.exists():
                shutil.rmtree(d)
    elif run_file.is_file() and any(d.exists() for d in state_dirs):
        prev = json.loads(run_file.read_text()).get("fingerprint")
        if prev != run_id:
            raise UsageError(f"--out {out} holds a run with other settings (fingerprint {prev}, now {run_id}); "
                             "use a new --out, or --restart to discard it")
    out_dir.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps({"fingerprint": run_id, "config": cfg.model_dump(), "backbone": bb, "data": data,
                                    "counts": spec["counts"]}, indent=2))
    spec.update(backbone=bb["path"], total_steps=total)
    loop_config = {"cfg": cfg.model_dump(), "spec": spec, "ray": executor == "ray", "out": str(out_dir),
                   "cpu_threads": max(1, int(round(cfg.cpus_per_worker))), "verbose": verbose}
    quiet_progress()
    t0 = time.perf_counter()
    if executor == "inline":
        rv = student_loop({**loop_config, "spec": {**spec, "table": table}})
        ckpt_dir = out_dir / "checkpoint"
        model_dir = _export(ckpt_dir, out_dir, cfg)
        history = rv["history"]
        use_gpu = False
    else:
        import ray.data
        import ray.train
        from ray.train.torch import TorchTrainer

        from sentsim.runtime import init_ray

        init_ray(address)
        use_gpu = _use_gpu(cfg)
        resources = {"CPU": cfg.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
        trainer = TorchTrainer(
            student_loop, train_loop_config=loop_config,
            scaling_config=ray.train.ScalingConfig(num_workers=cfg.num_workers, use_gpu=use_gpu,
                                                   resources_per_worker=resources),
            run_config=ray.train.RunConfig(name=cfg.objective, storage_path=str((out_dir / "ray").resolve()),
                                           checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoints_to_keep)),
            datasets={"train": ray.data.from_arrow(table)},
            dataset_config=ray.train.DataConfig(datasets_to_split=["train"]),
        )
        result = trainer.fit()
        rv = result.return_value or {}
        if result.checkpoint is None:
            raise RuntimeError(f"{cfg.objective}: training ended without a checkpoint")
        with result.checkpoint.as_directory() as d:
            history = rv.get("history") or json.loads((Path(d) / "history.json").read_text())
            model_dir = _export(Path(d), out_dir, cfg)
    losses = [h["train_loss"] for h in history if h.get("train_loss") is not None]
    summary = {"fingerprint": run_id, "objective": cfg.objective, "model": str(model_dir), "rows": n_rows,
               "total_steps": total, "gpu": use_gpu, "seconds": round(time.perf_counter() - t0, 1),
               "counts": spec["counts"], "skips": spec["skips"], "empty_filter_batches": rv.get("empty_filter_batches"),
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
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
