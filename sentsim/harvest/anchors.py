"""The harvest run's `rank_anchors` side table: the anchor sentences behind every rank vector (004 §3.2),
written once per run by the harvest (job.run_anchors) and read back by the rank stage and by the
students, so that both rank over the very anchors the harvest used.

With rank.storage=vectors the table also holds each anchor's E1 vector (float16): the anchor matrix
from which ranks are computed where used.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from sentsim.errors import UsageError

ANCHORS_TABLE = "rank_anchors"  # side table: the anchor sentences behind every rank vector


def stored_anchor_vectors(store, fp: Optional[str], where: Optional[str] = None) -> np.ndarray:
    """The run's anchor matrix [n_anchors, dim] (float16) from its `rank_anchors` side table (`store`: the
    run's storage.ShardStore); a run without one (missing, from another run, or written without vectors)
    is one UsageError line."""
    from sentsim.rank.targets import anchor_matrix

    where = where or store.uri
    table = store.read_side_table(ANCHORS_TABLE, fingerprint=fp)
    if table is None:
        raise UsageError(f"{where}: rank.storage=vectors but _side/{ANCHORS_TABLE}.parquet is missing or from another "
                         "run, so the anchor matrix behind its base vectors is unknown; re-run the harvest "
                         "(--force-new) or restore that side table")
    return anchor_matrix(table, f"{where}/_side/{ANCHORS_TABLE}.parquet")
