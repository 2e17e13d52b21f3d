"""The harvest: pair similarities from contexts (Eq. 4) and rank-vector targets, into shards."""
