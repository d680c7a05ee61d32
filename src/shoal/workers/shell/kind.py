"""Background shell tasks for the leader's loop (`ShellKind`): a process group per task
(process.py), its output read into the record and held under the cap (output_cap.py), a
silent task at a prompt reported once, and kills that never wait.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from shoal.core.errors import ShoalError, TaskError
from shoal.core.events import TaskStalled, task_started
from shoal.core.notify import stall_notification_xml, stall_summary
from shoal.core.output import output_size, read_output_delta, tail, tail_lines
from shoal.core.procs import process_start_time
from shoal.core.sandbox import Policy
from shoal.core.secretenv import lost_env_error
from shoal.core.taskrecords import ShellResult
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    LocalShellTaskState,
    TaskStatus,
    TaskType,
    missing_env,
)
from shoal.workers.agent.attachments import note_owned
from shoal.workers.kinds import TaskStore, end_unannounced
from shoal.workers.process_kind import ProcessKind
from shoal.workers.shell.output_cap import (
    CAP_CHECK_FLOOR_S,
    cap_reached,
    cap_reason,
    next_cap_check,
    output_limit,
)
from shoal.workers.shell.process import (
    EXIT_KILLED,
    ShellProcess,
    exit_file_for,
    kill_leftover_group,
    locate,
    open_stdin_fifo,
    recorded_exit,
    recorded_pid,
    start,
)

PROMPT_PATTERNS = re.compile(
    r"(\(y/n\)|\[y/n\]|\(yes/no\)|press (enter|any key)|continue\?|overwrite\?"
    r"|^(do you|would you|shall i|are you sure|ready to)\b.*\?)",
    re.IGNORECASE,
)


def looks_like_prompt(output_file: str | Path) -> str | None:
    """The last line of the output if it looks like an interactive prompt, else None."""
    lines = [ln for ln in tail_lines(output_file, n=5) if ln.strip()]
    if not lines:
        return None
    last = lines[-1].strip()
    return last if PROMPT_PATTERNS.search(last) else None


class ShellKind(ProcessKind[ShellProcess]):
    """`local_bash` tasks for the leader's loop: start, reap, output, stalls and kills.

    Live handles (the processes, the kills in progress) stay here in memory; the task records
    in the store hold only plain data (kills: see workers/process_kind.py).
    """

    types = frozenset({TaskType.LOCAL_BASH})

    def __init__(self) -> None:
        self.procs: dict[str, ShellProcess] = {}
        super().__init__(self.procs)
        self._growth: dict[str, tuple[int, float]] = {}  # task -> (size, since when)
        self._output: dict[str, tuple[str, int]] = {}  # task -> (output file, offset read)
        # Output-cap watch of fast writers only: task -> when to look again, and the size
        # seen last (with when), from which the growth rate is measured.
        self._cap_due: dict[str, float] = {}
        self._sizes: dict[str, tuple[int, float]] = {}
        self._next_stall_check = 0.0

    # -- the protocol ------------------------------------------------------------------------

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, LocalShellTaskState)
        lost = missing_env(task)
        if lost:  # (never run without them: the command would see them unset)
            why = lost_env_error(task.id, lost, "shoal sh")
            store.move_task(task.id, TaskStatus.FAILED, error=why, result=ShellResult(code=-1))
            store.emit(task_started(store.get(task.id) or task))
            return
        try:
            proc = start(
                list(task.argv),
                task.output_file,
                cwd=task.cwd,
                env=_environ(store.environ, {**(task.env or {}), **(task.env_values or {})}),
                # (the session's tasks/ directory was checked against symlinks when it was
                # made; the file itself is opened O_EXCL|O_NOFOLLOW)
                stdin=Path(task.stdin_fifo) if task.stdin_fifo else None,
                sandbox=Policy.from_json(task.sandbox) if task.sandbox is not None else None,
                file_limit=output_limit(store.limits.output_cap),
            )
        except (ShoalError, OSError, ValueError) as exc:
            store.move_task(task.id, TaskStatus.FAILED, error=str(exc), result=ShellResult(code=-1))
        else:
            store.move_task(
                task.id,
                TaskStatus.RUNNING,
                pid=proc.pid,
                pid_started_at=proc.started_at,
                start_time=time.time(),
            )
            self._watch(task.id, proc, store)
            # (its agent asks for its output from its next round on)
            note_owned(task, exit_file_for(task.output_file))
        store.emit(task_started(store.get(task.id) or task))

    # Looked at from the live handles: a quiet task costs a waitpid and a stat per pass, and
    # its record is read only when something happened.

    def _poll_reap(self, ids: list[str], store: TaskStore, now: float) -> None:
        super()._poll_reap(ids, store, now)
        if self._cap_due:  # (every pass, quick ones too: a fast writer cannot wait)
            self._check_fast_writers(store, now)

    def _poll_output(self, ids: list[str], store: TaskStore, now: float) -> None:
        for task_id in ids:
            self._record_start_time(task_id, store)
            self._read_output(task_id, store, now)

    def _poll_stalls(self, ids: list[str], store: TaskStore, now: float) -> None:
        if now < self._next_stall_check:  # (every stall interval, not every pass)
            return
        self._next_stall_check = now + store.limits.stall_check_interval
        for task_id in ids:
            task = store.get(task_id)
            if isinstance(task, LocalShellTaskState):
                self._check_stall(task, store, now)

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        if task.is_terminal or task.id in self.killing:
            return
        proc = self.procs.get(task.id)
        if proc is not None and not proc.poll():  # it ended already: that is its result
            self._finish(task.id, proc, store)
            return
        store.set_task(task.id, kill_reason=reason)
        if proc is None:
            self._finish(task.id, None, store, killed=True)
            return
        if not self._begin_kill(task.id, proc, store):
            proc.poll()
            self._finish(task.id, proc, store, killed=True)
            return
        if isinstance(task, LocalShellTaskState) and task.paused_at is not None:
            # A stopped group acts on the TERM only once it is continued.
            self.signal_group(task.id, signal.SIGCONT)
        store.wake()  # (the pidfd says when it ends; the deadline is in next_due)

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """A task of an earlier leader: watch it if it still runs, else give it the exit code
        its wrapper recorded. One that never started is left pending (the caller queues it)."""
        assert isinstance(task, LocalShellTaskState)
        started, proc = locate(task.pid, task.pid_started_at, task.output_file)
        if not started:
            return
        if task.status == TaskStatus.PENDING:
            store.move_task(
                task.id,
                TaskStatus.RUNNING,
                pid=proc.pid if proc else recorded_pid(task.output_file),
                pid_started_at=proc.started_at if proc else None,
            )
        if proc is not None:
            if task.stdin_fifo and os.path.exists(task.stdin_fifo):
                with contextlib.suppress(OSError, ShoalError):
                    proc.stdin = open_stdin_fifo(Path(task.stdin_fifo), create=False)
            self._watch(task.id, proc, store)
            store.note(f"adopted {task.id} (pid {proc.pid}): {task.command}")
        else:
            self._finish(task.id, None, store, ended_unattended=True)

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        return {}

    def _process(self, run: ShellProcess) -> ShellProcess:
        return run

    def _has_news(self, run: ShellProcess) -> bool:
        return run.status is not None  # (reaped already: by a kill, or a look at its output)

    def next_due(self) -> float | None:
        kills = super().next_due()
        caps = min(self._cap_due.values(), default=None)
        if kills is None or caps is None:
            return caps if kills is None else kills
        return min(kills, caps)

    # -- what `shoal pause/resume/send-input` ask of a live task ------------------------------

    def signal_group(self, task_id: str, signum: int) -> bool:
        """Send `signum` to the task's process group; False when it has no live process."""
        proc = self.procs.get(task_id)
        if proc is None:
            return False
        try:
            os.killpg(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def write_stdin(self, task_id: str, data: bytes) -> int:
        """Write `data` to the task's stdin without blocking; the bytes written. TaskError
        when it has no open stdin, or its pipe is full (the task does not read)."""
        proc = self.procs.get(task_id)
        if proc is None or proc.stdin is None:
            raise TaskError(f"task {task_id} has no open stdin (start it with `shoal sh --stdin`)")
        try:
            return os.write(proc.stdin, data)
        except BlockingIOError:
            raise TaskError(
                f"the stdin pipe of task {task_id} is full (it is not reading); nothing written"
            ) from None

    def close_stdin(self, task_id: str) -> bool:
        """Close the task's stdin (it reads EOF); False when it had none open."""
        proc = self.procs.get(task_id)
        return proc is not None and proc.close_stdin()

    def was_started(self, task: AnyTaskState) -> bool:
        """Whether an earlier leader got as far as starting `task` (see `locate`)."""
        assert isinstance(task, LocalShellTaskState)
        return locate(task.pid, task.pid_started_at, task.output_file)[0]

    # -- the steps ---------------------------------------------------------------------------

    def _watch(self, task_id: str, proc: ShellProcess, store: TaskStore) -> None:
        task = store.get(task_id)
        assert isinstance(task, LocalShellTaskState)
        self.procs[task_id] = proc
        self._output[task_id] = (task.output_file, task.output_offset)
        now = time.monotonic()
        self._sizes[task_id] = (task.output_offset, now)
        self._cap_due[task_id] = now + CAP_CHECK_FLOOR_S  # (its first look: see CAP_SLACK_MIN)
        store.watch_pid(task_id, proc.pid)

    def _settle_run(self, task_id: str, run: ShellProcess, store: TaskStore) -> None:
        self._finish(task_id, run, store, killed=task_id in self.killing)

    def _record_start_time(self, task_id: str, store: TaskStore) -> None:
        """Note a fresh task's start time (pid reuse protection) once it has exec'd."""
        proc = self.procs[task_id]
        if proc.started_at is None:
            proc.started_at = process_start_time(proc.pid)
            if proc.started_at is not None:
                store.set_task(task_id, pid_started_at=proc.started_at)

    def _read_delta(self, task: LocalShellTaskState, store: TaskStore) -> None:
        """Advance the task's reported offset over new output (8 MiB a read). Not of an
        agent's task: its agent is the reader, and the offset moves when an attachment
        reached it (workers/agent/attachments.py)."""
        if task.agent_task is not None:
            return
        data, offset = read_output_delta(task.output_file, task.output_offset)
        if not data:
            return
        lines = data.count(b"\n")
        store.set_task(
            task.id,
            output_offset=offset,
            last_reported_total_lines=task.last_reported_total_lines + lines,
        )
        if task.id in self._output:
            self._output[task.id] = (task.output_file, offset)

    def _read_output(self, task_id: str, store: TaskStore, now: float) -> None:
        path, offset = self._output[task_id]
        size = output_size(path)  # (one stat when nothing was written)
        if size <= offset:
            return
        task = store.get(task_id)
        if not isinstance(task, LocalShellTaskState):
            return
        if task.agent_task is None:
            self._read_delta(task, store)
        else:  # (only looked at here: its agent's attachments move its offset)
            self._output[task_id] = (path, size)
        self._check_cap(task_id, size, now, store)

    def _check_fast_writers(self, store: TaskStore, now: float) -> None:
        """Look at the size of each fast writer whose next look is due."""
        for task_id, due in list(self._cap_due.items()):
            if due <= now and task_id in self._output:
                self._check_cap(task_id, output_size(self._output[task_id][0]), now, store)

    def _check_cap(self, task_id: str, size: int, now: float, store: TaskStore) -> None:
        """Kill a task whose output passed the cap; else, from how fast its file grew since
        it was last looked at, say when to look again (sooner than the next full tick, for a
        task that could otherwise write past the cap's slack)."""
        if task_id in self.killing:
            self._cap_due.pop(task_id, None)
            return
        limits = store.limits
        cap = limits.output_cap
        if size > cap:
            self._cap_due.pop(task_id, None)
            reason = cap_reason(size, cap)
            task = store.get(task_id)
            if task is not None:
                self.kill(task, store, reason)
                store.note(f"killed {task_id}: {reason}")
            return
        last_size, last_seen = self._sizes.get(task_id, (size, now))
        self._sizes[task_id] = (size, now)
        # A quiet task is looked at every full tick, so its growth happened within one tick
        # of now, however long ago the size was last recorded.
        elapsed = min(max(now - last_seen, CAP_CHECK_FLOOR_S / 10), limits.poll_interval or 1.0)
        due = next_cap_check(cap, (size - last_size) / elapsed, limits.poll_interval or 1.0)
        if due is None:
            self._cap_due.pop(task_id, None)
        else:
            self._cap_due[task_id] = now + due

    def _check_stall(self, task: LocalShellTaskState, store: TaskStore, now: float) -> None:
        """Every stall interval: a task silent for `stall_after` at a prompt is reported once."""
        limits = store.limits
        if task.kind == "monitor":
            return
        size = output_size(task.output_file)
        last_size, since = self._growth.get(task.id, (-1, now))
        if size != last_size:
            self._growth[task.id] = (size, now)
            return
        if task.stall_notified or now - since < limits.stall_after:
            return
        prompt = looks_like_prompt(task.output_file)
        if prompt is None:
            return
        store.set_task(task.id, stall_notified=True)
        text = stall_notification_xml(task, tail(task.output_file, 1024))
        summary = stall_summary(task.description)
        store.emit(TaskStalled(task_id=task.id, prompt=prompt, notification=text, summary=summary))
        store.notify_owner(task, text, summary, status="running", msg_id=None)

    def _finish(
        self,
        task_id: str,
        proc: ShellProcess | None,
        store: TaskStore,
        *,
        killed: bool = False,
        ended_unattended: bool = False,
    ) -> None:
        """Give an ended task its final state (from its wait status, else its exit file)."""
        ended = self._forget(task_id, store)
        if ended is not None:
            ended.close_stdin()
        self._output.pop(task_id, None)
        self._growth.pop(task_id, None)
        self._cap_due.pop(task_id, None)
        self._sizes.pop(task_id, None)
        task = store.get(task_id)
        if not isinstance(task, LocalShellTaskState) or task.is_terminal:
            return
        # A task's children never outlive it: what its wrapper left behind (a `cmd &`, or
        # everything, when the wrapper itself was killed) goes with it.
        pgid = proc.pid if proc is not None else task.pid or recorded_pid(task.output_file)
        leftovers = kill_leftover_group(pgid)
        if leftovers:
            store.note(f"killed what {task_id} left running in its process group {pgid}")
        # Our own child: its wait status is the wrapper's (= the command's) exit code. A task
        # adopted after a restart has only what the wrapper recorded on disk.
        code = proc.returncode() if proc is not None else None
        if code is None:
            code = recorded_exit(task.output_file)
        self._read_delta(task, store)
        reason = task.kill_reason
        if not killed and not reason:
            reason = cap_reached(task.output_file, store.limits.output_cap)
            if reason:
                store.set_task(task_id, kill_reason=reason)
                store.note(f"{task_id} ended at the file size limit: {reason}")
        if killed or reason:
            result = ShellResult(code=code if code is not None else EXIT_KILLED, interrupted=True)
            store.move_task(task_id, TaskStatus.KILLED, result=result)
            if not reason or reason == STOPPED_ON_REQUEST:
                # A kill the user asked for is not news: no notification, no 137 "failure".
                end_unannounced(store, task_id)
            return
        if code is None:
            error = (
                "ended while no leader was running and recorded no exit code"
                if ended_unattended
                else "ended without recording an exit code (killed?)"
            )
            if leftovers:
                error += "; the processes it left in its group were killed"
            store.move_task(task_id, TaskStatus.FAILED, result=ShellResult(code=-1), error=error)
        elif code == 0:
            store.move_task(task_id, TaskStatus.COMPLETED, result=ShellResult(code=0))
        else:
            store.move_task(task_id, TaskStatus.FAILED, result=ShellResult(code=code))


def _environ(base: dict[bytes, bytes], extra: dict[str, str] | None) -> dict[bytes, bytes]:
    """The leader's environment (as at its start) plus a task's own variables."""
    if not extra:
        return base
    return {**base, **{os.fsencode(k): os.fsencode(v) for k, v in extra.items()}}
