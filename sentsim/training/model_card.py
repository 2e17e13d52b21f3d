"""The model card (README.md) of an exported surrogate or student: what a user who finds the folder needs to
know what it is. YAML front matter as sentence-transformers' own cards have it (base_model, tags,
library_name, pipeline_tag, and model-index once STS scores exist), then its base model, the harvest it
was trained on (path and fingerprint) and the teacher's metric, the objective and its main settings, the
row counts, the final dev metrics and its STS scores.

The card is rendered from `sentsim_model.json` (its "card" and "sts" entries), written by the export; `sentsim
eval sts --model FOLDER` records its scores there and renders the card again (`record_sts`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from sentsim.evaluation.datasets import DEFAULT_TASKS
from sentsim.evaluation.model_folder import INFO_FILE

CARD_FILE = "README.md"
_POINT_KEYS = ("step", "epoch")


def base_model(bb: dict, init: str) -> dict:
    """The card's base model from check_backbone's record. Its folder, not a hub name: a config's
    _name_or_path names what that model was trained from (all-MiniLM-L6-v2's says nreimers/MiniLM-...)."""
    return {"name": None, "path": str(bb["path"]), "model_type": bb.get("model_type"), "init": init}


def harvest_data(path: Optional[str], manifest: dict) -> dict:
    """The card's training data when it is a harvest run."""
    config = manifest.get("config") or {}
    return {"kind": "harvest", "path": str(path), "fingerprint": manifest.get("fingerprint"),
            "stage": manifest.get("stage"), "teacher_metric": config.get("metric"),
            "complete": manifest.get("complete")}


def final_metrics(checkpoint: Path) -> dict:
    """The dev/test metrics of a checkpoint's last history point that has any."""
    from sentsim.training.loop import HISTORY_FILE

    try:
        history = json.loads((Path(checkpoint) / HISTORY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    for point in reversed(history):
        found = {k: v for k, v in point.items() if k.startswith(("dev_", "test_")) and isinstance(v, (int, float))}
        if found:
            return {"step": point.get("step"), **found}
    return {}


def front_matter(card: dict, sts: dict) -> dict:
    bm = card.get("base_model") or {}
    cross = card.get("form") == "cross-encoder"
    front = {}
    if bm.get("init") == "pretrained":
        front["base_model"] = bm.get("name") or bm.get("path")
    front.update({
        "library_name": "sentence-transformers",
        "pipeline_tag": "text-ranking" if cross else "sentence-similarity",
        "tags": ["sentence-transformers", "cross-encoder" if cross else "sentence-similarity", "sentsim",
                 f"sentsim-{card.get('kind')}", str((card.get("objective") or {}).get("name"))],
    })
    data = card.get("data") or {}
    if data.get("kind") == "STS-B train":
        front["datasets"] = ["sentence-transformers/stsb"]
    # published-comparable scores only: a stand-in split (SICK train+trial for a missing test file) is in the
    # card's table with its note, not in the metadata that model hubs list beside other models' results
    tasks = {k: v for k, v in (sts.get("tasks") or {}).items()
             if v.get("spearman") is not None and not _stand_in(v)}
    if tasks:
        front["metrics"] = ["spearman_cosine", "pearson_cosine"]
        front["model-index"] = [{"name": card.get("title"), "results": [
            {"task": {"type": "semantic-similarity", "name": "Semantic Similarity"},
             "dataset": {"name": name, "type": name},
             "metrics": [{"type": "spearman_cosine", "value": round(t["spearman"] / 100, 4), "name": "Spearman Cosine"},
                         *([{"type": "pearson_cosine", "value": round(t["pearson"] / 100, 4),
                             "name": "Pearson Cosine"}] if t.get("pearson") is not None else [])]}
            for name, t in tasks.items()]}]
    return front


def _num(x) -> str:
    return f"{x:,}" if isinstance(x, int) else (f"{x:.4g}" if isinstance(x, float) else str(x))


def _base_lines(card: dict) -> list[str]:
    bm = card.get("base_model") or {}
    where = f"folder `{bm.get('path')}` ({bm.get('model_type')})"
    if bm.get("name"):
        where = f"`{bm['name']}`, {where}"
    if bm.get("init") == "scratch":
        return [f"- Trained from scratch (random weights); tokenizer from {where}"]
    return [f"- Base model: {where}, fine-tuned from its weights"]


def _data_lines(card: dict) -> list[str]:
    d = card.get("data") or {}
    if d.get("kind") == "harvest":
        state = "" if d.get("complete") in (None, True) else " (incomplete when training read it)"
        lines = [f"- Harvest: `{d.get('path')}`, fingerprint `{d.get('fingerprint')}`, {d.get('stage')} run{state}",
                 "- Teacher: the Origin similarity of the harvest (Eq. 4), metric "
                 + (f"`{d['teacher_metric']}`" if d.get("teacher_metric") else "not recorded in its manifest")]
    elif d:
        lines = [f"- {d.get('kind')}: `{d.get('path')}` ({d.get('targets', 'gold scores')})"]
    else:
        lines = ["- No training data recorded"]
    rows = card.get("rows") or {}
    if rows:
        why = ", ".join(f"{_num(n)} {reason}" for reason, n in (rows.get("left_out") or {}).items() if n)
        of = f" of {_num(rows['total'])}" if rows.get("total") is not None else ""
        lines.append(f"- Rows: trained on {_num(rows.get('trained'))}{of} {rows.get('unit', 'rows')}"
                     + (f" (left out: {why})" if why else ""))
        for k, v in rows.items():
            if k not in ("trained", "total", "unit", "left_out"):
                lines.append(f"- {k.replace('_', ' ')}: {_num(v)}")
    return lines


def _training_lines(card: dict) -> list[str]:
    obj = card.get("objective") or {}
    lines = [f"- Objective: `{obj.get('name')}`" + (f", {obj['description']}" if obj.get("description") else "")]
    t = card.get("training") or {}
    if t:
        lines.append(_steps_line(t))
        final = {k: v for k, v in (t.get("final") or {}).items() if k not in _POINT_KEYS}
        if final:
            lines.append(f"- Dev/test metrics at step {_num((t.get('final') or {}).get('step'))}: "
                         + ", ".join(f"{k} {_num(v)}" for k, v in final.items())
                         + " (Spearman x100 against the training targets)")
    settings = card.get("settings") or {}
    if settings:
        lines += ["", "| setting | value |", "|---|---|"]
        lines += [f"| {k} | `{json.dumps(v)}` |" for k, v in settings.items()]
    return lines


def _steps_line(t: dict) -> str:
    """What was trained: the steps, the epochs they make and the rows they read (`training_extent`'s entries); a
    card exported before those were recorded says its steps and the epochs its settings asked for."""
    steps, per_epoch = t.get("steps"), t.get("steps_per_epoch")
    if not isinstance(steps, int) or not isinstance(per_epoch, int) or per_epoch < 1:
        return f"- Steps: {_num(steps)}, with epochs={_num(t.get('epochs'))}"
    rows, read = t.get("rows"), t.get("rows_read")
    if steps < per_epoch:
        part = f"{steps / per_epoch:.2g}"
        if float(part) >= 1:  # a part of an epoch never rounds up to a whole one: 299 of 300 steps is 0.99
            part = f"{math.floor(100 * steps / per_epoch) / 100:g}"
        return (f"- Steps: {steps:,}, {part} of an epoch of {per_epoch:,} steps: "
                f"{_num(read)} of the {_num(rows)} training rows read (the step budget ended the run)")
    epochs = steps / per_epoch
    return (f"- Steps: {steps:,}, {epochs:.3g} epoch{'' if epochs == 1 else 's'} of {per_epoch:,} steps: "
            f"{_num(read)} reads of the {_num(rows)} training rows")


def _sts_lines(sts: dict, folder_hint: str) -> list[str]:
    tasks = sts.get("tasks") or {}
    if not tasks:
        return [f"Not evaluated yet: `sentsim eval sts --model {folder_hint} --data STS_DIR` adds its scores here."]

    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    lines = ["Spearman and Pearson x100 of the cosine (a cross-encoder: its score) against gold, every pair of "
             "a task pooled ('all' setting), from `sentsim eval sts`.", "",
             "| task | pairs | Spearman | Pearson | data hash | note |", "|---|---:|---:|---:|---|---|"]
    for name, t in tasks.items():
        lines.append(f"| {name} | {t.get('scored')}/{t.get('pairs')} | {fmt(t.get('spearman'))} | "
                     f"{fmt(t.get('pearson'))} | `{t.get('data_hash')}` | {t.get('note') or ''} |")
    # the suite's mean: its tasks only (not STS-B's train or dev splits, which a model may also be scored on),
    # each on its published split
    suite = [n for n, t in tasks.items() if n in DEFAULT_TASKS and t.get("spearman") is not None and not _stand_in(t)]
    if suite:
        mean = sum(tasks[n]["spearman"] for n in suite) / len(suite)
        lines.append(f"| **Avg.** | | **{mean:.2f}** | | | mean of {len(suite)} of the suite's {len(DEFAULT_TASKS)} "
                     f"tasks ({', '.join(suite)}) |")
    return lines


def _stand_in(task: dict) -> bool:
    """Whether a task was scored on another split than the published one (eval sts's note says so)."""
    return "not comparable" in (task.get("note") or "")


def render(info: dict) -> str:
    """README.md from a sentsim_model.json's content."""
    import yaml

    card, sts = info.get("card") or {}, info.get("sts") or {}
    cross = card.get("form") == "cross-encoder"
    loader = "CrossEncoder" if cross else "SentenceTransformer"
    use = "model.predict([(s1, s2)])" if cross else "model.similarity(model.encode([s1]), model.encode([s2]))"
    body = [f"# {card.get('title', 'sentsim model')}", "", card.get("summary", ""), "", "## Base model", "",
            *_base_lines(card), "", "## Training data", "", *_data_lines(card), "", "## Training", "",
            *_training_lines(card), "", "## STS evaluation", "", *_sts_lines(sts, "path/to/this/folder"), "",
            "## Usage", "", "```python", f"from sentence_transformers import {loader}", "",
            f'model = {loader}("path/to/this/folder")', f"scores = {use}", "```", "",
            f"`{INFO_FILE}` holds the same facts as JSON, and the size of every file of the model "
            "(`sentsim eval sts` refuses a folder that does not match it).", ""]
    front = yaml.safe_dump(front_matter(card, sts), sort_keys=False, allow_unicode=True)
    return f"---\n{front}---\n\n" + "\n".join(body)


def record_sts(folder: Path, report) -> bool:
    """Add an evaluation report's per-task scores to a sentsim model folder's card (a task evaluated again
    is replaced), atomically; False for a folder that sentsim did not export (left alone)."""
    from storage.fs import write_text_atomic

    folder = Path(folder)
    path = folder / INFO_FILE
    if not path.is_file():
        return False
    info = json.loads(path.read_text(encoding="utf-8"))
    tasks = dict((info.get("sts") or {}).get("tasks") or {})
    for t in report.tasks:
        tasks[t.name] = {"pairs": t.n, "scored": t.scored, "spearman": t.spearman, "pearson": t.pearson,
                         "data_hash": t.data_hash, "note": t.note}
    info["sts"] = {"tasks": tasks}
    # the same scores again (a rerun of the same evaluation) leave both files as they were, mtimes included
    for target, text in ((path, json.dumps(info, indent=2)), (folder / CARD_FILE, render(info))):
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            write_text_atomic(str(target), text)
    return True
