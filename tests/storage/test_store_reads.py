"""Every read checked: no reader of a run returns a row its unit's marker (or the committed compaction)
does not vouch for. A shard replaced by another valid Parquet file, markers untouched, is refused in one
line naming it (exit 2 through the CLI) by every reader path: RunReader's tables, datasets, batches,
file lists and units, the corpus view, the trainers' harvest readers and `sentsim index build`."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest
from conftest import sentsim_cli

from sentsim.errors import UsageError
from storage import RunReader, ShardStore, StoreError
from storage.records import record_check

FIX = r"sentsim store verify .*then resume the job"


def swap(run, table: str, victim: int, donor: int) -> None:
    """Replace one unit's shard by another unit's (a valid Parquet file); the markers are left alone."""
    shutil.copyfile(run / table / f"part-{donor:05d}.parquet", run / table / f"part-{victim:05d}.parquet")


@pytest.fixture()
def swapped_corpus(speech_corpus, tmp_path):
    run = tmp_path / "corpus"
    shutil.copytree(speech_corpus, run)
    swap(run, "sentences", 1, 3)
    return run


def test_every_run_reader_path_refuses_a_replaced_shard(swapped_corpus):
    import pandas  # noqa: F401  (hf_dataset and the pandas path share read_table)

    bad = "sentences/part-00001.parquet: .* bytes, but its unit marker says"
    r = RunReader(str(swapped_corpus))
    reads = {
        "read_table": lambda: r.read_table("sentences"),
        "columns": lambda: r.read_table("sentences", ["sentence_id"]),
        "files": lambda: r.files("sentences"),
        "file_uris": lambda: r.file_uris("sentences"),
        "schema": lambda: r.schema("sentences"),
        "dataset": lambda: r.dataset("sentences").to_table(),
        "iter_batches": lambda: list(r.iter_batches("sentences")),
        "ray_dataset": lambda: r.ray_dataset("sentences"),
        "unit_table": lambda: RunReader(str(swapped_corpus)).unit_table(1, "sentences"),
    }
    for name, read in reads.items():
        with pytest.raises(StoreError, match=f"{bad}.*{FIX}"):
            read()
    # the units the markers vouch for still read, one by one, and the other table whole
    assert RunReader(str(swapped_corpus)).unit_table(0, "sentences").num_rows > 0
    assert r.read_table("chunks").num_rows == r.rows("chunks")


def test_the_corpus_view_and_index_build_refuse_a_replaced_shard(swapped_corpus, tmp_path):
    from corpus.view import CorpusIndex, SentenceTable
    from sentsim.context.windows import iter_documents

    for read in (lambda: SentenceTable.load(swapped_corpus), lambda: CorpusIndex(str(swapped_corpus)),
                 lambda: list(iter_documents(str(swapped_corpus), 0.0, "all"))):
        with pytest.raises(UsageError, match="sentences/part-00001.parquet: .*bytes, but its unit marker says"):
            read()
    r = sentsim_cli("index", "build", "--corpus", swapped_corpus, "--out", tmp_path / "index")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "sentences/part-00001.parquet" in r.stderr, r.stderr
    assert "sentsim store verify" in r.stderr and not (tmp_path / "index" / "manifest.json").exists()


def test_a_same_size_file_with_other_rows_is_refused_by_its_footer(tmp_path):
    """A file of the marker's size whose row count is not the marker's: caught as it is opened."""
    root = tmp_path / "run"
    store = ShardStore(str(root))
    store.open_run("toy", "fp", {}, [], {"t": pa.schema([("x", pa.int64())])}, planned_units=2)
    for u in range(2):
        store.write_unit(u, {"t": pa.table({"x": list(range(10 * u, 10 * u + 5))})}, "fp")
    store.finalize(2, {})
    marker = root / "_units" / "00001.json"
    rec = json.loads(marker.read_text())
    rec["files"]["t"]["rows"] = 4  # as if the file at its path held another count
    rec["check"] = record_check(rec)
    marker.write_text(json.dumps(rec))
    for read in ("read_table", "dataset", "iter_batches"):
        r = RunReader(str(root))
        with pytest.raises(StoreError, match=f"t/part-00001.parquet: 5 rows, but its unit marker says 4.*{FIX}"):
            res = getattr(r, read)("t")
            list(res) if read == "iter_batches" else res
    assert RunReader(str(root)).unit_table(0, "t").num_rows == 5


def test_the_trainers_harvest_readers_refuse_a_replaced_shard(tmp_path):
    from test_run_reader import FP, pairs_table, sentences_table

    from sentsim.students import data as D
    from sentsim.surrogate.data import inspect_harvest

    root = tmp_path / "run"
    store = ShardStore(str(root))
    store.open_run("harvest", FP, {}, [], {"pairs": pairs_table(3).schema, "sentences": sentences_table(1).schema},
                   planned_units=3)
    for u in range(3):
        store.write_unit(u, {"pairs": pairs_table(30 + 10 * u, 100 * u), "sentences": sentences_table(10, 100 * u)},
                         FP)
    store.finalize(3, {})
    swap(root, "pairs", 0, 2)
    for read in (lambda: inspect_harvest(str(root)), lambda: D.scored_pairs(D.harvest_root(str(root)), "train")):
        with pytest.raises(UsageError, match=f"pairs/part-00000.parquet: .*bytes, but its unit marker says.*{FIX}"):
            read()


def test_a_compacted_file_replaced_is_refused(speech_corpus, tmp_path):
    from storage.compact import compact_run

    run = tmp_path / "run"
    shutil.copytree(speech_corpus, run)
    assert compact_run(str(run), target_bytes=100_000)["status"] == "compacted"
    files = sorted((run / "sentences").glob("compact-*.parquet"))
    assert len(files) > 1
    shutil.copyfile(files[0], files[1])
    with pytest.raises(StoreError, match=f"{files[1].name}: .*bytes, but _compact/manifest.json says.*{FIX}"):
        RunReader(str(run)).read_table("sentences")
    with pytest.raises(StoreError, match=f"{files[1].name}: .*bytes, but _compact/manifest.json says"):
        RunReader(str(run)).dataset("sentences")
