"""Timestamps: ISO-8601 UTC strings on disk, epoch floats for arithmetic."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


# The last second's "YYYY-MM-DDTHH:MM:SS" (every message carries a timestamp: a datetime and
# its isoformat per message cost more than the second's digits made once).
_second: tuple[int, str] = (-1, "")


def iso_now() -> str:
    """The current time as ISO-8601 UTC with microseconds, e.g. 2026-01-01T00:00:00.000001Z."""
    global _second
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    last, prefix = _second
    if seconds != last:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _second = (seconds, prefix)
    return f"{prefix}.{micros:06d}Z"
