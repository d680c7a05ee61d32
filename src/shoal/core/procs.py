"""Process liveness from pid + start time, so a reused pid never looks alive."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable

# psutil's create_time is a float derived from jiffies; allow for rounding between reads.
START_TIME_TOLERANCE_S = 0.05
# A start time read from /proc is ticks since boot plus the boot time in whole seconds
# (`btime`): it runs up to a second behind the wall clock that `since` values are taken from.
BOOT_TIME_SLACK_S = 1.0
# How long to wait for a SIGKILLed process to disappear.
KILL_WAIT_S = 2.0


@functools.cache
def _proc_clock() -> tuple[float, float] | None:
    """(boot time, clock ticks per second) from /proc, as psutil computes start times on
    Linux; None where there is no /proc (then psutil answers)."""
    try:
        with open("/proc/stat", "rb") as fh:
            for line in fh:
                if line.startswith(b"btime"):
                    return float(line.split()[1]), float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        pass
    return None


def _proc_stat(pid: int) -> tuple[bytes, float] | None:
    """(state letter, start time) of `pid` read from /proc/PID/stat, or None when it does not
    exist. A reader without psutil's import (27 ms of every CLI call that asks whether a leader
    runs); the start time is psutil's `create_time()` to the bit."""
    clock = _proc_clock()
    assert clock is not None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0], float(fields[19]) / clock[1] + clock[0]


def process_start_time(pid: int) -> float | None:
    """The start time (epoch seconds) of process `pid`, or None when it does not exist."""
    if pid > 0 and _proc_clock() is not None:
        stat = _proc_stat(pid)
        return None if stat is None else stat[1]
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def is_alive(pid: int | None, started_at: float | None) -> bool:
    """True when `pid` runs and, if `started_at` is known, it is the same process (not reused)."""
    if pid is None or pid <= 0:
        return False
    if _proc_clock() is not None:
        stat = _proc_stat(pid)
        if stat is None or stat[0] == b"Z":
            return False
        created = stat[1]
    else:
        import psutil

        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            created = proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return False
    return started_at is None or abs(created - started_at) <= START_TIME_TOLERANCE_S


def find_by_argument(needle: str, since: float) -> tuple[int, float] | None:
    """(pid, start time) of the oldest live process of this user started at `since` or later
    whose command line holds `needle` (a whole argument, or part of one: a shell's `-c`
    string), or None. How a leader finds a runner its predecessor spawned but died before
    recording: the job file's path is in the runner's command line and nowhere else."""
    want = os.fsencode(needle)

    def matches(pid: str) -> bool:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return want in fh.read()

    return _oldest(matches, since)


def find_by_stdout(path: str, since: float) -> tuple[int, float] | None:
    """As `find_by_argument`, for the process whose standard output is the file `path` (a
    runner or monitor spawned with its output file, or its log, as stdout)."""
    want = os.path.realpath(path)

    def matches(pid: str) -> bool:
        return os.readlink(f"/proc/{pid}/fd/1") == want

    return _oldest(matches, since)


def _oldest(matches: Callable[[str], bool], since: float) -> tuple[int, float] | None:
    """The oldest live process of this user started at `since` or later that `matches`."""
    uid = os.getuid()
    found: list[tuple[float, int]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid or not matches(entry.name):
                continue
        except OSError:
            continue
        pid = int(entry.name)
        started = process_start_time(pid)
        if started is None or started < since - BOOT_TIME_SLACK_S - START_TIME_TOLERANCE_S:
            continue
        if is_alive(pid, started):
            found.append((started, pid))
    if not found:
        return None
    started, pid = min(found)
    return pid, started


def lineage(pid: int | None = None) -> list[tuple[int, float]]:
    """(pid, start time) of process `pid` (default: this one) and of each of its ancestors,
    nearest first, up to (not including) pid 0: whose process tree a command runs in."""
    pid = os.getpid() if pid is None else pid
    out: list[tuple[int, float]] = []
    clock = _proc_clock()
    if clock is None:
        import psutil

        try:
            proc = psutil.Process(pid)
            chain = [proc, *proc.parents()]
            return [(p.pid, float(p.create_time())) for p in chain]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return out
    while pid > 0 and len(out) < 4096:  # (a cycle cannot happen; the cap is only a guard)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                raw = fh.read()
        except (FileNotFoundError, ProcessLookupError):
            break
        fields = raw[raw.rindex(b")") + 2 :].split()
        out.append((pid, float(fields[19]) / clock[1] + clock[0]))
        pid = int(fields[1])
    return out


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


class Termination:
    """A polite death as a state, so a caller that must not block can drive it.

    `begin()` sends SIGTERM (to the group) and records the deadline; each `advance(now)`
    sends SIGTERM once more to a group still there after GROUP_TERM_RESEND_S (a process forked
    while the first was delivered may have missed it), SIGKILL once the grace has run out, and
    returns True when the process is gone. `terminate()` is this in a loop, for callers that
    may wait.
    """

    def __init__(
        self, pid: int, started_at: float | None, *, grace: float, group: bool = False
    ) -> None:
        self.pid = pid
        self.started_at = started_at
        self.grace = grace
        self.group = group
        self.deadline = 0.0
        self.resend_at = 0.0
        self.killed = False
        self.signalled = False

    def begin(self, now: float | None = None) -> bool:
        """Send SIGTERM; returns False when the process was already gone (stragglers of a dead
        group leader get SIGKILL at once)."""
        now = time.monotonic() if now is None else now
        if not is_alive(self.pid, self.started_at):
            if self.group:
                _signal(self.pid, signal.SIGKILL, group=True)
            self.killed = True
            return False
        _signal(self.pid, signal.SIGTERM, self.group)
        self.signalled = True
        self.deadline = now + self.grace
        self.resend_at = now + GROUP_TERM_RESEND_S if self.group else self.deadline
        return True

    def advance(self, now: float | None = None, *, alive: bool | None = None) -> bool:
        """One step: True once the process is gone (`alive`: what the caller knows already)."""
        now = time.monotonic() if now is None else now
        if alive is None:
            alive = is_alive(self.pid, self.started_at)
        if not alive:
            if self.group and not self.killed:
                _signal(self.pid, signal.SIGKILL, group=True)  # children that ignored TERM
                self.killed = True
            return True
        if self.killed:
            return False  # SIGKILL is on its way
        if now >= self.deadline:
            _signal(self.pid, signal.SIGKILL, self.group)
            if self.group:
                _signal(self.pid, signal.SIGKILL, group=True)
            self.killed = True
        elif now >= self.resend_at:
            _signal(self.pid, signal.SIGTERM, self.group)
            self.resend_at = self.deadline
        return False

    def next_due(self) -> float:
        """When `advance` next has something to do (monotonic seconds)."""
        return min(self.resend_at, self.deadline) if not self.killed else time.monotonic()


def terminate(
    pid: int, started_at: float | None = None, *, grace: float = 5.0, group: bool = False
) -> bool:
    """Politely end a process (or its whole group): SIGTERM, up to `grace` s, then SIGKILL,
    waiting for it (see `Termination` for the same without waiting).

    Only acts when `pid` is still the process that started at `started_at`. Returns True when
    a signal was sent. Zombies count as gone (their parent reaps them).
    """
    ending = Termination(pid, started_at, grace=grace, group=group)
    if not ending.begin():
        return False
    delay = 0.005
    while not ending.advance():
        if ending.killed:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    # SIGKILL is delivered asynchronously: wait (briefly) until the process is really gone.
    deadline = time.monotonic() + KILL_WAIT_S
    while is_alive(pid, started_at) and time.monotonic() < deadline:
        time.sleep(0.005)
    if group:
        _signal(pid, signal.SIGKILL, group=True)
    return True
