"""The leader's table of views' holds (orchestrator/holds.py) on an injected clock: a hold
keeps `retain` set and the task past eviction until its lease runs out unrenewed, its view's
process ends, or it is released; a renewal starts the lease afresh; the holds a restarted
leader finds in its records last one lease."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.core.errors import TaskError
from shoal.core.tasks import LocalShellTaskState, TaskStatus, TaskType, new_task_id, should_evict
from shoal.core.taskupdates import evolve
from shoal.orchestrator.holds import HOLD_LEASE_S, Holds
from shoal.orchestrator.registry import TaskRegistry


class Host:
    """What the table needs of the leader: its registry, history and `set_task`."""

    team = "t"

    def __init__(self, *tasks: LocalShellTaskState) -> None:
        self.registry = TaskRegistry(tasks)
        self.evicted: dict[str, Any] = {}

    def history(self) -> dict[str, Any]:
        return self.evicted

    def set_task(self, task_id: str, **changes: Any) -> bool:
        return self.registry.update_task_state(task_id, lambda t: evolve(t, **changes))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ended_shell(**changes: Any) -> LocalShellTaskState:
    task_id = new_task_id(TaskType.LOCAL_BASH)
    return LocalShellTaskState(
        id=task_id,
        description="done",
        output_file=f"/tmp/{task_id}.output",
        command="true",
        status=TaskStatus.COMPLETED,
        end_time=1.0,
        notified=True,
        **changes,
    )


def test_a_hold_lasts_its_lease_and_a_renewal_starts_it_afresh() -> None:
    task = ended_shell()
    host, clock = Host(task), Clock()
    holds = Holds(clock=clock, alive=lambda pid, started: True)
    assert should_evict(task, 2.0)
    holds.hold(host, task.id, "ui:1", pid=1, lease=10)
    assert host.registry.get(task.id).retain  # type: ignore[union-attr]
    assert not should_evict(host.registry.get(task.id), 2.0)  # type: ignore[arg-type]
    clock.now += 9
    holds.step(host, 0)
    holds.hold(host, task.id, "ui:1", pid=1, lease=10)  # (renewed at 9 s)
    clock.now += 9
    holds.step(host, 0)
    assert holds.holders(task.id) == ["ui:1"]
    clock.now += 2  # (11 s since the renewal)
    holds.step(host, 0)
    assert holds.holders(task.id) == []
    current = host.registry.get(task.id)
    assert current is not None and not current.retain and should_evict(current, 2.0)


def test_a_hold_ends_with_its_view_and_the_task_waits_for_its_last_holder() -> None:
    task = ended_shell()
    host, clock = Host(task), Clock()
    dead: set[int] = set()
    holds = Holds(clock=clock, alive=lambda pid, started: pid not in dead)
    holds.hold(host, task.id, "ui:1", pid=1)
    holds.hold(host, task.id, "chat:2", pid=2)
    dead.add(1)
    holds.step(host, 0)
    assert holds.holders(task.id) == ["chat:2"]
    assert host.registry.get(task.id).retain  # type: ignore[union-attr]
    holds.release(host, task.id, "chat:2")
    assert not host.registry.get(task.id).retain  # type: ignore[union-attr]


def test_a_restarted_leader_keeps_its_records_holds_for_one_lease() -> None:
    task = ended_shell(retain=True)
    host, clock = Host(task), Clock()
    holds = Holds(clock=clock, alive=lambda pid, started: True)
    holds.step(host, 0)
    clock.now += HOLD_LEASE_S - 1
    holds.step(host, 0)
    assert host.registry.get(task.id).retain  # type: ignore[union-attr]
    clock.now += 2
    holds.step(host, 0)
    assert not host.registry.get(task.id).retain  # type: ignore[union-attr]


def test_holds_on_what_is_not_there_are_refused_and_dropped() -> None:
    task = ended_shell()
    host, clock = Host(task), Clock()
    holds = Holds(clock=clock, alive=lambda pid, started: True)
    with pytest.raises(TaskError, match="no task b"):
        holds.hold(host, new_task_id(TaskType.LOCAL_BASH), "ui:1")
    holds.hold(host, task.id, "ui:1")
    host.evicted[task.id] = host.registry.remove(task.id)  # (`shoal clean --force`)
    holds.step(host, 0)
    assert holds.held == {}
    with pytest.raises(TaskError, match="has ended and left the registry"):
        holds.hold(host, task.id, "ui:1")
