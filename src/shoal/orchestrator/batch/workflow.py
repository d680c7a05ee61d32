"""`local_workflow` tasks: a `shoal run` spec run by the team's leader as one task (`w...`).

This module is what the CLI and the leader's requests need before a workflow exists: the spec,
read and checked as `shoal run` checks it, and the pending task. Running it is
`workflow_kind.py`'s (the batch engine inside the leader).
"""

from __future__ import annotations

import os
from pathlib import Path

from shoal.core.tasks import LocalWorkflowTaskState, TaskType, new_task_id
from shoal.orchestrator.batch.parse import parse_spec
from shoal.orchestrator.batch.spec import Spec
from shoal.teams.models import LEAD_NAME


def load_spec(path: str | os.PathLike[str], *, display: str | None = None) -> Spec:
    """Read and check a workflow's spec: SpecError (exit 2, file:line) for anything `shoal run`
    refuses. A `[[member]]` whose name is taken in the team is refused when the workflow
    starts (the leader's answer names it)."""
    return parse_spec(path, display=display)


def new_workflow_task(spec: Spec, output_file: Path, task_id: str) -> LocalWorkflowTaskState:
    """A pending `local_workflow` task for a checked `spec` (`task_id`: from `new_id`)."""
    return LocalWorkflowTaskState(
        id=task_id,
        description=f"workflow {spec.path.name}",
        workflow=spec.path.stem,
        spec_path=str(spec.path),
        total_steps=len(spec.tasks),
        output_file=str(output_file),
        owner=LEAD_NAME,
    )


def new_id() -> str:
    """A fresh workflow task id (`w` + 8 characters)."""
    return new_task_id(TaskType.LOCAL_WORKFLOW)
