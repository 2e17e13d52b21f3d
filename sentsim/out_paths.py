"""An output never overlaps an input: the one check every job runs on its --out before it writes or deletes.

`sentsim harvest --corpus X --out X --force-new` once deleted its own corpus: --force-new clears the run
folder, and nothing asked whether that folder was an input. Every job (corpus build, index build, cache
build, contexts, harvest, remix, the trainers, eval's report files) now calls `check_out` first, with
every path it reads. An output that is an input, lies inside one or holds one is refused, whether or not
--force-new was given, so the refusal of a fingerprint mismatch that suggests --force-new can never lead
to deleting an input.

Local paths are compared resolved (absolute, `~` expanded, symlinks followed, `file://` stripped);
URIs (`s3://bucket/key`) by scheme, bucket and key, one path segment at a time, so `s3://b/run2`
is not inside `s3://b/run`. A local path and a URI never overlap.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple, Union

from sentsim.errors import UsageError

Paths = Union[None, str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def location(path: Union[str, os.PathLike]) -> Tuple[str, ...]:
    """A comparable form of a path or URI: ("", resolved parts...) for a local path,
    (scheme, bucket, key parts...) for a URI."""
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    if "://" not in text:
        return ("",) + Path(os.path.expanduser(text)).resolve().parts
    scheme, _, rest = text.partition("://")
    return (scheme.lower(),) + tuple(p for p in rest.split("/") if p not in ("", "."))


def _within(inner: Tuple[str, ...], outer: Tuple[str, ...]) -> bool:
    return len(inner) >= len(outer) and inner[:len(outer)] == outer


def overlap(out: Union[str, os.PathLike], inp: Union[str, os.PathLike]) -> Optional[str]:
    """How `out` overlaps `inp` ("is", "lies inside", "holds"), or None when they are apart."""
    a, b = location(out), location(inp)
    if a == b:
        return "is"
    if _within(a, b):
        return "lies inside"
    if _within(b, a):
        return "holds"
    return None


def _each(paths: Paths):
    if paths is None:
        return
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for p in paths:
        if p is not None and os.fspath(p) != "":
            yield p


# What a command's --out becomes, in the words of a refusal; "run" is any sharded run (its stage is the
# store's to check: a run of another stage is refused there, and --force-new may replace it).
KINDS = {"run": "a sentsim run", "index": "a retrieval index", "discriminator": "a discriminator",
         "context": "a context-model bundle", "surrogate": "a surrogate's training output",
         "student": "a student's training output"}


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def held_kind(folder: Union[str, os.PathLike]) -> Optional[Tuple[str, str]]:
    """What a local folder already holds, as (kind, words), by the files each writer leaves there, from
    its first moment (a trainer killed before its first export included); None for anything else."""
    p = Path(os.path.expanduser(os.fspath(folder)))
    if "://" in os.fspath(folder) or not p.is_dir():
        return None
    names = {c.name for c in p.iterdir()}
    if "manifest.json" in names:
        stage = _json(p / "manifest.json").get("stage")
        return "run", f"a sentsim '{stage}' run" if stage else KINDS["run"]
    if "index.json" in names or any(n.startswith("build-") for n in names):
        return "index", KINDS["index"]
    fmt = str(_json(p / "sentsim_model.json").get("format", ""))
    if "context.json" in names or fmt.startswith("sentsim-context") or (
            "run.json" in names and names & {"runs", "tokenizer"}):
        return "context", KINDS["context"]
    if fmt.startswith("sentsim-discriminator") or (p / "_train" / "run.json").is_file():
        return "discriminator", KINDS["discriminator"]
    if "run.json" in names:
        config = _json(p / "run.json").get("config")
        if isinstance(config, dict) and "objective" in config:
            return "student", KINDS["student"]
        if isinstance(config, dict) and "loss" in config:
            return "surrogate", KINDS["surrogate"]
    return None


# What the trainers write into their --out by fixed names (a model, its reports, `model`, `curves`, `config.json`,
# `ray`, `checkpoint`), replaced on export and deleted by --force-new: a folder of other files is refused, as the
# sharded runs (storage.ShardStore.refuse_other_files) and the index writer refuse one.
TRAINED_KINDS = ("discriminator", "context", "surrogate", "student")


def refuse_other_files(p: Path, out_flag: str, text: str, writes: str) -> None:
    """Refuse a local --out folder that holds files and no sentsim output (held_kind is None there): the trainer's
    export would replace, and --force-new delete, whatever of them bears one of its names. Hidden names (a
    file system's own) are not counted, nor what a trainer leaves before its first mark: the lease of a run killed
    before it went ahead (the discriminator takes its lease in _train/). A folder with a writer's mark
    (has_writer_mark) is a sentsim output, of a kind held_kind may not name (an earlier format's)."""
    if has_writer_mark(p):
        return
    try:
        names = sorted(c.name for c in p.iterdir() if not c.name.startswith("."))
    except OSError:  # none there yet, a file (refused below), or a folder this process may not list: refused later
        return
    if not names:
        return
    from storage.lease import LEASE
    from storage.store import some_names

    other = [n for n in names if n not in (LEASE, "_train")]
    if other:
        shown = some_names(other)
        raise UsageError(f"{out_flag} {text} is not empty ({shown}) and holds no sentsim output; refusing to write "
                         f"{KINDS[writes]} among other files (--force-new discards only {KINDS[writes]}): give "
                         f"another {out_flag}")


def output_around(path: Path) -> Optional[Tuple[Path, str]]:
    """The nearest folder above `path` that holds a sentsim output, as (folder, words), or None. Only a sentsim
    writer's own marks count (a run's manifest naming its stage, a model's listing, a trainer's fingerprinted
    run record, a discriminator's training state, an index's record), so a project folder with a manifest.json
    of its own is none. A run's nested runs (a harvest's own rep_cache/) are built inside it by design."""
    for q in path.parents:
        try:
            found = _output_at(q, path)
        except OSError:  # a folder on the way this process may pass through but not look into: no mark it can see
            continue
        if found is not False:
            return found
    return None


def _output_at(q: Path, path: Path):
    """output_around's look at one folder above `path`: (q, words); None, where `path` is one of q's nested
    runs (no refusal); False, where q holds no output."""
    from storage.store import NESTED_RUNS

    if q.name == "_train" and (q / "run.json").is_file() and held_kind(q.parent) is not None:
        return False  # a discriminator's training state: named by the model folder it belongs to, next
    if (q / "manifest.json").is_file() and _json(q / "manifest.json").get("stage"):
        return None if q == path.parent and path.name in NESTED_RUNS else (q, held_kind(q)[1])
    return (q, (held_kind(q) or ("", "a sentsim output"))[1]) if has_writer_mark(q) else False


def has_writer_mark(q: Path) -> bool:
    """Whether folder `q` bears a sentsim writer's own mark beside a run's manifest: a model's listing, a
    discriminator's training state, a trainer's fingerprinted run record, an index's record."""
    return ((q / "sentsim_model.json").is_file() or (q / "_train" / "run.json").is_file()
            or ((q / "run.json").is_file() and "fingerprint" in _json(q / "run.json"))
            or str(_json(q / "index.json").get("format", "")).startswith("sentsim"))


def refuse_another_kind(folder: str, command: str) -> None:
    """`store verify` and `store compact` take a sharded run: another sentsim output there is named."""
    held = held_kind(folder)
    if held is not None and held[0] != "run":
        raise UsageError(f"{folder}: holds {held[1]}, not a sharded run; `sentsim {command}` takes the runs that "
                         "corpus build, cache build, contexts, harvest and remix write")


def in_job_working_copy() -> bool:
    """Whether this process is the driver of a `ray job submit --working-dir` job: Ray runs it in a copy of
    that folder under its session's runtime resources, so a relative output would be written there."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")  # set by Ray's job supervisor for the driver
    try:
        runtime_env = json.loads(raw).get("runtime_env") if raw else None
    except (ValueError, AttributeError):
        return False
    return isinstance(runtime_env, dict) and bool(runtime_env.get("working_dir"))


def refuse_relative_in_job(path, flag: str, uri_ok: bool = True) -> None:
    """A path a command writes to (an output, or a folder it changes in place, such as a run it compacts or a
    model whose card it records scores in), given relative inside a `ray job submit --working-dir` job: there
    it names Ray's temporary copy, which Ray deletes, so the work would be lost while the job reports success.
    `uri_ok`: whether the flag takes an object store too, so that the line offers only what the flag takes."""
    text = os.fspath(path)
    if "://" not in text and not os.path.isabs(os.path.expanduser(text)) and in_job_working_copy():
        raise UsageError(f"{flag} {text} is relative, and this Ray job runs in Ray's temporary copy of its "
                         "--working-dir, which Ray deletes: give an absolute path (one every node sees)"
                         + (" or s3://" if uri_ok else ""))


def check_out(out: Union[str, os.PathLike, None], inputs: Mapping[str, Paths], out_flag: str = "--out",
              folder: bool = True, local: Optional[str] = None, writes: Optional[str] = None) -> None:
    """Refuse `out` when it is, lies inside or holds any of `inputs` ({flag or config key: path(s)}),
    or (`folder`) when a local `out` is an existing file where the run's folder belongs (not `folder`: an
    existing folder where the output file belongs), or (`local`: what
    the command writes) when it is a URI and the command writes local files only, or (`writes`: a key of
    KINDS) when a local `out` already holds something of another kind, which the command would mix its
    files into or, exporting a model, delete: --force-new never changes that, since it discards only a
    run of the command's own kind.
    Call it before anything is written, read for resuming, or deleted."""
    if out is None or os.fspath(out) == "":
        return
    if local and "://" in os.fspath(out):  # else Path("s3://b/x") would quietly be a local folder s3:/b/x
        raise UsageError(f"{out_flag} {os.fspath(out)}: {local} go to a local folder (or a shared file system "
                         "that every node mounts), not an object store")
    if "://" not in os.fspath(out):  # first: in a job, the overlap line would be taken for a missing input's
        refuse_relative_in_job(os.fspath(out), out_flag, uri_ok=not local)
    for flag, paths in inputs.items():
        for inp in _each(paths):
            how = overlap(out, inp)
            if how is None:
                continue
            raise UsageError(
                f"{out_flag} {os.fspath(out)} {how} the input {flag} {os.fspath(inp)}; write to a folder outside "
                "every input (an output there could overwrite or, with --force-new, delete it)")
    text = os.fspath(out)
    if "://" in text:
        return
    held = held_kind(text) if writes else None
    if held is not None and held[0] != writes:
        raise UsageError(f"{out_flag} {text} holds {held[1]}, not {KINDS[writes]}; give another {out_flag}")
    p = Path(os.path.expanduser(text)).absolute()
    if held is None and writes in TRAINED_KINDS:
        refuse_other_files(p, out_flag, text, writes)
    if writes:
        outer = output_around(p)
        if outer is not None:
            raise UsageError(f"{out_flag} {text} lies inside {outer[0]}, which holds {outer[1]}: written there, it "
                             f"would mix with that output's files (or, with --force-new, delete them); give a "
                             f"{out_flag} outside it")
    # a symlink to nothing (a disk not mounted, a folder moved away) at out or on the way to it: neither a
    # folder nor one that can be made there, and following it would write somewhere the user did not name
    given = Path(os.path.expanduser(text))  # named as the user spelt it
    dangling = next((q for q in (given, *given.parents) if q.is_symlink() and not q.exists()), None)
    if dangling is not None:
        where = "is" if dangling == given else f"lies under {dangling}, which is"
        raise UsageError(f"{out_flag} {text}: {where} a symlink to {os.readlink(dangling)}, which does not exist; "
                         f"make its target, or give another {out_flag}")
    # the nearest existing path: out itself, or the ancestor it would be made in
    first = next((q for q in (p, *p.parents) if q.exists()), None)
    if not folder and first == p and p.is_dir():  # refused now, not after the work whose result it was to hold
        raise UsageError(f"{out_flag} {text}: is a folder, where the output is a file; give a file path")
    if first is not None and not first.is_dir():
        where = "is a file" if first == p else f"lies under {first}, which is a file"
        if folder or first != p:
            raise UsageError(f"{out_flag} {text}: {where}, not a folder; give a folder for the output")


def probe_file_out(path: Union[str, os.PathLike]) -> None:
    """Make a local output file's folder and write and remove an empty file there under the temporary name its
    writer uses, so that a report the file system will not take (a read-only disk, a folder such as /proc that
    makes no files) fails before the work whose result it holds, with the error the command's line names."""
    from storage.fs import temp_name

    p = Path(os.path.expanduser(os.fspath(path))).absolute()
    p.parent.mkdir(parents=True, exist_ok=True)
    probe = p.parent / temp_name(p.name)
    try:
        probe.open("wb").close()
    finally:
        probe.unlink(missing_ok=True)
