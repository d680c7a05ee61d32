"""The leader: owns a team's task registry and runs its supervisor loop.

The loop is a `tick()` of small named steps in a fixed order — reap, read output, watch for
stalls and the output cap, clean up orphans, notify, evict, start pending, persist — each a
method a test can call. Between ticks it sleeps in a selector on pidfds of running tasks and a
wake-up pipe, so a task ending or a control request is handled at once, and an idle leader
costs nothing but one tick a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from ulid import ULID

from shoal.core.config import Limits
from shoal.core.errors import ConflictError, CorruptFileError, ShoalError
from shoal.core.notify import (
    stall_notification_xml,
    summary_for,
    task_notification_for,
    task_started_event,
    task_terminated_event,
)
from shoal.core.output import output_size, read_output_delta, tail
from shoal.core.paths import Layout
from shoal.core.procs import current_identity, is_alive, process_start_time
from shoal.core.tasks import (
    AnyTaskState,
    InProcessTeammateTaskState,
    LocalShellTaskState,
    ShellResult,
    TaskStatus,
    TaskType,
    evolve,
    new_task_id,
)
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.schema import AnyMessage, ControlMessage
from shoal.mailbox.store import Maildir
from shoal.orchestrator.registry import TaskRegistry
from shoal.orchestrator.session import Session, SessionState
from shoal.orchestrator.swarm import Swarm
from shoal.teams.models import LEAD_NAME, TeamFile
from shoal.teams.store import MemberState, Teams
from shoal.teams.tasklist import TaskList
from shoal.workers import shell

EventSink = Callable[[dict[str, Any]], None]

# How often the shared task list is checked for tasks of members that are gone.
RELEASE_INTERVAL_S = 5.0
# state.json is rewritten at most this often by the loop (requests from users force a write).
PERSIST_INTERVAL_S = 0.2


class TaskError(ShoalError):
    """A task request was refused (unknown task, already finished)."""


def notification_id(task_id: str) -> str:
    """A message id fixed by the task alone (a task ends once), so a notification re-sent after
    a crash — even with another end time — is the same message and handled once."""
    digest = hashlib.sha256(task_id.encode()).digest()
    return str(ULID.from_bytes(digest[:16]))


class Leader:
    """The supervisor of one team's background tasks (one per team, one per process)."""

    def __init__(
        self,
        layout: Layout,
        team: str,
        *,
        limits: Limits | None = None,
        jobs: int = 0,
        on_event: EventSink | None = None,
    ) -> None:
        self.layout = layout
        self.team = team
        self.teams = Teams(layout)
        self.limits = limits or Limits()
        self.jobs = jobs
        self.on_event = on_event
        self.registry = TaskRegistry()
        self.procs: dict[str, shell.ShellProcess] = {}
        self.queue: deque[str] = deque()
        self.lock = threading.RLock()
        self.session: Session
        self.created_at = time.time()
        self._dirty = True
        self._stopping = False
        self._last_growth: dict[str, tuple[int, float]] = {}
        self._last_stall_check = 0.0
        self._announced: set[str] = set()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._pidfds: dict[str, int] = {}
        self._task_json: dict[str, tuple[AnyTaskState, orjson.Fragment]] = {}
        self._exited: set[str] = set()
        self._step_errors: dict[str, str] = {}  # keys whose pidfd said "exited" since the last pass
        self._last_persist = 0.0
        self._last_release = 0.0
        self._identity = current_identity()
        # What tasks inherit, as a plain dict: handing posix_spawn `os.environb` itself costs a
        # Python-level lookup per variable on every start.
        self._environ: dict[bytes, bytes] = dict(os.environb)
        self._inbox: Inbox | None = None
        self.swarm = Swarm(self)
        self._subscription: Any = None
        self.notes: list[str] = []

    # -- start and resume ----------------------------------------------------------------------

    def start(self) -> Leader:
        """Become the team's leader: resume its last session or begin a new one."""
        if not self.teams.exists(self.team):
            self.teams.create(self.team)
        me, my_start = self._identity

        def claim(tf: TeamFile) -> TeamFile:
            # Checked and taken under the team file's lock: two `shoal up` at once, one leader.
            lead = tf.member(LEAD_NAME)
            if lead is None:
                raise CorruptFileError(self.layout.team_file(self.team), "it lists no team-lead")
            if lead.pid not in (None, me) and is_alive(lead.pid, lead.pid_started_at):
                raise ConflictError(
                    f"a leader already runs for team {self.team!r} (pid {lead.pid}); "
                    f"stop it with `shoal down --team {self.team}`"
                )
            return tf.with_member(
                lead.model_copy(
                    update={
                        "pid": me,
                        "pid_started_at": my_start,
                        "backend": "leader",
                        "cwd": os.getcwd(),
                    }
                )
            )

        tf = self.teams.update(self.team, claim)
        _raise_fd_limit()  # a thousand in-process teammates hold a thousand inbox files
        session_id = tf.lead_session_id
        resumed = False
        if session_id and Session(self.layout, session_id).state_file.exists():
            self.session = Session(self.layout, session_id).ensure()
            try:
                state = self.session.read_state()
            except CorruptFileError as exc:
                aside = self.session.set_aside()
                self.session.close()
                self.session = Session(self.layout, _new_session_id()).ensure()
                self.note(f"{exc}; moved it to {aside} and started a new session")
            else:
                self._resume(state)
                resumed = True
        else:
            self.session = Session(self.layout, _new_session_id()).ensure()
        self.teams.update(
            self.team, lambda t: t.model_copy(update={"lead_session_id": self.session.id})
        )
        self.persist(force=True)
        self.emit(
            {
                "type": "system",
                "subtype": "leader_started",
                "team": self.team,
                "pid": me,
                "resumed": resumed,
            }
        )
        maildir = Maildir.create(self.layout.inbox_dir(self.team, LEAD_NAME), self.layout.home)
        self._inbox = Inbox(maildir, lead=LEAD_NAME)
        self._subscription = self._inbox.subscribe(self._on_message)
        return self

    def _resume(self, state: SessionState) -> None:
        """Adopt what still runs; give tasks that ended meanwhile their recorded result.

        state.json is written at most every PERSIST_INTERVAL_S, so it can lag behind the event
        stream: what the events say was announced or notified is not announced again.
        """
        announced: set[str] = set()
        notified: set[str] = set()
        for event in self.session.events():
            task_id = event.get("task_id")
            if not isinstance(task_id, str):
                continue
            if event.get("subtype") == "task_terminated":
                announced.add(task_id)
            elif event.get("subtype") == "task_notification":
                notified.add(task_id)
        self._announced = announced
        self.created_at = state.created_at
        for task in state.tasks.values():
            self.registry.register_task(task)
            if isinstance(task, InProcessTeammateTaskState) and not task.is_terminal:
                if self.swarm.adopt(task):
                    self.note(f"adopted teammate {task.identity.agent_name} ({task.id})")
                else:
                    self._move(
                        task.id,
                        TaskStatus.FAILED,
                        error="the teammate ended while no leader was running",
                    )
                continue
            if task.is_terminal or not isinstance(task, LocalShellTaskState):
                continue
            started, proc = shell.locate(task.pid, task.pid_started_at, task.output_file)
            if not started:
                self.queue.append(task.id)
                continue
            if task.status == TaskStatus.PENDING:
                pid = proc.pid if proc else shell.recorded_pid(task.output_file)
                self._move(
                    task.id,
                    TaskStatus.RUNNING,
                    pid=pid,
                    pid_started_at=proc.started_at if proc else None,
                )
            if proc is not None:
                self._watch(task.id, proc)
                self.note(f"adopted {task.id} (pid {proc.pid}): {task.command}")
            else:
                self._finish_shell(task.id, None, ended_unattended=True)
        for task_id in notified:  # (a no-op for tasks state.json already has as notified)
            self.registry.mark_notified(task_id)

    def note(self, text: str) -> None:
        """A line for the person running the leader (also an event)."""
        self.notes.append(text)
        self.emit({"type": "system", "subtype": "note", "text": text})

    # -- events and persistence ----------------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        record = self.session.emit(event)
        if self.on_event is not None:
            self.on_event(record)

    def persist(self, *, force: bool = False) -> None:
        """Write state.json if anything changed, at most every PERSIST_INTERVAL_S unless forced.

        The throttle is safe because what a crash must not lose is on disk per task anyway
        (output file, the wrapper's pid and exit files). Each task's JSON is kept between
        writes and re-encoded only when the (immutable) task object changed.
        """
        if not (self._dirty or force):
            return
        now = time.monotonic()
        if not force and now - self._last_persist < PERSIST_INTERVAL_S:
            return
        self._last_persist = now
        fragments: dict[str, orjson.Fragment] = {}
        cache = self._task_json
        for task in self.registry.get_all_tasks():
            hit = cache.get(task.id)
            if hit is None or hit[0] is not task:
                hit = (task, orjson.Fragment(orjson.dumps(task.model_dump(mode="json"))))
                cache[task.id] = hit
            fragments[task.id] = hit[1]
        for gone in [k for k in cache if k not in fragments]:
            del cache[gone]
        me, started = self._identity
        leader = (
            None
            if self._stopping and not self.procs
            else {"pid": me, "started_at": started, "jobs": self.jobs}
        )
        self.session.write_state_bytes(
            orjson.dumps(
                {
                    "v": 1,
                    "session_id": self.session.id,
                    "team": self.team,
                    "created_at": self.created_at,
                    "updated_at": time.time(),
                    "leader": leader,
                    "tasks": fragments,
                }
            )
        )
        self._dirty = False

    def _update(self, task_id: str, updater: Callable[[Any], AnyTaskState]) -> bool:
        changed = self.registry.update_task_state(task_id, updater)
        self._dirty = self._dirty or changed
        return changed

    def _set(self, task_id: str, **changes: Any) -> bool:
        """Change fields of a task (same values: no change, no write)."""
        return self._update(task_id, lambda t: evolve(t, **changes))

    def _move(self, task_id: str, status: TaskStatus, **changes: Any) -> bool:
        """Move a task through the transition table (see `transition`; the values are the
        leader's own, so the record is not re-validated)."""

        def move(task: AnyTaskState) -> AnyTaskState:
            if status == task.status:
                return task if task.is_terminal else evolve(task, **changes)
            return evolve(task, status=status, **changes)

        return self._update(task_id, move)

    # -- submitting and stopping ----------------------------------------------------------------

    def make_shell_task(
        self,
        command: list[str],
        *,
        description: str | None = None,
        agent: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        kind: str = "bash",
        background: bool = True,
        tool_use_id: str | None = None,
    ) -> LocalShellTaskState:
        """Build (and check) a new pending shell task; nothing is registered yet."""
        if not command or not all(isinstance(a, str) for a in command) or not command[0]:
            raise TaskError("no command given (usage: shoal sh -- CMD ARGS...)")
        if cwd is not None and not os.path.isdir(cwd):
            raise TaskError(f"working directory {cwd!r} does not exist")
        if kind not in ("bash", "monitor"):
            raise TaskError(f"unknown shell task kind {kind!r} (bash or monitor)")
        owner = LEAD_NAME
        if agent:
            name = agent.split("@", 1)[0]
            if self.teams.read(self.team).member(name) is None:
                raise TaskError(f"no member {name!r} in team {self.team!r} to own the task")
            owner = name
        display, argv = shell.argv_for(command)
        task_id = new_task_id(TaskType.LOCAL_BASH)
        return LocalShellTaskState(
            id=task_id,
            description=description or display,
            command=display,
            argv=tuple(argv),
            cwd=cwd or os.getcwd(),
            env=env or None,
            output_file=str(self.session.output_file(task_id)),
            owner=owner,
            agent_id=owner if agent else None,
            kind=kind,
            is_backgrounded=background,
            tool_use_id=tool_use_id,
        )

    def submit(self, tasks: list[LocalShellTaskState]) -> list[LocalShellTaskState]:
        """Register tasks and start them now (or as job slots free); one state write."""
        with self.lock:
            for task in tasks:
                self.registry.register_task(task)
                self.queue.append(task.id)
            self._dirty = True
            self.start_pending()
            self.persist(force=True)
            current = [self.registry.get(t.id) for t in tasks]
        self.wake()
        return [t for t in current if isinstance(t, LocalShellTaskState)]

    def submit_shell(self, command: list[str], **options: Any) -> LocalShellTaskState:
        """Register one shell task and start it (see `make_shell_task` for the options)."""
        return self.submit([self.make_shell_task(command, **options)])[0]

    def start_pending(self) -> None:
        """Start queued tasks while job slots are free (`jobs` 0 means no limit)."""
        while self.queue and (self.jobs <= 0 or len(self.procs) < self.jobs):
            task_id = self.queue.popleft()
            task = self.registry.get(task_id)
            if not isinstance(task, LocalShellTaskState) or task.status != TaskStatus.PENDING:
                continue
            env = task.env
            try:
                proc = shell.start(
                    list(task.argv),
                    Path(task.output_file),
                    cwd=task.cwd,
                    env=self._task_environ(env),
                    # (the session's tasks/ directory was checked against symlinks when it
                    # was made; the file itself is opened O_EXCL|O_NOFOLLOW)
                )
            except (ShoalError, OSError) as exc:
                message = str(exc)
                self._move(task_id, TaskStatus.FAILED, error=message, result=ShellResult(code=-1))
                self.emit(task_started_event(self.registry.get(task_id)))  # type: ignore[arg-type]
                continue
            self._move(
                task_id,
                TaskStatus.RUNNING,
                pid=proc.pid,
                pid_started_at=proc.started_at,
                start_time=time.time(),
            )
            self._watch(task_id, proc)
            self.emit(task_started_event(self.registry.get(task_id)))  # type: ignore[arg-type]

    def _task_environ(self, extra: dict[str, str] | None) -> dict[bytes, bytes]:
        """The leader's environment (as at its start) plus a task's own variables."""
        if not extra:
            return self._environ
        return {**self._environ, **{os.fsencode(k): os.fsencode(v) for k, v in extra.items()}}

    def stop_task(self, task_id: str, reason: str = "stopped on request") -> AnyTaskState:
        """Stop a running task: kill it and mark it notified, with no exit-137 failure noise."""
        with self.lock:
            task = self.registry.get(task_id)
            if task is None:
                if task_id in self.session.history():
                    raise TaskError(f"task {task_id} already finished")
                raise TaskError(f"no task {task_id} in team {self.team!r} (see `shoal ps --all`)")
            if task.is_terminal:
                raise TaskError(f"task {task_id} already finished ({task.status.value})")
            member = self.swarm.member_of_task(task_id)
        if member is not None:
            self.swarm.stop(member, reason)
            with self.lock:
                self.persist(force=True)
                final_member = self.registry.get(task_id)
            assert final_member is not None
            return final_member
        with self.lock:
            proc = self.procs.get(task_id)
            self._set(task_id, kill_reason=reason)
        if proc is not None:
            shell.kill(proc, self.limits.kill_grace)
        with self.lock:
            self._finish_shell(task_id, proc, killed=True)
            self.persist(force=True)
            final = self.registry.get(task_id)
        self.wake()
        assert final is not None
        return final

    # -- the loop -------------------------------------------------------------------------------

    def wake(self) -> None:
        """Make the loop run its steps now (from any thread)."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _watch(self, task_id: str, proc: shell.ShellProcess) -> None:
        self.procs[task_id] = proc
        self.watch_pid(task_id, proc.pid)

    def _unwatch(self, task_id: str) -> None:
        self.procs.pop(task_id, None)
        self.unwatch_pid(task_id)

    def watch_pid(self, key: str, pid: int | None) -> None:
        """Wake the loop when process `pid` exits (a pidfd in the selector)."""
        if pid is None or key in self._pidfds:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            self.wake()  # already gone: the next pass finds out
            return
        self._pidfds[key] = fd
        self._selector.register(fd, selectors.EVENT_READ, key)

    def unwatch_pid(self, key: str) -> None:
        fd = self._pidfds.pop(key, None)
        if fd is not None:
            self._selector.unregister(fd)
            os.close(fd)

    @property
    def identity(self) -> tuple[int, float]:
        """(pid, start time) of the leader's process."""
        return self._identity

    def mark_dirty(self) -> None:
        """Something in the registry changed outside `_update` (state.json must be written)."""
        self._dirty = True

    def set_task(self, task_id: str, **changes: Any) -> bool:
        """Change fields of a task (public for the swarm and other task kinds)."""
        return self._set(task_id, **changes)

    def move_task(self, task_id: str, status: TaskStatus, **changes: Any) -> bool:
        """Move a task through the transition table (public for other task kinds)."""
        return self._move(task_id, status, **changes)

    def run(self, stop: threading.Event | None = None) -> None:
        """Run ticks until `stop` is set or `request_stop` is called."""
        stop = stop or threading.Event()
        self._stop_event = stop
        next_tick = 0.0
        while not stop.is_set() and not self._stopping:
            now = time.monotonic()
            due = next_tick
            if self._dirty:
                due = min(due, self._last_persist + PERSIST_INTERVAL_S)
            timeout = max(0.0, due - now)
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 4096):
                            pass
                else:
                    self._exited.add(key.data)
            with self.lock:
                if time.monotonic() >= next_tick:
                    self.tick()
                    next_tick = time.monotonic() + self.limits.poll_interval
                else:
                    self.quick_tick()

    def request_stop(self) -> None:
        self._stopping = True
        self.wake()

    def _step(self, name: str, fn: Callable[[], None]) -> None:
        """Run one step of a pass; a failure (a full disk, a broken team file) is reported and
        the leader carries on, rather than taking every task down with it."""
        try:
            fn()
        except Exception as exc:
            message = f"{name} failed: {exc!r}"
            if self._step_errors.get(name) != message:  # once per new error, not every pass
                self._step_errors[name] = message
                with contextlib.suppress(Exception):
                    self.note(message)
        else:
            self._step_errors.pop(name, None)

    def quick_tick(self) -> None:
        """The steps that must not wait for the next full tick: reap, notify, start, persist."""
        now = time.time()
        self._step("reap", lambda: self.reap(only_signalled=True))
        self._step("teammates", self.swarm.check)
        self._step("notify", self.notify)
        self._step("evict", lambda: self.evict(now))
        self._step("start", self.start_pending)
        self._step("persist", self.persist)

    def tick(self) -> None:
        """One full supervisor pass."""
        now = time.time()
        self._step("reap", self.reap)
        self._step("teammates", self.swarm.check)
        self._step("start times", self.record_start_times)
        self._step("output", self.read_output)
        self._step("stall check", lambda: self.check_stalls(now))
        self._step("orphan cleanup", self.cleanup_orphans)
        self._step("task list", lambda: self.release_orphaned_tasks(now))
        self._step("notify", self.notify)
        self._step("evict", lambda: self.evict(now))
        self._step("start", self.start_pending)
        self._step("persist", self.persist)

    def reap(self, *, only_signalled: bool = False) -> None:
        """Finish tasks whose process has ended, with their exit code.

        With `only_signalled`, look only at the tasks whose pidfd reported an exit (a quick
        pass between ticks); a full tick looks at all of them.
        """
        exited, self._exited = self._exited, set()
        if only_signalled:  # (plus any already reaped elsewhere)
            ids = [i for i, p in self.procs.items() if i in exited or p.status is not None]
        else:
            ids = list(self.procs)
        for task_id in ids:
            proc = self.procs[task_id]
            if not proc.poll():
                self._finish_shell(task_id, proc)

    def record_start_times(self) -> None:
        """Note the start time of tasks started since the last tick (pid reuse protection)."""
        for task_id, proc in self.procs.items():
            if proc.started_at is None:
                proc.started_at = process_start_time(proc.pid)
                if proc.started_at is not None:
                    self._set(task_id, pid_started_at=proc.started_at)

    def _finish_shell(
        self,
        task_id: str,
        proc: shell.ShellProcess | None,
        *,
        killed: bool = False,
        ended_unattended: bool = False,
    ) -> None:
        task = self.registry.get(task_id)
        self._unwatch(task_id)
        if not isinstance(task, LocalShellTaskState) or task.is_terminal:
            return
        # Our own child: its wait status is the wrapper's (= the command's) exit code. A task
        # adopted after a restart has only what the wrapper recorded on disk.
        code = proc.returncode() if proc is not None else None
        if code is None:
            code = shell.recorded_exit(task.output_file)
        self._read_delta(task)
        if killed or task.kill_reason:
            result = ShellResult(code=code if code is not None else 137, interrupted=True)
            self._move(task_id, TaskStatus.KILLED, result=result)
            if not task.kill_reason or task.kill_reason == "stopped on request":
                # A kill the user asked for is not news: no notification, no 137 "failure".
                self.registry.mark_notified(task_id)
                self.emit(task_terminated_event(self.registry.get(task_id)))  # type: ignore[arg-type]
                self._announced.add(task_id)
            return
        if code is None:
            error = (
                "ended while no leader was running and recorded no exit code"
                if ended_unattended
                else "ended without recording an exit code (killed?)"
            )
            self._move(task_id, TaskStatus.FAILED, result=ShellResult(code=-1), error=error)
        elif code == 0:
            self._move(task_id, TaskStatus.COMPLETED, result=ShellResult(code=0))
        else:
            self._move(task_id, TaskStatus.FAILED, result=ShellResult(code=code))

    def _read_delta(self, task: LocalShellTaskState) -> int:
        """Advance the task's reported offset over new output (8 MiB a read); returns growth."""
        data, offset = read_output_delta(task.output_file, task.output_offset)
        if not data:
            return 0
        lines = data.count(b"\n")
        self._update(
            task.id,
            lambda t: evolve(
                t,
                output_offset=offset,
                last_reported_total_lines=t.last_reported_total_lines + lines,
            ),
        )
        return len(data)

    def read_output(self) -> None:
        """Read each running task's output delta; kill a task past the output cap."""
        for task_id in list(self.procs):
            task = self.registry.get(task_id)
            if not isinstance(task, LocalShellTaskState):
                continue
            size = output_size(task.output_file)  # (one stat when nothing was written)
            if size > task.output_offset:
                self._read_delta(task)
            if size > self.limits.output_cap:
                reason = (
                    f"output reached {size} bytes, over the cap of {self.limits.output_cap} bytes"
                )
                self._set(task_id, kill_reason=reason)
                proc = self.procs.get(task_id)
                if proc is not None:
                    shell.kill(proc, self.limits.kill_grace)
                self._finish_shell(task_id, proc, killed=True)
                self.note(f"killed {task_id}: {reason}")

    def check_stalls(self, now: float) -> None:
        """Every stall interval: a task silent for `stall_after` at a prompt is reported once."""
        if now - self._last_stall_check < self.limits.stall_check_interval:
            return
        self._last_stall_check = now
        for task_id in list(self.procs):
            task = self.registry.get(task_id)
            if not isinstance(task, LocalShellTaskState) or task.kind == "monitor":
                continue
            size = output_size(task.output_file)
            last_size, since = self._last_growth.get(task_id, (-1, now))
            if size != last_size:
                self._last_growth[task_id] = (size, now)
                continue
            if task.stall_notified or now - since < self.limits.stall_after:
                continue
            prompt = shell.looks_like_prompt(task.output_file)
            if prompt is None:
                continue
            self._set(task_id, stall_notified=True)
            text = stall_notification_xml(task, tail(task.output_file, 1024))
            self.emit(
                {
                    "type": "system",
                    "subtype": "task_stalled",
                    "task_id": task_id,
                    "prompt": prompt,
                    "notification": text,
                }
            )
            self._deliver(task, text, status="running", msg_id=None)

    def release_orphaned_tasks(self, now: float) -> None:
        """Every few seconds: list tasks owned by members that died or left go back to pending
        (teammates this leader runs are settled at once when they end)."""
        if now - self._last_release < RELEASE_INTERVAL_S:
            return
        self._last_release = now
        try:
            released = TaskList(self.teams, self.team).release_orphaned()
        except ShoalError as exc:
            self.note(f"could not check the task list: {exc}")
            return
        if released:
            self.note(
                "tasks of departed members went back to pending: "
                + ", ".join(f"{t.id} ({t.subject})" for t in released)
            )

    def cleanup_orphans(self) -> None:
        """Kill shell tasks whose owning agent has exited or left the team."""
        owned = [
            t
            for t in self.registry.get_all_tasks()
            if isinstance(t, LocalShellTaskState) and t.agent_id and not t.is_terminal
        ]
        if not owned:
            return
        states = {v.member.name: v.state for v in self.teams.members(self.team)}
        for task in owned:
            if states.get(task.agent_id or "") in (MemberState.DEAD, MemberState.LEFT, None):
                reason = f"its agent {task.agent_id} exited"
                self._set(task.id, kill_reason=reason)
                proc = self.procs.get(task.id)
                if proc is not None:
                    shell.kill(proc, self.limits.kill_grace)
                self._finish_shell(task.id, proc, killed=True)

    def notify(self) -> None:
        """Send each terminal task's notification exactly once."""
        for task in self.registry.terminal_tasks():
            if task.notified or not self.registry.mark_notified(task.id):
                continue
            self._dirty = True
            final = self.registry.get(task.id)
            assert final is not None
            summary = summary_for(final)
            if task.id not in self._announced:
                self.emit(task_terminated_event(final, summary))
                self._announced.add(task.id)
            text = task_notification_for(final, summary)
            self._deliver(
                final,
                text,
                status=final.status.value,
                msg_id=notification_id(final.id),
            )
            self.emit(
                {
                    "type": "system",
                    "subtype": "task_notification",
                    "task_id": final.id,
                    "owner": final.owner,
                    "status": final.status.value,
                    "notification": text,
                }
            )

    def _deliver(self, task: AnyTaskState, text: str, *, status: str, msg_id: str | None) -> None:
        owner = task.owner
        if not owner or owner == LEAD_NAME:
            return  # the lead reads notifications from the event stream
        try:
            inbox = self.teams.directory(self.team).inbox(owner)
            msg = make_message(
                sender=LEAD_NAME,
                to=owner,
                kind="task_notification",
                text=text,
                summary=text.split("<summary>")[-1].split("</summary>")[0],
                data={
                    "task_id": task.id,
                    "status": status,
                    "task_type": task.type.value,
                    "output_file": task.output_file,
                },
                message_id=msg_id,
            )
            deliver_to(inbox, msg)
        except ShoalError as exc:
            self.note(f"could not notify {owner} about {task.id}: {exc}")

    def evict(self, now: float) -> None:
        """Drop terminal, notified tasks (after their grace) into history."""
        for task in self.registry.evict(now):
            self.session.record_history(task)
            self._last_growth.pop(task.id, None)
            self._dirty = True

    # -- control requests ------------------------------------------------------------------------

    def _on_message(self, msg: AnyMessage) -> None:
        if not isinstance(msg, ControlMessage):
            self.emit({"type": "message", "message": msg.model_dump(mode="json", by_alias=True)})
            with self.lock:
                self.swarm.on_message(msg)
            self.wake()
            return
        if msg.data.op == "spawn" and not self._stopping:
            self._spawn_later(msg)
            return
        request_id = msg.data.request_id
        reply: dict[str, Any]
        try:
            result = self.handle_control(msg.data.op, msg.data.args)
            reply = {"request_id": request_id, "ok": True, "result": result}
        except ShoalError as exc:
            reply = {
                "request_id": request_id,
                "ok": False,
                "error": str(exc),
                "code": exc.exit_code,
            }
        except Exception as exc:  # a bug must not kill the leader; the client hears of it
            reply = {
                "request_id": request_id,
                "ok": False,
                "error": f"internal error: {exc!r}",
                "code": 1,
            }
        self._reply(msg, reply)

    def _spawn_later(self, msg: ControlMessage) -> None:
        """Start teammates now; answer the client once they are ready (or failed)."""
        request_id = msg.data.request_id
        batch = msg.data.args.get("batch")

        def answer(result: Any, error: ShoalError | None) -> None:
            if error is not None:
                self._reply(
                    msg,
                    {
                        "request_id": request_id,
                        "ok": False,
                        "error": str(error),
                        "code": error.exit_code,
                    },
                )
            else:
                self._reply(msg, {"request_id": request_id, "ok": True, "result": result})

        try:
            if isinstance(batch, list):
                self.swarm.spawn_many(batch, answer)
            else:
                self.swarm.spawn(msg.data.args, answer)
        except ShoalError as exc:
            answer(None, exc)
        except Exception as exc:  # a bug must not kill the leader; the client hears of it
            self._reply(
                msg,
                {
                    "request_id": request_id,
                    "ok": False,
                    "error": f"internal error: {exc!r}",
                    "code": 1,
                },
            )

    def _reply(self, msg: AnyMessage, reply: dict[str, Any]) -> None:
        from shoal.orchestrator.control import reply_inbox_path

        if not msg.reply_to:
            return
        path = reply_inbox_path(self.layout, self.team, msg.reply_to)
        if path is None or not path.is_dir():
            return  # the client gave up waiting
        try:
            deliver_to(
                path,
                make_message(sender=LEAD_NAME, to=msg.reply_to, kind="control_reply", data=reply),
            )
        except (ShoalError, OSError) as exc:
            # (e.g. an answer over the message cap): the client must not wait for nothing.
            op = getattr(msg.data, "op", msg.kind)
            self.note(f"could not answer the {op!r} request {reply.get('request_id')}: {exc}")
            failed = {
                "request_id": reply.get("request_id"),
                "ok": False,
                "error": f"the leader could not send its answer: {exc}",
                "code": 1,
            }
            with contextlib.suppress(ShoalError, OSError):
                deliver_to(
                    path,
                    make_message(
                        sender=LEAD_NAME, to=msg.reply_to, kind="control_reply", data=failed
                    ),
                )

    def _task_from_spec(self, spec: dict[str, Any]) -> LocalShellTaskState:
        return self.make_shell_task(
            list(spec.get("command") or []),
            description=spec.get("description"),
            agent=spec.get("agent"),
            cwd=spec.get("cwd"),
            env=spec.get("env"),
            kind=spec.get("kind", "bash"),
            background=bool(spec.get("background", True)),
        )

    def handle_control(self, op: str, args: dict[str, Any]) -> Any:
        """Carry out one control request; returns JSON-able data or raises ShoalError."""
        if self._stopping and op in ("sh", "spawn"):
            raise TaskError(f"the leader of team {self.team!r} is shutting down; nothing started")
        if op == "ping":
            return {"session_id": self.session.id, "pid": os.getpid()}
        if op == "sh":
            specs = args.get("batch")
            if specs is None:
                specs = [args]
            if not isinstance(specs, list) or not all(isinstance(x, dict) for x in specs):
                raise TaskError("'batch' must be a list of task specs")
            tasks = [self._task_from_spec(spec) for spec in specs]  # all checked before any runs
            started = self.submit(tasks)
            if args.get("batch") is None:
                return started[0].model_dump(mode="json")
            return [t.model_dump(mode="json") for t in started]
        if op == "stop":
            return self.stop_task(str(args.get("task_id"))).model_dump(mode="json")
        if op == "down":
            self.request_stop()
            return {
                "stopping": True,
                "running": len(self.procs),
                "teammates": sorted(self.swarm.members),
            }
        raise TaskError(f"unknown control operation {op!r}")

    # -- shutdown --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every task this leader owns, notify, persist and step down as lead."""
        self._stopping = True
        killed = self.swarm.shutdown_all()  # the inbox still reads their answers meanwhile
        if killed:
            self.note(f"killed teammates that did not shut down: {', '.join(killed)}")
        if self._subscription is not None:
            self._subscription.stop()
        with self.lock:
            for task_id in list(self.procs):
                with contextlib.suppress(ShoalError):
                    self.stop_task(task_id, reason="stopped on request")
            for task_id in list(self.queue):
                self._move(task_id, TaskStatus.KILLED, kill_reason="leader shut down")
            self.queue.clear()
            self.notify()
            self.persist(force=True)
        if self._inbox is not None:
            self._inbox.close()
        with contextlib.suppress(ShoalError):
            me, _ = current_identity()
            lead = self.teams.read(self.team).member(LEAD_NAME)
            if lead is not None and lead.pid == me:
                self.teams.update_member(self.team, LEAD_NAME, pid=None, pid_started_at=None)
        self.emit({"type": "system", "subtype": "leader_stopped", "team": self.team})
        self._selector.close()
        self.session.close()
        for fd in (self._wake_r, self._wake_w, *self._pidfds.values()):
            with contextlib.suppress(OSError):
                os.close(fd)


def _raise_fd_limit(want: int = 65536) -> None:
    """Raise this process's soft limit of open files towards the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _new_session_id() -> str:
    return str(ULID()).lower()
