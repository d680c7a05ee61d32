"""Process liveness from pid + start time, so a reused pid never looks alive."""

from __future__ import annotations

import os
import signal
import time

import psutil

# psutil's create_time is a float derived from jiffies; allow for rounding between reads.
START_TIME_TOLERANCE_S = 0.05
# How long to wait for a SIGKILLed process to disappear.
KILL_WAIT_S = 2.0


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


def _signal(pid: int, sig: int, group: bool) -> bool:
    """Send `sig`; False when the process (group) no longer exists (ESRCH is success)."""
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


# A group is sent SIGTERM a second time when it has not ended after this long.
GROUP_TERM_RESEND_S = 0.2


def terminate(
    pid: int, started_at: float | None = None, *, grace: float = 5.0, group: bool = False
) -> bool:
    """Politely end a process (or its whole group): SIGTERM, up to `grace` s, then SIGKILL.

    Only acts when `pid` is still the process that started at `started_at`. Returns True when
    a signal was sent. Zombies count as gone (their parent reaps them).
    """
    if not is_alive(pid, started_at):
        if group:
            _signal(pid, signal.SIGKILL, group=True)  # stragglers of a dead leader
        return False
    _signal(pid, signal.SIGTERM, group)
    start = time.monotonic()
    deadline = start + grace
    resend_at = start + GROUP_TERM_RESEND_S if group else deadline
    delay = 0.005
    while time.monotonic() < deadline:
        if not is_alive(pid, started_at):
            break
        if time.monotonic() >= resend_at:
            # A process the group forked while the first SIGTERM was being delivered (or that
            # had not reset its handlers yet) may have missed it: once more, for the group.
            _signal(pid, signal.SIGTERM, group)
            resend_at = deadline
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    else:
        _signal(pid, signal.SIGKILL, group)
    if group:
        _signal(pid, signal.SIGKILL, group=True)  # children that ignored SIGTERM
    # SIGKILL is delivered asynchronously: wait (briefly) until the process is really gone.
    deadline = time.monotonic() + KILL_WAIT_S
    while is_alive(pid, started_at) and time.monotonic() < deadline:
        time.sleep(0.005)
    return True
