"""The leader's other state machines: a batch run's tasks and attempts, and a teammate's run
in the swarm. Each is an enum, one table and one function that refuses an illegal move."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.orchestrator.batch.spec import TaskSpec
from shoal.orchestrator.batch.state import (
    FINAL_STATUSES,
    RUN_TRANSITIONS,
    Attempt,
    IllegalRunMove,
    RunStatus,
    TaskRun,
)
from shoal.teams.backends.base import Handle
from shoal.teams.backends.process import ProcessBackend
from shoal.workers.teammate.members import (
    PHASE_TRANSITIONS,
    IllegalPhase,
    MemberRun,
    Phase,
    StopCause,
)


def _task_run() -> TaskRun:
    spec = TaskSpec(id="t", seq=1, run="true", cwd=str(Path()))
    return TaskRun(spec)


def _member() -> MemberRun:
    return MemberRun(
        name="ana",
        task_id="tabcdefgh",
        backend=ProcessBackend(),
        handle=Handle(backend="process", pid=None),
        why="test",
    )


@given(st.lists(st.sampled_from(list(RunStatus)), max_size=12))
def test_a_run_task_moves_only_through_the_table(moves: list[RunStatus]) -> None:
    run = _task_run()
    for target in moves:
        before = run.status
        legal = target == before or target in RUN_TRANSITIONS[before]
        if legal:
            run.move(target)
            assert run.status == target
        else:
            with pytest.raises(IllegalRunMove):
                run.move(target)
            assert run.status == before  # a refused move changes nothing
        if before in FINAL_STATUSES:
            assert run.status == before  # a verdict is final


@given(st.lists(st.sampled_from(list(RunStatus)), max_size=12))
def test_an_attempt_never_goes_back_to_pending(moves: list[RunStatus]) -> None:
    attempt = Attempt(number=1, handle=None)
    for target in moves:
        before = attempt.status
        legal = target != RunStatus.PENDING and (
            target == before or target in RUN_TRANSITIONS[before]
        )
        if legal:
            attempt.move(target)
            assert attempt.status == target
        else:
            with pytest.raises(IllegalRunMove):
                attempt.move(target)
            assert attempt.status == before


def test_the_run_table_shape() -> None:
    assert all(not RUN_TRANSITIONS[s] for s in FINAL_STATUSES)
    assert RunStatus.PENDING in RUN_TRANSITIONS[RunStatus.RUNNING]  # a retry
    assert RunStatus.SKIPPED not in RUN_TRANSITIONS[RunStatus.RUNNING]  # it ran
    with pytest.raises(IllegalRunMove, match=r'task "t": illegal move pending -> running'):
        _task_run().move(RunStatus.RUNNING)


@given(st.lists(st.sampled_from(list(Phase)), max_size=10))
def test_a_teammate_run_moves_only_through_the_table(moves: list[Phase]) -> None:
    run = _member()
    for target in moves:
        before = run.phase
        legal = target == before or target in PHASE_TRANSITIONS[before]
        if legal:
            run.move(target)
            assert run.phase == target
            if target == Phase.READY:
                assert run.became_ready
        else:
            with pytest.raises(IllegalPhase):
                run.move(target)
            assert run.phase == before
        if before == Phase.ENDED:
            assert run.phase == Phase.ENDED


def test_the_first_stop_cause_stands_but_a_stop_on_request_wins() -> None:
    run = _member()
    run.end_because(StopCause.SHUTDOWN_APPROVED)
    run.end_because(StopCause.SHUTDOWN_TIMEOUT, "did not shut down within 10s; killed")
    assert (run.cause, run.detail) == (StopCause.SHUTDOWN_APPROVED, "shut down on request")
    run.end_because(StopCause.ON_REQUEST)
    assert (run.cause, run.detail) == (StopCause.ON_REQUEST, "stopped on request")
