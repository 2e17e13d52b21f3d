"""The student objectives, registered by name: each is one file, and one `register` line at the foot of this one.

An objective is a subclass of `sentsim.students.common.Objective` in its own module, documented there with
its paper and its inputs, that says beside its loss everything the trainer needs of it:

    settings      its own config section (a `Section` whose defaults cite the paper), given as `NAME.key`
                  (`--set rankencoder.temperature=0.1`); None when it has no keys of its own
    needs_data    what it reads from --data HARVEST_DIR, for the error when --data is missing; None when
                  it can train without a harvest
    input_paths   the input files its settings name (`--out` must not overlap them)
    data_files    the keys of its settings naming a data file it reads, known to the run by its content
    check         cfg and backbone checks that must fail before any data is read
    prepare       on the driver: the training table, its counts and skips, and what the workers need
    build         on each worker: the objective around its encoder; `step(batch, device)` is its loss
    side_files    what the exported student keeps beside its weights (its inference rule's files)
    scorers       the scorers the STS evaluation adds to plain cosine (--eval-sts)

`sentsim.students.train` calls these and nothing else by name. A registration names the class by its import
path ("module:Class"), so that `sentsim --help` lists the objectives without importing torch; the class is
imported when an objective is first used. `StudentConfig` takes its `objective` choices and its sections
from the registry when `sentsim.students.config` is first imported: register an objective before that
(this file does so for the built-in ones; tests/students/toy_objective.py shows one registered from outside).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Registration", "describe", "names", "objective_class", "register", "registered", "seal"]


@dataclass(frozen=True)
class Registration:
    name: str      # `--objective NAME`, and the objective's config section `NAME.key`
    target: str    # "module:Class", imported when the objective is first used
    summary: str   # a few words for `--help`: its paper and what it learns from
    batch_size: int = 64  # the default `batch_size` of a student trained with it, from its paper


_REGISTRY: dict[str, Registration] = {}
_SEALED = False  # set once StudentConfig has been built from the registry


def register(name: str, target: str, summary: str, batch_size: int = 64) -> None:
    """Add an objective. Refused once `StudentConfig` exists (its choices and sections are fixed then)."""
    if not name.isidentifier():
        raise ValueError(f"student objective name {name!r}: use letters, digits and _ (it is a config section)")
    if name in _REGISTRY:
        raise ValueError(f"student objective {name!r} is registered already (as {_REGISTRY[name].target})")
    if ":" not in target:
        raise ValueError(f"student objective {name!r}: target {target!r} is not 'module:Class'")
    if _SEALED:
        raise RuntimeError(f"student objective {name!r} registered after sentsim.students.config was imported; "
                           "StudentConfig's choices and sections were built from the registry then: "
                           "register it first")
    if not (isinstance(batch_size, int) and batch_size >= 2):
        raise ValueError(f"student objective {name!r}: batch_size {batch_size!r} is not an integer of 2 or more")
    _REGISTRY[name] = Registration(name, target, summary, batch_size)


def names() -> tuple[str, ...]:
    """Registered names in registration order (the first is the default objective)."""
    return tuple(_REGISTRY)


def registered() -> tuple[Registration, ...]:
    return tuple(_REGISTRY.values())


def describe() -> str:
    """'rankencoder (004: rank-vector targets), rse (...), ...' for `--help`."""
    return ", ".join(f"{r.name} ({r.summary})" for r in _REGISTRY.values())


def objective_class(name: str):
    """The objective's class, imported on first use."""
    module, _, cls = _REGISTRY[name].target.partition(":")
    return getattr(importlib.import_module(module), cls)


def taking(setting: str) -> tuple[str, ...]:
    """The objectives whose settings section has `setting` (a flag such as --triples sets it for them)."""
    return tuple(n for n in _REGISTRY if setting in objective_class(n).settings.model_fields)


def takes(name: str, setting: str) -> bool:
    return name in taking(setting)


def seal() -> tuple[Registration, ...]:
    """What StudentConfig is built from; no registration is taken after this."""
    global _SEALED
    _SEALED = True
    return registered()


# ----------------------------------------------------------------------------- the built-in objectives
# A new objective: its module beside these, then one line here.

# batch_size: 004 follows SimCSE (64); 000 appendix D searches {128, 256, 512}, and contrastive learning wants the
# large end (000 §3.3 reaches 512 by Gradient Cache), here its smallest; 002 §4.2 picks from {32, 64, 96}.
register("rankencoder", "sentsim.students.rankencoder:RankEncoderObjective", "004: rank-vector targets",
         batch_size=64)
register("rse", "sentsim.students.rse:RSEObjective", "000: relational", batch_size=128)
register("paser", "sentsim.students.paser:PaSeRObjective", "002: phrase reconstruction", batch_size=64)
