"""What every record of a run shares (its manifest, unit markers, side-table and compaction records):
the error a run that cannot be used as asked raises, the checksum a record carries of itself, and
the time it was written.

The bottom of the store: `store`, `compaction`, `reader` and `compact` all take these from here, so
none of them imports another just for them (and no two import each other).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json

from sentsim.errors import UsageError


class StoreError(UsageError):
    """A store that cannot be used as asked: another run's fingerprint, a missing manifest, ..."""


def record_check(record: dict) -> str:
    """A checksum of a JSON record (less its own `check`): an edited or bit-flipped marker or compaction
    record that still parses is caught, not trusted."""
    body = json.dumps({k: v for k, v in record.items() if k != "check"}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def timestamp() -> str:
    """Now, in UTC, as every record writes it (ISO 8601, whole seconds)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
