"""Replace a model folder so that a kill at any moment leaves the old model or the new one, whole.

Both ways write the new model into a staged folder first and seal it: `sentsim_model.json` (the size of
every file) written last, then the whole staged folder fsynced. A staged folder that is not sealed is a
half-written one and is removed; nothing reads it.

`replace_folder`: a folder that is only the model (a trainer's OUT/model). The new one is OUT/model.new;
two renames swap it in: OUT/model aside to OUT/model.old, OUT/model.new to OUT/model; then OUT/model.old
is removed. POSIX has no rename that replaces a non-empty folder, hence the two. Killed while writing:
OUT/model is untouched. Killed between the renames: no OUT/model, but OUT/model.old and a whole
OUT/model.new; readers read the new one (sentsim.evaluation.model_folder.resolve_model_folder), and
`finish_swap` (each export, and each training run as it starts) renames it in. Killed while removing
OUT/model.old: OUT/model is the new model; the rest of OUT/model.old goes next time.

`replace_in_place`: a folder that is a model and also holds its trainer's state (a discriminator's or a
context bundle's --out), which a swap of the whole folder would move, and which may be a mount point that
cannot be renamed. The model's *commit file* (config.json, context.json) is what makes the folder a model:
it is removed first and written last, atomically. The new model is staged beside the folder, in
`.NAME.sentsim-new`, hidden and named for sentsim so that no folder of the user's is taken for it, and
outside the folder so that the model's identity (sentsim.identity.model_files) never sees it. Once it is
sealed the replacement is decided: the old commit file goes, then the old model's files, the staged files
are linked in (copied across filesystems), the commit file is written, the trainer's scratch the export
ends (`scratch_removed`) is removed, and last the staged folder. Each step can be done again, so
`finish_in_place` (each save, and the discriminator trainer under its --out lease, as it starts) completes a
replacement a kill cut short. Readers (`resolve_in_place`) read the folder while it has its commit file
(the old model whole, or the new one whole) and else the sealed staged folder (the new model whole);
they never write.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional

from sentsim.evaluation.model_folder import ASIDE, INFO_FILE, STAGED, UNLISTED, sibling

IN_PLACE_SUFFIX = "sentsim-new"


# ------------------------------------------------------------------------------------ the whole folder


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


# ------------------------------------------------------------------------------------ in place


def staged_beside(folder: Path) -> Path:
    """Where `replace_in_place` stages the new model of `folder`: beside it, hidden."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.{IN_PLACE_SUFFIX}"


def sealed_info(staged: Path) -> Optional[dict]:
    """The sealed staged folder's `sentsim_model.json` when every file it lists is there at its size; else
    None (not sealed: a kill cut the writing short)."""
    try:
        info = json.loads((Path(staged) / INFO_FILE).read_text(encoding="utf-8"))
        files = info["files"]
        if all((Path(staged) / n).is_file() and (Path(staged) / n).stat().st_size == s for n, s in files.items()):
            return info
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
        pass
    return None


def resolve_in_place(folder: str | Path, commit: str) -> Path:
    """The folder a reader loads for `folder`: itself while its commit file is there, else the sealed
    staged folder of a replacement a kill cut short (the new model, whole), else itself (to be refused)."""
    folder = Path(folder)
    if (folder / commit).is_file():
        return folder
    staged = staged_beside(folder)
    if sealed_info(staged) is not None:
        print(f"note: {folder}: a save of this model stopped midway; reading {staged.name}, the new model beside "
              "it (the next save or training run with that --out puts it in place)", file=sys.stderr)
        return staged
    return folder


def _link_or_copy(src: Path, dst: Path) -> None:
    """`dst` becomes `src`'s bytes in one rename (a hard link, or a copy across filesystems)."""
    from storage.fs import temp_name

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / temp_name(dst.name)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def remove_path(path: Path) -> None:
    """Remove a file, link or folder, whichever is there; nothing when none is."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def listed_names(folder: Path) -> set:
    """The top-level names of the files a model folder's listing (INFO_FILE) names; none when it has no
    readable listing."""
    try:
        return {Path(n).parts[0] for n in json.loads((folder / INFO_FILE).read_text())["files"]}
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return set()


def in_place_steps(folder: Path, commit: str) -> list[Callable[[], None]]:
    """The replacement of `folder`'s model by its sealed staged folder, one step each; each can run again."""
    from storage.fs import durable_replace, fsync_path, temp_name

    folder = Path(folder)
    staged = staged_beside(folder)

    def files() -> list[Path]:
        return sorted(f.relative_to(staged) for f in staged.rglob("*") if f.is_file())

    def drop_commit():
        if (folder / commit).exists():
            (folder / commit).unlink()
            fsync_path(str(folder))

    def drop_old():  # the old model's files: every top-level name of the new model and of the old listing
        for name in sorted({f.parts[0] for f in files()} | listed_names(folder)):
            remove_path(folder / name)

    def link_new():
        dirs = {folder}
        for rel in files():
            if str(rel) != commit:
                _link_or_copy(staged / rel, folder / rel)
                fsync_path(str(folder / rel))
                dirs.update(p for p in (folder / rel).parents if folder in (p, *p.parents))
        for d in sorted(dirs, key=lambda p: -len(p.parts)):  # deepest first: a folder's entry after its names
            fsync_path(str(d))

    def write_commit():
        tmp = folder / temp_name(commit)
        shutil.copyfile(staged / commit, tmp)
        durable_replace(str(tmp), str(folder / commit))

    def drop_scratch():
        for name in (sealed_info(staged) or {}).get("scratch_removed", []):
            remove_path(folder / name)

    def drop_staged():
        shutil.rmtree(staged, ignore_errors=True)

    return [drop_commit, drop_old, link_new, write_commit, drop_scratch, drop_staged]


def finish_in_place(folder: str | Path, commit: str) -> bool:
    """Complete a replacement a kill cut short (its staged folder sealed), or remove a half-written staged
    folder: `folder` then holds one whole model, or none, and nothing is staged beside it. True when a
    replacement was completed (the model in `folder` is the one that export wrote)."""
    folder = Path(folder)
    staged = staged_beside(folder)
    if not staged.exists():
        return False
    info = sealed_info(staged)
    if info is None or not folder.is_dir():
        shutil.rmtree(staged, ignore_errors=True)
        return False
    # from the start even when the kill came after the commit: two models' folders can match file for file
    # in every size, so nothing short of their bytes tells whether this one is linked in yet
    for step in in_place_steps(folder, commit):
        step()
    return True


def discard_in_place(folder: str | Path, commit: str) -> None:
    """Remove the model in `folder` (its commit file first, so that no reader takes what is left for a model,
    then every file its listing names, and the listing), keeping the folder's other names: what --force-new
    does to the model of the run it discards, which would otherwise sit beside the new run's state."""
    folder = Path(folder)
    finish_in_place(folder, commit)
    if not (folder / commit).exists() and not (folder / INFO_FILE).exists():
        return
    (folder / commit).unlink(missing_ok=True)
    for name in sorted(listed_names(folder) - {commit}):
        remove_path(folder / name)
    (folder / INFO_FILE).unlink(missing_ok=True)


def _format_of(folder: Path) -> Optional[str]:
    try:
        info = json.loads((folder / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return str(info.get("format")) if isinstance(info, dict) and info.get("format") else None


def replace_in_place(folder: str | Path, commit: str, write: Callable[[Path], None], info: dict,
                     scratch_removed: Iterable[str] = ()) -> Path:
    """Replace the model in `folder` (other names in it are kept) by the one `write(staged)` writes,
    whose file `commit` makes it a model; then remove `scratch_removed` from `folder`. On an error before
    the staged folder is sealed, the old model stays as it was."""
    folder = Path(folder)
    held = _format_of(folder)
    if held and held != info.get("format"):  # its listing would name the other model's files for removal
        from sentsim.errors import UsageError

        raise UsageError(f"{folder} holds a model of another kind ({held}), not {info.get('format')}; "
                         "give another --out")
    finish_in_place(folder, commit)
    staged = staged_beside(folder)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    try:
        write(staged)
        if not (staged / commit).is_file():
            raise RuntimeError(f"{staged}: the model written there has no {commit}")
        seal(staged, {**info, "scratch_removed": sorted(scratch_removed)})
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    folder.mkdir(parents=True, exist_ok=True)
    for step in in_place_steps(folder, commit):
        step()
    return folder
