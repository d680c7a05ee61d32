"""What a remote task's job says, and what it decides: the markers a job prints
(`::shoal-NAME:: VALUE`), and the completion checkers that turn the job's status and markers
into the task's next state (one registered per remote type).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from shoal.core.tasks import RemoteAgentTaskState, TaskStatus
from shoal.workers.remote.ray_jobs import STOPPED, SUCCEEDED, JobInfo
from shoal.workers.remote.spec import first_line

MARKER: Final = re.compile(r"^::shoal-([a-z-]+)::[ \t]?(.*)$")
QUESTION: Final = re.compile(r"^\s*QUESTION:\s*(.+)$", re.MULTILINE)
"""How an ultraplan's agent asks its question (the node's job turns it into a marker)."""


@dataclass(frozen=True)
class Verdict:
    """What a completion checker decided: a new status (None: still running) and fields."""

    status: TaskStatus | None = None
    changes: dict[str, Any] = field(default_factory=dict)


CompletionChecker = Callable[[RemoteAgentTaskState, JobInfo, Mapping[str, str]], Verdict | None]
_CHECKERS: dict[str, CompletionChecker] = {}


def register_completion_checker(remote_type: str, checker: CompletionChecker) -> None:
    """Run `checker` at every poll of a task of `remote_type` (the last one registered wins)."""
    _CHECKERS[remote_type] = checker


def checker_for(remote_type: str) -> CompletionChecker:
    """The completion checker of `remote_type` (the job's own verdict, when none is
    registered)."""
    return _CHECKERS.get(remote_type, job_verdict)


def _marker_text(markers: Mapping[str, str], name: str) -> str | None:
    raw = markers.get(name)
    if raw is None:
        return None
    with contextlib.suppress(orjson.JSONDecodeError):
        value = orjson.loads(raw)
        if isinstance(value, str):
            return value
    return raw


TASK_LIST_KEEP: Final = 100  # items of a job's task list kept in its record
TASK_LIST_STATUSES: Final = ("pending", "in_progress", "completed")


def todo_of(markers: Mapping[str, str]) -> tuple[dict[str, str], ...] | None:
    """The job's agent's task list from its latest `todo` marker (a JSON list of {content,
    status}), each content cut to 200 characters; None when it printed none, or garbage."""
    raw = markers.get("todo")
    if raw is None:
        return None
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(items, list):
        return None
    return tuple(
        {
            "content": item["content"][:200],
            "status": item.get("status") if item.get("status") in TASK_LIST_STATUSES else "pending",
        }
        for item in items[:TASK_LIST_KEEP]
        if isinstance(item, dict) and isinstance(item.get("content"), str)
    )


def job_verdict(
    task: RemoteAgentTaskState, info: JobInfo, markers: Mapping[str, str]
) -> Verdict | None:
    """Done when the job is: succeeded is completed, failed is failed (with its exit code),
    stopped is killed. The result is the job's `result` marker, if it printed one."""
    if not info.terminal:
        return None
    result = _marker_text(markers, "result")
    changes: dict[str, Any] = {"exit_code": info.exit_code}
    if result is not None:
        changes["result"] = result
    if info.status == SUCCEEDED:
        return Verdict(TaskStatus.COMPLETED, changes)
    if info.status == STOPPED:
        return Verdict(TaskStatus.KILLED, changes)
    if info.exit_code is not None:
        error = f"the job exited with code {info.exit_code}"
    else:
        error = f"the job failed: {first_line(info.message) or 'no reason given'}"
    return Verdict(TaskStatus.FAILED, {**changes, "error": error})


def review_verdict(
    task: RemoteAgentTaskState, info: JobInfo, markers: Mapping[str, str]
) -> Verdict | None:
    """An ultrareview is done when its result file is named in the job's logs (with the
    review itself); its progress is the last `progress` marker."""
    progress = _marker_text(markers, "progress")
    changes: dict[str, Any] = {}
    if progress is not None:
        changes["review_progress"] = {"stage": progress}
    if "result-file" in markers and "result" in markers:
        file = _marker_text(markers, "result-file")
        changes.update(result=_marker_text(markers, "result"), exit_code=info.exit_code)
        meta = {**(task.remote_task_metadata or {}), "result_file": file}
        return Verdict(TaskStatus.COMPLETED, {**changes, "remote_task_metadata": meta})
    verdict = job_verdict(task, info, markers)
    if verdict is not None and verdict.status == TaskStatus.COMPLETED:
        return Verdict(
            TaskStatus.FAILED,
            {**verdict.changes, "error": "the review ended without naming its result file"},
        )
    if verdict is None:
        return Verdict(None, changes) if changes else None
    return Verdict(verdict.status, {**changes, **verdict.changes})


def plan_verdict(
    task: RemoteAgentTaskState, info: JobInfo, markers: Mapping[str, str]
) -> Verdict | None:
    """An ultraplan moves `running -> needs_input -> plan_ready` by the job's `phase`
    markers; it stays running (waiting for `shoal approve`) once its job has ended with one."""
    phase = _marker_text(markers, "phase")
    if phase in ("needs_input", "plan_ready") and info.terminal:
        changes: dict[str, Any] = {"ultraplan_phase": phase, "exit_code": info.exit_code}
        result = _marker_text(markers, "result")
        if result is not None:
            changes["result"] = result
        question = _marker_text(markers, "question")
        if phase == "needs_input":
            meta = {**(task.remote_task_metadata or {}), "question": question}
            changes["remote_task_metadata"] = meta
        return Verdict(None, changes)
    return job_verdict(task, info, markers)


for _type in ("remote-agent", "autofix-pr", "background-pr", "shell"):
    register_completion_checker(_type, job_verdict)
register_completion_checker("ultrareview", review_verdict)
register_completion_checker("ultraplan", plan_verdict)
