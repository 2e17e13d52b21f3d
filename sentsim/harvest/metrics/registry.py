"""The Eq. 4 metrics by name, and the config type that accepts exactly the registered names.

A metric is a `Metric`: its name (what configs, fingerprints and `--metric` spell), and `compare`, the
similarity of two score vectors over the same contexts. `compare` sees only entries finite in both
vectors (and in the context effect, when there is one), at least MIN_POINTS (3) distinct points:
`sentsim.harvest.similarity.pair_similarity` drops the rest and returns NaN below that, so a metric
deals with the arithmetic alone. A metric that reads the context effect (the mean score of a
shared set of reference sentences in each context) says so, since a harvest keeps no reference
scores and `sentsim remix` therefore cannot offer it.

The names are checked when a config is validated, not when its schema is built, so a metric
registered after `sentsim.harvest.config` was imported (a test's, a plug-in's) is accepted too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

if TYPE_CHECKING:  # numpy is not imported to list the names: `sentsim --help` builds --metric's choices
    import numpy as np

# compare(a, b, effect): a and b finite and aligned; effect the context effect over the same
# entries, or None when the caller has none
Compare = Callable[["np.ndarray", "np.ndarray", Optional["np.ndarray"]], float]


@dataclass(frozen=True)
class Metric:
    name: str
    compare: Compare
    # reads the context effect: a harvest computes it from `reference_sentences`; remix cannot
    uses_context_effect: bool = False


_REGISTRY: Dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Make `metric` selectable by its name (in `metric:` of a harvest and `--metric` of remix)."""
    if metric.name in _REGISTRY and _REGISTRY[metric.name] is not metric:
        raise ValueError(f"an Eq. 4 metric named {metric.name!r} is already registered")
    _REGISTRY[metric.name] = metric
    return metric


def unregister(name: str) -> None:
    """Withdraw a metric (a test's toy, once it is done with it); unknown names are ignored."""
    _REGISTRY.pop(name, None)


def names() -> Tuple[str, ...]:
    """Every registered metric's name, in registration order."""
    return tuple(_REGISTRY)


def remixable() -> Tuple[str, ...]:
    """The metrics `sentsim remix` can recompute from a harvest's stored terms."""
    return tuple(n for n, m in _REGISTRY.items() if not m.uses_context_effect)


def get(name: str) -> Metric:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(_REGISTRY)}") from None


def spelt(choices: Tuple[str, ...]) -> str:
    """'a', 'b' or 'c', as pydantic lists a Literal's values."""
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


class OneOf:
    """Pydantic metadata for a string that must be one of `choices()` at validation time (a
    registry's names). The refusal reads as a Literal's: "Input should be 'a', 'b' or 'c'".
    `choices` is also what docs/configuration.md lists for the field (sentsim/docs_config.py)."""

    def __init__(self, choices: Callable[[], Tuple[str, ...]]):
        self.choices = choices

    def __get_pydantic_core_schema__(self, source, handler):
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: str) -> str:
        allowed = self.choices()
        if value not in allowed:
            from pydantic_core import PydanticCustomError

            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": spelt(allowed)})
        return value

    def __repr__(self) -> str:
        return f"OneOf({self.choices.__name__})"
