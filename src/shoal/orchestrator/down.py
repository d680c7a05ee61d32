"""Stopping a team's leader and whatever it owns, including what a crashed leader left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

from shoal.channel.client import call
from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive, terminate
from shoal.core.tasks import InProcessTeammateTaskState, LocalShellTaskState, TaskStatus
from shoal.core.taskupdates import transition
from shoal.orchestrator.liveness import leader_alive
from shoal.teams.models import TeamFile
from shoal.teams.session import Session, current_session
from shoal.teams.store import Teams
from shoal.workers.shell import process as shell
from shoal.workers.teammate.commands import kill_left_commands

ORPHAN_KILL_GRACE_S = 2.0


@dataclass
class DownReport:
    """What `bring_down` did."""

    team: str
    leader_pid: int | None = None
    killed_orphans: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def bring_down(layout: Layout, team: str, *, timeout: float = 30.0) -> DownReport:
    """Ask the leader to stop (killing it after `timeout`), then kill leftover task processes.

    The leader is found through the team file, or, when that file is unreadable or gone,
    through its session's own record (pid + start time): a corrupt team file never strands
    a leader and its tasks."""
    report = DownReport(team)
    found = find_leader(layout, team, report)
    if found.alive is not None:
        pid, started = found.alive
        report.leader_pid = pid
        asked = False
        if found.team_file is not None:
            with contextlib.suppress(ShoalError):
                call(layout, team, "down", timeout=min(timeout, 10.0))
                asked = True
        if not asked:
            # No control channel to reach it through: SIGTERM is the leader's normal stop.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if is_alive(pid, started):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while is_alive(pid, started) and time.monotonic() < deadline:
            time.sleep(0.02)
        if is_alive(pid, started):
            terminate(pid, started)
            report.warnings.append(f"the leader (pid {pid}) did not stop in {timeout:g}s; killed")
    report.killed_orphans = kill_orphans(layout, team, report, found)
    # Then what dead teammates left running: their commands' process groups, as their status
    # files list them (`w1:pgid 1234` each).
    with contextlib.suppress(ShoalError):
        report.killed_orphans += kill_left_commands(Teams(layout), team)
    return report


@dataclass
class FoundLeader:
    """Where a team's leader and its session are, as far as the disk tells."""

    session: Session | None
    alive: tuple[int, float] | None  # (pid, start time) of a running leader
    team_file: TeamFile | None  # None: unreadable or missing


def find_leader(layout: Layout, team: str, report: DownReport) -> FoundLeader:
    """The team's session and running leader: from the team file when it can be read, else
    from the newest session on disk that belongs to the team (its state.json names the leader)."""
    try:
        tf = Teams(layout).read(team)
    except ShoalError as exc:
        session = latest_session_of(layout, team)
        if session is None:
            raise  # no team file and no session of the team: nothing to bring down
        report.warnings.append(f"{exc}; using session {session.id}'s own record of its leader")
        return FoundLeader(session, _recorded_leader(session), None)
    session = current_session(layout, team)
    return FoundLeader(session, leader_alive(layout, team), tf)


def latest_session_of(layout: Layout, team: str) -> Session | None:
    """The newest session directory whose state.json belongs to `team` (session ids are
    time-ordered ULIDs), or None."""
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(layout.sessions_dir), reverse=True):
            session = Session(layout, name)
            with contextlib.suppress(ShoalError, OSError):
                if session.state_file.exists() and session.read_state().team == team:
                    return session
    return None


def _recorded_leader(session: Session) -> tuple[int, float] | None:
    with contextlib.suppress(ShoalError, OSError):
        leader = session.read_state().leader
        if leader is not None and is_alive(leader.pid, leader.started_at):
            return leader.pid, leader.started_at
    return None


def kill_orphans(
    layout: Layout, team: str, report: DownReport, found: FoundLeader | None = None
) -> list[str]:
    """Kill what no leader owns any more: the session's shell task processes and its
    teammates (process or tmux; in-process ones died with their leader). TERM goes to all of
    them first, then one wait; they are marked killed."""
    if found is None:
        found = find_leader(layout, team, report)
    session = found.session
    if session is None or not session.state_file.exists():
        return []
    if leader_alive(layout, team) if found.team_file is not None else _recorded_leader(session):
        return []
    try:
        state = session.read_state()
    except ShoalError as exc:
        report.warnings.append(str(exc))
        return []
    tf = found.team_file
    killed: list[str] = []
    victims: list[tuple[int, float | None]] = []
    tasks = dict(state.tasks)
    for task_id, task in state.tasks.items():
        if task.is_terminal:
            continue
        if isinstance(task, LocalShellTaskState):
            started, proc = shell.locate(task.pid, task.pid_started_at, task.output_file)
            if proc is not None:
                victims.append((proc.pid, proc.started_at))
                killed.append(task_id)
            elif started and shell.kill_leftover_group(
                task.pid or shell.recorded_pid(task.output_file)
            ):
                killed.append(task_id)  # its wrapper died, its children did not
            if not (started or task.status == TaskStatus.PENDING):
                continue
        elif isinstance(task, InProcessTeammateTaskState):
            member = tf.member(task.identity.agent_name) if tf is not None else None
            if member is not None and member.pid and is_alive(member.pid, member.pid_started_at):
                victims.append((member.pid, member.pid_started_at))
                killed.append(task_id)
        else:
            continue
        why = "stopped by shoal down"
        extra = {"kill_reason": why} if isinstance(task, LocalShellTaskState) else {"error": why}
        tasks[task_id] = transition(task, TaskStatus.KILLED, notified=True, **extra)
    _terminate_all(victims)
    if tf is not None and any(m.backend == "tmux" for m in tf.members):
        with contextlib.suppress(ShoalError, ImportError):
            from shoal.teams.backends.tmux import TmuxBackend

            TmuxBackend().close(team)
    if tasks != state.tasks:
        session.write_state(
            state.model_copy(update={"tasks": tasks, "leader": None, "updated_at": time.time()})
        )
    return killed


def _terminate_all(victims: list[tuple[int, float | None]]) -> None:
    """TERM every victim's process group at once, wait once, then KILL who is left."""
    for pid, started in victims:
        if is_alive(pid, started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + ORPHAN_KILL_GRACE_S
    while time.monotonic() < deadline and any(is_alive(p, s) for p, s in victims):
        time.sleep(0.02)
    for pid, started in victims:
        terminate(pid, started, grace=0, group=True)
