"""A toy student objective, registered from outside the package: everything a new objective needs is in
this one file, and the `register` line at its foot (a built-in one puts that line in
sentsim/students/objectives.py instead). tests/students/test_student_objectives.py imports it ahead of the `sentsim`
command and trains it through the trainer.

Loss: toy.weight * the mean squared distance between the two dropout views of each sentence (a SimCSE
positive without negatives; it teaches nothing useful, and needs no paper).
Inputs: the harvest's distinct, non-empty sentences (`sentences` shards).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from pydantic import Field

from sentsim.config import Section
from sentsim.students.common import Harvest, Objective, Prepared, column
from sentsim.students.objectives import register

TOY_FILE = "toy.json"


class ToyConfig(Section):
    weight: float = Field(1.0, gt=0)  # the loss's only knob


class ToyObjective(Objective):
    settings = ToyConfig
    needs_data = "its sentences"
    side_files = (TOY_FILE,)

    @classmethod
    def prepare(cls, cfg, harvest: Harvest) -> Prepared:
        from sentsim.students.data import read_table

        rows = read_table(harvest.root, "sentences", ["text"])["text"].to_pylist()
        texts = [t for t in dict.fromkeys(rows) if t and t.strip()]
        return Prepared(pa.table({"text": texts}), counts={"sentences": len(texts)},
                        skips={"repeated or empty": len(rows) - len(texts)})

    def step(self, batch: dict, device):
        texts = [str(t) for t in column(batch, "text")]
        v = self.embed(texts + texts, device)  # one pass, two dropout views
        gap = (v[:len(texts)] - v[len(texts):]).pow(2).sum(-1).mean()
        return self.cfg.toy.weight * gap, {"l_views": float(gap.detach())}

    def save_extras(self, folder: Path) -> None:
        (folder / TOY_FILE).write_text(json.dumps({"weight": self.cfg.toy.weight}))


register("toy", "toy_objective:ToyObjective", "a test's toy: two dropout views pulled together")
