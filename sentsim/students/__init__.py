"""Student encoders trained from harvested shards: RankEncoder (004), RSE (000), PaSeR (002).

    from sentsim.students import StudentConfig, train_student
    train_student(StudentConfig(objective="rankencoder"), data="harvest/", backbone=MINILM, out="student/")

One objective per module (rankencoder.py, rse.py, paser.py), each a Trainee of the training loop,
Ray Train set-up and checkpointing the surrogate uses too (sentsim.training); train.py checks the
data, builds the objectives and exports the student; inference scorers for the STS evaluator are
`RankEncoderScorer` and `RelationalScorer`.
"""

from sentsim.students.config import StudentConfig
from sentsim.students.train import TrainingDiverged, train_student

__all__ = ["StudentConfig", "TrainingDiverged", "train_student"]
