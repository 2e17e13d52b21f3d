"""`EncoderDriver`: the steps every trainer of a transformer encoder takes on the driver, in order.

0. refuse an executor that is neither "ray" nor "inline", and take the run's worker count (`workers`: the
   config's num_workers on Ray, 1 inline), which the trainer's step and epoch planning use;
1. refuse an --out that would overwrite an input (`check_out`), then make every path absolute;
2. the trainer's checks of its inputs that need no backbone (`check_inputs`);
3. the backbone's config and tokenizer (`check_backbone`), so a bad one fails before any worker starts;
4. the trainer's checks and data that need it (`prepare`);
5. the run's fingerprint: the config less RESUMABLE_KEYS (its sections' too), then what the trainer adds
   (`identity`); a run whose record holds the fingerprint this same run had in an earlier run-record format
   (`fingerprint_in_format`) goes on under that one;
6. on Ray with an address, the cluster reached (`attach_before_writing`), so that one that cannot be reached
   leaves --out as it was; then the --out's lease (`claim_out`, with the trainer's `record`), held to the run's
   end; the record is written to OUT/run.json when the run goes ahead (its first fit that trains, or its end),
   so a refused run leaves the earlier one's, and --force-new discards the earlier run's state, models and
   reports only then, so a refused --force-new run leaves the earlier run whole too;
7. an export a kill left between its renames is finished (`finish_swap` of each of `models`);
8. quiet progress bars, and Ray unless the run is inline (an inline run neither imports nor starts Ray);
9. the trainer's fits, exports and curves (`train`, using `fit` and `write_curves`);
10. the summary, first its fingerprint, written to OUT/summary.json.

The surrogate (sentsim.surrogate.train) and the students (sentsim.students.train) subclass it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from sentsim.errors import UsageError
from sentsim.identity import fingerprint
from sentsim.training.config import TRAINING_FORMAT, resumable_paths, without_resumable
from sentsim.training.run import EXECUTORS, claim_out, discard_exports, quiet_progress, write_curves


class EncoderDriver:
    """One training run of an encoder; subclasses supply the steps marked as theirs."""

    # what OUT is (a key of sentsim.out_paths.KINDS): an OUT holding something else is refused
    kind: str = ""
    # folders under OUT that an export swaps in whole
    models: tuple[str, ...] = ("model",)
    # the curves' panels: (y label, [(history key, legend)], log scale), as `write_curves` takes them
    panels: list = []

    def __init__(self, cfg, *, inputs: dict, out: str, address: Optional[str] = None, executor: str = "ray",
                 force_new: bool = False, verbose: bool = True):
        """`inputs`: flag -> path of each input (None when not given); read back, made absolute, as
        self.inputs[flag]. `executor`: "ray", or "inline" (this process, no Ray). The executor is not part
        of the run's identity, and neither reads the other's state (OUT/ray/ or OUT/checkpoint/): a stage
        finished on one is finished on the other (the same settings and budget), and any other run of it on
        the other executor is refused in one line (sentsim.training.run.check_state)."""
        self.cfg, self.inputs, self.out_arg = cfg, dict(inputs), out
        self.address, self.executor, self.force_new, self.verbose = address, executor, force_new, verbose
        # DDP workers on Ray; inline, this process is the one worker, whatever num_workers says
        self.workers = cfg.num_workers if executor == "ray" else 1

    # ------------------------------------------------------------------------------------------ the trainer's

    def guarded(self) -> dict:
        """flag -> path of inputs --out may not overwrite beyond `inputs` (left as given)."""
        return {}

    def check_inputs(self) -> None:
        """Checks that need no backbone (raise UsageError)."""

    def prepare(self, bb: dict) -> None:
        """Checks and data that need the backbone (`bb`: check_backbone's record)."""

    def identity(self, what: dict) -> tuple:
        """The fingerprint's parts, `what` (the config less RESUMABLE_KEYS) among them."""
        raise NotImplementedError

    def fingerprint_in_format(self, version: int, stored: dict) -> Optional[tuple[str, dict]]:
        """The fingerprint this same run held in run-record format `version` (older than TRAINING_FORMAT),
        given its stored record (OUT/run.json), and what it was made of beyond today's settings (claim_out
        keeps that in the record); None where it held today's (sentsim/run_formats.py)."""
        return None

    def unfingerprinted(self, version: int = TRAINING_FORMAT) -> tuple:
        """Flattened keys of `record` outside the fingerprint of run-record format `version` (the stored record's,
        for a refusal of it): a refusal does not name their changes."""
        return tuple(f"config.{k}" for k in resumable_paths(self.cfg.model_dump()))

    def record(self) -> dict:
        """What OUT/run.json records besides the fingerprint."""
        raise NotImplementedError

    def train(self) -> dict:
        """Fit, export, write the curves; the summary's entries after its fingerprint."""
        raise NotImplementedError

    def finish(self, summary: dict) -> None:
        """Anything the summary adds after training (e.g. an evaluation)."""

    # ------------------------------------------------------------------------------------------ the skeleton

    def run(self) -> dict:
        from sentsim.out_paths import check_out
        from sentsim.runtime import absolute_local
        from sentsim.training.encoders import check_backbone

        if self.executor not in EXECUTORS:
            raise UsageError(f"unknown executor {self.executor!r} (ray or inline)")
        check_out(self.out_arg, {**self.inputs, **self.guarded()}, local="a model and its training state",
                  writes=self.kind)
        self.inputs = {k: absolute_local(v) for k, v in self.inputs.items()}
        self.out = Path(absolute_local(self.out_arg))
        self.check_inputs()
        self.bb = check_backbone(self.inputs["--backbone"], self.cfg.init)
        self.prepare(self.bb)
        self.run_id = fingerprint(*self.identity(without_resumable(self.cfg.model_dump())))
        if self.executor == "ray":  # a cluster that turns this driver away is refused before --out is written
            from sentsim.runtime import attach_before_writing

            attach_before_writing(self.address)
        # --force-new: the discarded run's exports go with its state when this run goes ahead, not stay beside its own
        with claim_out(self.out, self.run_id, self.record(), self.force_new, self.out_arg,
                       unfingerprinted=self.unfingerprinted, earlier=self.fingerprint_in_format,
                       discard=lambda: discard_exports(self.out, self.models)) as claim:
            self.run_id, self.record_format = claim.fingerprint, claim.format
            return self._train_claimed()

    def _train_claimed(self) -> dict:
        """run()'s part under the --out lease: exports, training, the summary."""
        from sentsim.model_swap import finish_swap

        for name in self.models:
            finish_swap(self.out / name)
        quiet_progress()
        self.t0 = time.perf_counter()
        if self.executor == "ray":
            from sentsim.runtime import init_ray

            init_ray(self.address)
        summary = {"fingerprint": self.run_id, **self.train()}
        self.finish(summary)
        from storage.fs import write_text_atomic

        # whole or not at all: a kill while writing leaves the last run's summary, never half a new one
        write_text_atomic(str(self.out / "summary.json"), json.dumps(summary, indent=2))
        return summary

    def curves(self, history: list[dict], name: str, title: str) -> None:
        write_curves(history, self.out / "curves", name, title, self.panels)
