"""Start a team's leader in the background (`shoal up --detach`) and wait until it is ready:
a process of its own, in a session of its own, writing to a log file under SHOAL_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shoal.core.errors import ConflictError, ShoalError
from shoal.core.events import LeaderStarted, Note
from shoal.core.paths import FILE_MODE, Layout
from shoal.core.procs import terminate
from shoal.orchestrator.liveness import leader_alive, leader_ready

READY_TIMEOUT = 60.0  # seconds a starting leader may take (resuming a big session, say)
NOTES_TIMEOUT = 5.0  # seconds to look for its start notes once it is ready
_POLL = 0.02
ERROR_PREFIX = "shoal: error: "  # how the CLI words an error (cli/main.py)


@dataclass(frozen=True)
class DetachedLeader:
    """A leader started in the background, once it is ready: its pid, its log, its session, and
    what it noted while starting (a corrupt state set aside, adopted tasks)."""

    team: str
    pid: int
    log_path: Path
    session_id: str | None
    notes: tuple[str, ...]


class LeaderStartError(ShoalError):
    """The detached leader died while starting, or was not ready in time; `log_path` is where
    it wrote why, and `returncode` its exit code when it died."""

    def __init__(self, message: str, *, log_path: Path, returncode: int | None = None) -> None:
        self.log_path = log_path
        self.returncode = returncode
        super().__init__(message)


def leader_log_path(layout: Layout, team: str) -> Path:
    """The log file a detached leader of `team` writes to (its directory made if need be)."""
    return layout.ensure(layout.home / "logs") / f"leader-{team}.log"


def leader_argv(layout: Layout, team: str, *, jobs: int = 0, quiet: bool = False) -> list[str]:
    """The command line of a foreground leader for `team`, as the detached process runs it."""
    return [
        sys.executable,
        "-m",
        "shoal",
        "--home",
        str(layout.home),
        "up",
        "--team",
        team,
        "--jobs",
        str(jobs),
        # (its log gets a line per task event unless asked to be quiet)
        *(["--quiet"] if quiet else []),
    ]


def start_detached(
    layout: Layout,
    team: str,
    *,
    jobs: int = 0,
    quiet: bool = False,
    timeout: float = READY_TIMEOUT,
    notes_timeout: float = NOTES_TIMEOUT,
) -> DetachedLeader:
    """Start `team`'s leader in the background and return once it is ready.

    Refused (ConflictError) while a leader runs. LeaderStartError when it exits while starting
    (with the tail of its log) or is not ready within `timeout` s (it is then stopped).
    """
    running = leader_alive(layout, team)
    if running is not None:
        raise ConflictError(f"a leader already runs for team {team!r} (pid {running[0]})")
    log_path = leader_log_path(layout, team)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
    launched = time.time()  # (a note written before this is an earlier leader's)
    with os.fdopen(log_fd, "ab") as log:
        proc = subprocess.Popen(
            leader_argv(layout, team, jobs=jobs, quiet=quiet),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # it outlives this process and its terminal
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if leader_ready(layout, team) == proc.pid:
            session_id, notes = _start_notes(layout, team, proc.pid, launched, notes_timeout)
            return DetachedLeader(team, proc.pid, log_path, session_id, notes)
        if proc.poll() is not None:
            raise LeaderStartError(
                f"the leader exited at start (code {proc.returncode}): {_start_failure(log_path)}",
                log_path=log_path,
                returncode=proc.returncode,
            )
        time.sleep(_POLL)
    terminate(proc.pid)
    proc.poll()  # (reap it: it is this process's child)
    raise LeaderStartError(
        f"the leader did not become ready within {timeout:g}s; see {log_path}", log_path=log_path
    )


def _start_failure(log_path: Path) -> str:
    """Why a leader exited at start, from its log: its own `shoal: error:` line when it ends
    with one (the log is appended to, so earlier lines may be an earlier leader's), else the
    last lines."""
    lines = log_path.read_text(errors="replace").strip().splitlines()
    if lines and lines[-1].startswith(ERROR_PREFIX):
        return lines[-1].removeprefix(ERROR_PREFIX)
    return " | ".join(lines[-5:])


def _start_notes(
    layout: Layout, team: str, pid: int, launched: float, timeout: float
) -> tuple[str | None, tuple[str, ...]]:
    """The session of the leader `pid` and the notes it wrote to the session's events before
    its `leader_started` (otherwise only in its log). Notes written before it was `launched`
    are an earlier leader's, said while that one ran (a dream settled under it): the start
    of the next leader is no news of them. Best effort: ((id or None), ()) when they cannot
    be read, or do not show up within `timeout` s."""
    from shoal.teams.session import current_session

    session_id: str | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            session = current_session(layout, team)
        except ShoalError:
            return session_id, ()  # (a courtesy only: the log has them)
        if session is None:
            return session_id, ()
        session_id = session.id
        notes: list[str] = []
        for event in session.typed_events():
            if isinstance(event, Note):
                if event.ts is None or event.ts >= launched:
                    notes.append(event.text)
            elif isinstance(event, LeaderStarted):
                if event.pid == pid:
                    return session_id, tuple(notes)
                notes = []  # an earlier leader's
        time.sleep(_POLL)
    return session_id, ()
