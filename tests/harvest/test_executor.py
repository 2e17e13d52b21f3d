"""The one executor of sharded jobs, and stage resources from config honoured on Ray.

The Ray tests run on this module's own local Ray with 2 logical GPUs (`num_gpus=2` works on a
CPU machine: Ray only counts them and sets CUDA_VISIBLE_DEVICES for the actors it places).
"""

from __future__ import annotations

import io
from collections import Counter

import pytest
from harvest_support import build_index_for, harvest_config, tiny_context_bundle
from run_support import every_file, refused_toy_job, toy_job


def test_a_job_is_a_class_and_says_only_what_it_must():
    """A job that leaves out an abstract method cannot be built; the others have defaults that do nothing."""
    from sentsim.executor import ShardedJob

    class Half(ShardedJob):
        stage = "half"

        def fingerprint_parts(self):
            return ("half",)

    with pytest.raises(TypeError, match="abstract"):
        Half()
    job = toy_job("r", [])
    assert job.fp == toy_job("elsewhere", [{"unit": 0}]).fp  # the fingerprint is the parts', not the location's
    assert (job.detail({"unit": 0}), job.open_extra(), job.fingerprint_in_format(1, {})) == (None, {}, None)


def test_resume_max_units_and_progress(tmp_path, capsys):
    from sentsim.executor import execute

    units = [{"unit": u, "x": u * u} for u in range(5)]
    m = execute(toy_job(tmp_path / "r", units), executor="inline", max_units=2)
    assert (m["completed_units"], m["complete"], m["this_run"]["units"]) == (2, False, 2)
    err = capsys.readouterr().err
    assert "[toy] unit 00001 | 2/5 units | 2 rows" in err and "ETA" in err
    m = execute(toy_job(tmp_path / "r", units), executor="inline")
    assert m["complete"] and m["n"] == 5 and m["this_run"]["units"] == 3
    err = capsys.readouterr().err
    assert "[toy] resuming" in err and "2 already complete, 3 to do" in err
    assert "[toy] unit 00004 | 5/5 units | 3 rows this run |" in err  # the units resumed, the rows its own
    # nothing left: no stage is built, nothing runs
    m = execute(toy_job(tmp_path / "r", units), executor="inline")
    assert m["complete"] and m["this_run"]["units"] == 0


def test_a_quiet_run_closes_the_null_device_it_writes_its_lines_to(tmp_path):
    """A quiet run's progress goes to os.devnull; the run closes it, not the garbage collector, so a process
    that runs many quiet jobs (the tests, a harvest building its rep cache) holds no descriptor for each."""
    import gc
    import warnings

    from sentsim.executor import execute

    units = [{"unit": u, "x": u} for u in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        m = execute(toy_job(tmp_path / "q", units), executor="inline", quiet=True)
        assert m["complete"] and m["this_run"]["units"] == 3
        m = execute(toy_job(tmp_path / "q", units), executor="inline", quiet=True)  # and one with nothing to do
        assert m["complete"] and m["this_run"]["units"] == 0
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not [w for w in unclosed if "/dev/null" in w or "devnull" in w], unclosed


def test_streamed_units_run_in_windows_and_stop_on_request(tmp_path):
    from sentsim.executor import execute

    seen = []

    def units():
        for u in range(7):
            seen.append(u)
            yield {"unit": u, "x": u}

    stop = lambda r: r["unit"] == 2  # noqa: E731
    m = execute(toy_job(tmp_path / "s", units(), window=3, on_result=stop), executor="inline")
    # planning goes on to the end (the planned count is right) but no unit after the stop starts
    assert seen == list(range(7)) and m["planned_units"] == 7 and m["completed_units"] == 3


@pytest.fixture(scope="module")
def ray_2gpu():
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, ignore_reinit_error=True)
    # Ray Data starts a pool's min_actors without waiting for them, and on these tiny inputs the
    # first actor up would do every unit; waiting for the whole pool makes "each actor works" testable.
    ctx = ray.data.DataContext.get_current()
    saved, ctx.wait_for_min_actors_s = ctx.wait_for_min_actors_s, 300
    yield ray
    ctx.wait_for_min_actors_s = saved
    ray.shutdown()


@pytest.fixture(scope="module")
def inputs(speech_corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("exec")
    return {"corpus": speech_corpus, "index": build_index_for(speech_corpus, root / "index"),
            "bundle": tiny_context_bundle(speech_corpus, root / "ctx")}


def test_contexts_runs_the_configured_actor_pool(inputs, ray_2gpu, tmp_path):
    """`resources.max_actors=2` of `sentsim contexts` gives 2 screening actors that both work."""
    from sentsim.config import load_config
    from sentsim.screening.contexts_job import ScreenConfig, screen_contexts

    cfg = load_config(ScreenConfig, None, ["sample=48", "per_unit=4", "contexts.size=5", "contexts.retrieve_chunks=40",
                                           "resources.num_cpus=0.5", "resources.min_actors=2",
                                           "resources.max_actors=2"],
                      corpus=str(inputs["corpus"]), index=str(inputs["index"]), out=str(tmp_path / "c"))
    m = screen_contexts(cfg, executor="ray", quiet=True)
    assert m["complete"] and m["counts"]["sentences"] == 48
    actors = m["this_run"]["actors"]["screen"]
    assert len({a["pid"] for a in actors}) == 2, actors


def test_scoring_actors_get_their_gpu_fractions(inputs, ray_2gpu, tmp_path):
    """4 scoring actors at 0.5 GPU on 2 GPUs: two share each device, and each actor sees only the
    device Ray gave it, recorded from inside the stage."""
    from sentsim.harvest.job import harvest

    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "h",
                         anchors={"n": 24, "per_unit": 2}, rank={"enabled": False},
                         resources={"contexts": {"num_cpus": 0.25}, "rank": {"num_cpus": 0.25},
                                    "scoring": {"num_cpus": 0.25, "num_gpus": 0.5, "min_actors": 4, "max_actors": 4}})
    m = harvest(cfg, executor="ray", quiet=True)
    assert m["complete"]
    scoring = m["this_run"]["actors"]["scoring"]
    assert len({a["pid"] for a in scoring}) == 4, scoring
    per_device = Counter(a["cuda_visible_devices"] for a in scoring)
    assert per_device == {"0": 2, "1": 2}, scoring
    # the CPU-only stages get no device
    assert all(a["cuda_visible_devices"] in (None, "") for a in m["this_run"]["actors"]["contexts"])


def test_gpu_asks_beyond_the_cluster_are_refused(inputs, ray_2gpu, tmp_path):
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest

    cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], tmp_path / "g",
                         resources={"scoring": {"num_gpus": 1, "min_actors": 3, "max_actors": 3}})
    with pytest.raises(UsageError, match="ask for 3 GPUs but the cluster has 2"):
        harvest(cfg, executor="ray", quiet=True)
    assert not list((tmp_path / "g").glob("_units/*.json"))  # refused before any unit ran


def test_a_stage_reserves_the_memory_its_config_declares(ray_2gpu):
    from sentsim.pipeline import Resources, StageResources, StageSpec, run_pipeline

    class _Assigned:  # defined here so that Ray's workers get it by value (they cannot import this module)
        """A stage that reports the resources Ray assigned to its actor."""

        name = "assigned"

        def setup(self):
            pass

        def process(self, items):
            import ray

            return [dict(it, assigned=ray.get_runtime_context().get_assigned_resources()) for it in items]

    res = Resources.of(StageResources(num_cpus=0.25, memory_gb=0.5))
    out = list(run_pipeline([{"unit": 0}], [StageSpec(_Assigned, res)], executor="ray"))
    assert out[0]["assigned"].get("memory") == 0.5 * 2**30 and out[0]["assigned"]["CPU"] == 0.25, out[0]
    # undeclared (the default): no memory reserved, as before the setting existed
    out = list(run_pipeline([{"unit": 0}], [StageSpec(_Assigned, Resources(num_cpus=0.25))], executor="ray"))
    assert "memory" not in out[0]["assigned"], out[0]


def test_a_shared_value_is_loaded_once_a_run_and_mapped_by_every_actor(ray_2gpu, tmp_path):
    """pipeline.Shared: the driver loads it once and puts it in the object store; each actor maps it (numpy
    zero-copy, so read-only) instead of loading its own copy. In-process it loads once, at first use."""
    import functools

    import numpy as np

    from sentsim.pipeline import Resources, Shared, StageSpec, run_pipeline

    def load(log):
        with open(log, "a") as f:
            f.write("load\n")
        return {"a": np.arange(100_000, dtype=np.float64)}

    class _Reads:  # by value to Ray's workers, as _Assigned above
        name = "reads"

        def __init__(self, value):
            self.value = value

        def setup(self):
            self.a = self.value.get()["a"]

        def process(self, items):
            import os

            return [dict(it, pid=os.getpid(), writeable=self.a.flags.writeable, total=float(self.a.sum()))
                    for it in items]

    log = tmp_path / "loads"
    shared = Shared(functools.partial(load, str(log)))
    res = Resources(num_cpus=0.25, min_actors=2, max_actors=2)
    out = list(run_pipeline([{"unit": u} for u in range(12)], [StageSpec(_Reads, res, {"value": shared})],
                            executor="ray"))
    assert len(out) == 12 and {o["total"] for o in out} == {float(np.arange(100_000).sum())}
    assert not any(o["writeable"] for o in out)  # mapped from the object store, not an actor's own copy
    assert log.read_text().count("load") == 1  # in the driver, once; not once per actor
    assert len({o["pid"] for o in out}) == 2
    log.unlink()
    out = list(run_pipeline([{"unit": u} for u in range(3)], [StageSpec(_Reads, res, {"value": shared})],
                            executor="inline"))
    assert len(out) == 3 and log.read_text().count("load") == 1
    # a value the driver read for itself first is handed over, not loaded again, and not kept once put
    log.unlink()
    held = Shared(functools.partial(load, str(log)))
    held.hold({"a": np.arange(100_000, dtype=np.float64)})
    out = list(run_pipeline([{"unit": u} for u in range(4)], [StageSpec(_Reads, res, {"value": held})],
                            executor="ray"))
    assert {o["total"] for o in out} == {float(np.arange(100_000).sum())} and not log.exists()
    assert held._value is None and not held._loaded


def test_memory_and_cpu_asks_beyond_the_cluster_are_refused(inputs, ray_2gpu, tmp_path):
    """Ray Data would start the pools that fit and wait for the others for ever: refused before any unit."""
    from sentsim.errors import UsageError
    from sentsim.harvest.job import harvest

    for ask, msg in (({"contexts": {"memory_gb": 4096}}, "ask for 4096 GiB of memory but the cluster has .*memory_gb"),
                     # 2 contexts + 2 scoring actors at 0.5 CPU leave the rank and write stages' 0.25 each (the
                     # writer runs on resources.rank) no room on 2 CPUs
                     ({"contexts": {"min_actors": 2, "max_actors": 2}, "scoring": {"min_actors": 2, "max_actors": 2}},
                      "ask for 2.5 CPUs but the cluster has 2; lower resources.*.num_cpus")):
        out = tmp_path / str(len(msg))
        with pytest.raises(UsageError, match=msg):
            harvest(harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, resources=ask),
                    executor="ray", quiet=True)
        assert not list(out.glob("_units/*.json"))


def test_a_force_new_the_cluster_refuses_keeps_the_old_run_whole(inputs, ray_2gpu, sample_path, tmp_path, capsys):
    """A finished corpus build and harvest, then --force-new on Ray asking for more CPUs than the cluster has: exit 2
    in one line, and every file of the old run as it was (bytes and mtime), where the old run used to be deleted
    before the check. A pool harvest's vectors run, which it builds first, is checked before the old harvest is
    discarded too. A --force-new that goes ahead then replaces the run."""
    import json

    from conftest import error_line
    from harvest_support import cli_in_process

    corpus = tmp_path / "corpus"
    build = ["corpus", "build", sample_path, "--out", corpus, "--set", "docs_per_unit=5"]
    assert cli_in_process(capsys, *build, "--executor", "inline").returncode == 0
    old = json.loads((corpus / "manifest.json").read_text())
    before = every_file(corpus)
    r = cli_in_process(capsys, *build, "--executor", "ray", "--force-new", "--set", "resources.num_cpus=64")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert error_line(r.stderr) == ("sentsim: error: resources ask for 64 CPUs but the cluster has 2; lower "
                                    "resources.*.num_cpus or min_actors, or add nodes"), r.stderr
    assert every_file(corpus) == before
    r = cli_in_process(capsys, *build[:-1], "docs_per_unit=10", "--executor", "inline", "--force-new")
    assert r.returncode == 0, r.stderr[-3000:]
    new = json.loads((corpus / "manifest.json").read_text())
    assert new["complete"] and new["fingerprint"] != old["fingerprint"] and new["planned_units"] < old["planned_units"]
    assert len(list((corpus / "_units").iterdir())) == new["planned_units"]

    per_pair = dict(rank={"n_anchors": 32}, resources={"contexts": {"num_cpus": 0.25}, "scoring": {"num_cpus": 0.25},
                                                       "rank": {"num_cpus": 0.25}})
    pool = dict(contexts={"mode": "pool", "pool_size": 12}, anchors={"n": 8, "per_unit": 4}, sentences_per_unit=8,
                pairs_per_unit=8, rank={"n_anchors": 32}, resources={"label": {"num_cpus": 0.25},
                                                                     "rank": {"num_cpus": 0.25}})
    for name, over, asks, refused in (
            ("h", per_pair, {"scoring": {"num_cpus": 64}}, "resources ask for 64.75 CPUs but the cluster has 2"),
            # the harvest's own stages fit; the vectors run's scoring stage does not
            ("p", pool, {"scoring": {"num_cpus": 64}},
             f"{tmp_path / 'p' / 'pool_vectors'} (built before the harvest): resources ask for 64.25 CPUs but the "
             "cluster has 2")):
        out = tmp_path / name
        cfg = harvest_config(inputs["corpus"], inputs["index"], inputs["bundle"], out, **over)
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps(cfg.model_dump()))  # JSON is YAML
        assert cli_in_process(capsys, "harvest", "--config", config, "--executor", "inline").returncode == 0
        old, before = json.loads((out / "manifest.json").read_text()), every_file(out)
        data = cfg.model_dump()
        data["seed"] += 1  # another run: the pool's vectors too
        data["resources"]["scoring"].update(asks["scoring"])
        config.write_text(json.dumps(data))
        r = cli_in_process(capsys, "harvest", "--config", config, "--executor", "ray", "--force-new")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        assert error_line(r.stderr).startswith(f"sentsim: error: {refused}; lower resources"), r.stderr
        assert every_file(out) == before, name
    data["resources"]["scoring"]["num_cpus"] = 0.25  # the pool run's, goes ahead inline
    config.write_text(json.dumps(data))
    r = cli_in_process(capsys, "harvest", "--config", config, "--executor", "inline", "--force-new")
    assert r.returncode == 0, r.stderr[-3000:]
    new = json.loads((out / "manifest.json").read_text())
    assert new["complete"] and new["fingerprint"] != old["fingerprint"]
    assert new["config"]["seed"] == old["config"]["seed"] + 1


def test_progress_line_without_a_plan():
    from sentsim.executor import Progress

    buf = io.StringIO()
    p = Progress("corpus", None, 0, "sentences", stream=buf, detail=lambda r: "x")
    p.update({"unit": 3, "sentences": 10})
    assert buf.getvalue().startswith("[corpus] unit 00003 | 1 units | 10 sentences |") and "ETA" not in buf.getvalue()


def test_no_empty_run_is_written(tmp_path):
    """0 planned units (a list) or a stream that yields none: refused before anything is written."""
    from sentsim.errors import UsageError
    from sentsim.executor import execute

    for units in ([], iter(())):
        out = tmp_path / ("list" if isinstance(units, list) else "stream")
        with pytest.raises(UsageError, match="empty run"):
            execute(toy_job(str(out), units), executor="inline", quiet=True)
        assert not out.exists()


def test_a_force_new_refused_after_it_opened_keeps_the_old_run_whole(tmp_path):
    """--force-new discards the old run only once the new one goes ahead: a refusal in the new run's stages, or from
    a run it builds first (here a folder that run cannot be written in, refused before the old run is discarded)
    leaves every file of the old run as it was, bytes and mtime, and no lease; a --force-new that goes ahead then
    replaces the run."""
    import json

    from sentsim.errors import UsageError
    from sentsim.executor import execute
    from storage import StoreError

    out = tmp_path / "r"
    units = [{"unit": u, "x": u} for u in range(3)]
    assert execute(toy_job(out, units), executor="inline", quiet=True)["complete"]
    (out / "nested").mkdir()
    (out / "nested" / "notes.txt").write_text("not a run")
    before = every_file(out)
    for refused, first, raised, line in ((True, None, UsageError, "refused in stages"),
                                         (False, toy_job(out / "nested", units), StoreError, "nested is not empty")):
        with pytest.raises(raised, match=line):
            execute(refused_toy_job(out, units[:2], refused, first), executor="inline", quiet=True, force_new=True)
        assert every_file(out) == before, line
    assert json.loads((out / "manifest.json").read_text())["planned_units"] == 3
    m = execute(toy_job(out, units[:2]), executor="inline", quiet=True, force_new=True)
    assert m["complete"] and (m["planned_units"], m["completed_units"], m["this_run"]["units"]) == (2, 2, 2)
    assert sorted(p.name for p in (out / "_units").iterdir()) == ["00000.json", "00001.json"]
    assert sorted(p.name for p in (out / "t").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]


class _Killed(BaseException):
    """A kill part-way through the clear: nothing after it runs."""


@pytest.mark.parametrize("old_stage", ["toy", "corpus", "lost"])
def test_a_force_new_killed_anywhere_in_its_clear_is_finished_by_the_same_command(tmp_path, monkeypatch, old_stage):
    """--force-new over a run that holds nested runs and reports (a pool harvest's vectors, its report.json), or
    over one that lost its manifest (as LOST_MANIFEST tells the user to), killed after any deletion of its clear:
    the same --force-new starts the run over, leaving nothing of the old run of another stage and keeping a
    same-stage run's nested runs; the old manifest left says "complete": false, and a plain rerun with the old
    settings redoes the units the clear removed; a plain rerun with new settings refuses in one line that names
    --force-new (or resumes), never taking the folder for one of other files."""
    import json
    import shutil

    import pyarrow as pa

    from sentsim.executor import execute
    from storage import ShardStore, StoreError
    from storage import fs as sfs

    units = [{"unit": u, "x": u} for u in range(3)]

    def old_run(out):
        if old_stage != "corpus":
            execute(toy_job(out, units), executor="inline", quiet=True)
        else:  # a run of another stage, with its own table
            store = ShardStore(str(out))
            store.open_run(old_stage, "c" * 16, {}, [], {"sentences": pa.schema([("s", pa.int64())])}, planned_units=1)
            store.write_unit(0, {"sentences": pa.table({"s": [1]})}, "c" * 16)
            store.finalize(1, {})
        for name in ("pool_vectors", "rep_cache"):  # the runs a job builds inside its folder, and its reports
            execute(toy_job(out / name, units[:1]), executor="inline", quiet=True)
        (out / "report.json").write_text("{}")
        (out / "report.png").write_bytes(b"png")
        if old_stage == "lost":
            (out / "manifest.json").unlink()

    real_clear, real_remove = ShardStore.clear, sfs.remove_any
    kill_at = {"n": None, "seen": 0, "on": False}

    def remove_any(fs, path):
        if kill_at["on"]:
            if kill_at["seen"] == kill_at["n"]:
                raise _Killed()
            kill_at["seen"] += 1
        return real_remove(fs, path)

    def clear(self, tables):
        kill_at.update(seen=0, on=True)
        try:
            real_clear(self, tables)
        finally:
            kill_at["on"] = False

    monkeypatch.setattr(sfs, "remove_any", remove_any)
    monkeypatch.setattr(ShardStore, "clear", clear)
    n = 0
    while True:
        out = tmp_path / f"k{n}"
        old_run(out)
        kill_at["n"] = n
        try:
            execute(toy_job(out, units[:2]), executor="inline", quiet=True, force_new=True)
            break  # the clear ran to its end: every point of it was tried
        except _Killed:
            pass
        kill_at["n"] = None
        manifest = out / "manifest.json"
        if manifest.exists():  # the old run's, until the new one replaces it: never "complete" with units gone
            assert json.loads(manifest.read_text())["complete"] is False, n
        if old_stage == "toy":  # a plain rerun with the old settings redoes what the clear removed
            again = tmp_path / f"again{n}"
            shutil.copytree(out, again)
            m = execute(toy_job(again, units), executor="inline", quiet=True)
            assert m["complete"] and m["completed_units"] == 3, n
            assert sorted(p.name for p in (again / "t").iterdir()) == [f"part-0000{u}.parquet" for u in range(3)], n
        plain = tmp_path / f"plain{n}"
        shutil.copytree(out, plain)
        try:
            execute(toy_job(plain, units[:2]), executor="inline", quiet=True)
        except StoreError as exc:
            assert "--force-new" in str(exc) and "holds no sentsim run" not in str(exc), (n, str(exc))
        m = execute(toy_job(out, units[:2]), executor="inline", quiet=True, force_new=True)
        assert m["complete"] and m["stage"] == "toy" and m["this_run"]["units"] == 2, n
        left = {p.name for p in out.iterdir()}
        if old_stage != "corpus":
            assert {"pool_vectors", "rep_cache"} <= left, (n, left)
        else:
            assert not left & {"sentences", "pool_vectors", "rep_cache", "report.json", "report.png"}, (n, left)
        assert sorted(p.name for p in (out / "_units").iterdir()) == ["00000.json", "00001.json"], n
        n += 1
    assert n >= 5  # the flag, the commit points and the data were each a point a kill was tried at


def test_a_run_whose_lease_was_taken_over_stops_before_finalizing(tmp_path, monkeypatch):
    """A holder judged stale and taken over notices on its next heartbeat; the executor then stops with
    the one-line LeaseLost (exit 2 from the CLI) and does not finalize the new holder's run."""
    import json

    from sentsim.executor import execute
    from storage.lease import LEASE, LeaseLost, RunLease

    out = tmp_path / "r"
    held = []
    real_acquire = RunLease.acquire
    monkeypatch.setattr(RunLease, "acquire", lambda self: held.append(self) or real_acquire(self))

    def take_over(result):
        if result["unit"] == 0:  # another writer replaces the lease, as a stale takeover does
            rec = json.loads((out / LEASE).read_text())
            (out / LEASE).write_text(json.dumps(dict(rec, token="someone-else", pid=4242, host="other-host")))
        held[0].heartbeat()  # the beat the background thread sends every stale_after / 5 seconds
        return False

    with pytest.raises(LeaseLost, match="taken over by pid 4242 on host other-host"):
        execute(toy_job(out, [{"unit": u, "x": u} for u in range(4)], on_result=take_over), executor="inline")
    assert not (out / "_COMPLETE").exists()
    assert json.loads((out / LEASE).read_text())["token"] == "someone-else"  # the new holder's lease stays


def test_inline_runs_and_scoring_import_neither_ray_nor_the_splitter(tmp_path, sample_path):
    """Scoring exported context sets on a machine with only the model (bench/teacher_gpu.py score) imports the
    scoring stage without the sentence splitter, and an inline job runs where Ray is not installed."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # any import of Ray now fails\n"
        "import sentsim.harvest.stages, sentsim.context.scorer\n"
        "assert 'blingfire' not in sys.modules, 'the scoring stage imported the splitter'\n"
        "from sentsim.corpus_job import build_corpus\n"
        f"build_corpus([{str(sample_path)!r}], {str(tmp_path / 'c')!r}, overrides=['docs_per_unit=10'],"
        " executor='inline', quiet=True)\n"
        "print('built')\n")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("built"), r.stderr[-3000:]
    assert list((tmp_path / "c" / "sentences").glob("*.parquet"))
