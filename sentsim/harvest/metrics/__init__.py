"""Eq. 4's similarity of two score vectors: one metric per file, registered by name (registry.py).

A new metric is one file here that defines `compare(a, b, effect)` (registry.py says what it is
given) and `METRIC = Metric("its-name", compare)`, plus its import and its `register` line below.
Its name is then accepted by `metric:` of a harvest config and, unless it reads the context effect,
by `sentsim remix --metric`. The name is part of a harvest's fingerprint: renaming a metric changes
the fingerprint of every run that used it.
"""

from sentsim.harvest.metrics import cosine, double_centred, pearson, spearman
from sentsim.harvest.metrics.registry import Metric, OneOf, get, names, register, remixable, unregister

# the order here is the order configs, errors and `--metric` list them
register(cosine.METRIC)
register(pearson.METRIC)
register(spearman.METRIC)
register(double_centred.METRIC)

DEFAULT = pearson.METRIC.name  # the harvest's (README, "Why the harvest's default metric is not the paper's ...")
DOUBLE_CENTRED = double_centred.METRIC.name  # grouping.py's `centred` variant

__all__ = ["DEFAULT", "DOUBLE_CENTRED", "Metric", "OneOf", "get", "names", "register", "remixable", "unregister"]
