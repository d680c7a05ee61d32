"""Process liveness from pid + start time, so a reused pid never looks alive."""

from __future__ import annotations

import os

import psutil

# psutil's create_time is a float derived from jiffies; allow for rounding between reads.
START_TIME_TOLERANCE_S = 0.05


def process_start_time(pid: int) -> float | None:
    """The start time (epoch seconds) of process `pid`, or None when it does not exist."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def is_alive(pid: int | None, started_at: float | None) -> bool:
    """True when `pid` runs and, if `started_at` is known, it is the same process (not reused)."""
    if pid is None or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False
    return started_at is None or abs(created - started_at) <= START_TIME_TOLERANCE_S


def current_identity() -> tuple[int, float]:
    """This process's (pid, start time)."""
    pid = os.getpid()
    started = process_start_time(pid)
    assert started is not None  # our own process always exists
    return pid, started
