"""A run's verdict from its tasks' states: their counts by verdict, and the exit code
(exitcodes.py's table) the run ends with."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shoal.orchestrator.batch.exitcodes import INTERRUPTED, OK, TASKS_FAILED, TIMED_OUT
from shoal.orchestrator.batch.spec import Spec
from shoal.orchestrator.batch.state import RunStatus, TaskRun


def counts(tasks: Iterable[TaskRun]) -> dict[str, int]:
    """Tasks by verdict (plus `total`, and `resumed`: carried from a previous run)."""
    runs = list(tasks)
    out = {s.value: 0 for s in RunStatus}
    for run in runs:
        out[run.status.value] += 1
    return {
        "total": len(runs),
        "succeeded": out["succeeded"],
        "failed": out["failed"],
        "timed_out": out["timed_out"],
        "killed": out["killed"],
        "skipped": out["skipped"],
        "pending": out["pending"] + out["queued"],
        "running": out["running"],
        "resumed": sum(1 for r in runs if r.carried is not None),
        "flaky": sum(1 for r in runs if r.flaky),
    }


def exit_code(
    spec: Spec, tasks: Mapping[str, TaskRun], *, interrupted: bool, halted_on_success: bool
) -> int:
    """130 interrupted; 0 when every task succeeded (or a success halt ended the run with no
    failure: `halted_on_success`); 124 when what did not succeed timed out (or was skipped
    because of a timeout); else 1."""
    if interrupted:
        return INTERRUPTED
    # (an `always` task that was skipped does not make a green run red)
    if all(
        r.succeeded or (r.spec.always and r.status == RunStatus.SKIPPED) for r in tasks.values()
    ):
        return OK
    if halted_on_success:
        return OK
    if only_timeouts(spec, tasks):
        return TIMED_OUT
    return TASKS_FAILED


def only_timeouts(spec: Spec, tasks: Mapping[str, TaskRun]) -> bool:
    """True when some task timed out and every other one that did not succeed is a
    dependent skipped because of that (directly or through another skip)."""
    timed_out = {r.spec.id for r in tasks.values() if r.status == RunStatus.TIMED_OUT}
    if not timed_out:
        return False
    blamed = set(timed_out)
    for run in (tasks[t.id] for t in spec.topological()):
        if run.status in (RunStatus.SUCCEEDED, RunStatus.TIMED_OUT):
            continue
        if run.status != RunStatus.SKIPPED or run.carried is not None:
            return False
        if not any(d in blamed for d in run.spec.after):
            return False  # (skipped by a halt or an interrupt, not by a timeout)
        blamed.add(run.spec.id)
    return True
