"""ShardStore: manifests, atomic unit writes, completion markers and resume."""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage import fs as sfs
from storage.compaction import COMPACT_DIR, load_compaction
from storage.lease import LEASE, RunLease
from storage.records import StoreError, record_check, timestamp

MANIFEST = "manifest.json"
UNITS_DIR = "_units"
SIDE_DIR = "_side"  # run-level tables that belong to no unit (e.g. the harvest's rank anchors)
TMP_DIR = "_tmp"  # temporary files, renamed into place when whole: never inside a table's folder
COMPLETE = "_COMPLETE"
NOT_A_FILE = "is not a regular file"  # a folder (or FIFO) where a run's file belongs: never read, removed on resume
# The run format: the layout and table schemas a run's files follow. open_run writes it into a new run's
# manifest ("format_version") and a resume keeps it, so a run has one format for its whole life. Code that
# still reads runs of an earlier format asks `run_format` (sentsim/run_formats.py lists each such path
# and the formats that need it, so it can be retired with them). 1: every run whose
# manifest has no format_version; its harvests may lack columns or keep older types, and its
# fingerprint may hold its input paths as spelt. 2: a pool harvest's fingerprints (its own and its
# vectors') hold the keys only screening reads. 3: a per-pair harvest's fingerprint holds the keys its mode
# does not read (pairs_per_unit in a corpus harvest, anchors and partners in a --pairs one). 4: a pool
# harvest's fingerprint holds the keys its mode does not read (anchors.per_unit in a corpus harvest, and the
# partners it does not draw in a clustered one; anchors and partners in a --pairs one). 5: the schemas and
# fingerprints of this version. 6: those of 5, and a manifest that carries a checksum of itself (MANIFEST_CHECK),
# which a sentsim of format 5 or earlier would keep stale when it rewrote the manifest: it refuses a run of 6.
FORMAT_VERSION = 6
# The first run format whose manifest carries its checksum: one of it without its checksum was edited.
SEALED_FORMAT = 6


def run_format(manifest: Optional[dict]) -> int:
    """The format a run was opened with: its manifest's "format_version" (1 where the manifest has none)."""
    v = (manifest or {}).get("format_version", 1)
    return v if isinstance(v, int) and not isinstance(v, bool) else 1


def check_format(manifest: Optional[dict], uri: str, fix: str) -> None:
    """Refuse a run written in a format newer than this sentsim's: it could be misread, or resumed
    with shards of another layout. `fix` ends the line (what the user can do)."""
    v = run_format(manifest)
    if v > FORMAT_VERSION:
        raise StoreError(f"{uri} was written by a newer sentsim (run format {v}; this one knows formats up to "
                         f"{FORMAT_VERSION}); {fix}")


def some_names(names: Sequence[str], most: int = 4) -> str:
    """The first `most` of `names` and how many more, for a refusal that lists what a folder holds."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def part_name(unit: int) -> str:
    """Output names carry the unit rank, as datatrove does: part-00042.parquet."""
    return f"part-{unit:05d}.parquet"


def schema_signature(schema: pa.Schema) -> List[List]:
    # Parquet names list items "element" where Arrow says "item"; the signature ignores that.
    return [[f.name, str(f.type).replace("<element:", "<item:"), bool(f.nullable)] for f in schema]


@dataclass
class UnitRecord:
    unit: int
    files: Dict[str, dict]
    extra: dict = field(default_factory=dict)

    @property
    def rows(self) -> Dict[str, int]:
        return {t: f["rows"] for t, f in self.files.items()}


def _flatten(tree, prefix: str = "") -> Dict[str, object]:
    """{"a": {"b": 1}, "l": [{"x": 2}]} -> {"a.b": 1, "l.0.x": 2}"""
    if isinstance(tree, list) and any(isinstance(v, (dict, list)) for v in tree):
        tree = {str(i): v for i, v in enumerate(tree)}
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: Dict[str, object] = {}
    for k, v in tree.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def what_changed(stored: dict, config: dict, inputs: List[dict], most: int = 6, ignore: Sequence[str] = ()) -> str:
    """The config keys and inputs that differ from a stored manifest's, for a refused resume. `ignore`:
    flattened keys (and their children; `inputs.0.corpus` for an input) outside the fingerprint, such as
    `out` or `resources`, whose differences did not cause the refusal and are not listed."""
    skip = lambda k: any(k == p or k.startswith(p + ".") for p in ignore)  # noqa: E731
    # through JSON, as the stored side went: a tuple in the new config is the list it was stored as
    old = _flatten(json.loads(json.dumps(stored.get("config") or {}, default=str)))
    new = _flatten(json.loads(json.dumps(config or {}, default=str)))
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and not skip(k))
    parts = [f"{k}: {old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r}" for k in keys[:most]]
    if len(keys) > most:
        parts.append(f"and {len(keys) - most} more key(s)")
    old_in = _flatten({"inputs": json.loads(json.dumps(stored.get("inputs") or [], default=str))})
    new_in = _flatten({"inputs": json.loads(json.dumps(inputs or [], default=str))})
    # an input field a run recorded none of (e.g. `models`, from before runs recorded it) is not a change, but an
    # input it recorded nothing of at all is (a second file given to a corpus build)
    field = lambda k: ".".join(k.split(".")[:3])  # noqa: E731  (inputs.<i>.<field>)
    index = lambda k: ".".join(k.split(".")[:2])  # noqa: E731  (inputs.<i>)
    recorded, indices = {field(k) for k in old_in}, {index(k) for k in old_in}
    changed = sorted(k for k in old_in.keys() | new_in.keys()
                     if old_in.get(k) != new_in.get(k) and not skip(k)
                     and (field(k) in recorded or index(k) not in indices))
    if changed:
        records = list(inputs or []) or list(stored.get("inputs") or [])
        named = [_input_words(k, records, k in old_in, k in new_in) for k in changed[:3]]
        parts.append(f"input(s) changed: {', '.join(named)}" + (" ..." if len(changed) > 3 else ""))
    return "; ".join(parts) if parts else "same config and inputs, so a model or checkpoint they name changed"


def _input_words(key: str, records: Sequence[dict] = (), was: bool = True, now: bool = True) -> str:
    """A changed input's manifest key, with what the user gave that changed: a run's `inputs` record each input
    by the identity of what it holds (`fingerprint` of its corpus, or of the source run a remix reads;
    `models.<flag>` of each model or index, recorded only while the settings read it: `was` and `now` say
    whether the stored and the new record hold the key)."""
    parts = key.split(".")
    if len(parts) == 3 and parts[2] == "fingerprint":
        i = int(parts[1]) if parts[1].isdigit() else -1
        record = records[i] if 0 <= i < len(records) and isinstance(records[i], dict) else {}
        return f"{key} (the content of the source run {record['harvest']})" if "harvest" in record else \
            f"{key} (the corpus's content)"
    if len(parts) >= 4 and parts[2] == "models":
        what = parts[3].replace("_", " ")
        if was != now:  # a setting turned its reading on or off; the model itself may be the same
            return f"{key} ({what}: {'now read' if now else 'no longer read'})"
        return f"{key} (the content of {what})"
    return key


# Runs a job builds inside its own folder and reads back later: a pool harvest's sentence vectors (remix reads
# them) and rank targets (its labelling reads them), and a job's own representation cache
# (sentsim/harvest/pool_vectors.py, sentsim/harvest/pool_ranks.py, sentsim/screening/cache_job.py).
NESTED_RUNS = ("pool_vectors", "pool_ranks", "rep_cache")
# A manifest's list of the nested runs in its folder that the run does not read (a relabel with rank targets off
# keeps the ranks run for a later one that turns them on): `store verify` names them, and does not count one
# that is unfinished as damage to the run.
UNREAD_NESTED = "unread_nested_runs"
# The nested runs read only while the run that holds them works: a job's own representation cache, read by its
# screening. Once that run is finished nothing reads it again, and a run that screens again resumes it first,
# so one left unfinished there is no damage to the finished run (`store verify` says so in a note).
NESTED_CACHES = ("rep_cache",)
# What a run writes in its folder beside its tables and nested runs once it finishes (sentsim/harvest/report.py)
RUN_REPORTS = ("report.json", "report.png")


def holding_run(uri: str, stage: str = "harvest") -> Optional[str]:
    """The run folder of `stage` that holds `uri` as one of its NESTED_RUNS, or None: so that a command given
    such a part where it takes the whole can name the whole."""
    bare = str(uri).rstrip("/")
    parent, _, name = bare.rpartition("/")
    if name not in NESTED_RUNS or not parent or parent.endswith(":/"):
        return None
    try:
        # its stage only, which a hand edit of the rest does not change: the hint names the harvest all the same
        manifest = ShardStore(parent).read_manifest(trusted=False)
    except StoreError:  # not JSON, or not a file: no stage to name
        return None
    return parent if manifest and manifest.get("stage") == stage else None


def part_of_run_refusal(uri: str, given: str) -> Optional[str]:
    """The line for a command given a harvest's nested run (`uri`) where it takes the harvest: `given` is how
    the user gave it (`--data X`, `--scores X`, or X itself), which the line repeats with the harvest instead;
    None when no harvest holds `uri`."""
    whole = holding_run(uri)
    if whole is None:
        return None
    return f"{given}: not a harvest run but a part of the harvest {whole}; give {given.replace(uri, whole)}"


# The manifest's checksum of itself (storage.records.record_check of its canonical JSON, less this key, which is
# the one record_check leaves out), written in the same file by the same write as what it covers, so no reader ever
# sees one without the other. Runs of SEALED_FORMAT and later carry it. A run of an earlier format is written
# without one, as its format was, and its manifest is not checked: a sentsim of that format may resume it, and
# rewriting the manifest it would keep a checksum it does not know of as it was, stale.
MANIFEST_CHECK = "check"


def manifest_checks(manifest: dict) -> Optional[bool]:
    """True when the manifest's checksum matches its content, False when it does not, None when it has none."""
    if MANIFEST_CHECK not in manifest:
        return None
    return manifest[MANIFEST_CHECK] == record_check(manifest)


def manifest_seal_broken(manifest: dict) -> Optional[str]:
    """What is wrong with the checksum of a manifest of a run format that carries one (SEALED_FORMAT up to this
    sentsim's), in words that follow the file's name; None when it matches, and for a run of an earlier format
    (not checked) or a newer one (check_format refuses it as such: its checksum may be made otherwise)."""
    if not SEALED_FORMAT <= run_format(manifest) <= FORMAT_VERSION:
        return None
    ok = manifest_checks(manifest)
    if ok is None:
        return (f"has no checksum of itself, which every manifest of run format {SEALED_FORMAT} and later carries "
                "(edited by hand, or corrupt)")
    return None if ok else "does not match its own checksum (edited by hand, or corrupt)"


def sealed_manifest(manifest: dict) -> dict:
    """The manifest as written: its content as JSON reads it back (a tuple is a list, an int key a string), and,
    for a run of SEALED_FORMAT or later, the checksum of that, so that the check a reader computes from the parsed
    file is the one written. A run of an earlier format gets none (any it held is dropped)."""
    body = json.loads(json.dumps({k: v for k, v in manifest.items() if k != MANIFEST_CHECK}))
    if run_format(body) >= SEALED_FORMAT:
        body[MANIFEST_CHECK] = record_check(body)
    return body


def edited_manifest(uri: str, why: str) -> str:
    """The line for a manifest whose checksum is broken (`why`, manifest_seal_broken): its settings are not used."""
    return (f"{uri.rstrip('/')}/{MANIFEST} {why}, so its settings are not used and the run is neither read nor "
            "resumed; put back the manifest.json the run wrote, or start the run over with its command and "
            "--force-new (its units are redone)")


LOST_MANIFEST = (f"{MANIFEST} is missing, though {UNITS_DIR}/ holds the run's completion markers, so the run can be "
                 f"neither read nor resumed: put its {MANIFEST} back, or start it over with --force-new")


def _plain_table_name(name) -> bool:
    """Whether a table name read from a manifest (one that may be edited by hand) names a folder of the run
    itself: one path component, none of the run's own bookkeeping (`_units`, `_LEASE`, `manifest.json`, hidden
    names). `--force-new` deletes the folders so named, and `../x` would be outside --out."""
    return (isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name
            and "\\" not in name and not name.startswith(("_", ".")))


class ShardStore:
    """One run directory. Safe to construct in many Ray workers: all state lives in the files."""

    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.fs, self.root = sfs.resolve(self.uri)
        self.lease: Optional[RunLease] = None  # held by the driver between take_lease/open_run and finalize/release
        self._made: List[str] = []  # the local folders the lease created, deepest first, until the run holds a file
        self._pending: Optional[tuple] = None  # (what to clear or None, the new manifest) until go_ahead

    def take_lease(self) -> None:
        """Take the run's lease now, if this store does not hold it yet; open_run keeps it. A job whose setup
        before open_run takes minutes (a pool harvest draws its pool and clusters its anchors) takes it first,
        so that a second writer is refused before that setup rather than after it. The folders the lease had
        to create are removed again on release while nothing but the lease was written in them: a setup
        refused or interrupted before the run opened leaves no run folder where there was none."""
        if self.lease is not None:
            return
        made = []
        if sfs.is_local(self.fs):
            here = self.root
            while here and not sfs.exists(self.fs, here):
                made.append(here)
                parent = posixpath.dirname(here)
                here = parent if parent != here else ""
        self.lease = RunLease(self.fs, self.root, self.uri).acquire()
        self._made = made

    def release(self) -> None:
        """Give up the run's lease (finalize does it too); safe to call twice. A run open_run put off (`defer_clear`)
        that never went ahead is forgotten: the old run stays as it was."""
        self._pending = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        made, self._made = self._made, []
        for folder in made:
            try:
                os.rmdir(folder)  # only an empty one: a run opened there (or another writer's lease) keeps it
            except OSError:
                break

    # ---- paths ----------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return sfs.join(self.root, *parts)

    def table_uri(self, table: str) -> str:
        """What a reader passes to pyarrow.dataset / ray.data / pandas."""
        return f"{self.uri}/{table}"

    def shard_path(self, table: str, unit: int) -> str:
        return self.path(table, part_name(unit))

    def marker_path(self, unit: int) -> str:
        return self.path(UNITS_DIR, f"{unit:05d}.json")

    # ---- manifest -------------------------------------------------------------------------
    def lost_manifest(self) -> bool:
        """Whether this is a run that lost its manifest: none there, while completion markers are."""
        units = self.path(UNITS_DIR)
        return not self.has_manifest() and sfs.exists(self.fs, units) and bool(
            self.fs.get_file_info(pafs.FileSelector(units)))

    def has_manifest(self) -> bool:
        """Whether anything is at the manifest's name: a run's, or a broken one `read_manifest` refuses."""
        return sfs.exists(self.fs, self.path(MANIFEST))

    def refuse_another_run(self, existing: dict, stage: str, fingerprint: str, config: dict, inputs: List[dict],
                           unfingerprinted: Sequence[str] = ()) -> None:
        """Refuse to resume `existing` (the manifest here) as a run of `stage` with `fingerprint`: a run written by
        a newer sentsim, of another stage, or with other settings, each named with what the user can do."""
        check_format(existing, self.uri, "resume it with that sentsim, or pass --force-new to start it over here")
        if existing.get("stage") != stage:
            raise StoreError(
                f"{self.uri} holds a '{existing.get('stage')}' run, not '{stage}'; "
                "choose another --out or pass --force-new to replace it"
            )
        if existing.get("fingerprint") != fingerprint:
            raise StoreError(
                f"{self.uri} was written with fingerprint {existing.get('fingerprint')} but this run's is "
                f"{fingerprint} ({what_changed(existing, config, inputs, ignore=unfingerprinted)}); "
                "resume with the same settings, "
                "or pass --force-new to start a new run there"
            )

    def refuse_another_runs_part(self, stage: str) -> None:
        """Refuse to start a run of `stage` in a folder that holds a run of another stage nested in an outer run
        (a pool harvest's pool_vectors/, a contexts run's rep_cache/), with --force-new too: replacing it would
        delete part of the run around it, which its own command rebuilds at a cost."""
        parent, _, name = self.uri.rpartition("/")
        if name not in NESTED_RUNS or not parent or parent.endswith(":/"):
            return
        try:
            # their stages only: a run whose manifest was edited by hand is still the run that wrote it, and still
            # part of the run around it
            here, outer = self.read_manifest(trusted=False), ShardStore(parent).read_manifest(trusted=False)
        except StoreError:  # not JSON, or not a file: no stage to tell
            return
        if here and outer and here.get("stage") != stage:
            raise StoreError(f"{self.uri} holds the {name} run of the '{outer.get('stage')}' run {parent}, "
                             "so nothing else is written there; choose another --out")

    def read_manifest(self, trusted: bool = True) -> Optional[dict]:
        """The run's manifest, None when there is none. One that fails its own checksum is refused (StoreError)
        unless `trusted` is False: for `store verify`, which names it among the run's damage."""
        odd = sfs.not_a_file(self.fs.get_file_info(self.path(MANIFEST)))
        if odd:
            raise StoreError(
                f"{self.uri}/{MANIFEST} is {odd}, not a file, so this run cannot be resumed or read; start it over "
                f"with --force-new (its units are redone), or put the run's {MANIFEST} back in its place")
        found, manifest = sfs.read_json(self.fs, self.path(MANIFEST))
        if not found:
            return None
        if not isinstance(manifest, dict):
            raise StoreError(
                f"{self.uri}/{MANIFEST} is empty or not valid JSON, so this run cannot be resumed or read; "
                f"start it over with --force-new (its units are redone), or restore {MANIFEST} from a copy")
        broken = manifest_seal_broken(manifest) if trusted else None
        if broken:
            raise StoreError(edited_manifest(self.uri, broken))
        return manifest

    def commit_bytes(self, path: str, data: bytes) -> None:
        """Every file of the run is committed through here: whole, durable (fsync before and after the
        rename on local disk), its temporary file in `_tmp/`, where no reader of a table looks."""
        sfs.write_bytes_atomic(self.fs, path, data, tmp_dir=self.path(TMP_DIR))

    def write_manifest(self, manifest: dict) -> None:
        """The manifest and its checksum, in one atomic write (sealed_manifest); any checksum it holds is
        replaced (a run of a format before SEALED_FORMAT is written with none). Written under the run's lease
        (open_run, finalize), so no two writers interleave."""
        body = json.dumps(sealed_manifest(manifest), indent=2, sort_keys=True)
        self.commit_bytes(self.path(MANIFEST), body.encode())

    def open_run(
        self,
        stage: str,
        fingerprint: str,
        config: dict,
        inputs: List[dict],
        schemas: Dict[str, pa.Schema],
        planned_units: Optional[int] = None,
        force_new: bool = False,
        extra: Optional[dict] = None,
        unfingerprinted: Sequence[str] = (),
        defer_clear: bool = False,
    ) -> dict:
        """Start a run or resume the one already here.

        Resuming is allowed only with the same fingerprint (config + inputs + checkpoints);
        anything else is refused unless `force_new`, which clears the old run first. The refusal
        names the changed keys, less `unfingerprinted` ones (what_changed's `ignore`). With `defer_clear`,
        `force_new` clears the old run and writes the new manifest only at `go_ahead` (the manifest is returned
        unwritten), so that a run refused before then leaves the old one whole; `release` forgets it.
        """
        self.refuse_another_runs_part(stage)
        # one writer per run: taken before anything is read or deleted, released by finalize/release
        self.take_lease()
        existing = None if force_new else self.read_manifest()  # --force-new clears even a broken manifest
        if existing is not None and not force_new:
            self.refuse_another_run(existing, stage, fingerprint, config, inputs, unfingerprinted)
            self.sweep_temp(list(schemas))
            return existing
        self.refuse_other_files(schemas)
        if existing is None and not force_new and self._has_shards(schemas):
            raise StoreError(
                f"{self.uri} already holds Parquet shards but no {MANIFEST}; refusing to mix runs "
                "(pass --force-new to clear it)"
            )
        discard = list(schemas) + self._another_stages_parts(stage) if force_new else None
        manifest = {
            "format_version": FORMAT_VERSION,
            "stage": stage,
            "fingerprint": fingerprint,
            "config": config,
            "inputs": inputs,
            "tables": {t: schema_signature(s) for t, s in schemas.items()},
            "planned_units": planned_units,
            "created": timestamp(),
            "complete": False,
        }
        if extra:
            manifest.update(extra)
        self._pending = (discard, manifest)
        if not (force_new and defer_clear):
            self.go_ahead()
        return manifest

    def go_ahead(self) -> None:
        """The run open_run opened goes ahead: --force-new clears the old run now (when open_run's `defer_clear`
        put it off until the new run's refusals were behind it), and the new manifest is written, over the old
        one (clear leaves it there until then). Nothing when no opened run waits."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        discard, manifest = pending
        if discard is not None:
            self.clear(discard)
        self.fs.create_dir(self.root, recursive=True)
        self.write_manifest(manifest)
        self._made = []  # a run now: its folder stays

    def refuse_other_files(self, tables: Iterable[str]) -> None:
        """A folder with no run in it (no manifest) that holds names no run writes there (hidden ones
        aside: a temporary file, or the file system's own) is refused: a run would be mixed in among them. A run
        that lost its manifest (LOST_MANIFEST: its completion markers are there) owns its nested runs and reports
        too, so that --force-new starts it over as that message says (a nested run is checked by its own
        fingerprint before anything reuses it)."""
        if self.has_manifest() or not sfs.exists(self.fs, self.root):
            return
        own = {MANIFEST, UNITS_DIR, SIDE_DIR, TMP_DIR, COMPLETE, COMPACT_DIR, LEASE, *tables}
        if self.lost_manifest():
            own |= {*NESTED_RUNS, *RUN_REPORTS}
        found = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        other = sorted(i.base_name for i in found if i.base_name not in own and not i.base_name.startswith("."))
        if other:
            shown = some_names(other)
            raise StoreError(f"{self.uri} is not empty ({shown}) and holds no sentsim run; refusing to write a run "
                             "among other files (--force-new clears only a run): give another --out")

    def _has_shards(self, tables: Iterable[str]) -> bool:
        for t in tables:
            d = self.path(t)
            if sfs.exists(self.fs, d):
                if any(i.base_name.endswith(".parquet") for i in self.fs.get_file_info(pafs.FileSelector(d))):
                    return True
        return False

    def sweep_temp(self, tables: Iterable[str]) -> int:
        """Delete temporary files a killed writer left behind (everything in `_tmp/`, and the
        dot-prefixed temporaries older versions wrote beside their targets). They were never visible
        to readers. Called under the run's lease, so no live writer owns one."""
        n = 0
        for name in [TMP_DIR] + list(tables) + [UNITS_DIR, SIDE_DIR]:
            d = self.path(name)
            if not sfs.exists(self.fs, d):
                continue
            for info in self.fs.get_file_info(pafs.FileSelector(d)):
                if info.type == pafs.FileType.File and (name == TMP_DIR or info.base_name.startswith(sfs.TMP_PREFIX)):
                    self.fs.delete_file(info.path)
                    n += 1
        return n

    def _another_stages_parts(self, stage: str) -> List[str]:
        """What a run of another stage left here beside the parts every run has: its tables, the runs it built
        inside its folder and its reports, which `--force-new` replacing it removes too, so no reader takes
        them for the new run's. A run of the same stage keeps them (a pool harvest's vectors are reused). Read
        untrusted: a manifest edited by hand still names the stage and tables of the run that wrote it, and
        `--force-new` is what the refusal of an edited manifest tells the user to run."""
        try:
            old = self.read_manifest(trusted=False)
        except StoreError:  # not JSON, or not a file: what it held cannot be told
            return []
        if not old:  # a run that lost its manifest, started over: its reports go (its nested runs are checked)
            return list(RUN_REPORTS) if self.lost_manifest() else []
        if old.get("stage") == stage:
            return []
        tables = old.get("tables") if isinstance(old.get("tables"), dict) else {}
        return sorted({t for t in tables if _plain_table_name(t)} | set(NESTED_RUNS) | set(RUN_REPORTS))

    def clear(self, tables: Iterable[str]) -> None:
        """Delete a run, in an order that leaves, wherever a kill stops it, a folder the same --force-new clears
        again (a plain rerun refuses it or resumes it, never takes it for a folder of other files). The completion
        flag and the units' commit points go first (markers, side tables, a compaction's record), so that no
        marker is left without its data, then the data (tables, the runs built inside the folder, reports); the
        manifest says "complete": false before any of it goes (_withdraw_complete). The
        manifest goes last: go_ahead writes the new one over it (an atomic replace), so until then the folder
        is still a run of its stage, whose tables and nested runs refuse_other_files and _another_stages_parts
        know it by. A run that lost its manifest is known by its markers alone (LOST_MANIFEST), and no reader
        reads it: there they go last."""
        held = self.has_manifest()
        if held:
            self._withdraw_complete()
        sfs.remove_any(self.fs, self.path(COMPLETE))
        commit_points = [UNITS_DIR, SIDE_DIR, COMPACT_DIR]  # _compact/manifest.json commits a compaction
        data = list(tables) + [TMP_DIR]
        for name in commit_points if held else data:
            sfs.remove_any(self.fs, self.path(name))
        if held and sfs.is_local(self.fs):  # the commit points are gone from the disk before any data goes
            sfs.fsync_path(self.root)
        for name in data if held else commit_points[::-1]:  # the markers the very last
            sfs.remove_any(self.fs, self.path(name))
        if held and not sfs.is_file(self.fs, self.path(MANIFEST)):  # a folder at its name cannot be replaced
            sfs.remove_any(self.fs, self.path(MANIFEST))

    def _withdraw_complete(self) -> None:
        """Before clear deletes anything, the manifest it leaves in place until go_ahead says "complete": false,
        so that a kill part-way through the clear leaves no run that every reader of the flag (a run built first,
        a representation cache, a pool's vectors, remix) takes for whole while its units are gone: a plain
        rerun with the old settings resumes it and redoes them. A manifest that fails its own checksum is left
        as it is: nothing reads it, and rewriting it would seal what was edited."""
        try:
            old = self.read_manifest()
        except StoreError:
            return
        if old and old.get("complete") is not False and run_format(old) <= FORMAT_VERSION:
            self.write_manifest({**old, "complete": False})

    # ---- units ----------------------------------------------------------------------------
    def write_unit(self, unit: int, tables: Dict[str, pa.Table], fingerprint: str,
                   extra: Optional[dict] = None) -> UnitRecord:
        """Write every table of one unit atomically, then its completion marker (last)."""
        files = {}
        for table, data in tables.items():
            buf = io.BytesIO()
            pq.write_table(data, buf, compression="zstd")
            blob = buf.getvalue()
            self.commit_bytes(self.shard_path(table, unit), blob)
            files[table] = {
                "path": f"{table}/{part_name(unit)}",
                "rows": data.num_rows,
                "bytes": len(blob),
                "sha256": hashlib.sha256(blob).hexdigest(),
            }
        record = {"unit": unit, "fingerprint": fingerprint, "files": files, "extra": extra or {},
                  "written": timestamp()}
        record["check"] = record_check(record)
        # the commit point of the unit: only once every shard above is durably in place
        self.commit_bytes(self.marker_path(unit), json.dumps(record, sort_keys=True).encode())
        return UnitRecord(unit=unit, files=files, extra=extra or {})

    def read_marker(self, unit: int) -> Optional[dict]:
        """The unit's marker, or None when it is missing or not a valid marker (see marker_status)."""
        return self.marker_status(unit)[0]

    def marker_status(self, unit: int) -> Tuple[Optional[dict], Optional[str]]:
        """(marker, None), or (None, what is wrong with it): missing, empty, not JSON, or edited (its own
        checksum, its unit number or its file names disagree). A unit without a valid marker is not done."""
        p = self.marker_path(unit)
        info = self.fs.get_file_info(p)
        if info.type == pafs.FileType.NotFound:
            return None, "is missing"
        odd = sfs.not_a_file(info)
        if odd:  # never opened: a folder cannot be read, and a FIFO would block the reader
            return None, f"{NOT_A_FILE} ({odd})"
        raw = sfs.read_bytes(self.fs, p)
        if not raw.strip():
            return None, "is empty"
        try:
            rec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None, "is not valid JSON"
        files = rec.get("files") if isinstance(rec, dict) else None
        if not isinstance(files, dict) or rec.get("unit", unit) != unit or \
                any(not isinstance(f, dict) or f.get("path") != f"{t}/{part_name(unit)}"
                    or not all(k in f for k in ("rows", "bytes", "sha256")) for t, f in files.items()):
            return None, "is not a marker of this unit (edited or corrupt)"
        if rec.get("check") is not None and rec["check"] != record_check(rec):
            return None, "fails its own checksum (edited or corrupt)"
        return rec, None

    def _json_names(self, folder: str) -> List[str]:
        """Stems of the visible *.json files in a run folder (temporaries are dot-prefixed)."""
        d = self.path(folder)
        if not sfs.exists(self.fs, d):
            return []
        return [i.base_name[:-5] for i in self.fs.get_file_info(pafs.FileSelector(d))
                if i.base_name.endswith(".json") and not i.base_name.startswith(".")]

    def marker_scan(self) -> Tuple[Dict[int, dict], Dict[int, str]]:
        """(valid markers by unit, what is wrong with each invalid one): one read of each marker."""
        valid: Dict[int, dict] = {}
        invalid: Dict[int, str] = {}
        for stem in self._json_names(UNITS_DIR):
            if stem.isdigit():
                rec, why = self.marker_status(int(stem))
                if why is None:
                    valid[int(stem)] = rec
                else:
                    invalid[int(stem)] = why
        return valid, invalid

    def markers(self) -> Dict[int, dict]:
        """The valid completion markers, by unit (a missing, empty or edited one is left out)."""
        return self.marker_scan()[0]

    def check_file(self, f: dict, deep: bool = True) -> Optional[str]:
        """None if the file a marker names is there with its size (and, `deep`, its sha256)."""
        p = self.path(f["path"])
        info = self.fs.get_file_info(p)
        if info.type == pafs.FileType.NotFound:
            return f"{f['path']}: missing"
        if sfs.not_a_file(info):
            return f"{f['path']}: {NOT_A_FILE} ({sfs.not_a_file(info)})"
        if info.size != f["bytes"]:
            return f"{f['path']}: size {info.size} bytes, marker says {f['bytes']}"
        if deep:
            digest, _ = sfs.sha256_file(self.fs, p)
            if digest != f["sha256"]:
                return f"{f['path']}: checksum mismatch (edited or corrupt)"
        return None

    def check_unit(self, record: dict, deep: bool = True, compaction=None) -> Optional[str]:
        """None if the unit's files match its marker; otherwise what is wrong. A table whose rows a
        committed compaction holds (`compaction`, storage.compaction.Compaction) is checked there."""
        for table, f in record["files"].items():
            if compaction is not None and compaction.covers(table, int(record["unit"]), f) is not None:
                continue  # its compacted file is checked once, for all its units (completed_units)
            problem = self.check_file(f, deep)
            if problem:
                return problem
        return None

    def completed_units(self, fingerprint: str, deep: bool = True) -> Dict[int, UnitRecord]:
        """Units that are done and whose files still check out. A bad unit is left pending, to be redone.

        On a compacted run (`sentsim store compact`) a unit's rows may live in a compacted file: a file
        that no longer checks out is withdrawn from the compaction first, and its units are redone."""
        done: Dict[int, UnitRecord] = {}
        self.redo_reasons: Dict[int, str] = {}
        compaction = load_compaction(self, fingerprint)
        if compaction is not None:
            bad = {}
            for recs in compaction.tables.values():
                for rec in recs:
                    problem = compaction.file_problem(rec, deep=deep)
                    if problem:
                        bad[rec["path"]] = problem
            if bad:
                why = {int(e[0]): bad[r["path"]] for recs in compaction.tables.values() for r in recs
                       if r["path"] in bad for e in r["units"]}
                self.unmark_complete()
                compaction.withdraw(list(bad))
                self.redo_reasons.update(why)
        markers, invalid = self.marker_scan()
        for unit, why in invalid.items():  # an empty or edited marker: the unit is not done
            self.redo_reasons[unit] = f"its completion marker {why}"
            if why.startswith(NOT_A_FILE):  # a folder at the marker's name: the unit's new marker needs the name
                self.unmark_complete()
                sfs.remove_any(self.fs, self.marker_path(unit))
        for unit, rec in markers.items():
            if rec.get("fingerprint") != fingerprint:
                self.redo_reasons[unit] = "marker from another run"
                continue
            problem = self.check_unit(rec, deep=deep, compaction=compaction)
            if problem:
                self.redo_reasons[unit] = self.redo_reasons.get(unit, problem)
                self.unmark_complete()  # before the marker goes: never "complete" with a unit missing
                sfs.delete_durable(self.fs, self.marker_path(unit))
                for f in rec["files"].values():  # a folder at a shard's name: the redone shard needs the name
                    if sfs.not_a_file(self.fs.get_file_info(self.path(f["path"]))):
                        sfs.remove_any(self.fs, self.path(f["path"]))
                continue
            self.redo_reasons.pop(unit, None)
            done[unit] = UnitRecord(unit=unit, files=rec["files"], extra=rec.get("extra", {}))
        return done

    def finalize(self, planned_units: int, summary: dict) -> dict:
        """Record counts in the manifest and mark the run complete if every unit is done."""
        manifest = self.read_manifest() or {}
        markers = self.markers()
        done = [u for u in range(planned_units)
                if u in markers and markers[u].get("fingerprint") == manifest.get("fingerprint")]
        manifest.update(summary)
        manifest["planned_units"] = planned_units
        manifest["completed_units"] = len(done)
        manifest["complete"] = len(done) == planned_units
        manifest["finished"] = timestamp()
        self.write_manifest(manifest)
        if manifest["complete"]:
            if sfs.not_a_file(self.fs.get_file_info(self.path(COMPLETE))):  # a folder at its name: never a flag
                sfs.remove_any(self.fs, self.path(COMPLETE))
            self.commit_bytes(self.path(COMPLETE), manifest["fingerprint"].encode())
            self._settle_compaction(manifest.get("fingerprint"), markers)
        self.release()
        return manifest

    def _settle_compaction(self, fingerprint: Optional[str], markers: Dict[int, dict]) -> None:
        """After units of a compacted run were redone: a redone shard identical to the compacted rows
        (same sha256) is removed, so DIR/<table> holds each row once; units redone with other bytes
        leave a compacted file holding rows no marker vouches for, which readers refuse until
        `sentsim store compact` rewrites it: said here, once."""
        comp = load_compaction(self, fingerprint)
        if comp is None:
            return
        stale = set()
        for u, m in markers.items():
            for t, f in m.get("files", {}).items():
                if comp.covers(t, u, f) is not None and sfs.exists(self.fs, self.path(f["path"])):
                    sfs.delete_durable(self.fs, self.path(f["path"]))
        for t in comp.tables:
            for units in comp.stale(t, markers).values():
                stale.update(units)
        if stale:
            print(f"note: {self.uri}: {len(stale)} unit(s) were redone after `sentsim store compact`; run "
                  f"`sentsim store compact {self.uri}` again to fold them in (readers refuse the run until then)",
                  file=sys.stderr, flush=True)

    # ---- side tables ----------------------------------------------------------------------
    def side_path(self, name: str) -> str:
        return self.path(SIDE_DIR, f"{name}.parquet")

    def write_side_table(self, name: str, data: pa.Table, fingerprint: str) -> dict:
        """A run-level table written once (not per unit): Parquet first, then its record with the
        checksum, both atomic, so a reader sees the whole table or none of it."""
        buf = io.BytesIO()
        pq.write_table(data, buf, compression="zstd")
        blob = buf.getvalue()
        self.commit_bytes(self.side_path(name), blob)
        record = {"name": name, "path": f"{SIDE_DIR}/{name}.parquet", "rows": data.num_rows, "bytes": len(blob),
                  "sha256": hashlib.sha256(blob).hexdigest(), "fingerprint": fingerprint, "written": timestamp()}
        self.commit_bytes(self.path(SIDE_DIR, f"{name}.json"), json.dumps(record, sort_keys=True).encode())
        return record

    def side_records(self) -> Dict[str, dict]:
        out: Dict[str, dict] = {}
        for name in self._json_names(SIDE_DIR):
            rec = sfs.read_json(self.fs, self.path(SIDE_DIR, f"{name}.json"))[1]
            out[name] = rec if isinstance(rec, dict) and "sha256" in rec else \
                {"name": name, "path": f"{SIDE_DIR}/{name}.parquet", "broken": True}
        return out

    def check_side_table(self, record: dict) -> Optional[str]:
        if record.get("broken"):
            return f"{record['path']}: its record is not valid JSON (or not a file)"
        p = self.path(record["path"])
        if not sfs.exists(self.fs, p):
            return f"{record['path']}: missing"
        if not sfs.is_file(self.fs, p):
            return f"{record['path']}: {NOT_A_FILE}"
        digest, size = sfs.sha256_file(self.fs, p)
        if digest != record["sha256"]:
            return f"{record['path']}: checksum mismatch (edited or corrupt)"
        return None

    def _checked_side_record(self, name: str, fingerprint: Optional[str]) -> Optional[dict]:
        rec = self.side_records().get(name)
        if rec is None or (fingerprint is not None and rec.get("fingerprint") != fingerprint):
            return None
        problem = self.check_side_table(rec)
        if problem:
            raise StoreError(f"{self.uri}/{problem}")
        return rec

    def has_side_table(self, name: str, fingerprint: Optional[str] = None) -> bool:
        """Whether read_side_table would return the table (it raises as that does on a damaged one), without
        reading it into memory: its checksum is streamed, and a table of a million rows is not parsed."""
        return self._checked_side_record(name, fingerprint) is not None

    def read_side_table(self, name: str, fingerprint: Optional[str] = None) -> Optional[pa.Table]:
        """The side table if it was written (for this fingerprint, when given) and checks out, else None."""
        rec = self._checked_side_record(name, fingerprint)
        if rec is None:
            return None
        with self.fs.open_input_file(self.path(rec["path"])) as fh:
            return pq.read_table(fh)

    def unmark_complete(self) -> None:
        """Withdraw `_COMPLETE` while units are being redone; finalize writes it again."""
        sfs.remove_any(self.fs, self.path(COMPLETE))

    def is_complete(self) -> bool:
        return sfs.is_file(self.fs, self.path(COMPLETE))

    def incomplete_note(self) -> Optional[str]:
        """One line for readers of a run that is still going (or stopped part-way), or of a finished run
        that has lost units since (a deleted or damaged completion marker): training on it works, on
        the units there are, but the user should know. None when every planned unit is readable, and
        for hand-made folders (no manifest)."""
        manifest = self.read_manifest() or {}
        planned = manifest.get("planned_units")
        done = len(self.markers())
        if manifest.get("complete", True) is not False:
            if not isinstance(planned, int) or done >= planned:
                return None
            return (f"{self.uri} says it is complete, but only {done}/{planned} units are readable "
                    "(`sentsim store verify` names the others; resuming the job redoes them)")
        return f"{self.uri} is not complete ({done}/{planned if planned else '?'} units written)"


def open_store(uri: str) -> ShardStore:
    return ShardStore(uri)
