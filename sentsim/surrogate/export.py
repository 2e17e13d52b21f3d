"""Replace a model folder so that a kill at any moment leaves the old model or the new one, whole.

The new folder is written beside the old one (OUT/model.new, same filesystem), with `sentsim_model.json`
listing every file it holds and its size, and fsynced. Then two renames swap it in: OUT/model aside to
OUT/model.old, OUT/model.new to OUT/model; then OUT/model.old is removed. POSIX has no rename that
replaces a non-empty folder, hence the two.

Killed while writing: OUT/model is untouched; the half-written OUT/model.new is removed by the next
export. Killed between the renames: no OUT/model, but OUT/model.old and a whole OUT/model.new; readers
read the new one (sentsim.evaluation.model_folder.resolve_model_folder), and `finish_swap` (each export,
and each training run as it starts) renames it in. Killed while removing OUT/model.old: OUT/model is the
new model; the rest of OUT/model.old goes next time.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from sentsim.evaluation.model_folder import ASIDE, INFO_FILE, STAGED, UNLISTED, sibling


def finish_swap(out: Path) -> None:
    """Leave OUT/model as the whole old or whole new model and no export sibling beside it."""
    from storage.fs import durable_replace

    out = Path(out)
    staged, aside = sibling(out, STAGED), sibling(out, ASIDE)
    if not out.exists():
        if staged.is_dir() and aside.is_dir():  # the first rename happened: staged was whole by then
            durable_replace(str(staged), str(out))
        elif aside.is_dir():
            durable_replace(str(aside), str(out))
    for d in (staged, aside):  # a staged folder never renamed in was not finished, or is not wanted
        if d.exists():
            shutil.rmtree(d)


def stage(out: Path) -> Path:
    """An empty OUT/model.new to write the new model into, after any earlier swap is finished."""
    finish_swap(out)
    staged = sibling(Path(out), STAGED)
    staged.mkdir(parents=True)
    return staged


def seal(staged: Path, info: dict) -> None:
    """Write `sentsim_model.json` (`info` plus the size of every file written so far) and fsync the folder."""
    from storage.fs import fsync_tree

    files = {str(f.relative_to(staged)): f.stat().st_size for f in sorted(staged.rglob("*"))
             if f.is_file() and f.name not in UNLISTED}
    (staged / INFO_FILE).write_text(json.dumps({**info, "files": files}, indent=2), encoding="utf-8")
    fsync_tree(str(staged))


def swap_steps(out: Path) -> list[Callable[[], None]]:
    """The commit of a sealed OUT/model.new, one rename or removal a step."""
    from storage.fs import durable_replace

    out = Path(out)
    staged, aside = sibling(out, STAGED), sibling(out, ASIDE)

    def move_aside():
        if out.exists():
            durable_replace(str(out), str(aside))

    def move_in():
        durable_replace(str(staged), str(out))

    def remove_aside():
        if aside.exists():
            shutil.rmtree(aside)

    return [move_aside, move_in, remove_aside]


def replace_folder(out: Path, write: Callable[[Path], None], info: dict) -> Path:
    """Write a new OUT/model with `write(folder)` and swap it in; on an error, the old one stays."""
    staged = stage(out)
    try:
        write(staged)
        seal(staged, info)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    for step in swap_steps(out):
        step()
    return Path(out)

