"""Timestamps: ISO-8601 UTC strings on disk, epoch floats for arithmetic."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def iso_now() -> str:
    """The current time as ISO-8601 UTC with microseconds, e.g. 2026-01-01T00:00:00.000001Z."""
    return utc_now().isoformat(timespec="microseconds").replace("+00:00", "Z")
