"""Path handling through pyarrow filesystems, so that `s3://` works exactly like a local path."""

from __future__ import annotations

import hashlib
import os
import posixpath
from typing import Tuple

import pyarrow.fs as pafs


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
                allow_bucket_creation=True,
            )
            return fs, uri[len("s3://"):].rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def join(*parts: str) -> str:
    return posixpath.join(*parts)


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


def write_bytes_atomic(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """A reader never sees half a file. On local disk: write a dot-prefixed sibling, then rename.
    On an object store one PUT is already atomic, so the bytes go once, straight to their name
    (a temp key would be uploaded, copied and deleted: every byte written twice)."""
    parent, name = posixpath.split(path)
    if fs.type_name != "local":
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    tmp = posixpath.join(parent, f".tmp-{os.getpid()}-{name}")
    fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(tmp) as f:
        f.write(data)
    fs.move(tmp, path)


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
