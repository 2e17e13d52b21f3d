"""A stage put between ranking and the writer: the harvest writes what it hands on, and the run is an
ordinary one (its shards verify, a rerun resumes and redoes nothing). README "Adding a harvest stage"."""

from dataclasses import replace

import pyarrow.dataset as ds
import pytest
from harvest_support import harvest_config, harvest_inputs

from sentsim.harvest.work import Ranked, envelope, work_of
from sentsim.pipeline import Resources, Stage, StageSpec

pytestmark = pytest.mark.slow


class KeepScoredAtLeast(Stage):
    """A toy filter: keeps the pairs whose score is at least `threshold` (a null score is dropped)."""

    name = "keep_scored"

    def __init__(self, threshold: float):
        self.threshold = threshold

    def process(self, items):
        out = []
        for item in items:
            work: Ranked = work_of(item)
            kept = [r for r in work.rows if r.score is not None and r.score >= self.threshold]
            out.append(envelope(replace(work, rows=kept)))
        return out


def table(run, name):
    return ds.dataset(str(run / name)).to_table()


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    return harvest_inputs(speech_corpus, tmp_path_factory.mktemp("filter_inputs"))


def test_a_filter_before_the_writer_decides_the_rows_written(inputs, tmp_path, monkeypatch):
    from sentsim.harvest.job import HarvestRun, harvest
    from storage import verify_store

    def config(out):
        return harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / out)

    harvest(config("all"), executor="inline", quiet=True)
    every = table(tmp_path / "all", "pairs").to_pandas().sort_values("pair_id").reset_index(drop=True)
    threshold = float(every.score.dropna().median())

    pipeline = HarvestRun.stages

    def with_filter(self, ctx):
        specs = pipeline(self, ctx)
        assert specs[-1].name == "write"
        return specs[:-1] + [StageSpec(KeepScoredAtLeast, Resources(num_cpus=0.25), {"threshold": threshold})] \
            + specs[-1:]

    monkeypatch.setattr(HarvestRun, "stages", with_filter)
    out = tmp_path / "filtered"
    first = harvest(config("filtered"), executor="inline", quiet=True)
    got = table(out, "pairs").to_pandas().sort_values("pair_id").reset_index(drop=True)
    want = every[every.score.notna() & (every.score >= threshold)].reset_index(drop=True)
    assert 0 < len(got) < len(every)
    assert got.equals(want)  # the very rows of the unfiltered run, rank similarity included
    assert table(out, "sentences").sort_by("sentence_id").equals(
        table(tmp_path / "all", "sentences").sort_by("sentence_id"))
    assert first["complete"] and first["this_run"]["pairs"] == len(got)
    assert verify_store(str(out)) == []

    again = harvest(config("filtered"), executor="inline", quiet=True)
    assert again["this_run"]["units"] == 0 and again["fingerprint"] == first["fingerprint"]
    assert table(out, "pairs").to_pandas().sort_values("pair_id").reset_index(drop=True).equals(got)
