"""`dream` tasks for the leader's loop: memory consolidation by a forked agent.

`new_dream_task` checks and prepares one (the memory directory, the model, the sessions to
review) and takes the consolidation lock, so a second dream is refused before anything is
registered. `DreamKind` runs it: a runner process (runner.py) in a session of its own,
whose status file is read each tick into the record (`phase` through its transition table,
`files_touched`, the last turns); its end settles the lock — a completed dream stamps the
lock with its end, a killed, failed or dead one puts back `prior_mtime`.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from shoal.core.errors import ShoalError
from shoal.core.events import TaskProgress, task_started
from shoal.core.filestamp import Stamp
from shoal.core.procs import (
    current_identity,
    find_by_stdout,
    is_alive,
)
from shoal.core.taskrecords import DreamTurn
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    DreamPhase,
    DreamTaskState,
    TaskStatus,
    TaskType,
    new_task_id,
)
from shoal.workers.agent.job import AgentStatus, JobOutcome, read_changed
from shoal.workers.agent.models import (
    DEFAULT_SPEC,
    ModelSpec,
    check_model,
    choose_model,
    resolve_file,
)
from shoal.workers.dream.memory import (
    ConsolidationLock,
    Holder,
    SessionFiles,
    check_memory_dir,
    memory_dir,
    sessions_since,
)
from shoal.workers.dream.runner import DreamJob
from shoal.workers.kinds import TaskStore, end_unannounced
from shoal.workers.process_kind import ProcessKind, spawn_logged
from shoal.workers.shell.process import ShellProcess

RUNNER_MODULE: Final = "shoal.workers.dream.runner"
# sessions/{s}/dreams/{id}.job.json, .status.json, .log, .transcript.jsonl
DREAMS_DIR: Final = "dreams"
DREAM_SCRIPT: Final = "dream_script.toml"
PROGRESS_EVENT_INTERVAL_S: Final = 1.0
INSTRUCTIONS: Final = """\
You consolidate a team's memory. The memory directory holds Markdown files (*.md) that later
sessions read first. Review the transcripts and event streams of the sessions listed below,
then rewrite the memory files: keep what stays true and useful (decisions, conventions, where
things are, what failed and why), merge duplicates, drop what is stale, and keep each file
short. You may read the memory directory and the sessions; you may write only memory files in
the memory directory (Write and Edit; Read a file before you change it). End with a short
summary of what you changed."""


class DreamSpec(BaseModel):
    """A dream to start (the fields of `shoal dream`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = None
    sessions: int | None = Field(None, ge=1)
    """Review the newest N sessions (default: every session since the last consolidation)."""
    cwd: str | None = None
    """The requester's directory: its `.shoal/memory/`, if there is one, is the memory."""
    reason: str | None = None
    """Why it was started (an automatic dream says so)."""


def dream_paths(session_dir: Path, task_id: str) -> tuple[Path, Path, Path]:
    """(job file, status file, runner log) of dream `task_id`."""
    base = session_dir / DREAMS_DIR
    return base / f"{task_id}.job.json", base / f"{task_id}.status.json", base / f"{task_id}.log"


def default_model() -> str:
    """The embedded dream script, as a `scripted:` spec."""
    path = resources.files("shoal.workers.dream").joinpath(DREAM_SCRIPT)
    return f"scripted:{path}"


def dream_prompt(memory: Path, sessions: Sequence[SessionFiles]) -> str:
    """The dream's first message: where the memory is and what to review."""
    lines = [f"Memory directory: {memory}", ""]
    if not sessions:
        lines.append("No session has been active since the last consolidation; tidy the memory.")
    else:
        lines.append(f"Sessions to review ({len(sessions)}, oldest first):")
        for s in sessions:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.touched))
            lines.append(f"- {s.session_id} (last active {when})")
            if s.events is not None:
                lines.append(f"  events: {s.events}")
            lines += [f"  transcript: {t}" for t in s.transcripts]
    return "\n".join(lines)


@dataclass(frozen=True)
class DreamHost:
    """What building a dream needs of its leader."""

    home: Path
    team: str
    output_file: Callable[[str], Path]
    environ: Mapping[str, str]
    live: Callable[[str], bool]
    """True while dream `task_id` is a live task of this leader."""


def new_dream_task(host: DreamHost, spec: DreamSpec) -> DreamTaskState:
    """A pending dream task holding the consolidation lock (see the module docstring).

    Refused, before anything is written: a memory directory that is a symlink (or not a
    directory), a model that cannot run, another live dream (named)."""
    project = Path(spec.cwd) if spec.cwd else None
    memory = check_memory_dir(memory_dir(host.home, project), host.home)
    asked = choose_model(spec.model, None, host.environ, host.home)
    chosen = ModelSpec.parse(default_model()) if str(asked) == DEFAULT_SPEC else asked
    check_model(chosen, host.environ, project)
    if chosen.provider in ("scripted", "replay") and chosen.name:
        # (the runner runs elsewhere: a script named relative to the requester is made whole)
        chosen = ModelSpec(chosen.provider, str(resolve_file(chosen.name, project).absolute()))
    model = str(chosen)
    lock = ConsolidationLock(memory)
    root = host.home / "sessions"
    if spec.sessions is not None:
        sessions = sessions_since(root, None)[-spec.sessions :]
    else:
        sessions = sessions_since(root, lock.last_consolidated())
    task_id = new_task_id(TaskType.DREAM)
    pid, started = current_identity()

    def stale(holder: Holder) -> bool:
        # (a dream of this very leader that is no longer live: settled, its release lost)
        return holder.team == host.team and holder.pid == pid and not host.live(holder.task_id)

    prior = lock.acquire(Holder(task_id, host.team, pid, started), stale)
    count = len(sessions)
    return DreamTaskState(
        id=task_id,
        description=spec.reason or f"dream: consolidate {count} session(s) into {memory}",
        output_file=str(host.output_file(task_id)),
        prior_mtime=prior,
        memory_dir=str(memory),
        sessions=tuple(s.session_id for s in sessions),
        sessions_reviewing=count,
        model=model,
    )


def release_lock(task: DreamTaskState, completed_at: float | None) -> bool:
    """Free the task's lock: stamped `completed_at` when it completed, else rolled back to
    `prior_mtime`. False when it no longer held it."""
    if task.memory_dir is None:
        return False
    mtime = completed_at if completed_at is not None else task.prior_mtime
    with contextlib.suppress(ShoalError, OSError):
        return ConsolidationLock(Path(task.memory_dir)).release(task.id, mtime)
    return False


@dataclass
class _Run:
    """What the kind holds in memory about one running dream."""

    task_id: str
    status_file: Path
    proc: ShellProcess
    status_seen: Stamp | None = None
    last_event: float = 0.0


class DreamKind(ProcessKind[_Run]):
    """The `dream` task kind (see the module docstring)."""

    types = frozenset({TaskType.DREAM})

    def __init__(self, home: Path) -> None:
        self.home = home
        self.runs: dict[str, _Run] = {}
        super().__init__(self.runs)

    # -- the protocol ------------------------------------------------------------------------

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, DreamTaskState)
        session_dir = Path(task.output_file).parent.parent
        job_file, status_file, log = dream_paths(session_dir, task.id)
        try:
            job = self._job(task, session_dir, status_file)
            job_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            job.save(job_file)
            if not store.write_ahead(task.id):
                release_lock(task, None)
                store.emit(task_started(store.get(task.id) or task))
                return
            proc = self._spawn(job_file, log, store)
        except (ShoalError, OSError, ValueError) as exc:
            store.move_task(task.id, TaskStatus.FAILED, error=f"could not start the dream: {exc}")
            release_lock(task, None)
            store.emit(task_started(store.get(task.id) or task))
            return
        with contextlib.suppress(ShoalError, OSError):
            ConsolidationLock(Path(job.memory_dir)).started(task.id, proc.pid, proc.started_at)
        run = _Run(task.id, status_file, proc)
        self._running(task, run, store, pid=proc.pid, pid_started_at=proc.started_at)

    def _poll_output(self, ids: list[str], store: TaskStore, now: float) -> None:
        for task_id in ids:
            run = self.runs.get(task_id)
            if run is not None:
                self._read_status(run, store)

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        if task.is_terminal:
            return
        assert isinstance(task, DreamTaskState)
        store.set_task(task.id, kill_reason=reason)
        run = self.runs.get(task.id)
        if run is None:  # never started
            store.move_task(task.id, TaskStatus.KILLED, error=reason)
            release_lock(task, None)
            return
        if task.id not in self.killing:
            if not self._begin_kill(task.id, run.proc, store):
                run.proc.poll()
            store.wake()

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """A dream of an earlier leader: watched again if its runner still runs, else settled
        from the status it left (a runner that died mid-run rolls the lock back)."""
        assert isinstance(task, DreamTaskState)
        session_dir = Path(task.output_file).parent.parent
        _job, status_file, log = dream_paths(session_dir, task.id)
        if task.status == TaskStatus.PENDING:  # (queued again by the caller: it never started)
            return
        if task.pid is None:  # (written ahead as running; its leader died before the pid)
            found = find_by_stdout(str(log), since=task.start_time or 0.0)
            if found is not None:
                store.set_task(task.id, pid=found[0], pid_started_at=found[1])
                task = store.get(task.id) or task
                assert isinstance(task, DreamTaskState)
        alive = task.pid is not None and is_alive(task.pid, task.pid_started_at)
        proc = ShellProcess(task.pid or 0, task.pid_started_at, child=False)
        run = _Run(task.id, status_file, proc)
        self.runs[task.id] = run
        if alive:
            store.watch_pid(task.id, proc.pid)
            store.note(f"adopted dream {task.id} (pid {task.pid})")
            return
        self._settle(run, store, unattended=True)

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        if not isinstance(task, DreamTaskState):
            return {}
        return {"result": task.result}

    def _process(self, run: _Run) -> ShellProcess:
        return run.proc

    # -- starting ----------------------------------------------------------------------------

    def _job(self, task: DreamTaskState, session_dir: Path, status_file: Path) -> DreamJob:
        assert task.memory_dir is not None
        memory = Path(task.memory_dir)
        root = self.home / "sessions"
        reviewed = [s for s in sessions_since(root, None) if s.session_id in task.sessions]
        return DreamJob(
            task_id=task.id,
            home=str(self.home),
            prompt=dream_prompt(memory, reviewed),
            instructions=INSTRUCTIONS,
            model=task.model or default_model(),
            memory_dir=str(memory),
            sessions=tuple(str(s.path) for s in reviewed),
            cwd=str(memory),
            output_file=task.output_file,
            # (beside its job, not in transcripts/: the next dream reviews sessions, not dreams)
            transcript=str(status_file.with_name(f"{task.id}.transcript.jsonl")),
            status_file=str(status_file),
        )

    def _spawn(self, job_file: Path, log: Path, store: TaskStore) -> ShellProcess:
        argv = [sys.executable, "-m", RUNNER_MODULE, str(job_file)]
        return spawn_logged(argv, dict(store.environ), log)

    # -- the steps ---------------------------------------------------------------------------

    def _settle_run(self, task_id: str, run: _Run, store: TaskStore) -> None:
        self._settle(run, store)

    def _read_status(self, run: _Run, store: TaskStore) -> AgentStatus | None:
        status = read_changed(run)
        task = store.get(run.task_id)
        if status is None or not isinstance(task, DreamTaskState) or task.is_terminal:
            return status
        raw = status.progress
        phase = DreamPhase(raw.get("phase") or task.phase)
        store.set_task(
            task.id,
            phase=DreamPhase.UPDATING if task.phase == DreamPhase.UPDATING else phase,
            files_touched=tuple(str(f) for f in raw.get("files_touched") or ()),
            turns=tuple(
                DreamTurn(
                    text=str(t.get("text") or ""), tool_use_count=int(t.get("tool_use_count") or 0)
                )
                for t in raw.get("turns") or ()
                if isinstance(t, dict)
            ),
        )
        now = time.monotonic()
        if now - run.last_event >= PROGRESS_EVENT_INTERVAL_S and status.state == "running":
            run.last_event = now
            last = raw.get("last_activity")
            store.emit(
                TaskProgress(
                    task_id=task.id,
                    tool_use_count=int(raw.get("tool_use_count") or 0),
                    token_count=int(raw.get("token_count") or 0),
                    activity=last if isinstance(last, str) else None,
                    summary=f"{phase.value}: {len(raw.get('files_touched') or ())} file(s)",
                )
            )
        return status

    def _settle(self, run: _Run, store: TaskStore, *, unattended: bool = False) -> None:
        """Give an ended dream its final state from its status file, and settle the lock."""
        self._forget(run.task_id, store)
        run.status_seen = None
        status = self._read_status(run, store)
        task = store.get(run.task_id)
        if not isinstance(task, DreamTaskState) or task.is_terminal:
            return
        outcome: JobOutcome | None = status.outcome if status is not None else None
        if task.kill_reason or (outcome is not None and outcome.status == "killed"):
            store.move_task(task.id, TaskStatus.KILLED, error=task.kill_reason or "killed")
            release_lock(task, None)
            if task.kill_reason in (None, STOPPED_ON_REQUEST):  # (not news: no notification)
                end_unannounced(store, task.id)
            return
        if outcome is not None and outcome.status == "completed":
            assert status is not None
            store.move_task(task.id, TaskStatus.COMPLETED, result=outcome.result)
            # (an unattended end is stamped when it happened, not when a leader saw it)
            release_lock(task, status.updated_at if unattended else time.time())
            return
        if outcome is not None:
            error = outcome.error or "the dream failed"
        else:
            code = run.proc.returncode()
            how = (
                "ended while no leader was running, without an outcome"
                if unattended
                else f"exited with code {code} without an outcome"
                if code is not None
                else "ended without an outcome (killed?)"
            )
            error = f"the dream's runner {how}"
        store.move_task(task.id, TaskStatus.FAILED, error=error)
        if release_lock(task, None):
            store.note(f"dream {task.id} did not complete; the consolidation lock was rolled back")
