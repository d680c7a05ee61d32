"""The teammate runner's run state: the transition table, the one move function, and the states a
real runner writes to its status file (which must stay the strings written before the enum)."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.core.paths import Layout
from shoal.mailbox.router import send
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams
from shoal.teams.tasklist import TaskList
from shoal.workers.teammate.brains import Script, ScriptedBrain
from shoal.workers.teammate.runner import RunnerConfig, TeammateRunner
from shoal.workers.teammate.runstate import (
    RUN_TRANSITIONS,
    TERMINAL_RUN_STATES,
    IllegalRunTransition,
    RunState,
    move_run_state,
)
from tests.polling import wait_until_async


def make_runner(
    layout: Layout, cwd: Path, name: str, steps: list[dict[str, Any]] | None = None
) -> tuple[TeammateRunner, list[str]]:
    """A runner of team `t` and the list every status it writes appends its `state` to."""
    states: list[str] = []

    def seen(status: dict[str, Any]) -> None:
        states.append(status["state"])

    config = RunnerConfig(
        team="t",
        name=name,
        brain=ScriptedBrain(Script.parse({"step": steps or []})),
        output_file=cwd / f"{name}.output",
        cwd=str(cwd),
        on_status=seen,
    )
    return TeammateRunner(layout, config), states


def status_state(layout: Layout, name: str) -> object:
    return (Teams(layout).read_status("t", name) or {}).get("state")


async def until(cond: Callable[[], object], timeout: float = 15.0) -> None:
    """Poll `cond` from the loop (the runner keeps running between checks)."""
    await wait_until_async(cond, timeout)


def distinct(states: list[str]) -> list[str]:
    """`states` without repeats in a row (each status write carries the state, changed or not)."""
    return [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s]


# --------------------------------------------------------------------------- the table


def test_values_are_the_status_file_strings() -> None:
    assert [s.value for s in RunState] == ["idle", "busy", "stopping", "stopped"]
    assert RunState("stopping") is RunState.STOPPING


def test_transition_table_shape() -> None:
    assert set(RUN_TRANSITIONS) == set(RunState)
    assert RUN_TRANSITIONS[RunState.IDLE] == {RunState.BUSY, RunState.STOPPING, RunState.STOPPED}
    assert RUN_TRANSITIONS[RunState.BUSY] == {RunState.IDLE, RunState.STOPPING, RunState.STOPPED}
    assert RUN_TRANSITIONS[RunState.STOPPING] == {RunState.STOPPED}
    assert frozenset({RunState.STOPPED}) == TERMINAL_RUN_STATES
    assert all(state not in nexts for state, nexts in RUN_TRANSITIONS.items())  # no self-loops


def test_illegal_move_names_teammate_and_states() -> None:
    with pytest.raises(IllegalRunTransition) as info:
        move_run_state("ann", RunState.STOPPED, RunState.IDLE)
    err = info.value
    assert (err.name, err.from_state, err.to_state) == ("ann", RunState.STOPPED, RunState.IDLE)
    assert "ann" in str(err) and "stopped -> idle" in str(err) and "terminal" in str(err)
    with pytest.raises(IllegalRunTransition, match=r"stopping -> busy \(allowed: stopped\)"):
        move_run_state("ann", RunState.STOPPING, RunState.BUSY)


@settings(max_examples=200)
@given(st.lists(st.sampled_from(list(RunState)), max_size=12))
def test_random_moves_follow_the_table(moves: list[RunState]) -> None:
    """On a real runner: a move is accepted exactly when the table has it; a refused one leaves
    the state (in memory and in the status file) as it was; nothing leaves `stopped`."""
    with tempfile.TemporaryDirectory() as tmp:
        layout = Layout(Path(tmp))
        runner, written = make_runner(layout, Path(tmp), "prop")
        terminal_seen = False
        for target in moves:
            before = runner.state
            legal = target in RUN_TRANSITIONS[before]
            if legal:
                runner._move(target)
                assert runner.state is target
                assert status_state(layout, "prop") == target.value
            else:
                with pytest.raises(IllegalRunTransition):
                    runner._move(target)
                assert runner.state is before
                assert status_state(layout, "prop") == (written[-1] if written else None)
            if terminal_seen:
                assert runner.state is RunState.STOPPED
            terminal_seen = runner.state in TERMINAL_RUN_STATES
        # Only accepted moves were ever written, and each of them is in the table.
        path = [RunState.IDLE, *map(RunState, written)]
        assert all(b in RUN_TRANSITIONS[a] for a, b in itertools.pairwise(path))


# --------------------------------------------------------------------------- a real runner


@pytest.fixture
def team(layout: Layout) -> Teams:
    teams = Teams(layout)
    teams.create("t")
    return teams


def test_a_task_then_a_shutdown(layout: Layout, team: Teams, tmp_path: Path) -> None:
    """idle -> busy -> idle -> stopping -> stopped, as the status file says at each step."""
    runner, states = make_runner(layout, tmp_path, "one", [{"run": "true"}])
    TaskList(team, "t").add("job")

    async def main() -> int:
        task = asyncio.create_task(runner.run())
        await until(lambda: runner.state is RunState.IDLE and "busy" in states)
        await until(lambda: TaskList(team, "t").list()[0].status == "completed")
        send(
            team.directory("t"),
            to="one",
            sender=LEAD_NAME,
            kind="shutdown_request",
            data={"request_id": secrets.token_hex(8), "reason": "test"},
        )
        return await asyncio.wait_for(task, 15)

    assert asyncio.run(main()) == 0
    assert distinct(states) == ["idle", "busy", "idle", "stopping", "stopped"]
    assert runner.state is RunState.STOPPED and status_state(layout, "one") == "stopped"
    assert (team.read_status("t", "one") or {}).get("shutdown_requested") is True


def test_abort_twice_in_a_turn_is_one_stop(layout: Layout, team: Teams, tmp_path: Path) -> None:
    """A second abort (SIGTERM twice) is no illegal move; the turn is cut short once."""
    runner, states = make_runner(layout, tmp_path, "two", [{"run": "sleep 300"}])
    TaskList(team, "t").add("slow")

    async def main() -> int:
        task = asyncio.create_task(runner.run())
        await until(lambda: runner.state is RunState.BUSY)
        runner.abort()
        runner.abort()
        code = await asyncio.wait_for(task, 15)
        runner.abort()  # after the end, too
        return code

    assert asyncio.run(main()) == 0
    assert distinct(states) == ["idle", "busy", "stopping", "stopped"]
    assert not runner.shutdown_approved
    assert TaskList(team, "t").list()[0].status == "pending"


def test_cancelled_from_outside_goes_straight_to_stopped(
    layout: Layout, team: Teams, tmp_path: Path
) -> None:
    """An in-process teammate whose task is cancelled ends without a stopping phase."""
    runner, states = make_runner(layout, tmp_path, "three")

    async def main() -> None:
        task = asyncio.create_task(runner.run())
        await asyncio.wait_for(runner.ready.wait(), 15)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert distinct(states) == ["idle", "stopped"] and runner.exit_code == 143
