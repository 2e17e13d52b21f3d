"""An index folder (local path or s3://), written so that a killed build never breaks the index there.

Layout:
    index.json               the commit point: config, counts, and every file of the index with its size
    build-<id>/...           the files of one build (vocab.json, idf.npy, shard-NNNNN/, or lucene/)

A build writes its files into a new `build-<id>/` folder, then replaces `index.json` (atomically: a
local rename, one S3 PUT), and only then deletes what the index held before (an earlier build's
folder, or the files of an index from before this layout). Killed at any point, the folder holds either
the old index, whole, or the new one; the next build sweeps what a killed one left. One build at a time
holds the folder's lease (storage.lease, the lease of sharded runs).

A build asked for the index already committed there (`finished_index`: the same fingerprint, config and
format, and every file at its recorded size) writes nothing: it only sweeps what a killed build left,
under the lease. An index from before build folders has no file sizes to check it by and is rebuilt.

Readers check the files `index.json` names before they use the index (`check_index_files`): an index
damaged by a killed build of an older sentsim (which rewrote shards in place under the old index.json)
is named at the start of a harvest, not when its first unit searches.
"""

from __future__ import annotations

import fnmatch
import io
import json
import uuid
from pathlib import Path
from typing import Callable, Optional

import pyarrow.fs as pafs

from sentsim.errors import UsageError
from storage import fs as sfs
from storage.lease import LEASE

INDEX_MANIFEST = "index.json"
# what an index build owns at the top of its folder: every other entry is the user's and is left alone
_BUILD_ENTRIES = ("build-*", "shard-*", "vocab.json", "idf.npy", "lucene", "_collection", ".tmp-*")


def resolve(index_dir) -> tuple[pafs.FileSystem, str]:
    return sfs.resolve(str(index_dir))


def read_bytes(index_dir, rel: str) -> bytes:
    fs, root = resolve(index_dir)
    return sfs.read_bytes(fs, sfs.join(root, rel))


def read_index_manifest(index_dir) -> dict:
    fs, root = resolve(index_dir)
    p = sfs.join(root, INDEX_MANIFEST)
    if fs.get_file_info(p).type != pafs.FileType.File:
        if fs.get_file_info(root).type == pafs.FileType.NotFound:
            # configs/teacher.yaml names the reference teacher's index, which `make reference` builds
            made_by = "`make reference`" if str(index_dir).rstrip("/").endswith("reference/index") else None
            raise UsageError(f"{index_dir}: no such index (the folder does not exist); build it with "
                             f"{made_by or '`sentsim index build`'}")
        raise UsageError(f"{index_dir}: not an index directory (no {INDEX_MANIFEST})")
    try:
        manifest = json.loads(sfs.read_bytes(fs, p))
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = None
    if not isinstance(manifest, dict):
        raise UsageError(f"{index_dir}/{INDEX_MANIFEST}: not valid JSON; rebuild the index with `sentsim index build`")
    return manifest


def expected_files(manifest: dict) -> dict:
    """{path inside the index: bytes, or None where the size was not recorded}. An index built before
    `files` was recorded: the files its backend reads, by their fixed names."""
    if isinstance(manifest.get("files"), dict):
        return dict(manifest["files"])
    shards = [s.get("path") for s in manifest.get("shards") or []]
    if manifest.get("backend") == "lucene":
        return {f"{p}/": None for p in shards}
    files = {"vocab.json": None, "idf.npy": None}
    for p in shards:
        files.update({f"{p}/matrix.npz": None, f"{p}/chunk_ids.npy": None})
    return files


def check_index_files(index_dir, manifest: Optional[dict] = None) -> dict:
    """The manifest, once every file it names is there with its recorded size; else a UsageError naming
    the first missing or damaged file."""
    manifest = read_index_manifest(index_dir) if manifest is None else manifest
    fs, root = resolve(index_dir)
    want = expected_files(manifest)
    infos = fs.get_file_info([sfs.join(root, rel.rstrip("/")) for rel in want])
    for (rel, size), info in zip(want.items(), infos):
        kind = pafs.FileType.Directory if rel.endswith("/") else pafs.FileType.File
        problem = None
        if info.type == pafs.FileType.NotFound and not (kind == pafs.FileType.Directory and fs.type_name != "local"):
            problem = "is missing"
        elif size is not None and info.type == pafs.FileType.File and info.size != size:
            problem = f"has {info.size} bytes, index.json says {size}"
        if problem:
            raise UsageError(f"{index_dir}: the index is damaged: {rel.rstrip('/')} {problem} (an index build was "
                             "killed part-way?); rebuild it with `sentsim index build`")
    return manifest


def finished_index(out, matches: Callable[[dict], bool]) -> Optional[dict]:
    """The index committed at `out` when `matches(manifest)` and it checks out whole, after sweeping (under
    the folder's lease) what a killed build left beside it; None when it is to be built. A damaged or
    unreadable index is None too: the build replaces it, as it would any other index."""
    fs, root = resolve(out)
    if fs.get_file_info(sfs.join(root, INDEX_MANIFEST)).type != pafs.FileType.File:
        return None

    def whole() -> Optional[dict]:
        try:
            manifest = read_index_manifest(out)
            if not isinstance(manifest.get("files"), dict) or not matches(manifest):
                return None
            return check_index_files(out, manifest)
        except UsageError:
            return None

    if whole() is None:  # looked at first without the lease: a folder to build in is not touched twice
        return None
    with IndexWriter(out) as writer:  # a build in progress there is refused as for any other build
        manifest = whole()
        if manifest is not None:
            writer.remove_other_builds(keep={rel.split("/")[0] for rel in manifest["files"]})
    return manifest


class IndexWriter:
    """One build of the index at `out`: `put` files into a new build folder, then `commit` the manifest.

    Use it as a context manager: it holds the folder's lease from entry until the commit (or the error)."""

    def __init__(self, out, local_only: Optional[str] = None):
        self.uri = str(out)
        if local_only and "://" in self.uri:
            raise UsageError(f"--out {self.uri}: {local_only}")
        self.fs, self.root = resolve(self.uri)
        self.build = f"build-{uuid.uuid4().hex[:12]}"
        self.files: dict[str, int] = {}
        self.lease = None

    # ---- the folder --------------------------------------------------------------------------
    def _entries(self) -> list:
        if self.fs.get_file_info(self.root).type == pafs.FileType.NotFound:
            return []
        return self.fs.get_file_info(pafs.FileSelector(self.root))

    def __enter__(self) -> "IndexWriter":
        from storage.lease import RunLease

        info = self.fs.get_file_info(self.root)
        if info.type == pafs.FileType.File:
            raise UsageError(f"--out {self.uri}: is a file, not a folder; give a folder for the index")
        names = {e.base_name for e in self._entries()} - {LEASE}
        if names and INDEX_MANIFEST not in names:
            raise UsageError(f"{self.uri}: exists, is not empty and is not an index directory")
        if info.type == pafs.FileType.NotFound:  # on S3 create_dir rewrites the folder's marker object
            self.fs.create_dir(self.root, recursive=True)
        self.lease = RunLease(self.fs, self.root, self.uri).acquire()
        return self

    def __exit__(self, *exc) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    # ---- writing -----------------------------------------------------------------------------
    def put(self, rel: str, data: bytes) -> str:
        """Write one file of this build; returns its path inside the index."""
        path = f"{self.build}/{rel}"
        sfs.write_bytes_atomic(self.fs, sfs.join(self.root, path), data)
        self.files[path] = len(data)
        return path

    def local_dir(self) -> Path:
        """This build's folder on local disk (the lucene backend writes its index there itself)."""
        d = Path(self.root) / self.build
        d.mkdir(parents=True, exist_ok=True)
        return d

    def record_local(self, sub: str) -> None:
        """Add the files a tool wrote under local_dir()/sub to this build's file list."""
        base = self.local_dir()
        for p in sorted((base / sub).rglob("*")):
            if p.is_file():
                self.files[f"{self.build}/{p.relative_to(base)}"] = p.stat().st_size

    def commit(self, manifest: dict) -> dict:
        """Replace index.json with `manifest` (plus this build's file list), then remove what the index
        held before. Returns the manifest as written."""
        if self.lease is not None:
            self.lease.check()  # a build that lost the folder to another writer commits nothing
        manifest = dict(manifest, files=dict(sorted(self.files.items())))
        sfs.write_bytes_atomic(self.fs, sfs.join(self.root, INDEX_MANIFEST),
                               json.dumps(manifest, indent=2).encode("utf-8"))
        self._remove_earlier_builds()
        return manifest

    def _remove_earlier_builds(self) -> None:
        self.remove_other_builds(keep={self.build})

    def remove_other_builds(self, keep: set) -> None:
        """Delete every entry an index build owns at the top of the folder but those named in `keep`."""
        for e in self._entries():
            name = e.base_name
            if name in keep or not any(fnmatch.fnmatchcase(name, pat) for pat in _BUILD_ENTRIES):
                continue
            if e.type == pafs.FileType.Directory:
                self.fs.delete_dir(e.path)
            else:
                self.fs.delete_file(e.path)


def npy_bytes(array) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npz_bytes(matrix) -> bytes:
    import scipy.sparse as sp

    buf = io.BytesIO()
    sp.save_npz(buf, matrix, compressed=False)
    return buf.getvalue()


def load_npy(index_dir, rel: str):
    import numpy as np

    return np.load(io.BytesIO(read_bytes(index_dir, rel)), allow_pickle=False)


def load_npz(index_dir, rel: str):
    import scipy.sparse as sp

    return sp.load_npz(io.BytesIO(read_bytes(index_dir, rel)))
