"""What a run that died (its leader killed) finished without saying so, for `--resume`.

The run record is saved as the run moves, but a leader killed between a task's end and the
next save leaves that task "running" or "queued" there, and tasks still running at the kill
go on to end with no one watching. The session knows better: every shell task a run starts
carries the run's id and its spec task in its environment, the resumed leader has settled
each one from what its wrapper recorded on disk (the `.exit` file), and evicted ones are in
the session's history. A task whose attempt of that run completed with exit code 0 succeeded,
whatever the record says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from shoal.core.tasks import LocalShellTaskState, TaskStatus
from shoal.orchestrator.batch.report import iso

# Environment of every shell task a run starts: which run (with ENV_TASK and ENV_ATTEMPT of
# the engine: which spec task, which attempt).
ENV_RUN: Final = "SHOAL_RUN_ID"
_ENV_TASK: Final = "SHOAL_RUN_TASK"
_ENV_ATTEMPT: Final = "SHOAL_RUN_ATTEMPT"


def succeeded_attempts(
    previous: Mapping[str, Any], tasks: Iterable[LocalShellTaskState | Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Spec task id -> its record entry, for each task the record does not have as succeeded
    but whose attempt of the previous run completed with exit code 0 among `tasks` (the
    session's shell tasks: live records or history dicts)."""
    run_id = previous.get("run_id")
    before = {t["id"]: t for t in previous.get("tasks", []) if isinstance(t, dict) and "id" in t}
    # (records written before the run id was in the environment name their attempts' tasks)
    handles = {
        a.get("task_id"): tid
        for tid, t in before.items()
        for a in t.get("attempt_log") or []
        if isinstance(a, dict) and a.get("task_id")
    }
    found: dict[str, dict[str, Any]] = {}
    for task in tasks:
        rec = task.model_dump(mode="json") if isinstance(task, LocalShellTaskState) else task
        env = rec.get("env") or {}
        if run_id is not None and env.get(ENV_RUN) == run_id:
            spec_id = env.get(_ENV_TASK)
        else:
            spec_id = handles.get(rec.get("id"))
        old = before.get(spec_id) if isinstance(spec_id, str) else None
        if old is None or old.get("status") == "succeeded":
            continue
        result = rec.get("result") or {}
        if rec.get("status") != TaskStatus.COMPLETED.value or result.get("code") != 0:
            continue
        assert isinstance(spec_id, str)
        found[spec_id] = _entry(old, rec, env)
    return found


def _entry(
    old: Mapping[str, Any], rec: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    """The record entry of a task that succeeded in attempt `rec` (its other attempts kept)."""
    try:
        number = int(env.get(_ENV_ATTEMPT, ""))
    except ValueError:
        number = len(old.get("attempt_log") or []) or 1
    start, end = rec.get("start_time"), rec.get("end_time")
    duration = round(max(0.0, end - start), 3) if start is not None and end is not None else None
    attempt = {
        "attempt": number,
        "task_id": rec.get("id"),
        "status": "succeeded",
        "exit_code": 0,
        "started_at": iso(start),
        "ended_at": iso(end),
        "duration_s": duration,
        "output_file": rec.get("output_file"),
        "error": None,
    }
    log = [a for a in old.get("attempt_log") or [] if a.get("attempt") != number] + [attempt]
    log.sort(key=lambda a: a.get("attempt") or 0)
    return {
        **old,
        "status": "succeeded",
        "attempts": max(number, len(log)),
        "exit_code": 0,
        "duration_s": duration,
        "output_file": rec.get("output_file"),
        "started_at": iso(start),
        "ended_at": iso(end),
        "reason": "succeeded while no leader watched it (from its recorded exit code)",
        "attempt_log": log,
    }


def with_recovered(
    previous: Mapping[str, Any], recovered: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The previous record with the recovered entries in place of the old ones."""
    tasks = [
        dict(recovered.get(str(t.get("id")), t)) if isinstance(t, dict) else t
        for t in previous.get("tasks", [])
    ]
    return {**previous, "tasks": tasks}


def ended_attempts(
    previous: Mapping[str, Any], tasks: Iterable[LocalShellTaskState | Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Every attempt of the previous run that ended (its own exit or a kill), among `tasks`
    (the session's shell tasks), as joblog fields: seq, started_at, ended_at, exit_code,
    killed, command. The previous leader logged those it saw end; a resume logs the rest
    (those that ended while no leader watched), so that the joblog tells every attempt."""
    run_id = previous.get("run_id")
    if run_id is None:
        return []
    before = {t["id"]: t for t in previous.get("tasks", []) if isinstance(t, dict) and "id" in t}
    out: list[dict[str, Any]] = []
    for task in tasks:
        rec = task.model_dump(mode="json") if isinstance(task, LocalShellTaskState) else task
        env = rec.get("env") or {}
        old = before.get(env.get(_ENV_TASK)) if env.get(ENV_RUN) == run_id else None
        status = rec.get("status")
        terminal = (TaskStatus.COMPLETED.value, TaskStatus.FAILED.value, TaskStatus.KILLED.value)
        if old is None or status not in terminal or rec.get("pid") is None:  # (never ran)
            continue
        result = rec.get("result") or {}
        out.append(
            {
                "seq": int(old.get("seq") or 0),
                "started_at": rec.get("start_time"),
                "ended_at": rec.get("end_time"),
                "exit_code": result.get("code"),
                "killed": status == TaskStatus.KILLED.value,
                "command": str(old.get("command") or ""),
            }
        )
    out.sort(key=lambda a: (a["ended_at"] or 0.0, a["seq"]))
    return out
