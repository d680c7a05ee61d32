"""Stopping a team's leader and whatever it owns, including what a crashed leader left behind."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive, terminate
from shoal.core.tasks import LocalShellTaskState, TaskStatus, transition
from shoal.orchestrator.control import ControlError, call
from shoal.orchestrator.leader import leader_alive
from shoal.orchestrator.session import current_session
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
    """Kill task processes of the team's session that no leader owns; mark them killed."""
    session = current_session(layout, team)
    if session is None or not session.state_file.exists() or leader_alive(layout, team):
        return []
    try:
        state = session.read_state()
    except ShoalError as exc:
        report.warnings.append(str(exc))
        return []
    killed: list[str] = []
    tasks = dict(state.tasks)
    for task_id, task in state.tasks.items():
        if not isinstance(task, LocalShellTaskState) or task.is_terminal:
            continue
        started, proc = shell.locate(task.pid, task.pid_started_at, task.output_file)
        if proc is not None:
            shell.kill(proc, ORPHAN_KILL_GRACE_S)
            killed.append(task_id)
        if started or task.status == TaskStatus.PENDING:
            tasks[task_id] = transition(
                task, TaskStatus.KILLED, kill_reason="stopped by shoal down", notified=True
            )
    if tasks != state.tasks:
        session.write_state(
            state.model_copy(update={"tasks": tasks, "leader": None, "updated_at": time.time()})
        )
    return killed
