"""The `sentsim` command: a tree of subcommands discovered from `sentsim.commands`."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import re
import signal
import sys
from typing import NoReturn, Optional, Sequence

from sentsim.errors import UsageError, WorkerLost
from sentsim.lost_workers import error_chain

GROUP_HELP = {
    "corpus": "ingest documents into sentence and chunk shards",
    "cache": "build the discriminator's representation cache of a corpus, for screened contexts",
    "store": "verify and compact shard stores (the run folders every stage writes)",
    "index": "build retrieval indexes over corpus chunks",
    "train": "train models (discriminator, context, surrogate, student)",
    "eval": "evaluate models and scored pairs",
}


# `sentsim --help` lists the commands in the order data flows through them (README, "Commands"); a command
# not named here comes after these, by name
FLOW = ("corpus build", "index build", "train discriminator", "cache build", "contexts", "train context", "harvest",
        "remix", "train surrogate", "train student", "eval sts", "store verify", "store compact")


def _command_modules():
    import sentsim.commands as pkg

    mods = [importlib.import_module(f"sentsim.commands.{info.name}") for info in pkgutil.iter_modules(pkg.__path__)]
    mods = [m for m in mods if hasattr(m, "COMMAND") and hasattr(m, "run")]
    name = lambda m: " ".join(m.COMMAND)  # noqa: E731
    yield from sorted(mods, key=lambda m: (FLOW.index(name(m)) if name(m) in FLOW else len(FLOW), name(m)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sentsim",
        description="Harvest pseudo-labelled sentence similarities on Ray and distil encoders from them.",
    )
    sub = parser.add_subparsers(dest="_command", metavar="COMMAND")
    sub.required = True
    groups: dict[str, tuple[argparse.ArgumentParser, argparse._SubParsersAction]] = {}
    for mod in _command_modules():
        path = tuple(mod.COMMAND)
        target, levels = sub, [parser]
        for depth, name in enumerate(path[:-1]):
            key = " ".join(path[: depth + 1])
            if key not in groups:
                gp = target.add_parser(name, help=GROUP_HELP.get(key, name), description=GROUP_HELP.get(key))
                gsub = gp.add_subparsers(dest=f"_sub{depth}", metavar="COMMAND")
                gsub.required = True
                groups[key] = gp, gsub
            levels.append(groups[key][0])
            target = groups[key][1]
        p = target.add_parser(path[-1], help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        # the parser of each word of the command (`sentsim`, a group, the command), to refuse an unknown flag
        # with the usage of the one it was given to (see main)
        p.set_defaults(_run=mod.run, _path=path, _parsers=(*levels, p))
    return parser


def _refusing_parser(args, argv: Sequence[str], unknown: Sequence[str]):
    """The parser an unknown argument was given to, and the unknown arguments given to it: `sentsim` owns
    what comes before the command's first word, a group (`train`) what comes between its word and the next,
    the command the rest. argparse takes the first argument after a group's word that is no flag as the next
    word, so every argument before it is a flag given to that group, and the next word is the first argument
    of its spelling from there."""
    start = 0
    for level, word in zip(args._parsers, args._path):
        end = argv.index(word, start)
        given = [a for a in argv[start:end] if a in unknown]
        if given:
            return level, given
        start = end + 1
    return args._parsers[-1], list(unknown)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # batch jobs: per-file download/loading bars from huggingface_hub and transformers only bury the
    # progress lines in a job's log (set the variable to 0 to see them)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    # argparse hands a subcommand's unknown flags up to the top-level parser, whose error shows `sentsim`'s
    # usage (`sentsim [-h] COMMAND ...`); the usage of the parser a flag was given to lists the flags it takes
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        refusing, given = _refusing_parser(args, argv, unknown)
        refusing.error(f"unrecognized arguments: {' '.join(given)}")
    if getattr(args, "executor", None) == "inline" and getattr(args, "address", None):
        # an inline run attaches to no cluster: said, as index build says it of one worker, not left silent
        print(f"note: --address is not used (--executor inline runs in this process); --executor ray runs on "
              f"{args.address}", file=sys.stderr)
    try:
        return int(args._run(args) or 0)
    except WorkerLost as exc:
        # the machine's doing, not a bug: no traceback, but Ray's own report of the loss (which worker, the
        # node's memory and its top users) above the line, which says what to change; SENTSIM_DEBUG=1 shows
        # the whole chain
        if os.environ.get("SENTSIM_DEBUG"):
            raise
        if exc.detail and "Traceback" not in exc.detail:  # Train's text of a worker's failure holds its traceback
            print(f"Ray's report:\n{exc.detail.strip()}", file=sys.stderr)
        print(f"sentsim: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        # A user's mistake found inside a Ray task, actor or Train worker arrives wrapped in
        # Ray's own error types; unwrap it so it still prints as one line.
        msg = (_wrapped_usage_error(exc) or _setup_error(exc, args) or _output_not_made(exc, args)
               or _object_store_error(exc, argv))
        lost = None if msg is not None else _lost_worker_line(exc, args)
        if lost is not None and not os.environ.get("SENTSIM_DEBUG"):
            print(f"sentsim: error: {lost}", file=sys.stderr)
            return WorkerLost.exit_code
        if msg is None or os.environ.get("SENTSIM_DEBUG"):
            raise
        line = msg.splitlines()[0] if msg else repr(exc)
        print(f"sentsim: error: {line}{_job_copy_hint(line, argv)}", file=sys.stderr)
        return UsageError.exit_code
    except (KeyboardInterrupt, SystemExit):
        # no command exits from inside: a SystemExit there is Ray Train's SIGINT handler's, a Ctrl-C as well
        print(INTERRUPTED, file=sys.stderr)
        return 130


INTERRUPTED = "sentsim: interrupted; run the same command again to resume"


def _lost_worker_line(exc: BaseException, args):
    """A Ray worker killed for memory or dead where no run named its stage (the executor and the trainers
    do): one line, naming the command, that the same command resumes."""
    from sentsim.lost_workers import lost_worker, sharded_job_line

    lost = lost_worker(exc)
    return None if lost is None else sharded_job_line(" ".join(args._path), lost, [], {})


def _job_copy_hint(line: str, argv: Sequence[str]) -> str:
    """Inside a `ray job submit --working-dir` job, a relative input the error names and this copy lacks
    is most likely one git ignores (Ray uploads the working dir less what .gitignore lists): say so."""
    from sentsim.out_paths import in_job_working_copy

    if not in_job_working_copy() or " is relative, and this Ray job" in line:
        return ""
    flag = None  # the flag the value is given to: None for a positional one
    for arg in argv:
        value = arg.split("=", 1)[-1]
        # a path the line names: a command word (harvest, sts) or a --set number is none, however it is spelt
        # named as typed, or made absolute (a trainer resolves its inputs before it reads them)
        if _path_like(value) and "://" not in value and not os.path.isabs(value) and \
                (value in line or os.path.abspath(value) in line) and not os.path.exists(value):
            given = arg.split("=", 1)[0] if (arg.startswith("--") or flag == "--set") and "=" in arg else flag
            return (f" ({value} is relative, and this Ray job runs in Ray's copy of its --working-dir, which holds "
                    "neither what .gitignore lists nor anything outside it: give an absolute path that every node "
                    f"sees{', or s3://' if _takes_uri(argv, given) else ''})")
        flag = arg if arg.startswith("--") and "=" not in arg else None
    return ""


# the inputs read through the shard store or the index store, so an object store serves as well as a folder: a
# corpus or harvest run, an index, a run of scored pairs; every other input file or folder is read locally
_URI_INPUTS = {"--corpus", "--index", "--scores"}
_URI_INPUTS_OF = {("train", "surrogate"): {"--data"}, ("train", "student"): {"--data"}}
# the same inputs given as config keys (`--set KEY=PATH`): a run, an index, a representation cache
_URI_KEYS = {"corpus", "index", "contexts.rep_cache"}


def _takes_uri(argv: Sequence[str], flag: Optional[str]) -> bool:
    """Whether the input given to `flag` (None: a positional one; a config key for one given by --set) of the
    command in `argv` may be s3://."""
    words = tuple(a for a in argv[:2] if not a.startswith("-"))
    if flag is None:  # a run to verify, compact or remix; corpus build's inputs are local files
        return words[:1] in (("store",), ("remix",))
    return flag in _URI_INPUTS or flag in _URI_KEYS or flag in _URI_INPUTS_OF.get(words, set())


def _path_like(value: str) -> bool:
    return not value.startswith("-") and ("/" in value or re.search(r"[A-Za-z_]\.[A-Za-z0-9]+$", value) is not None)


_USAGE_LINE = re.compile(r"sentsim\.[\w.]*?(?:UsageError|InputError|StoreError|TrainingDiverged): (.+)")


def _wrapped_usage_error(exc: BaseException):
    text = str(exc)
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)  # Ray's task errors subclass the user's error type
        if isinstance(cause, UsageError):
            return str(cause)
        if isinstance(exc, UsageError) and cause is None:
            return str(exc)
        exc = exc.__cause__ or (cause if isinstance(cause, BaseException) else None)
    # Ray Train reports worker failures as text only.
    return _usage_line_in(text)


# pyarrow's S3 errors as Ray passes them on when only their text survives (an actor that died in its
# constructor: ActorDiedError carries the traceback as text, not the OSError)
_S3_MARKS = r"AWS Error|curlCode|resolving region"  # what pyarrow's S3 client's messages hold
_S3_ERROR_IN_TEXT = re.compile(rf"(?:OSError|ArrowIOError): ([^\n]*(?:{_S3_MARKS})[^\n]*)")


def _pyarrow_s3_message(e: BaseException) -> Optional[str]:
    """pyarrow's S3 error: its own OSError's message, or the one quoted in the text of an error Ray passed on
    from an actor (which is no OSError)."""
    first = (str(e).splitlines() or [""])[0]
    if isinstance(e, OSError) and re.search(_S3_MARKS, first):
        return first.strip()
    m = _S3_ERROR_IN_TEXT.search(str(e))
    return m.group(1).strip() if m else None


_MISSING_BUCKET = re.compile(r"Bucket '([^']+)' not found|\(NoSuchBucket\)()")


def _object_store_error(exc: BaseException, argv: Sequence[str]):
    """An object store that cannot be reached or refuses us is a setup problem, not a bug: one line
    that says which settings pyarrow's S3 client (and boto3, for the run's lease) reads, and that on a
    cluster each node reads them from its own environment."""
    botocore = next((e for e in error_chain(exc) if type(e).__module__.startswith("botocore")), None)
    s3_text = next((m for m in map(_pyarrow_s3_message, error_chain(exc)) if m), None)
    if botocore is not None:  # the lease's boto3, e.g. NoCredentialsError: "Unable to locate credentials"
        first = (str(botocore).splitlines() or [repr(botocore)])[0]
    elif s3_text is not None:  # pyarrow's S3 client, wherever the run's paths came from (flags or --config)
        first = s3_text
    elif isinstance(exc, OSError) and any("://" in a for a in argv):
        first = (str(exc).splitlines() or [repr(exc)])[0]
    else:
        return None
    bucket = _MISSING_BUCKET.search(first)
    if bucket:
        given = {a.split("://", 1)[1].split("/")[0] for a in argv if "://" in a}
        named = bucket.group(1) or (given.pop() if len(given) == 1 else None)
        return (f"cannot use the object store: the bucket {named or 'of an s3:// path'} does not exist; sentsim "
                "makes no bucket (a misspelt name would otherwise get one): create it, or correct the path")
    return (f"cannot use the object store ({first}); set AWS_ENDPOINT_URL (for a non-AWS or local S3), "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION, on a cluster in every node's "
            "environment (before `ray start`, or in the job's runtime env; docs/cluster.md, \"Object storage\")")


# Errors of the machine, not of sentsim: what each means for the user, given the path it happened at.
_SETUP_ERRNOS = {
    errno.ENOSPC: "no space left on the device ({where}); free some space and run the same command again: "
                  "a resumable run goes on from its last completed unit",
    errno.EDQUOT: "disk quota exceeded ({where}); free some space and run the same command again: "
                  "a resumable run goes on from its last completed unit",
    errno.EROFS: "{where}: read-only file system; give an output on a writable disk (or remount it read-write) "
                 "and run again",
    errno.EACCES: "{where}: permission denied; give a path this user may write (and read)",
    errno.EPERM: "{where}: operation not permitted; give a path this user may write (and read)",
    errno.ENOTDIR: "{where}: a file is where a folder belongs; give a folder (or move the file away)",
    errno.EISDIR: "{where}: a folder is where a file belongs; give a file path",
}
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\][^\n']*?(?:: '([^'\n]+)')?(?:\n|$)")


def _setup_error(exc: BaseException, args):
    """Disk full, a read-only or forbidden output, a file where a folder belongs: one line naming the path
    (the file the error names, else the command's output) and what to do. Found on the error or any error
    it wraps (Ray's task errors keep the original as `cause`; Ray Train reports worker failures as text)."""
    code, path = None, None
    for e in error_chain(exc):
        if isinstance(e, OSError) and e.errno in _SETUP_ERRNOS:
            code, path = e.errno, e.filename
            break
    if code is None:
        m = _ERRNO_IN_TEXT.search(str(exc))
        if m is None or int(m.group(1)) not in _SETUP_ERRNOS:
            return None
        code, path = int(m.group(1)), m.group(2)
    if path is not None:
        where = os.fsdecode(path)
    else:  # pyarrow's file errors name no file: the command's output is where it was writing
        flag, out = next(((f, getattr(args, k)) for f, k in (("--out", "out"), ("DIR", "run_dir"))
                          if getattr(args, k, None)), (None, None))
        where = f"{flag} {out}" if out else "a path the error does not name"
    return _SETUP_ERRNOS[code].format(where=where)


# the flags that name what a command writes (out_paths.check_out is called on each)
_OUTPUT_FLAGS = (("--out", "out"), ("--json", "json"), ("--markdown", "markdown"))
_QUOTED_PATH = re.compile(r"'([^'\n]+)'")


def _output_not_made(exc: BaseException, args):
    """A local output the file system will not make, though no check could tell beforehand (a folder on a
    pseudo file system such as /proc says "no such file"): one line when the error names the output or a folder
    above it. Any other missing file is sentsim's to explain, so it stays a traceback."""
    outs = [(flag, value) for flag, key in _OUTPUT_FLAGS
            if isinstance(value := getattr(args, key, None), str) and value and "://" not in value]
    for e in error_chain(exc):
        if not (isinstance(e, OSError) and e.errno in (errno.ENOENT, errno.EEXIST)):
            continue
        named = e.filename if e.filename is not None else next(iter(_QUOTED_PATH.findall(str(e))), None)
        if named is None:
            continue
        bad = os.path.abspath(os.fsdecode(named))
        for flag, value in outs:
            out = os.path.abspath(os.path.expanduser(value))
            if _temp_name_of(bad, out):  # an output file is written under a temporary name beside it first
                return (f"{flag} {value}: {os.path.dirname(out)} takes no new file ({os.strerror(e.errno)}); "
                        "give an output on a disk this user may write")
            if out == bad or out.startswith(bad.rstrip(os.sep) + os.sep):
                return (f"{flag} {value}: {bad} cannot be made there ({os.strerror(e.errno)}); "
                        "give an output on a disk this user may write")
    return None


def _temp_name_of(path: str, out: str) -> bool:
    """Whether `path` is a temporary name `storage.fs.temp_name` gives the file `out` (its own folder)."""
    from storage.fs import TMP_PREFIX

    name = os.path.basename(path)
    return (os.path.dirname(path) == os.path.dirname(out) and name.startswith(TMP_PREFIX)
            and name.endswith("-" + os.path.basename(out)))


def _usage_line_in(text: str):
    m = _USAGE_LINE.search(text)
    return m.group(1).strip() if m else None


def entry(argv: Sequence[str] | None = None) -> NoReturn:
    """A process's `sentsim` command (the console script, `python -m sentsim.cli`, and jobs/*.py, which `ray job
    submit` runs), then its exit: Ray left here, not in Ray's atexit callback, where a Ctrl-C prints a
    traceback and leaves the exit status as if nothing had happened (runtime.leave_ray_at_exit)."""
    from sentsim.runtime import leave_ray_at_exit

    try:
        code = main(argv)
    except KeyboardInterrupt:  # outside the command's own handling: while the parser loads the commands
        print(INTERRUPTED, file=sys.stderr)
        code = 130
    except BaseException:  # argparse's exit, or a bug's traceback: printed once Ray is left, as at any exit
        leave_ray_at_exit()
        raise
    signum = leave_ray_at_exit()
    if signum is not None and code != 130:  # an interrupted command has said so already
        name = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
        print(f"sentsim: interrupted{name} while leaving Ray, after the command had ended with exit status {code}; "
              "Ray was left all the same", file=sys.stderr)
        code = 128 + signum  # the shell's status for a process its signal ended: 130 for Ctrl-C
    sys.exit(code)


if __name__ == "__main__":
    entry()
