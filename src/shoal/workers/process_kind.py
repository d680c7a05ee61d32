"""The shared base of the task kinds whose tasks are local processes (shell, agent, dream,
monitor): the live table, the pidfd exits the loop reports, the kills in progress, and how a
kind starts a helper process of its own.

A kill is a state: TERM to the task's process group and a deadline (a `Termination` each, in
`killing`); a later REAP poll sends what is due (TERM once more, then KILL) and settles the
task once its process is gone, so no step ever waits out a grace period.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from shoal.core.events import task_started
from shoal.core.procs import Termination, process_start_time, terminate
from shoal.core.tasks import AnyTaskState, TaskStatus
from shoal.workers.kinds import Poll, TaskStore
from shoal.workers.shell.process import ShellProcess

R = TypeVar("R")


class ProcessKind(ABC, Generic[R]):
    """The part of `TaskKind` every process kind shares, over its live table (task id ->
    what the kind holds in memory about a running task: `R`)."""

    def __init__(self, table: dict[str, R]) -> None:
        self._table = table
        self.killing: dict[str, Termination] = {}
        """The kills in progress (task id -> its termination)."""
        self._news: set[str] = set()  # ids a pidfd (or a kill) pointed at since the last look

    @abstractmethod
    def _process(self, run: R) -> ShellProcess | None:
        """The process of a live task (None: it has none, e.g. an in-process agent)."""

    def _has_news(self, run: R) -> bool:
        """News of a live task that neither a pidfd nor a kill's deadline tells (none here)."""
        return False

    # -- TaskKind ----------------------------------------------------------------------------

    def poll(
        self, store: TaskStore, now: float, what: Poll, only: Iterable[str] | None = None
    ) -> None:
        """Hand the live ids (those of `only`, if given) to the look `what` names."""
        ids = self._ids(only)
        if what is Poll.REAP:
            self._poll_reap(ids, store, now)
        elif what is Poll.OUTPUT:
            self._poll_output(ids, store, now)
        elif what is Poll.STALLS:
            self._poll_stalls(ids, store, now)

    def _poll_reap(self, ids: list[str], store: TaskStore, now: float) -> None:
        """Settle the tasks among `ids` whose process ended or whose kill is done."""
        for task_id in ids:
            run = self._table.get(task_id)
            if run is not None and self._is_done(task_id, run):
                self._settle_run(task_id, run, store)

    def _is_done(self, task_id: str, run: R) -> bool:
        """Whether the live task is to be settled now (its process is reaped if it ended)."""
        proc = self._process(run)
        assert proc is not None
        return self._done_with(task_id, proc.poll())

    @abstractmethod
    def _settle_run(self, task_id: str, run: R, store: TaskStore) -> None:
        """Give an ended task its final state (and take it out of the live table)."""

    def _poll_output(self, ids: list[str], store: TaskStore, now: float) -> None:
        """Read what the tasks among `ids` wrote since the last look (nothing here)."""

    def _poll_stalls(self, ids: list[str], store: TaskStore, now: float) -> None:
        """Tell of the tasks among `ids` that seem stuck (none here)."""

    def live(self) -> Iterable[str]:
        return list(self._table)

    def running(self) -> int:
        return len(self._table)

    def on_exit(self, key: str) -> bool:
        if key in self._table:
            self._news.add(key)
            return True
        return False

    def signalled(self) -> Iterable[str]:
        news, self._news = self._news, set()
        now = time.monotonic()
        due = {i for i, k in self.killing.items() if k.next_due() <= now}
        return [i for i, r in self._table.items() if i in news or i in due or self._has_news(r)]

    def next_due(self) -> float | None:
        return min((k.next_due() for k in self.killing.values()), default=None)

    def kill_all_now(self, grace: float) -> None:
        """Stop every task's process, waiting (for cleanup at exit, when no loop runs)."""
        for run in list(self._table.values()):
            proc = self._process(run)
            if proc is not None:
                terminate(proc.pid, proc.started_at, grace=grace, group=True)
                proc.poll()  # (reap our child now, so no zombie lingers)

    # -- the steps ---------------------------------------------------------------------------

    def _ids(self, only: Iterable[str] | None) -> list[str]:
        """The live ids among `only` (every live one, when None)."""
        return list(self._table) if only is None else [i for i in only if i in self._table]

    def _running(self, task: AnyTaskState, run: R, store: TaskStore, **changes: Any) -> None:
        """A task whose process was spawned: live now, moved to running with `changes` (its
        pid), its process watched (a pidfd), and its start announced."""
        self._table[task.id] = run
        store.move_task(task.id, TaskStatus.RUNNING, **changes)
        proc = self._process(run)
        if proc is not None:
            store.watch_pid(task.id, proc.pid)
        store.emit(task_started(store.get(task.id) or task))

    def _begin_kill(self, task_id: str, proc: ShellProcess, store: TaskStore) -> bool:
        """TERM the task's process group and start its kill's clock; False when the process
        was gone already (what its group left gets KILL at once)."""
        ending = Termination(proc.pid, proc.started_at, grace=store.limits.kill_grace, group=True)
        self.killing[task_id] = ending
        return ending.begin()

    def _done_with(self, task_id: str, alive: bool) -> bool:
        """Whether a task whose process is `alive` (or not) is to be settled now: its process
        has ended, or, for one being killed, its kill is done (this advances it a step)."""
        ending = self.killing.get(task_id)
        if ending is not None:
            return ending.advance(alive=alive)
        return not alive

    def _forget(self, task_id: str, store: TaskStore) -> R | None:
        """Take an ended task out of the live table, with its kill, news and pidfd watch."""
        run = self._table.pop(task_id, None)
        self.killing.pop(task_id, None)
        self._news.discard(task_id)
        store.unwatch_pid(task_id)
        return run


def spawn_logged(
    argv: list[str], env: Mapping[bytes, bytes] | Mapping[str, str], log: str | os.PathLike[str]
) -> ShellProcess:
    """Start `argv` in a session of its own, stdin /dev/null, stdout and stderr appended to
    `log` (created 0600; a symlink there is refused): a handle on it (our child, its start
    time read now). The one way a kind starts a helper process of its own (an agent's
    runner, a dream's, an MCP monitor)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(fd)
    return ShellProcess(pid, process_start_time(pid), child=True)
