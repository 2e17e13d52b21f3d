"""Student encoders trained from harvested shards: RankEncoder (004), RSE (000), PaSeR (002).

    from sentsim.bundled_model import default_base_encoder   # the bundled all-MiniLM-L6-v2
    from sentsim.students import StudentConfig, train_student
    train_student(StudentConfig(objective="rankencoder"), data="harvest/", backbone=default_base_encoder(),
                  out="student/")

One objective per module (rankencoder.py, rse.py, paser.py), each registered by name in objectives.py
and a Trainee of the training loop, Ray Train set-up and checkpointing the surrogate uses too
(sentsim.training); train.py checks the data, builds the objective and exports the student; inference
scorers for the STS evaluator are `RankEncoderScorer` and `RelationalScorer`.

The names below are imported on first use: `sentsim --help` reads the registry's objective names
(sentsim.students.objectives) without importing the objectives themselves, and torch with them.
"""

from importlib import import_module

__all__ = ["StudentConfig", "TrainingDiverged", "train_student"]

_HOME = {"StudentConfig": "sentsim.students.config", "TrainingDiverged": "sentsim.students.train",
         "train_student": "sentsim.students.train"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(import_module(_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
