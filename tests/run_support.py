"""Run helpers the test areas share: a toy sharded job, a run rewritten as an earlier sentsim wrote it (or its
manifest as a writer would have written it in another state), an untrained (seeded) discriminator folder, a kill
just before a file is renamed into place, and the env of a machine without Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

SCHEMA = pa.schema([("unit", pa.int64()), ("x", pa.int64())])


class _Write:
    """A stage that writes its unit's one-row shard, as every job's last stage does."""

    name = "write"

    def __init__(self, out, fp):
        self.out, self.fp = out, fp

    def setup(self):
        pass

    def process(self, items):
        from storage import ShardStore

        for it in items:
            ShardStore(self.out).write_unit(it["unit"], {"t": pa.table({"unit": [it["unit"]], "x": [it["x"]]},
                                                                          schema=SCHEMA)}, self.fp, {"x": it["x"]})
        return [{"unit": it["unit"], "rows": 1, "x": it["x"]} for it in items]


def toy_job(out, units, window=None, on_result=None):
    """A toy job over `units`, each written as a one-row shard; `on_result(r)` True stops it."""
    from sentsim.executor import ShardedJob
    from sentsim.pipeline import Resources, StageSpec

    class Toy(ShardedJob):
        stage = "toy"
        count = "rows"

        def __init__(self):
            self.out, self.window = str(out), window

        @property
        def units(self):
            return units

        def fingerprint_parts(self):
            return ("toy", 1)

        def config(self):
            return {}

        def inputs(self):
            return []

        def tables(self):
            return {"t": SCHEMA}

        def stages(self, ctx):
            return [StageSpec(_Write, Resources(num_cpus=0.25), args=dict(out=self.out, fp=ctx.fp))]

        def on_result(self, result):
            return bool(on_result and on_result(result))

        def summary(self, ctx):
            return {"n": ctx.planned}

    return Toy()


def refused_toy_job(out, units, refused: bool, first=None):
    """toy_job, refused with a UsageError in its `stages` (`refused`), or running `first` (a job, as
    ShardedJob.runs_first gives it) before its own units: the refusals a --force-new run meets after it opened."""
    from sentsim.errors import UsageError

    class Refused(type(toy_job(out, units))):
        def stages(self, ctx):
            if refused:
                raise UsageError("refused in stages")
            return super().stages(ctx)

        def runs_first(self, ctx):
            return [first] if first is not None else []

    return Refused()


def every_file(uri) -> dict:
    """Every file and folder under a run folder, local or s3://, as {relative path: (bytes, mtime in ns)} (a folder's
    value: None): a run left whole is this same dict."""
    import pyarrow.fs as pafs

    from storage import fs as sfs

    fs, root = sfs.resolve(str(uri))
    found = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        rel = info.path[len(root):].lstrip("/")
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                found[rel] = (f.read(), info.mtime_ns)
        else:
            found[rel] = None
    return found


def as_fingerprinted(run, fp, run_format=1):
    """The run with every record's fingerprint replaced by `fp` (manifest, unit markers, side tables), as
    an earlier sentsim wrote it: run format 1, markers without a checksum of their own. A manifest of a format
    that carries its own checksum (storage.store.SEALED_FORMAT and later) is sealed, as a writer of it seals it."""
    from storage import ShardStore
    from storage.store import SEALED_FORMAT

    for f in [run / "manifest.json", *(run / "_units").glob("*.json"), *(run / "_side").glob("*.json")]:
        rec = json.loads(f.read_text())
        rec["fingerprint"] = fp
        rec.pop("check", None)  # markers too were written without one
        if f.name == "manifest.json":
            rec["format_version"] = run_format
            if run_format >= SEALED_FORMAT:
                ShardStore(str(run)).write_manifest(rec)
                continue
        f.write_text(json.dumps(rec))
    (run / "_COMPLETE").unlink()
    return run


def before_manifest_checksums(manifest: dict) -> dict:
    """`manifest` as a sentsim from before manifests carried a checksum of themselves wrote it: none, and a run
    format before storage.store.SEALED_FORMAT (that sentsim's last, 5, whose schemas and fingerprints are
    today's; an earlier one it records is kept)."""
    from storage.store import MANIFEST_CHECK, SEALED_FORMAT

    manifest.pop(MANIFEST_CHECK, None)
    if "format_version" in manifest:
        manifest["format_version"] = min(manifest["format_version"], SEALED_FORMAT - 1)
    return manifest


def rewrite_manifest(run, manifest: dict) -> None:
    """Write `manifest` as the run's, through the store, as a writer would have written it (with its checksum):
    for tests of a run in a state a real one can be in (stopped part-way, of other settings), made from another
    real one. A manifest written by hand is refused by every reader as edited."""
    from storage import ShardStore

    ShardStore(str(run)).write_manifest(manifest)


def save_untrained_discriminator(corpus, out, seed: int = 0, window: int = 1):
    """A real discriminator directory (weights, vocab, config) with untrained, seeded weights."""
    import torch
    from safetensors.torch import save_file

    from corpus.view import SentenceTable
    from sentsim.discriminator import CoherenceModel, ModelConfig
    from sentsim.discriminator.io import FORMAT
    from sentsim.discriminator.vocab import Vocab
    from sentsim.identity import corpus_fingerprint

    torch.manual_seed(seed)
    mc = ModelConfig(window=window, embed_dim=16, hidden=16, head_dim=16, embed_init="random")
    vocab = Vocab.build(SentenceTable.load(corpus).texts, 2000, 1)
    model = CoherenceModel(len(vocab), mc)
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    vocab.save(out / "vocab.json")
    (out / "config.json").write_text(json.dumps({
        "format": FORMAT, "model": mc.model_dump(), "corpus_fingerprint": corpus_fingerprint(corpus),
        "vocab_fingerprint": vocab.fingerprint, "vocab_size": len(vocab), "fingerprint": f"untrained-{seed}-{window}",
    }))
    return out


class Killed(BaseException):
    """A kill, as the code under test meets one: nothing it has catches it."""


def killed_before_renaming(monkeypatch, name: str) -> list:
    """storage.fs.durable_replace (every atomic write's last step) stopped with Killed just before it renames a
    file called `name` into place, as a kill there would stop it. Returns the paths it renamed into place
    before then, so a test can tell which files went through an atomic write."""
    import os

    import storage.fs

    real, renamed = storage.fs.durable_replace, []

    def replace(src: str, dst: str) -> None:
        if os.path.basename(dst) == name:
            raise Killed(dst)
        renamed.append(str(dst))
        real(src, dst)

    monkeypatch.setattr(storage.fs, "durable_replace", replace)
    return renamed


def without_ray(tmp_path: Path) -> dict:
    """The env of a machine where Ray is not installed (the GPU bench's, a laptop's): `import ray` fails, so a
    command that imports Ray anywhere fails. The additions to os.environ, for a child process."""
    shim = tmp_path / "noray" / "ray"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text("raise ImportError('no Ray on this machine')\n")
    root = Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": os.pathsep.join([str(shim.parent), str(root)])}
    probe = subprocess.run([sys.executable, "-c", "import ray"], env={**os.environ, **env}, capture_output=True)
    assert probe.returncode != 0 and b"no Ray on this machine" in probe.stderr  # the shim does hide Ray
    return env
