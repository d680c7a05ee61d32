"""The ownership tree: one query over the registry says which unfinished tasks lost their
owner, and why, for every kind."""

from __future__ import annotations

from typing import Any

from shoal.core.tasks import TaskType, new_task_id, parse_task_state
from shoal.orchestrator.registry import TaskRegistry, owner_of


def task(kind: TaskType, status: str = "running", **fields: Any) -> Any:
    base: dict[str, Any] = {
        "id": new_task_id(kind),
        "type": kind.value,
        "status": status,
        "description": "x",
        "start_time": 1.0,
        "output_file": "/tmp/x.output",
    }
    return base | fields


def test_owner_of_reads_each_kinds_ownership_field() -> None:
    shell = parse_task_state(task(TaskType.LOCAL_BASH, command="true", agent_id="a00000001"))
    assert owner_of(shell) == ("a00000001", "its agent {} exited")
    lead_shell = parse_task_state(task(TaskType.LOCAL_BASH, command="true"))
    assert owner_of(lead_shell) is None


def test_the_registry_lists_the_orphans_with_their_reason_and_skips_ended_ones() -> None:
    orphan = parse_task_state(task(TaskType.LOCAL_BASH, command="true", agent_id="a00000001"))
    kept = parse_task_state(task(TaskType.LOCAL_BASH, command="true", agent_id="a00000002"))
    ended = parse_task_state(
        task(TaskType.LOCAL_BASH, status="completed", command="true", agent_id="a00000001")
    )
    registry = TaskRegistry([orphan, kept, ended])
    found = registry.orphans(lambda name: name == "a00000001")
    assert [(t.id, why) for t, why in found] == [(orphan.id, "its agent a00000001 exited")]
