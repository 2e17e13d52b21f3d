"""Path handling through pyarrow filesystems, so that `s3://` works exactly like a local path, and
the one way a file is committed (written whole, then made visible by a rename).

Durable commits. On local disk a commit is: write a temporary file, fsync it, rename it over its
name, fsync the folder. Without the first fsync a power loss can leave the new name pointing at an
empty or partial file (the rename reached the disk, the data did not); without the second the
rename itself can be lost, so a marker written after it could survive while the shard it vouches
for is gone. Every writer that renames into place goes through `durable_replace` (shards, markers,
manifests, side tables, compaction, the lease, training checkpoints). On an object store one PUT is
atomic and durable when it returns, so nothing more is needed there.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import uuid
from typing import Any, Optional, Tuple

import pyarrow.fs as pafs

from sentsim.errors import InputError

TMP_PREFIX = ".tmp-"  # temporary files: dot-prefixed, which every dataset reader skips


def resolve(uri: str) -> Tuple[pafs.FileSystem, str]:
    """Return (filesystem, path inside it) for a local path or a URI.

    S3 endpoints for tests or on-prem object stores come from the standard AWS variables;
    `AWS_ENDPOINT_URL` is honoured so a localhost S3 server works through the same code path.
    """
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            fs = pafs.S3FileSystem(
                endpoint_override=host or scheme,
                scheme=scheme if host else "http",
                region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                # no bucket is ever made (pyarrow's default): a misspelt one is refused, not created
            )
            return fs, uri[len("s3://"):].rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def join(*parts: str) -> str:
    return posixpath.join(*parts)


def is_local(fs: pafs.FileSystem) -> bool:
    return fs.type_name == "local"


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_file(fs: pafs.FileSystem, path: str) -> bool:
    """A regular file is there (a folder, a FIFO or a socket at a file's name is not one)."""
    return fs.get_file_info(path).type == pafs.FileType.File


def not_a_file(info: pafs.FileInfo) -> Optional[str]:
    """What stands at a file's name when it is not a regular file (None when it is one, or nothing is there)."""
    if info.type in (pafs.FileType.File, pafs.FileType.NotFound):
        return None
    return "a folder" if info.type == pafs.FileType.Directory else "not a regular file"


def remove_any(fs: pafs.FileSystem, path: str) -> None:
    """Remove whatever stands at a run's own file name, a folder included (durably, as delete_durable)."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
        if is_local(fs):
            fsync_path(posixpath.dirname(path))
    elif info.type != pafs.FileType.NotFound:
        delete_durable(fs, path)


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def read_json(fs: pafs.FileSystem, path: str) -> Tuple[bool, Any]:
    """(whether something is at `path`, its parsed JSON or None when it is empty, not valid JSON or not a
    regular file: a folder at a record's name is a broken record, never read)."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return False, None
    if info.type != pafs.FileType.File:
        return True, None
    try:
        return True, json.loads(read_bytes(fs, path))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True, None


# ---- durable commits (local disk) -----------------------------------------------------------------
def fsync_path(path: str) -> None:
    """Flush one file's or one folder's entry to the disk (a folder: the names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file and folder under `path` (a checkpoint folder), deepest first, then `path`."""
    for folder, _, names in os.walk(path, topdown=False):
        for name in names:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def durable_replace(src: str, dst: str) -> None:
    """Local disk: commit `src` (a file or a folder, already written) under the name `dst`: its bytes
    reach the disk first, then the rename, then the folder entry that the rename changed. `dst`, if
    it exists, must be a file (or an empty folder): the rename replaces it atomically."""
    if os.path.isdir(src):
        fsync_tree(src)
    else:
        fsync_path(src)
    os.replace(src, dst)
    fsync_path(os.path.dirname(dst) or ".")
    src_parent = os.path.dirname(src) or "."
    if os.path.abspath(src_parent) != os.path.abspath(os.path.dirname(dst) or "."):
        fsync_path(src_parent)  # the name leaving its old folder: else it can reappear there after a crash


def temp_name(name: str) -> str:
    """A temporary name no other writer uses (pid alone is not enough: threads, and pids are reused)."""
    return f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-{name}"


def write_bytes_atomic(fs: pafs.FileSystem, path: str, data: bytes, tmp_dir: Optional[str] = None) -> None:
    """A reader never sees half a file, and a power loss never leaves a committed name without its bytes.

    Local disk: write a temporary file (in `tmp_dir` if given, a folder plain readers never list;
    else beside `path`, dot-prefixed), fsync it, rename it into place, fsync the folder
    (`durable_replace`). An object store: one PUT, already atomic, so the bytes go once, straight to
    their name (a temp key would be uploaded, copied and deleted: every byte written twice)."""
    parent, name = posixpath.split(path)
    if not is_local(fs):
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    tmp_parent = tmp_dir or parent
    os.makedirs(parent, exist_ok=True)
    os.makedirs(tmp_parent, exist_ok=True)
    tmp = posixpath.join(tmp_parent, temp_name(name))
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        durable_replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str, text: str) -> None:
    """A small local file (a run record, a summary) committed whole and durably."""
    write_bytes_atomic(pafs.LocalFileSystem(), os.path.abspath(path), text.encode())


def move_durable(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Move a committed file to another name: one durable rename on local disk; on an object store
    a copy then a delete (both names briefly hold the same bytes)."""
    if is_local(fs):
        os.makedirs(posixpath.dirname(dst), exist_ok=True)
        durable_replace(src, dst)
    else:
        fs.move(src, dst)


def delete_durable(fs: pafs.FileSystem, path: str) -> None:
    """Delete a commit point (a marker, `_COMPLETE`) so that the deletion is on disk before whatever
    the caller does next: e.g. `_COMPLETE` withdrawn before a unit's marker goes."""
    fs.delete_file(path)
    if is_local(fs):
        fsync_path(posixpath.dirname(path))


def hash_into(h, fs: pafs.FileSystem, path: str, block: int = 1 << 22) -> int:
    """Stream a file's bytes into the hash object `h` (in blocks, so any size fits); returns the byte count."""
    n = 0
    with fs.open_input_stream(path) as f:
        while True:
            buf = f.read(block)
            if not buf:
                break
            h.update(buf)
            n += len(buf)
    return n


def sha256_file(fs: pafs.FileSystem, path: str, block: int = 1 << 22) -> Tuple[str, int]:
    """(hex sha256, bytes) of one file: the one file hash of the project (shards, inputs, checkpoints)."""
    h = hashlib.sha256()
    n = hash_into(h, fs, path, block)
    return h.hexdigest(), n


def sha256_path(uri: str) -> str:
    """Hex sha256 of the file at a local path or a URI."""
    fs, path = resolve(uri)
    return sha256_file(fs, path)[0]


def input_sha256(path: str) -> str:
    """sha256 of a local input file (a corpus input, a pairs file), as fingerprints have always taken it.

    pyarrow's streams decompress by the file's name, so a gzip file named *.gz has been hashed by its
    decompressed bytes (kept: the fingerprints of runs over such inputs stay); a truncated one is then an
    InputError, not a traceback. Any other file, a plain file named *.gz among them (the readers take it
    as plain text, by its first bytes), is hashed by its bytes, which pyarrow would have tried to inflate.
    """
    with open(path, "rb") as f:
        gzipped = path.lower().endswith(".gz") and f.read(2) == b"\x1f\x8b"
        if not gzipped:
            f.seek(0)
            return hashlib.file_digest(f, "sha256").hexdigest()
    try:
        return sha256_path(path)
    except (OSError, EOFError, ValueError) as exc:
        raise InputError(f"{path}: unreadable or truncated gzip file ({(str(exc).splitlines() or [''])[0]})") from None
