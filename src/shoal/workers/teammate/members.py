"""A teammate's run as the leader sees it (its phases, why it ended, its ready timeout) and
its records: its task record, in step with its status file and messages, and its entry in the
team file. (A spawn batch's plan and answer are spawn_plan.py's.)"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol

from shoal.core.errors import ShoalError
from shoal.core.filestamp import SETTLE_NS, Stamp, settled, stamp_of
from shoal.core.machine import IllegalMove, Machine, describe
from shoal.core.paths import Layout
from shoal.core.procs import Termination
from shoal.core.taskrecords import AgentProgress, ToolActivity
from shoal.core.tasks import (
    RECENT_ACTIVITIES_CAP,
    TEAMMATE_MESSAGES_UI_CAP,
    AnyTaskState,
    TaskStatus,
)
from shoal.teams.backends.base import Backend, Handle
from shoal.teams.store import Teams
from shoal.workers.kinds import TaskStore
from shoal.workers.teammate.commands import Settled, settle_and_release

SPAWN_TIMEOUT_S = float(os.environ.get("SHOAL_SPAWN_TIMEOUT", "30"))
# A batch of process teammates larger than the machine starts slower: each member past
# 4 per CPU adds this much to everyone's ready timeout (they share the CPUs while starting).
SPAWN_TIMEOUT_PER_MEMBER_S = 0.5


def ready_timeout(batch: int, in_process: bool) -> float:
    """Seconds a teammate launched in a batch of `batch` has to become ready."""
    if in_process:  # (no interpreter to start: they do not slow each other down)
        return SPAWN_TIMEOUT_S
    crowd = max(0, batch - 4 * (os.cpu_count() or 1))
    return SPAWN_TIMEOUT_S + SPAWN_TIMEOUT_PER_MEMBER_S * crowd


SHUTDOWN_TIMEOUT_S = float(os.environ.get("SHOAL_SHUTDOWN_TIMEOUT", "10"))
# Texts of messages kept in a teammate's task record are cut to this many characters (the
# record is in state.json: 50 messages of a thousand teammates must stay a few MB at most).
MESSAGE_TEXT_CAP = 200

Reply = Callable[[dict[str, Any] | None, ShoalError | None], None]
BatchReply = Callable[[list[dict[str, Any]] | None, ShoalError | None], None]


class Phase(StrEnum):
    """Where a teammate this leader started is in its run."""

    STARTING = "starting"  # launched, not ready yet (the lead sends it nothing)
    READY = "ready"  # told the lead it is ready; takes work
    STOPPING = "stopping"  # asked to shut down (the handshake), or being killed
    ENDED = "ended"


PHASE_TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    Phase.STARTING: frozenset({Phase.READY, Phase.STOPPING, Phase.ENDED}),
    Phase.READY: frozenset({Phase.STOPPING, Phase.ENDED}),
    Phase.STOPPING: frozenset({Phase.READY, Phase.ENDED}),  # (ready while being asked)
    Phase.ENDED: frozenset(),
}


class IllegalPhase(IllegalMove, ShoalError):
    """A teammate run moved in a way PHASE_TRANSITIONS does not allow (a bug)."""


PHASE_MACHINE: Final = Machine(
    PHASE_TRANSITIONS,
    refuse=lambda name, a, b, allowed: IllegalPhase(
        describe(f"teammate {name}", a, b, allowed), name, a, b, allowed
    ),
)


def check_phase(name: str, current: Phase, new: Phase) -> None:
    """Refuse a move that is not in PHASE_TRANSITIONS (staying put is always allowed)."""
    PHASE_MACHINE.check(name, current, new)


class StopCause(StrEnum):
    """Why a teammate's run ended, when the swarm knows (None: it exited by itself)."""

    ON_REQUEST = "stopped on request"  # `shoal stop`: killed, and not news
    SHUTDOWN_APPROVED = "shut down on request"  # it approved the lead's shutdown_request
    NOT_READY = "not ready in time"
    SHUTDOWN_TIMEOUT = "did not shut down in time"
    KILLED = "killed by the leader"  # (for a reason of its own, given in words)


class SwarmHost(TaskStore, Protocol):
    """What the swarm needs of the leader, beyond what every task kind may do."""

    layout: Layout
    team: str
    teams: Teams

    @property
    def identity(self) -> tuple[int, float]: ...

    @property
    def session_id(self) -> str: ...

    def register(self, task: AnyTaskState) -> AnyTaskState: ...


@dataclass
class MemberRun:
    """A teammate this leader started (live handles: never persisted)."""

    name: str
    task_id: str
    backend: Backend
    handle: Handle
    why: str
    prompt: str | None = None
    phase: Phase = Phase.STARTING
    became_ready: bool = False  # (a fact of its history: STOPPING may follow either phase)
    cause: StopCause | None = None
    detail: str | None = None  # the words of `cause`, with its numbers
    reply: Reply | None = None
    deadline: float = 0.0
    launched: float = field(default_factory=time.monotonic)
    log_file: Path | None = None
    in_process: bool = False
    ending: Termination | None = None  # a kill in progress (TERM sent; KILL at its deadline)
    # (inode, size, mtime_ns) of the status file last read; None: read it on the next look.
    status_key: Stamp | None = None
    status: dict[str, Any] | None = None  # the member's status as last applied
    sent: deque[dict[str, Any]] = field(
        default_factory=lambda: deque(maxlen=TEAMMATE_MESSAGES_UI_CAP)
    )  # what the member sent the lead, for the record's messages

    def move(self, phase: Phase) -> None:
        """Move to `phase` (IllegalTransition if PHASE_TRANSITIONS does not allow it)."""
        check_phase(self.name, self.phase, phase)
        self.phase = phase
        if phase == Phase.READY:
            self.became_ready = True

    def end_because(self, cause: StopCause, detail: str | None = None) -> None:
        """Record why it ends (the first cause stands, but for an explicit stop)."""
        if self.cause is None or cause == StopCause.ON_REQUEST:
            self.cause, self.detail = cause, detail or cause.value


class MemberRecords:
    """The records of a leader's teammates (the base of `Swarm`): their task records, in step
    with their status files and what they send the lead, and their entries in the team file."""

    def __init__(self, host: SwarmHost) -> None:
        self.leader = host
        self.members: dict[str, MemberRun] = {}
        # Statuses handed over by in-process teammates (from their loop's thread), latest per
        # member, applied on the next pass; names being started are kept until they are known.
        self._pushed: dict[str, dict[str, Any]] = {}
        self._push_lock = threading.Lock()
        self._launching: set[str] = set()
        self._status_dir = host.layout.status_dir(host.team)
        self._status_dir_seen: int | None = None

    def _begin_kill(self, run: MemberRun) -> bool:
        """Begin killing a teammate without waiting: TERM to its process group now, KILL from
        `check` once the grace is over. True when it is gone already (an in-process one is
        cancelled at once; a backend that cannot name a process group kills it itself)."""
        if run.ending is not None:
            return False
        pid = run.handle.pid
        if run.in_process or pid is None or run.backend.name not in ("process", "tmux"):
            run.backend.kill(run.handle)
            return True
        member = self.leader.teams.read(self.leader.team).member(run.name)
        started = member.pid_started_at if member is not None and member.pid == pid else None
        ending = Termination(pid, started, grace=self.leader.limits.kill_grace, group=True)
        if not ending.begin():
            run.backend.kill(run.handle)
            return True
        run.ending = ending
        if run.phase in (Phase.STARTING, Phase.READY):
            run.move(Phase.STOPPING)
        self.leader.wake()
        return False

    def _settle_tasks(self, name: str) -> tuple[Settled, list[Any]]:
        """The list tasks of a teammate that is gone (`settle_and_release`: nothing of it runs on
        once its tasks are handed back, and a finished task keeps its outcome). A task list it
        cannot write now is left to the leader's periodic release."""
        try:
            return settle_and_release(self.leader.teams, self.leader.team, name)
        except ShoalError:
            return Settled(), []

    def _update_teammate(self, run: MemberRun, **changes: Any) -> None:
        with contextlib.suppress(ShoalError, TypeError):
            self.leader.set_task(run.task_id, **changes)

    def sync_status(self) -> None:
        """Copy what changed in members' status files into their task records.

        In-process teammates hand their statuses over directly; the others' files are looked
        at only when the status directory changed (a stat), then only those whose file changed
        are read. A thousand quiet teammates cost one stat a pass.
        """
        if self._pushed:  # (read without the lock: one missed now is seen on the next pass)
            with self._push_lock:
                pushed, self._pushed = self._pushed, {}
            for name, status in pushed.items():
                run = self.members.get(name)
                if run is not None:
                    self._apply_status(run, status)
                elif name in self._launching:  # handed over before `_start` recorded it
                    with self._push_lock:
                        self._pushed.setdefault(name, status)
        if not self.members:
            return
        try:
            mtime = os.stat(self._status_dir).st_mtime_ns
        except OSError:
            return
        if mtime == self._status_dir_seen:
            return
        self._status_dir_seen = mtime if time.time_ns() - mtime > SETTLE_NS else None
        for run in self.members.values():
            if not run.in_process:
                found = self._read_status(run)
                if found is not None:
                    self._apply_status(run, found)

    def _read_status(self, run: MemberRun) -> dict[str, Any] | None:
        """The member's status file if it changed since the last read, else None."""
        stamp = stamp_of(self._status_dir / f"{run.name}.json")
        if stamp is None or stamp == run.status_key:
            return None
        status = self.leader.teams.read_status(self.leader.team, run.name)
        if status is not None:
            run.status_key = settled(stamp)
        return status

    def _refresh(self, run: MemberRun) -> None:
        """Bring one member's record up to date now (its latest status, its messages)."""
        status: dict[str, Any] | None
        if run.in_process:
            with self._push_lock:
                status = self._pushed.pop(run.name, None)
        else:
            status = self._read_status(run)
        if status is None and run.status is None:  # nothing known yet but its messages
            self._update_teammate(run, messages=self._messages(run, {}))
            return
        self._apply_status(run, status if status is not None else run.status or {})

    def _apply_status(self, run: MemberRun, status: dict[str, Any]) -> None:
        run.status = status
        self._update_teammate(
            run,
            is_idle=status.get("state") == "idle",
            awaiting_plan_approval=bool(status.get("awaiting_approval")),
            shutdown_requested=bool(status.get("shutdown_requested")),
            progress=_progress(status),
            messages=self._messages(run, status),
        )

    @staticmethod
    def _messages(run: MemberRun, status: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
        """What the member received (its status file lists them) and sent the lead, oldest
        first, the last TEAMMATE_MESSAGES_UI_CAP of them."""
        received = status.get("messages")
        listed = received if isinstance(received, list) else ()
        messages = [m for m in listed if isinstance(m, dict)]
        messages.extend(run.sent)
        messages.sort(key=lambda m: str(m.get("sent_at") or ""))
        return tuple(messages[-TEAMMATE_MESSAGES_UI_CAP:])

    def _leave(self, runs: list[MemberRun]) -> None:
        """Mark ended in-process teammates as gone in the team file (their pid is the
        leader's, so it cannot tell), in one update per outcome."""
        if not runs:
            return
        team = self.leader.team
        approved = [r.name for r in runs if r.cause == StopCause.SHUTDOWN_APPROVED]
        others = [r.name for r in runs if r.cause != StopCause.SHUTDOWN_APPROVED]
        with contextlib.suppress(ShoalError):
            if approved:
                self.leader.teams.leave_many(team, approved)
            if others:
                self.leader.teams.leave_many(team, others, departed=False)


def _outcome(run: MemberRun, log: str) -> tuple[TaskStatus, dict[str, Any]]:
    """The final status of an ended teammate's task, from how its run went."""
    if not run.became_ready:
        error = (
            f"teammate {run.name!r} died at start"
            + (f" ({run.detail})" if run.detail else "")
            + (f": {log.splitlines()[-1]}" if log else "")
        )
        return TaskStatus.FAILED, {"error": error}
    if run.cause == StopCause.ON_REQUEST:
        return TaskStatus.KILLED, {}
    if run.cause == StopCause.SHUTDOWN_APPROVED:
        return TaskStatus.COMPLETED, {"result": StopCause.SHUTDOWN_APPROVED.value}
    error = run.detail or "the teammate exited unexpectedly"
    return TaskStatus.FAILED, {"error": error + (f": {log[-300:]}" if log else "")}


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MESSAGE_TEXT_CAP:
        return text
    return text[:MESSAGE_TEXT_CAP] + "…"


def _activity(text: str, at: float) -> ToolActivity:
    """An activity line of a status file as a ToolActivity made at `at`; its first word
    (e.g. `run` of `run: make`) stands for the tool."""
    return ToolActivity(tool_name=text.split(":", 1)[0].split(" ", 1)[0], description=text, at=at)


def _written_at(status: Mapping[str, Any]) -> float:
    """When a status file was written (its `updated_at`), else now (an in-process member's
    status, handed over directly, has none)."""
    written = status.get("updated_at")
    if isinstance(written, str):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(written.replace("Z", "+00:00")).timestamp()
    return time.time()


def _progress(status: Mapping[str, Any]) -> AgentProgress | None:
    """The progress a status file reports (counts, summary, latest and recent activities,
    each at the time the member gives, else when the status was written)."""
    raw = status.get("progress")
    counts: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    recent = status.get("recent_activities")
    listed = recent if isinstance(recent, list) else []
    raw_times = status.get("activity_times")
    times = raw_times if isinstance(raw_times, list) and len(raw_times) == len(listed) else []
    current = status.get("activity")
    if not counts and not listed and not current:
        return None
    written = _written_at(status)
    pairs = [
        (a, t if isinstance(t, int | float) else written)
        for a, t in zip(listed, times or [written] * len(listed), strict=True)
        if isinstance(a, str) and a
    ]
    began = status.get("activity_at")
    at = began if isinstance(began, int | float) else written
    summary = counts.get("summary")
    try:
        return AgentProgress(
            tool_use_count=int(counts.get("tool_use_count") or 0),
            token_count=int(counts.get("token_count") or 0),
            last_activity=_activity(str(current), at) if current else None,
            recent_activities=tuple(_activity(a, t) for a, t in pairs[-RECENT_ACTIVITIES_CAP:]),
            summary=str(summary) if summary else None,
        )
    except (TypeError, ValueError):  # (a pydantic ValidationError is a ValueError)
        return None
