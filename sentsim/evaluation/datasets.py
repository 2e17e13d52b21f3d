"""Loaders for the STS evaluation sets: STS12-16 (SentEval layout), STS-B and SICK-R.

Layouts (see ../shared/data/README.md):
- STS20xx-en-test/STS.input.<set>.txt   `s1<TAB>s2` per line (STS2016: `STS2016.input.<set>.txt`,
  4 columns of which the first two are the sentences); STS.gs.<set>.txt has one gold score per
  line, aligned; an empty gold line marks an unscored pair, which is skipped.
- stsbenchmark/sts-{train,dev,test}.csv  TAB-separated genre, file, year, id, score, s1, s2 (+2
  optional source columns). Split on TAB only: CSV quoting corrupts rows with stray quotes.
- SentEval's own layout is accepted too: STS/STS12-en-test/, STS/STSBenchmark/sts-test.csv.
- SICK/SICK_test_annotated.txt  pair_ID, sentence_A, sentence_B, relatedness, entailment. When the
  test split is absent, the train and trial files are evaluated instead and the task says so.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sentsim.errors import InputError, UsageError
from sentsim.pairs_file import decode_text, parse_score, split_lines, stsb_fields

# Folder names SentEval uses for the yearly sets; the README's layout.
YEAR_DIRS = {f"STS{y - 2000}": f"STS{y}-en-test" for y in range(2012, 2017)}
STSB_SPLITS = {"STSb-train": "sts-train.csv", "STSb-dev": "sts-dev.csv", "STSb": "sts-test.csv"}
TASK_NAMES = (*YEAR_DIRS, *STSB_SPLITS, "SICK-R")
# The standard unsupervised suite (paper section 4.1): STS12-16, STS-B test and SICK-R.
DEFAULT_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSb", "SICK-R")


@dataclass
class StsSet:
    """One file pair: sentences and gold scores, aligned."""

    name: str
    s1: list[str]
    s2: list[str]
    gold: np.ndarray
    skipped: int = 0  # pairs with an empty gold line

    def __len__(self) -> int:
        return len(self.gold)


@dataclass
class StsTask:
    """One row of the suite table: a year (several sets pooled), an STS-B split or SICK-R."""

    name: str
    sets: list[StsSet]
    files: list[Path] = field(default_factory=list)
    note: str = ""

    @property
    def n_pairs(self) -> int:
        return sum(len(s) for s in self.sets)

    def data_hash(self) -> str:
        """sha256 over the exact bytes read (names included), so a result pins its data."""
        from pyarrow.fs import LocalFileSystem

        from storage.fs import hash_into

        h, local = hashlib.sha256(), LocalFileSystem()
        for f in sorted(self.files, key=lambda p: p.name):
            h.update(f.name.encode())
            hash_into(h, local, str(f.resolve()))
        return h.hexdigest()[:16]


def _read_lines(path: Path) -> list[str]:
    """The file's lines; a file that is not UTF-8 is refused, naming the line (never guessed as latin-1)."""
    return split_lines(decode_text(path))


def load_senteval_pair(input_path: Path, gold_path: Path) -> StsSet:
    """One `*.input.<set>.txt` / `*.gs.<set>.txt` pair; empty gold lines are skipped."""
    inputs = _read_lines(input_path)
    golds = _read_lines(gold_path)
    if len(inputs) != len(golds):
        raise InputError(
            f"{input_path}: {len(inputs)} lines, but its gold file {gold_path.name} has {len(golds)}; "
            "input and gold must be aligned line by line"
        )
    s1, s2, gold, skipped = [], [], [], 0
    for i, (line, g) in enumerate(zip(inputs, golds), start=1):
        if g.strip() == "":
            skipped += 1
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise InputError(f"{input_path}:{i}: expected sentence1<TAB>sentence2, found {len(cols)} column")
        s1.append(cols[0].strip())
        s2.append(cols[1].strip())
        gold.append(parse_score(g.strip(), f"{gold_path}:{i}"))
    name = re.sub(r"^STS(20\d\d)?\.input\.", "", input_path.name)[: -len(".txt")]
    return StsSet(name, s1, s2, np.asarray(gold, dtype=np.float64), skipped)


def load_senteval_year(folder: Path, task: str) -> StsTask:
    inputs = sorted(p for p in folder.glob("STS*.input.*.txt"))
    if not inputs:
        raise InputError(f"{folder}: no STS*.input.*.txt files (SentEval layout expected)")
    sets, files = [], []
    for inp in inputs:
        gs = inp.with_name(inp.name.replace(".input.", ".gs.", 1))
        if not gs.is_file():
            raise InputError(f"{inp}: its gold file {gs.name} is missing")
        sets.append(load_senteval_pair(inp, gs))
        files += [inp, gs]
    skipped = sum(s.skipped for s in sets)
    if not sum(len(s) for s in sets):
        raise InputError(f"{folder}: no pair with a gold score ({skipped} with an empty gold line); "
                         "nothing to evaluate")
    note = f"{len(sets)} sets pooled ('all')" + (f"; {skipped} unscored pairs skipped" if skipped else "")
    return StsTask(task, sets, files, note)


def load_stsb(path: Path, task: str) -> StsTask:
    s1, s2, gold = [], [], []
    for i, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        a, b, g = stsb_fields(line.split("\t"), f"{path}:{i}")
        s1.append(a)
        s2.append(b)
        gold.append(g)
    if not gold:
        raise InputError(f"{path}: no pairs")
    return StsTask(task, [StsSet(path.stem, s1, s2, np.asarray(gold))], [path])


def load_sick_file(path: Path) -> StsSet:
    s1, s2, gold = [], [], []
    for i, line in enumerate(_read_lines(path), start=1):
        cols = line.split("\t")
        if i == 1 and cols[0] == "pair_ID":  # the original release has a header line
            continue
        if not line.strip():
            continue
        if len(cols) < 4:
            raise InputError(f"{path}:{i}: expected pair_ID, sentence_A, sentence_B, relatedness_score")
        s1.append(cols[1].strip())
        s2.append(cols[2].strip())
        gold.append(parse_score(cols[3], f"{path}:{i}"))
    if not gold:
        raise InputError(f"{path}: no pairs (an empty or header-only SICK file)")
    return StsSet(path.stem, s1, s2, np.asarray(gold))


def load_sick(folder: Path) -> StsTask:
    test = folder / "SICK_test_annotated.txt"
    if test.is_file():
        return StsTask("SICK-R", [load_sick_file(test)], [test], "test split (4,927 pairs in the release)")
    found = [folder / n for n in ("SICK_train.txt", "SICK_trial.txt") if (folder / n).is_file()]
    if not found:
        raise InputError(f"{folder}: neither SICK_test_annotated.txt nor SICK_train/trial.txt found")
    sets = [load_sick_file(p) for p in found]
    task = StsTask("SICK-R", sets, found)
    task.note = (
        f"SICK_test_annotated.txt not found; evaluated {' + '.join(p.name for p in found)} "
        f"({task.n_pairs} pairs) instead, not comparable with published SICK-R"
    )
    return task


def locate_task(root: Path, task: str) -> Path | None:
    """Where `task` lives under root; root may also be the task's own folder or file."""
    # SentEval ships data/downstream/STS/STS12-en-test and STS/STSBenchmark: both layouts are accepted
    if task in YEAR_DIRS:
        short = YEAR_DIRS[task].replace("20", "", 1)  # SentEval's STS12-en-test
        for cand in (root / YEAR_DIRS[task], root / short, root / "STS" / YEAR_DIRS[task], root / "STS" / short):
            if cand.is_dir():
                return cand
        if root.name in (YEAR_DIRS[task], short):
            return root
        return None
    if task in STSB_SPLITS:
        for folder in ("stsbenchmark", "STSBenchmark", "STS/STSBenchmark", "."):
            cand = root / folder / STSB_SPLITS[task]
            if cand.is_file():
                return cand
        return None
    for cand in (root / "SICK", root):
        if any((cand / n).is_file() for n in ("SICK_test_annotated.txt", "SICK_train.txt", "SICK_trial.txt")):
            return cand
    return None


def load_task(root: Path, task: str) -> StsTask:
    where = locate_task(Path(root), task)
    if where is None:
        raise UsageError(f"{task}: not found under {root}")
    if task in YEAR_DIRS:
        return load_senteval_year(where, task)
    if task in STSB_SPLITS:
        return load_stsb(where, task)
    return load_sick(where)


def discover_tasks(root: str | Path, tasks: list[str] | None = None) -> tuple[list[StsTask], list[str]]:
    """Load the requested tasks (default: the standard suite) found under root.

    Returns (loaded tasks, names of default tasks that are absent). Explicitly requested tasks
    that are absent are an error; absent default ones are only reported.
    """
    root = Path(root)
    if not root.exists():
        raise UsageError(f"--data {root}: no such directory")
    if tasks:
        unknown = [t for t in tasks if t not in TASK_NAMES]
        if unknown:
            raise UsageError(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASK_NAMES)}")
        return [load_task(root, t) for t in tasks], []
    loaded, missing = [], []
    for t in DEFAULT_TASKS:
        if locate_task(root, t) is None:
            missing.append(t)
        else:
            loaded.append(load_task(root, t))
    if not loaded:
        raise UsageError(
            f"--data {root}: no STS data found (expected STS20xx-en-test/, stsbenchmark/ or SICK/ folders, "
            "or SentEval's STS/ folder)"
        )
    return loaded, missing
