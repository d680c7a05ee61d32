"""Stopping a team's leader and whatever it owns, including what a crashed leader left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive, terminate
from shoal.core.tasks import (
    InProcessTeammateTaskState,
    LocalShellTaskState,
    TaskStatus,
    transition,
)
from shoal.orchestrator.control import ControlError, call
from shoal.orchestrator.liveness import leader_alive
from shoal.orchestrator.session import current_session
from shoal.teams.store import Teams
from shoal.workers import shell

ORPHAN_KILL_GRACE_S = 2.0


@dataclass
class DownReport:
    """What `bring_down` did."""

    team: str
    leader_pid: int | None = None
    killed_orphans: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def bring_down(layout: Layout, team: str, *, timeout: float = 30.0) -> DownReport:
    """Ask the leader to stop (killing it after `timeout`), then kill leftover task processes."""
    report = DownReport(team)
    alive = leader_alive(layout, team)
    if alive is not None:
        pid, started = alive
        report.leader_pid = pid
        with contextlib.suppress(ControlError):
            call(layout, team, "down", timeout=min(timeout, 10.0))
        deadline = time.monotonic() + timeout
        while is_alive(pid, started) and time.monotonic() < deadline:
            time.sleep(0.02)
        if is_alive(pid, started):
            terminate(pid, started)
            report.warnings.append(f"the leader (pid {pid}) did not stop in {timeout:g}s; killed")
    report.killed_orphans = kill_orphans(layout, team, report)
    return report


def kill_orphans(layout: Layout, team: str, report: DownReport) -> list[str]:
    """Kill what no leader owns any more: the session's shell task processes and its
    teammates (process or tmux; in-process ones died with their leader). TERM goes to all of
    them first, then one wait; they are marked killed."""
    session = current_session(layout, team)
    if session is None or not session.state_file.exists() or leader_alive(layout, team):
        return []
    try:
        state = session.read_state()
    except ShoalError as exc:
        report.warnings.append(str(exc))
        return []
    teams = Teams(layout)
    try:
        tf = teams.read(team)
    except ShoalError as exc:
        report.warnings.append(str(exc))
        tf = None
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
