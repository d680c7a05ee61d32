"""The state of a batch run: the statuses of its tasks and their legal moves, a task's run and
attempts, and the events and interfaces of the executors that run them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol

from shoal.core.errors import ShoalError
from shoal.core.machine import IllegalMove, Machine, describe
from shoal.orchestrator.batch.report import iso
from shoal.orchestrator.batch.spec import MemberSpec, TaskSpec


class RunStatus(StrEnum):
    """Where a spec task is in a run; the last five are final."""

    PENDING = "pending"  # waiting for its dependencies or a free slot
    QUEUED = "queued"  # handed to an executor, not started yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    KILLED = "killed"
    SKIPPED = "skipped"


FINAL_STATUSES: Final = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.TIMED_OUT,
        RunStatus.KILLED,
        RunStatus.SKIPPED,
    }
)
_ENDS: Final = frozenset(FINAL_STATUSES - {RunStatus.SKIPPED})

# The one table of legal moves, for a task of the run and for one attempt of it. A task goes
# back to pending for a retry; one that never ran can end any way (a refused submit fails, a
# halt skips it, a carried one succeeded before); a final status is final.
RUN_TRANSITIONS: Final[dict[RunStatus, frozenset[RunStatus]]] = {
    RunStatus.PENDING: frozenset({RunStatus.QUEUED} | FINAL_STATUSES),
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.PENDING} | FINAL_STATUSES),
    RunStatus.RUNNING: frozenset({RunStatus.PENDING} | _ENDS),
    **{s: frozenset() for s in FINAL_STATUSES},
}


class IllegalRunMove(IllegalMove, ShoalError):
    """A run task or attempt moved in a way RUN_TRANSITIONS does not allow (a bug)."""


RUN_MACHINE: Final = Machine(
    RUN_TRANSITIONS,
    refuse=lambda what, a, b, allowed: IllegalRunMove(
        describe(what, a, b, allowed), what, a, b, allowed
    ),
)


def check_run_move(what: str, current: RunStatus, new: RunStatus) -> RunStatus:
    """`new`, if moving from `current` is legal (staying put always is); else IllegalRunMove."""
    return RUN_MACHINE.check(what, current, new)


# Why the engine itself stopped an attempt.
STOP_TIMEOUT: Final = "timeout"
STOP_HALT: Final = "halt"
STOP_INTERRUPT: Final = "interrupt"


# --------------------------------------------------------------------------- executor events


@dataclass(frozen=True)
class Started:
    """An attempt's process (or agent turn) started at wall time `at`."""

    handle: str
    at: float


@dataclass(frozen=True)
class Finished:
    """An attempt ended. `status` is the task framework's: completed, failed or killed;
    `ran` is False for one stopped before it started."""

    handle: str
    status: str
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    output_file: str | None = None
    error: str | None = None
    ran: bool = True
    junit_error: str | None = None
    """Why the task's JUnit report cannot be used, if it cannot (an attempt that completed
    then failed; one that did not is shown by how it ended)."""
    host: str | None = None
    """Where it ran, when not here (a Ray node's address)."""
    junit_failures: tuple[Mapping[str, str], ...] = ()
    """A failed attempt's failing testcases, read from its JUnit report (junit.failed_cases)."""


@dataclass(frozen=True)
class Stalled:
    """A running attempt seems to wait for interactive input (its last output line)."""

    handle: str
    prompt: str


ExecEvent = Started | Finished | Stalled


@dataclass(frozen=True)
class Refused:
    """An attempt the executor would not start (e.g. its working directory is missing)."""

    error: str


@dataclass(frozen=True)
class ShellRequest:
    """One attempt of a shell task, as handed to a ShellExecutor."""

    command: list[str]
    description: str
    cwd: str
    env: dict[str, str]
    timeout: float | None = None
    """The attempt's timeout (armed when it starts)."""
    junit: str | None = None
    """The JUnit report the attempt must write (checked when it succeeds)."""
    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    """What the attempt's Ray job holds (`--backend ray`; a local attempt ignores them)."""


class ShellExecutor(Protocol):
    """Runs shell attempts and reports them as `Started`/`Finished` events, by handle."""

    def submit(self, requests: Sequence[ShellRequest]) -> list[str | Refused]:
        """Queue the attempts (started as job slots allow); a handle or a refusal for each."""
        ...

    def stop(self, handle: str, reason: str) -> None:
        """Stop an attempt (asynchronously); a `Finished` with status killed follows."""
        ...

    def cancel(self, handle: str, reason: str) -> bool:
        """Drop an attempt that has not started; False when it already has."""
        ...


class AgentDispatcher(Protocol):
    """How agent tasks (`prompt` + `assign`) reach teammates: the one seam teammates fill in.

    `start` brings up the spec's members on `backend` in the run's team, working in `cwd`
    (the spec's directory). `dispatch` hands one
    attempt of a task to its member and returns a handle; the attempt's `Started` and
    `Finished` events come through the same path as shell tasks' (the `Poster` the factory
    receives), keyed by that handle. `stop` ends an attempt (a `Finished` with status killed
    follows). The members shut down with the run's leader. The engine gives each member one
    task at a time.
    """

    def start(self, members: Sequence[MemberSpec], backend: str, cwd: str) -> None: ...

    def dispatch(self, task: TaskSpec, member: MemberSpec, attempt: int) -> str: ...

    def stop(self, handle: str, reason: str) -> None: ...


Poster = Callable[[ExecEvent], None]
"""Queue an executor event for the engine (applied at its next step)."""


# --------------------------------------------------------------------------- run state


@dataclass
class Attempt:
    """One try of a task (a retry is a new attempt under a new task id)."""

    number: int
    handle: str | None
    status: RunStatus = RunStatus.QUEUED
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    output_file: str | None = None
    error: str | None = None
    junit_error: str | None = None
    deadline: float | None = None
    """Monotonic time at which the attempt times out."""
    stop: str | None = None
    """Why the engine stopped it (STOP_TIMEOUT, STOP_HALT, STOP_INTERRUPT), if it did."""
    host: str | None = None
    """The node it ran on, when not here (`--backend ray`)."""
    junit_failures: tuple[Mapping[str, str], ...] = ()
    """Its failing testcases, when it failed and its JUnit report says which."""

    def move(self, status: RunStatus) -> None:
        """Move through RUN_TRANSITIONS (attempts never go back to pending)."""
        if status == RunStatus.PENDING:
            what = f"attempt {self.number}"
            message = f"{what}: an attempt is never pending again"
            raise IllegalRunMove(message, what, self.status, status, frozenset())
        self.status = check_run_move(f"attempt {self.number}", self.status, status)

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to end, once both are known."""
        if self.started_at is None or self.ended_at is None:
            return None
        return round(max(0.0, self.ended_at - self.started_at), 3)

    def to_json(self) -> dict[str, Any]:
        """The attempt as it appears in the report's `attempt_log`."""
        return {
            "attempt": self.number,
            "task_id": self.handle,
            "status": self.status.value,
            "exit_code": self.exit_code,
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "duration_s": self.duration_s,
            "output_file": self.output_file,
            "error": self.error,
            "junit_error": self.junit_error,
            **({"host": self.host} if self.host else {}),
            **({"junit_failures": list(self.junit_failures)} if self.junit_failures else {}),
        }


@dataclass
class TaskRun:
    """A spec task within one run: its status, attempts and why it ended as it did."""

    spec: TaskSpec
    status: RunStatus = RunStatus.PENDING
    attempts: list[Attempt] = field(default_factory=list)
    reason: str | None = None
    carried: Mapping[str, Any] | None = None
    """The previous run's record, for a task --resume did not run again."""
    waiting_on: int = 0
    _json: tuple[tuple[Any, ...], dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def final(self) -> bool:
        """True once the task has its verdict."""
        return self.status in FINAL_STATUSES

    @property
    def flaky(self) -> bool:
        """True for a task that succeeded on a retry (in this run)."""
        tried = [a for a in self.attempts if a.status != RunStatus.SKIPPED]
        return self.succeeded and self.carried is None and len(tried) > 1

    @property
    def succeeded(self) -> bool:
        """True once the task has succeeded."""
        return self.status == RunStatus.SUCCEEDED

    def move(self, status: RunStatus) -> None:
        """Move through RUN_TRANSITIONS (IllegalRunMove otherwise)."""
        self.status = check_run_move(f'task "{self.spec.id}"', self.status, status)

    def to_json(self) -> dict[str, Any]:
        """The task as it appears in the report (cached until the task moves: the run record
        is rewritten often, and most tasks do not change between two writes)."""
        last = self.attempts[-1] if self.attempts else None
        key = (
            self.status,
            self.reason,
            len(self.attempts),
            last.status if last else None,
            last.handle if last else None,
        )
        if self._json is None or self._json[0] != key:
            self._json = (key, self._to_json())
        return self._json[1]

    def _to_json(self) -> dict[str, Any]:
        spec = self.spec
        base = {
            "id": spec.id,
            "seq": spec.seq,
            "command": spec.command_line,
            "after": list(spec.after),
            "fingerprint": spec.fingerprint,
            "junit": spec.junit,
        }
        if self.carried is not None:
            old = self.carried
            return {
                **base,
                "status": RunStatus.SUCCEEDED.value,
                "attempts": old.get("attempts", 1),
                "exit_code": old.get("exit_code"),
                "duration_s": old.get("duration_s"),
                "output_file": old.get("output_file"),
                "started_at": old.get("started_at"),
                "ended_at": old.get("ended_at"),
                "reason": "succeeded in a previous run (not run again)",
                "resumed": True,
                "junit_error": old.get("junit_error"),
                "attempt_log": old.get("attempt_log", []),
            }
        ran = [a for a in self.attempts if a.started_at is not None]
        tried = [a for a in self.attempts if a.status != RunStatus.SKIPPED]
        last = ran[-1] if ran else (self.attempts[-1] if self.attempts else None)
        first_start = ran[0].started_at if ran else None
        end = last.ended_at if last is not None else None
        duration = None
        if first_start is not None and end is not None:
            duration = round(max(0.0, end - first_start), 3)
        return {
            **base,
            "status": self.status.value,
            "attempts": len(tried),
            "exit_code": last.exit_code if last is not None else None,
            "duration_s": duration,
            "output_file": last.output_file if last is not None else None,
            "started_at": iso(first_start),
            "ended_at": iso(end),
            "reason": self.reason,
            "resumed": False,
            "junit_error": last.junit_error if last is not None else None,
            "attempt_log": [a.to_json() for a in self.attempts],
        }
