"""core/machine.py: every state machine is a `Machine`, and every refusal an `IllegalMove`."""

from __future__ import annotations

from enum import StrEnum

import pytest

from shoal.core.machine import IllegalMove, Machine
from shoal.core.taskstatus import TASK_MACHINE, TaskStatus
from shoal.orchestrator.batch.state import RUN_MACHINE as BATCH_MACHINE
from shoal.orchestrator.batch.state import RunStatus
from shoal.teams.taskitems import ITEM_MACHINE, TaskItemStatus
from shoal.workers.teammate.members import PHASE_MACHINE, Phase
from shoal.workers.teammate.runstate import RUN_MACHINE as TEAMMATE_MACHINE
from shoal.workers.teammate.runstate import RunState


class Light(StrEnum):
    RED = "red"
    GREEN = "green"
    OFF = "off"


LIGHT = Machine({Light.RED: {Light.GREEN, Light.OFF}, Light.GREEN: {Light.RED}, Light.OFF: ()})


def test_a_machine_allows_its_table_and_refuses_the_rest_naming_both_states() -> None:
    assert LIGHT.check("lamp", Light.RED, Light.GREEN) is Light.GREEN
    assert LIGHT.can(Light.OFF, Light.OFF)  # staying put is no move
    assert LIGHT.terminal == {Light.OFF} and LIGHT.is_terminal(Light.OFF)
    with pytest.raises(IllegalMove, match=r"lamp: illegal move green -> off \(allowed: red\)"):
        LIGHT.check("lamp", Light.GREEN, Light.OFF)
    with pytest.raises(IllegalMove, match=r"off -> red \(off is final\)") as info:
        LIGHT.check("lamp", Light.OFF, Light.RED)
    assert (info.value.current, info.value.target, info.value.allowed) == (
        Light.OFF,
        Light.RED,
        frozenset(),
    )


def test_without_stay_the_same_state_is_refused() -> None:
    strict = Machine({Light.RED: {Light.GREEN}, Light.GREEN: ()}, stay=False)
    with pytest.raises(IllegalMove):
        strict.check("lamp", Light.RED, Light.RED)


@pytest.mark.parametrize(
    ("machine", "current", "target"),
    [
        (TASK_MACHINE, TaskStatus.COMPLETED, TaskStatus.RUNNING),
        (ITEM_MACHINE, TaskItemStatus.COMPLETED, TaskItemStatus.IN_PROGRESS),
        (PHASE_MACHINE, Phase.ENDED, Phase.READY),
        (BATCH_MACHINE, RunStatus.SUCCEEDED, RunStatus.RUNNING),
        (TEAMMATE_MACHINE, RunState.STOPPED, RunState.BUSY),
    ],
)
def test_every_state_machine_refuses_with_the_one_error(
    machine: Machine[StrEnum], current: StrEnum, target: StrEnum
) -> None:
    """One `except IllegalMove` catches a refusal of any of them, with its states."""
    with pytest.raises(IllegalMove) as info:
        machine.check("1", current, target)
    assert (info.value.current, info.value.target) == (current, target)
    assert target not in machine.allowed(current)
