"""When queued shell tasks start: groups with their own parallelism, priorities, `--after`
dependencies, delays, timeouts, retries and pausing (what pueue and GNU parallel users expect).

`Scheduler` is a policy of the leader's loop (its `policy` step enforces timeouts and starts
retries; `next_due` wakes the loop for delays and deadlines) and the body of the `start` step.
It owns the queue of tasks waiting to start: requests and resume add to it through
`enqueue`. (Pausing is a queue verb: task_ops.py.)
A queue of plain tasks in the default group keeps the leader's first-in first-out fast path;
the ordered pass (priority, then queue order) runs once any task or group needs it.

Rules, as in a batch spec (orchestrator/batch/spec.py): `after` tasks must complete, and a
task whose dependency failed or was killed fails unstarted, with the dependency named;
`after_any` waits for them to end however. A failed or timed-out attempt with retries left
is followed by a new attempt (a new task id, `retry_of` the old one, the old one's
`retried_as` the new one; only the last attempt's end is notified), started after the retry
delay, which doubles for each further attempt. A timeout counts running time only: time spent
paused is not counted.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from shoal.core.errors import ConflictError, NotFoundError, TaskError, UsageError
from shoal.core.events import Event, task_terminated
from shoal.core.names import validate_name
from shoal.core.tasks import (
    TIMED_OUT_REASON,
    AnyTaskState,
    LocalShellTaskState,
    TaskStatus,
    TaskType,
    new_task_id,
    retry_due,
)
from shoal.orchestrator.batch.spec import format_duration
from shoal.orchestrator.registry import TaskRegistry
from shoal.orchestrator.session import Snapshot
from shoal.teams.session import GroupState, Session
from shoal.workers.kinds import TaskKind, TaskStore
from shoal.workers.shell.kind import ShellKind


class SchedulerHost(TaskStore, Protocol):
    """What the scheduler needs of the leader (its registry, kinds and steps)."""

    jobs: int
    registry: TaskRegistry
    shell: ShellKind
    kinds: dict[TaskType, TaskKind]
    session: Session
    snapshot: Snapshot

    @property
    def stopping(self) -> bool: ...

    def admitted(self, task: AnyTaskState) -> bool: ...

    def slots_used(self) -> int:
        """Job slots taken: running shell tasks and remote jobs in flight."""
        ...

    def stop(
        self,
        task_id: str,
        on_done: Callable[[AnyTaskState], None] | None = None,
        reason: str = ...,
    ) -> AnyTaskState: ...

    def set_task(self, task_id: str, **changes: Any) -> bool: ...

    def history(self) -> dict[str, dict[str, Any]]:
        """Final records of evicted tasks by id (read as the history grows)."""
        ...

    def move_task(self, task_id: str, status: TaskStatus, **changes: Any) -> bool: ...

    def mark_notified(self, task_id: str) -> bool: ...

    def mark_dirty(self) -> None: ...

    def register(self, task: AnyTaskState) -> AnyTaskState: ...

    def emit(self, event: Event) -> None: ...

    def note(self, text: str) -> None: ...

    def persist(self, *, force: bool = False) -> None: ...

    def start_pending(self) -> None: ...


DEFAULT_GROUP: Final = "default"
TIMED_OUT: Final = TIMED_OUT_REASON


@dataclass
class Group:
    """A group of tasks: at most `parallel` of them run at once (0: no limit)."""

    name: str
    parallel: int = 0
    paused: bool = False


def paused_ms(task: LocalShellTaskState, now: float) -> int:
    """Milliseconds the task has spent paused, the current pause included."""
    current = 0 if task.paused_at is None else max(0.0, now - task.paused_at) * 1000
    return task.total_paused_ms + int(current)


def ran_for(task: LocalShellTaskState, now: float) -> float:
    """Seconds the task has been running, paused time excluded."""
    end = task.end_time if task.end_time is not None else now
    return max(0.0, end - task.start_time - paused_ms(task, now) / 1000)


class Scheduler:
    """Groups, the order of starts, and the timed rules of shell tasks (see the module)."""

    def __init__(self, leader: SchedulerHost) -> None:
        self.leader = leader
        self.queue: deque[str] = deque()  # pending tasks, in order, waiting to start
        self.groups: dict[str, Group] = {DEFAULT_GROUP: Group(DEFAULT_GROUP)}
        self.ordered = False  # the ordered pass is needed (sticky for the session)
        self._timed: set[str] = set()  # tasks with a timeout, until they end
        self._retrying: set[str] = set()  # tasks with retries left, until they are settled
        self._delayed: set[str] = set()  # pending tasks with a start time in the future
        self._explained: set[str] = set()  # fast path: queued tasks given their reason
        self._synced = False

    # -- the queue --------------------------------------------------------------------------

    def enqueue(self, task_id: str, *, first: bool = False) -> None:
        """A pending task joins the queue: at its end (a retry, `first`: at its front)."""
        if first:
            self.queue.appendleft(task_id)
        else:
            self.queue.append(task_id)

    def dequeue(self, task_id: str) -> None:
        """Take a task that never started out of the queue (if it is there)."""
        if task_id in self.queue:
            self.queue.remove(task_id)

    def drop_queued(self) -> list[str]:
        """Empty the queue (the leader shuts down); the ids it held, in order."""
        dropped = list(self.queue)
        self.queue.clear()
        return dropped

    # -- groups ---------------------------------------------------------------------------

    def group_limit(self, name: str) -> int:
        """The parallelism of group `name` (the default group's is the leader's `jobs`)."""
        return self.leader.jobs if name == DEFAULT_GROUP else self.groups[name].parallel

    def restore(self, groups: Mapping[str, GroupState]) -> None:
        """The groups of a resumed session (the default group's limit stays `--jobs`)."""
        for name, info in groups.items():
            group = self.groups.setdefault(name, Group(name))
            group.paused = info.paused
            if name != DEFAULT_GROUP:
                group.parallel = info.parallel
        if len(self.groups) > 1 or any(g.paused for g in self.groups.values()):
            self.ordered = True

    def dump(self) -> dict[str, Any]:
        """`groups` for state.json."""
        return {
            name: {"parallel": self.group_limit(name), "paused": g.paused}
            for name, g in self.groups.items()
        }

    def check_group(self, name: str) -> Group:
        """The group `name`, or NotFoundError naming `shoal group add`."""
        group = self.groups.get(name)
        if group is None:
            known = ", ".join(sorted(self.groups))
            raise NotFoundError(
                f"no group {name!r} (groups: {known}); add it with `shoal group add {name}`"
            )
        return group

    def add_group(self, name: str, parallel: int) -> dict[str, Any]:
        validate_name(name, "group name")
        if parallel < 0:
            raise UsageError(f"--parallel takes a count of 0 or more (0: no limit), not {parallel}")
        if name in self.groups:
            raise ConflictError(f"group {name!r} exists already (`shoal group list`)")
        self.groups[name] = Group(name, parallel)
        self.ordered = True
        self.leader.mark_dirty()
        return self.describe(name)

    def remove_group(self, name: str) -> dict[str, Any]:
        if name == DEFAULT_GROUP:
            raise TaskError("the default group cannot be removed")
        self.check_group(name)
        running = self.members(name, TaskStatus.RUNNING)
        if running:
            raise TaskError(
                f"group {name!r} has running tasks: {' '.join(running)}; stop them or wait"
            )
        queued = self.members(name, TaskStatus.PENDING)
        if queued:
            raise TaskError(f"group {name!r} has queued tasks: {' '.join(queued)}; stop them first")
        del self.groups[name]
        self.leader.mark_dirty()
        return {"name": name, "removed": True}

    def set_parallel(self, name: str, parallel: int) -> dict[str, Any]:
        if parallel < 0:
            raise UsageError(f"parallel takes a count of 0 or more (0: no limit), not {parallel}")
        group = self.check_group(name)
        if name == DEFAULT_GROUP:
            self.leader.jobs = parallel
        else:
            group.parallel = parallel
        self.leader.mark_dirty()
        self.leader.start_pending()  # (a raised limit starts what waited at once)
        return self.describe(name)

    def describe(self, name: str) -> dict[str, Any]:
        """One group's record: limit, paused, and its running and queued tasks."""
        group = self.groups[name]
        return {
            "name": name,
            "parallel": self.group_limit(name),
            "paused": group.paused,
            "running": self.members(name, TaskStatus.RUNNING),
            "pending": self.members(name, TaskStatus.PENDING),
        }

    def list_groups(self) -> list[dict[str, Any]]:
        return [self.describe(name) for name in sorted(self.groups)]

    def members(self, name: str, status: TaskStatus) -> list[str]:
        return [
            t.id
            for t in self.leader.registry.get_all_tasks()
            if isinstance(t, LocalShellTaskState) and t.group == name and t.status == status
        ]

    # -- what a new task asks for -------------------------------------------------------------

    def track(self, task: AnyTaskState) -> None:
        """Note what of `task` the scheduler must watch (on registering it)."""
        if not isinstance(task, LocalShellTaskState) or task.is_terminal:
            return
        if task.timeout is not None:
            self._timed.add(task.id)
        if task.retries > 0:
            self._retrying.add(task.id)
        if task.not_before is not None and task.status == TaskStatus.PENDING:
            self._delayed.add(task.id)
        if (
            task.after
            or task.after_any
            or task.priority
            or task.group != DEFAULT_GROUP
            or task.not_before is not None
            or task.paused_at is not None
        ):
            self.ordered = True

    def _sync(self) -> None:
        """Once: track the tasks a resumed session brought back."""
        if self._synced:
            return
        self._synced = True
        for task in self.leader.registry.get_all_tasks():
            self.track(task)

    # -- the start step -------------------------------------------------------------------------

    def start_pending(self) -> None:
        """Start queued tasks that may start now, highest priority first."""
        leader = self.leader
        self._sync()
        if not self.ordered:
            self._start_in_order()
            return
        now = time.time()
        queued: list[tuple[int, AnyTaskState]] = []
        for position, task_id in enumerate(self.queue):
            task = leader.registry.get(task_id)
            if task is not None and task.status == TaskStatus.PENDING:
                queued.append((position, task))
        queued.sort(key=lambda pt: (-_priority(pt[1]), pt[0]))
        running = self._running_by_group()
        done: set[str] = set()
        for _, task in queued:
            if leader.stopping:
                break
            reason, failure = self._blocked(task, running, now)
            if failure is not None:
                done.add(task.id)
                leader.move_task(task.id, TaskStatus.FAILED, error=failure, pending_reason=None)
                continue
            if reason is not None:
                if isinstance(task, LocalShellTaskState):
                    leader.set_task(task.id, pending_reason=reason)
                continue
            done.add(task.id)  # (one not admitted, e.g. waiting for a lease, is queued again
            if not leader.admitted(task):  # by what it waits for, as on the fast path)
                continue
            if isinstance(task, LocalShellTaskState):
                leader.set_task(task.id, pending_reason=None)
                running[task.group] = running.get(task.group, 0) + 1
                self._delayed.discard(task.id)
            current = leader.registry.get(task.id) or task
            leader.kinds[current.type].start(current, leader)
        if done or len(queued) != len(self.queue):
            keep = {t.id for _, t in queued} - done
            left = [i for i in self.queue if i in keep]
            self.queue.clear()
            self.queue.extend(left)

    def _start_in_order(self) -> None:
        """The fast path: first in, first out, while the default group has room."""
        leader = self.leader
        while self.queue and not leader.stopping:
            if leader.jobs > 0 and leader.slots_used() >= leader.jobs:
                self._explain_full()
                return
            task = leader.registry.get(self.queue.popleft())
            if task is not None and task.status == TaskStatus.PENDING and leader.admitted(task):
                if isinstance(task, LocalShellTaskState) and task.pending_reason is not None:
                    leader.set_task(task.id, pending_reason=None)
                    task = leader.registry.get(task.id) or task
                self._explained.discard(task.id)
                leader.kinds[task.type].start(task, leader)

    def _explain_full(self) -> None:
        """Give each newly queued task the reason it waits (once per task).

        New tasks join the queue at its end (a retry at its front), so the walk from each end
        stops at the first task told already: a long queue costs nothing per ended task."""
        leader = self.leader
        reason = f"waiting for a slot: group {DEFAULT_GROUP} runs {leader.jobs} at a time"
        for ids in (iter(self.queue), reversed(self.queue)):
            fresh = list(itertools.takewhile(lambda i: i not in self._explained, ids))
            for task_id in fresh:
                self._explained.add(task_id)
                task = leader.registry.get(task_id)
                if isinstance(task, LocalShellTaskState):
                    leader.set_task(task_id, pending_reason=reason)

    def _running_by_group(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for task_id in self.leader.shell.procs:
            task = self.leader.registry.get(task_id)
            group = task.group if isinstance(task, LocalShellTaskState) else DEFAULT_GROUP
            counts[group] = counts.get(group, 0) + 1
        return counts

    def _blocked(
        self, task: AnyTaskState, running: dict[str, int], now: float
    ) -> tuple[str | None, str | None]:
        """(why it waits, why it can never start): both None when it may start now."""
        if not isinstance(task, LocalShellTaskState):
            limit = self.leader.jobs
            if limit > 0 and self.leader.slots_used() >= limit:
                return "waiting for a slot", None
            return None, None
        for dep in task.after:
            status, final = self._dependency(dep)
            if status is None:
                return f"waiting for {final} to complete", None
            if status != TaskStatus.COMPLETED:
                return None, f"not started: {final}, which it runs after, {status.value}"
        for dep in task.after_any:
            status, final = self._dependency(dep)
            if status is None:
                return f"waiting for {final} to end", None
        if task.paused_at is not None:
            return "paused", None
        group = self.groups.get(task.group)
        if group is None:
            return None, f"not started: its group {task.group!r} was removed"
        if group.paused:
            return f"group {task.group} is paused", None
        if task.not_before is not None and now < task.not_before:
            what = "retry" if task.retry_of else "start"
            return f"{what} at {time.strftime('%H:%M:%S', time.localtime(task.not_before))}", None
        limit = self.group_limit(task.group)
        if limit > 0 and running.get(task.group, 0) >= limit:
            return f"waiting for a slot: group {task.group} runs {limit} at a time", None
        return None, None

    def _dependency(self, task_id: str) -> tuple[TaskStatus | None, str]:
        """(the final status, None while it has not ended; the id of its last attempt)."""
        seen: set[str] = set()
        while task_id not in seen:
            seen.add(task_id)
            raw = self._record(task_id)
            if raw is None:
                return TaskStatus.FAILED, task_id  # (checked at submit; gone since: cleaned)
            status = TaskStatus(raw["status"])
            retried_as = raw.get("retried_as")
            if status not in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.KILLED):
                return None, task_id
            if not retried_as:
                return status, task_id
            task_id = retried_as
        return TaskStatus.FAILED, task_id

    def _record(self, task_id: str) -> dict[str, Any] | None:
        task = self.leader.registry.get(task_id)
        if task is not None:
            return {"status": task.status.value, "retried_as": getattr(task, "retried_as", None)}
        return self.leader.history().get(task_id)

    def known_ids(self) -> Iterable[str]:
        """Every task id of the session (live and evicted), for lookups by prefix."""
        yield from (t.id for t in self.leader.registry.get_all_tasks())
        yield from self.leader.history()

    # -- the policy step --------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """(Nothing to learn from events: the registry says it all.)"""

    def step(self, leader: Any, now: float) -> None:
        """Kill what ran past its timeout; follow failed attempts with their retries."""
        self._sync()
        wall = time.time()
        for task_id in list(self._timed):
            task = self.leader.registry.get(task_id)
            if not isinstance(task, LocalShellTaskState) or task.is_terminal:
                self._timed.discard(task_id)
                continue
            if task.status != TaskStatus.RUNNING or task.timeout is None:
                continue
            if task.id in self.leader.shell.killing or task.paused_at is not None:
                continue
            if ran_for(task, wall) >= task.timeout:
                self._timed.discard(task_id)
                self.leader.stop(task_id, reason=TIMED_OUT + format_duration(task.timeout))
        for task_id in list(self._retrying):
            task = self.leader.registry.get(task_id)
            if not isinstance(task, LocalShellTaskState):
                self._retrying.discard(task_id)
            elif task.is_terminal:
                self._retrying.discard(task_id)
                if self._should_retry(task):
                    self._retry(task, wall)
        if self._delayed and self.queue:
            self.start_pending()

    def _should_retry(self, task: LocalShellTaskState) -> bool:
        if task.retried_as or self.leader.stopping:
            return False
        # (pid None: it never ran, a failed start or a failed dependency)
        return retry_due(task.status.value, task.retries, task.pid, task.notified, task.kill_reason)

    def _retry(self, task: LocalShellTaskState, now: float) -> None:
        """Start the next attempt of `task` (a new id) after its retry delay."""
        leader = self.leader
        new_id = new_task_id(task.type)
        delay = task.retry_delay
        record = task.model_dump()
        record.update(
            id=new_id,
            status=TaskStatus.PENDING,
            output_file=str(leader.session.output_file(new_id)),
            output_offset=0,
            start_time=now,
            end_time=None,
            notified=False,
            result=None,
            pid=None,
            pid_started_at=None,
            kill_reason=None,
            error=None,
            stall_notified=False,
            last_reported_total_lines=0,
            completion_status_sent_in_attachment=False,
            total_paused_ms=0,
            paused_at=None,
            pending_reason=None,
            attempt=task.attempt + 1,
            retries=task.retries - 1,
            retry_of=task.id,
            retried_as=None,
            after=(),
            after_any=(),
            not_before=now + delay if delay else None,
            retry_delay=delay * 2 if delay else None,
            stdin_fifo=str(leader.session.tasks_dir / f"{new_id}.stdin")
            if task.stdin_fifo
            else None,
            env_values=task.env_values,  # (never in a dump: held in memory only)
        )
        retry = LocalShellTaskState.model_validate(record)
        leader.set_task(task.id, retried_as=new_id)
        # Its end is not news yet: the last attempt's is (so it is announced, not notified).
        if leader.mark_notified(task.id):
            final = leader.registry.get(task.id) or task
            leader.emit(task_terminated(final))
            leader.snapshot.announced.add(task.id)
        how = (
            f"exit code {task.result.code}"
            if task.result is not None and task.status == TaskStatus.FAILED
            else task.kill_reason or task.status.value
        )
        when = f" in {format_duration(delay)}" if delay else ""
        leader.note(
            f"{task.id} {task.status.value} ({how}); retrying as {new_id} "
            f"(attempt {retry.attempt} of {retry.attempt + task.retries - 1}){when}"
        )
        leader.register(retry)
        self.enqueue(new_id, first=True)
        self.track(retry)
        leader.start_pending()

    def next_due(self) -> float | None:
        """The next monotonic time a delay ends or a timeout falls due."""
        wall, mono = time.time(), time.monotonic()
        due: list[float] = []
        for task_id in list(self._delayed):
            task = self.leader.registry.get(task_id)
            if not isinstance(task, LocalShellTaskState) or task.status != TaskStatus.PENDING:
                self._delayed.discard(task_id)
            elif task.not_before is not None:
                due.append(mono + max(0.0, task.not_before - wall))
        for task_id in self._timed:
            task = self.leader.registry.get(task_id)
            if (
                isinstance(task, LocalShellTaskState)
                and task.status == TaskStatus.RUNNING
                and task.timeout is not None
                and task.paused_at is None
            ):
                due.append(mono + max(0.0, task.timeout - ran_for(task, wall)))
        return min(due, default=None)


def _priority(task: AnyTaskState) -> int:
    return task.priority if isinstance(task, LocalShellTaskState) else 0
