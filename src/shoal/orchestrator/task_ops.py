"""The leader's side of the queue verbs (`shoal group/parallel/pause/resume/restart/clean/
send-input`, and `sh`'s queueing options): each request checked, then carried out on the
loop's thread through the scheduler and the shell kind.

Task ids in these requests may be any unique prefix of an id of the session (live or
finished), resolved by core/ids.py's `resolve_task_id`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Protocol

from shoal.channel.protocol import (
    CleanRequest,
    GroupAddRequest,
    GroupListRequest,
    GroupRemoveRequest,
    ParallelRequest,
    PauseRequest,
    QueueRequest,
    RestartRequest,
    SendInputRequest,
    ShellSpec,
)
from shoal.core.errors import NotFoundError, TaskError, UsageError
from shoal.core.ids import resolve_task_id
from shoal.core.tasks import (
    AnyTaskState,
    LocalShellTaskState,
    TaskStatus,
    TaskType,
    in_grace,
    parse_task_state,
)
from shoal.orchestrator.scheduling import DEFAULT_GROUP, Scheduler, SchedulerHost, paused_ms
from shoal.workers.shell import process as shell


class Leader(SchedulerHost, Protocol):
    """What the queue verbs need of the leader, beyond what its scheduler does."""

    scheduler: Scheduler

    def notify(self) -> None: ...

    def submit(self, tasks: list[LocalShellTaskState]) -> list[LocalShellTaskState]: ...

    def make_shell_task(self, command: list[str], **options: Any) -> LocalShellTaskState: ...

    def holds_notification(self, task_id: str) -> bool: ...

    def forget_history(self) -> None: ...


def queueing_options(leader: Leader, spec: ShellSpec) -> dict[str, Any]:
    """The task fields for `spec`'s queueing options, checked (a bad one is a UsageError
    naming it, and nothing starts)."""
    known: list[str] = []  # (every id of the session: read once, and only when a spec has deps)

    def deps(ids: list[str], flag: str) -> tuple[str, ...]:
        out: list[str] = []
        if ids and not known:
            known.extend(leader.scheduler.known_ids())
        for given in ids:
            try:
                out.append(resolve_task_id(known, given))
            except NotFoundError:
                raise UsageError(
                    f"{flag}: no task {given!r} in this session (see `shoal ps --all`)"
                ) from None
            except UsageError as exc:
                raise UsageError(f"{flag}: {exc}") from None
        return tuple(dict.fromkeys(out))

    group = spec.group or DEFAULT_GROUP
    if group not in leader.scheduler.groups:
        raise UsageError(
            f"--group: no group {group!r}; add it with `shoal group add {group}` "
            f"(groups: {', '.join(sorted(leader.scheduler.groups))})"
        )
    for flag, value in (("--timeout", spec.timeout), ("--retry-delay", spec.retry_delay)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be more than zero seconds, not {value:g}")
    if spec.delay is not None and spec.delay < 0:
        raise UsageError(f"--delay must not be negative, not {spec.delay:g}")
    if spec.retries < 0:
        raise UsageError(f"--retries takes a count of 0 or more, not {spec.retries}")
    if spec.retry_delay is not None and not spec.retries:
        raise UsageError("--retry-delay needs --retries N")
    options: dict[str, Any] = {
        "label": spec.label,
        "group": group,
        "priority": spec.priority,
        "after": deps(spec.after, "--after"),
        "after_any": deps(spec.after_any, "--after-any"),
        "timeout": spec.timeout,
        "retries": spec.retries,
        "retry_delay": spec.retry_delay,
        "not_before": time.time() + spec.delay if spec.delay else None,
    }
    return options


def handle(leader: Leader, request: QueueRequest) -> Any:
    """Carry out one queue request (on the loop's thread); its JSON-able result."""
    scheduler = leader.scheduler
    if isinstance(request, GroupAddRequest):
        return scheduler.add_group(request.name, request.parallel)
    if isinstance(request, GroupRemoveRequest):
        return scheduler.remove_group(request.name)
    if isinstance(request, GroupListRequest):
        return scheduler.list_groups()
    if isinstance(request, ParallelRequest):
        return scheduler.set_parallel(request.group, request.parallel)
    if isinstance(request, PauseRequest):
        if request.group is not None and request.task_ids:
            raise UsageError(f"{request.op} takes task ids or --group, not both")
        ids = [_live_id(leader, i) for i in request.task_ids]
        if request.group is None and not ids:
            raise UsageError(f"{request.op} takes task ids or --group G")
        if request.group is not None:
            scheduler.check_group(request.group)
        act = pause if request.op == "pause" else resume
        return act(leader, list(dict.fromkeys(ids)), request.group)
    if isinstance(request, RestartRequest):
        return restart(leader, request.task_id, in_place=request.in_place)
    if isinstance(request, CleanRequest):
        return clean(leader, request.force)
    return send_input(leader, request)


def pause(leader: Leader, task_ids: list[str], group: str | None) -> list[dict[str, Any]]:
    """SIGSTOP running tasks' process groups; pending ones are held. With `group`: the
    group starts nothing more and its running tasks are paused."""
    if group is not None:
        leader.scheduler.check_group(group).paused = True
        leader.scheduler.ordered = True
        leader.mark_dirty()
        task_ids = leader.scheduler.members(group, TaskStatus.RUNNING)
        tasks = [_pausable(leader, i) for i in task_ids]
        tasks = [t for t in tasks if t.paused_at is None]
    else:
        tasks = [_pausable(leader, i) for i in task_ids]
        for task in tasks:
            if task.paused_at is not None:
                raise TaskError(f"task {task.id} is paused already (`shoal resume {task.id}`)")
    now = time.time()
    for task in tasks:
        if task.status == TaskStatus.RUNNING:
            leader.shell.signal_group(task.id, signal.SIGSTOP)
        leader.set_task(task.id, paused_at=now)
        leader.scheduler.ordered = True
    leader.persist(force=True)
    return [_summary(leader, t.id) for t in tasks]


def resume(leader: Leader, task_ids: list[str], group: str | None) -> list[dict[str, Any]]:
    """SIGCONT paused tasks (their paused time is added to `total_paused_ms`); with
    `group`: the group starts tasks again and its paused tasks continue."""
    if group is not None:
        leader.scheduler.check_group(group).paused = False
        leader.mark_dirty()
        candidates = [
            t
            for t in leader.registry.get_all_tasks()
            if isinstance(t, LocalShellTaskState)
            and t.group == group
            and not t.is_terminal
            and t.paused_at is not None
        ]
    else:
        candidates = [_pausable(leader, i) for i in task_ids]
        for task in candidates:
            if task.paused_at is None:
                raise TaskError(f"task {task.id} is not paused")
    now = time.time()
    for task in candidates:
        if task.status == TaskStatus.RUNNING:
            leader.shell.signal_group(task.id, signal.SIGCONT)
        leader.set_task(task.id, paused_at=None, total_paused_ms=paused_ms(task, now))
    leader.start_pending()
    leader.persist(force=True)
    return [_summary(leader, t.id) for t in candidates]


def _pausable(leader: Leader, task_id: str) -> LocalShellTaskState:
    task = leader.registry.get(task_id)
    if task is None:
        raise NotFoundError(f"task {task_id} already finished (`shoal ps --all`)")
    if not isinstance(task, LocalShellTaskState):
        raise TaskError(f"task {task_id} is a {task.type.value} task; only shell tasks pause")
    if task.is_terminal:
        raise TaskError(f"task {task_id} already finished ({task.status.value})")
    return task


def _summary(leader: Leader, task_id: str) -> dict[str, Any]:
    task = leader.registry.get(task_id)
    assert task is not None
    return task.model_dump(mode="json")


def _live_id(leader: Leader, given: str) -> str:
    return resolve_task_id(leader.scheduler.known_ids(), given)


def find(leader: Leader, task_id: str) -> AnyTaskState:
    """Task `task_id` (a unique prefix), live or from the session's history."""
    full = _live_id(leader, task_id)
    task = leader.registry.get(full)
    if task is not None:
        return task
    raw = leader.history().get(full)
    if raw is None:  # (listed a moment ago: cleaned since)
        raise NotFoundError(f"no task {task_id!r} in this session (see `shoal ps --all`)")
    return parse_task_state(raw)


def restart(leader: Leader, task_id: str, *, in_place: bool) -> dict[str, Any]:
    """Run finished shell task `task_id` again: as a new task (its `restarted_from` the old
    one), or `in_place` under the same id (its output file starts afresh). The options it
    was started with carry over, but `--after`, `--after-any` and `--delay`."""
    task = find(leader, task_id)
    if not isinstance(task, LocalShellTaskState):
        raise TaskError(f"task {task.id} is a {task.type.value} task; only shell tasks restart")
    if not task.is_terminal:
        raise TaskError(
            f"task {task.id} is {task.status.value}; only a finished task restarts "
            f"(`shoal stop {task.id}` first)"
        )
    if task.group not in leader.scheduler.groups:
        raise TaskError(
            f"task {task.id}'s group {task.group!r} was removed; add it again to restart it"
        )
    leader.notify()  # (its end is told before it runs again)
    new_id = task.id if in_place else None
    fresh = leader.make_shell_task(
        [task.command] if task.argv[:1] == ("-c",) else list(task.argv),
        description=task.description,
        agent=task.agent_id,
        cwd=task.cwd,
        env=task.env,
        env_values=task.env_values,
        env_names=task.env_names,  # (values a restarted leader lost: its start says so)
        kind=task.kind,
        background=task.is_backgrounded,
        label=task.label,
        group=task.group,
        priority=task.priority,
        timeout=task.timeout,
        retries=_first_retries(leader, task),
        retry_delay=_first_retry_delay(leader, task),
        restarted_from=None if in_place else task.id,
        restarts=task.restarts + 1 if in_place else 0,
        task_id=new_id,
        stdin=task.stdin_fifo is not None,
    )
    if in_place:
        _remove_files(task)
        leader.registry.remove(task.id)
        leader.snapshot.announced.discard(task.id)
    started = leader.submit([fresh])
    return started[0].model_dump(mode="json") if started else fresh.model_dump(mode="json")


def _first_attempt(leader: Leader, task: LocalShellTaskState) -> LocalShellTaskState:
    """The first attempt of a retried task (whose retry options a restart starts from)."""
    seen = {task.id}
    while task.retry_of and task.retry_of not in seen:
        seen.add(task.retry_of)
        try:
            earlier = find(leader, task.retry_of)
        except (NotFoundError, UsageError):
            break
        if not isinstance(earlier, LocalShellTaskState):
            break
        task = earlier
    return task


def _first_retries(leader: Leader, task: LocalShellTaskState) -> int:
    return _first_attempt(leader, task).retries


def _first_retry_delay(leader: Leader, task: LocalShellTaskState) -> float | None:
    return _first_attempt(leader, task).retry_delay


def _remove_files(task: LocalShellTaskState) -> None:
    """A finished task's output and side files (pid, exit, stdin FIFO). The side files go
    first: a start finds the output file gone only once they are gone too (it does not look
    for stale ones)."""
    paths: list[str | os.PathLike[str]] = [
        shell.exit_file_for(task.output_file),
        shell.pid_file_for(task.output_file),
    ]
    if task.stdin_fifo:
        paths.append(task.stdin_fifo)
    paths.append(task.output_file)
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def clean(leader: Leader, force: bool = False) -> dict[str, Any]:
    """Drop every finished task from the session's listing (the registry and the history),
    with its output files. Their ends are told first; unfinished tasks stay, and so do
    agents in their panel grace and tasks a view holds (`retain`) unless `force`."""
    leader.notify()
    removed: list[str] = []
    kept: list[str] = []
    now = time.time()
    for task in list(leader.registry.terminal_tasks()):
        if leader.holds_notification(task.id):
            continue  # (a full disk holds its notification: it stays until that is sent)
        if not force and in_grace(task, now):
            kept.append(task.id)
            continue
        leader.registry.remove(task.id)
        removed.append(task.id)
        if isinstance(task, LocalShellTaskState):
            _remove_files(task)
    history = leader.history()
    for raw in history.values():
        removed.append(raw["id"])
        if raw.get("type") == TaskType.LOCAL_BASH.value:
            with contextlib.suppress(ValueError):
                finished = parse_task_state(raw)
                assert isinstance(finished, LocalShellTaskState)
                _remove_files(finished)
    leader.session.clear_history()
    leader.forget_history()
    leader.mark_dirty()
    leader.persist(force=True)
    return {"removed": sorted(set(removed)), "kept": sorted(kept)}


def send_input(leader: Leader, request: SendInputRequest) -> dict[str, Any]:
    """Write `text` (and a newline) to a running shell task's stdin, or close it (`eof`)."""
    task = find(leader, request.task_id)
    if not isinstance(task, LocalShellTaskState):
        raise TaskError(f"task {task.id} is a {task.type.value} task; it has no stdin to write")
    if task.status != TaskStatus.RUNNING:
        raise TaskError(f"task {task.id} is {task.status.value}; only a running task takes input")
    if task.stdin_fifo is None:
        raise TaskError(
            f"task {task.id} was started without --stdin (its stdin is /dev/null); "
            "start it with `shoal sh --stdin -- CMD`"
        )
    written = 0
    if request.text or request.newline:
        data = request.text.encode() + (b"\n" if request.newline else b"")
        written = leader.shell.write_stdin(task.id, data)
        if written < len(data):
            raise TaskError(
                f"the stdin pipe of task {task.id} is full: {written} of {len(data)} bytes "
                "written (it is not reading)"
            )
    closed = leader.shell.close_stdin(task.id) if request.eof else False
    return {"task_id": task.id, "written": written, "closed": closed}
