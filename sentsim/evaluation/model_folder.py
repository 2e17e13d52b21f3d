"""Is a folder a whole model? The check every reader of a model folder makes before loading it, so that a
folder cut short (a killed copy, a truncated download, an export from before exports were atomic) is
refused in one line naming what is missing, never a traceback from deep inside a loader or, worse, a
score from a model that is not the one trained.

sentsim's own exports (sentsim.model_swap) write `sentsim_model.json` beside the weights: the size
of every file they wrote. A folder that has it is checked against it exactly; any other folder (a
sentence-transformers model from elsewhere, a plain transformers checkpoint, a cross-encoder) is checked
for what its loader needs: a readable config, whole weights, a tokenizer, and each module's folder.

An export swaps its new folder in by two renames (OUT/model aside to OUT/model.old, OUT/model.new in).
A kill between them leaves no OUT/model: `resolve_model_folder` then reads OUT/model.new (whole: it
was fsynced before the first rename), and the next export or training run with that --out finishes
the swap. Readers never rename: a trainer may be exporting into the folder at that moment.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Optional

from sentsim.encoder_folder import context_bundle, has_tokenizer, not_an_encoder
from sentsim.errors import UsageError

INFO_FILE = "sentsim_model.json"
# documentation a reader does not need, rewritten after the export (eval sts adds its scores to the card)
UNLISTED = frozenset({INFO_FILE, "README.md"})
STAGED, ASIDE = "new", "old"  # suffixes of the export's two sibling folders


def sibling(folder: Path, suffix: str) -> Path:
    """OUT/model.new or OUT/model.old: beside the model, on its filesystem, so that a rename moves it."""
    return folder.parent / f"{folder.name}.{suffix}"


def resolve_model_folder(path: str | Path, flag: str = "--model") -> Path:
    """The folder to read for `path`: itself, or the whole new model of an export cut between its renames.
    Raises UsageError (one line) when there is no folder there."""
    p = Path(path)
    if p.is_dir():
        return p
    if p.exists():
        raise UsageError(f"{flag} {path}: not a directory")
    staged, aside = sibling(p, STAGED), sibling(p, ASIDE)
    if staged.is_dir() and aside.is_dir():
        print(f"note: {flag} {path}: an export stopped between its two renames; reading {staged.name}, the new "
              "model beside it (the next training run with that --out puts it in place)", file=sys.stderr)
        return staged
    if aside.is_dir():
        print(f"note: {flag} {path}: an export stopped after moving it aside; reading {aside.name}, the model "
              "as it was", file=sys.stderr)
        return aside
    raise UsageError(f"{flag} {path}: no such folder")


def check_model_folder(path: str | Path, flag: str = "--model") -> Path:
    """The folder to load for `path` (see resolve_model_folder), checked whole; else one UsageError naming
    the folder and what is missing or cut short."""
    p = resolve_model_folder(path, flag)
    shown = f"{flag} {path}" if Path(path) == p else f"{flag} {path} ({p.name})"
    bundle = context_bundle(p)
    if bundle is not None:  # its models have no tokenizer of their own: "no tokenizer" would mislead
        raise UsageError(f"{shown}: {not_an_encoder(p, bundle)}; a context model's scores are evaluated by "
                         "harvesting the task's pairs (sentsim harvest --pairs FILE) and giving the run to "
                         "eval sts --scores")
    problem = _listed_problem(p) if (p / INFO_FILE).is_file() else _generic_problem(p)
    if problem and not problem.startswith("not a model folder"):
        problem = f"not a whole model: {problem}"
    if problem:
        raise UsageError(f"{shown}: {problem}")
    return p


def _read_json(f: Path):
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Bad(f"{f.name} is not readable JSON ({type(exc).__name__})") from None


class _Bad(Exception):
    pass


def _listed_problem(p: Path) -> Optional[str]:
    """A sentsim export: every file it lists is there at its size, and its weights are whole."""
    try:
        info = _read_json(p / INFO_FILE)
        files = info.get("files") if isinstance(info, dict) else None
        if not isinstance(files, dict) or not files:
            return f"{INFO_FILE} lists no files"
        for name, size in sorted(files.items()):
            f = p / name
            if not f.is_file():
                return f"{name} is missing ({INFO_FILE} lists it)"
            if f.stat().st_size != size:
                return f"{name} is {f.stat().st_size} bytes, the export wrote {size} (cut short or changed)"
            if name.endswith(".safetensors"):
                _check_safetensors(f, name)
    except _Bad as bad:
        return str(bad)
    return None


def exported_model_hint(p: Path) -> str:
    """A trainer's --out holds its models one level down (OUT/model, OUT/model-sts): name the one to give. A
    harvest's folder holds scored pairs, which `--scores` evaluates."""
    inside = [p / n for n in ("model", "model-sts") if (p / n / "config.json").is_file() or
              (p / n / "modules.json").is_file()]
    if inside:
        return f"; a trainer's output holds its model in a folder: give --model {inside[0]}"
    try:
        stage = json.loads((p / "manifest.json").read_text(encoding="utf-8")).get("stage")
    except (OSError, ValueError, AttributeError):
        return ""
    if stage in ("harvest", "harvest-remix"):
        return f"; it is a harvest run, whose scored pairs --scores {p} evaluates"
    return ""


def _generic_problem(p: Path) -> Optional[str]:
    """A folder from elsewhere: what sentence-transformers or transformers will read from it."""
    try:
        if (p / "modules.json").is_file():
            modules = _read_json(p / "modules.json")
            if not isinstance(modules, list):
                return "modules.json is not a list of modules"
            for m in modules:
                if not isinstance(m, dict):
                    return f"modules.json: {m!r} is not a module"
                sub = p / str(m.get("path", ""))
                if not sub.is_dir():
                    return f"module folder {m.get('path')} is missing"
                if str(m.get("type", "")).endswith("Transformer"):
                    _check_transformer(sub, p)
            return None
        if not (p / "config.json").is_file():
            return "not a model folder (no config.json or modules.json)" + exported_model_hint(p)
        _check_transformer(p, p)
    except _Bad as bad:
        return str(bad)
    return None


def _check_transformer(d: Path, root: Path) -> None:
    """config.json, whole weights and a tokenizer in `d` (names shown relative to `root`)."""
    rel = "" if d == root else f"{d.relative_to(root)}/"
    if not (d / "config.json").is_file():
        raise _Bad(f"{rel}config.json is missing")
    _read_json(d / "config.json")
    index = d / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set((_read_json(index).get("weight_map") or {}).values()))
        if not shards:
            raise _Bad(f"{rel}{index.name} names no shards")
    elif (d / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise _Bad(f"{rel}model.safetensors is missing (no weights)")
    for name in shards:
        if not (d / name).is_file():
            raise _Bad(f"{rel}{name} is missing")
        _check_safetensors(d / name, rel + name)
    if not has_tokenizer(d):
        raise _Bad(f"no tokenizer ({rel}tokenizer.json or a vocabulary file) is there")


def _check_safetensors(f: Path, shown: str) -> None:
    """A safetensors file is an 8-byte header length, a JSON header, then the tensors' bytes: the largest
    end offset in the header must be exactly the bytes that follow it. Read without loading a tensor."""
    size = f.stat().st_size
    try:
        with f.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise _Bad(f"{shown} is cut short ({size} bytes, not a safetensors file)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise _Bad(f"{shown} is cut short ({size} bytes; its header alone is {n})")
            header = json.loads(fh.read(n).decode("utf-8"))
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, struct.error, AttributeError, KeyError, IndexError,
            TypeError, ValueError) as exc:
        raise _Bad(f"{shown} is not a readable safetensors file ({type(exc).__name__})") from None
    want = 8 + n + max(ends, default=0)
    if want != size:
        raise _Bad(f"{shown} is {size} bytes, its header says {want} (cut short or not one file)")
