"""The pure parts of `shoal workflow`: steps under their workflow in listings, the counts line,
the spec check of agent steps, and old state files without the new fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.core.tasks import LocalShellTaskState, parse_task_state
from shoal.orchestrator.batch.spec import SpecError
from shoal.orchestrator.batch.workflow import load_spec
from shoal.orchestrator.batch.workflow_kind import counts_text
from shoal.ui.steps import nest_steps, step_prefix, workflow_progress


def test_steps_follow_their_workflow_in_order() -> None:
    rows = [
        {"id": "b1"},
        {"id": "w1", "type": "local_workflow"},
        {"id": "b2"},
        {"id": "s1", "workflow_id": "w1"},
        {"id": "s2", "workflow_id": "w1"},
        {"id": "s9", "workflow_id": "w-gone"},
    ]
    nested = [(r["id"], step) for r, step in nest_steps(rows, lambda r: r)]
    assert nested == [
        ("b1", False),
        ("w1", False),
        ("s1", True),
        ("s2", True),
        ("b2", False),
        ("s9", True),  # (its workflow is not listed: it stays where it was, still a step)
    ]
    assert step_prefix(rows[3]) == "└ " and step_prefix(rows[0]) == ""


def test_workflow_progress_and_counts() -> None:
    record = {"type": "local_workflow", "completed_steps": 1, "total_steps": 3,
              "current_step": "test"}  # fmt: skip
    assert workflow_progress(record) == " · 1/3 steps (running: test)"
    assert workflow_progress({"type": "local_bash"}) == ""
    counts = {"total": 3, "succeeded": 1, "failed": 1, "skipped": 1, "resumed": 0}
    assert counts_text(counts) == "3 steps: 1 succeeded, 1 failed, 1 skipped"
    assert counts_text({"total": 1, "killed": 1, "resumed": 1}) == (
        "1 step: 1 killed, 1 carried from before a restart"
    )
    assert counts_text({"total": 0}) == "0 steps: none ran"


def test_agent_steps_are_checked_as_shoal_run_checks_them(tmp_path: Path) -> None:
    spec = tmp_path / "agents.toml"
    spec.write_text(
        '[[member]]\nname = "rev"\n'
        '[[task]]\nid = "build"\nrun = "true"\n'
        '[[task]]\nid = "review"\nprompt = "look"\nassign = "rev"\nafter = ["build"]\n'
    )
    loaded = load_spec(spec)
    assert [m.name for m in loaded.members] == ["rev"]
    assert [t.id for t in loaded.agent_tasks] == ["review"]
    spec.write_text('[[task]]\nid = "review"\nprompt = "look"\nassign = "nobody"\n')
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert f'{spec}:4: task "review": assign names unknown member "nobody"' in str(caught.value)


def test_a_shell_record_without_workflow_id_still_loads() -> None:
    old = {"id": "b12345678", "type": "local_bash", "description": "x", "command": "x",
           "output_file": "/tmp/x.output"}  # fmt: skip
    task = parse_task_state(old)
    assert isinstance(task, LocalShellTaskState) and task.workflow_id is None
