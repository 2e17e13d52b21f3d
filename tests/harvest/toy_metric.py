"""A toy Eq. 4 metric, all in this one file: what a new metric needs (tests/harvest/test_eq4_metrics.py uses it).

`toy-l1` is minus the mean absolute difference of the two score vectors: 0 for equal vectors,
more negative the more the sentences' scores differ. Not a metric to harvest with.
"""

from typing import Optional

import numpy as np

from sentsim.harvest.metrics import Metric, register

NAME = "toy-l1"


def toy_l1(a: np.ndarray, b: np.ndarray, effect: Optional[np.ndarray] = None) -> float:
    return -float(np.mean(np.abs(a - b)))


METRIC = Metric(NAME, toy_l1)
register(METRIC)  # the registration line (a built-in metric's is in sentsim/harvest/metrics/__init__.py)
