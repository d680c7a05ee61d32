"""A teammate's run state (idle, busy, stopping, stopped): the `RunState` its status file's
`state` says, the one transition table `RUN_TRANSITIONS`, and `move_run_state`, the only way
a runner changes it (a refused move is an `IllegalRunTransition`, a bug in the runner).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from shoal.core.machine import IllegalMove, Machine


class RunState(StrEnum):
    """Where a teammate's run is; the value is the `state` of its status file (as written)."""

    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"
    STOPPED = "stopped"


RUN_TRANSITIONS: Final[dict[RunState, frozenset[RunState]]] = {
    # A turn starts; or a shutdown is approved, or the teammate is aborted.
    RunState.IDLE: frozenset({RunState.BUSY, RunState.STOPPING, RunState.STOPPED}),
    # The turn ends; or the teammate stops in the middle of it (the turn is then cut short).
    RunState.BUSY: frozenset({RunState.IDLE, RunState.STOPPING, RunState.STOPPED}),
    RunState.STOPPING: frozenset({RunState.STOPPED}),
    RunState.STOPPED: frozenset(),
}
# (idle/busy -> stopped directly: the runner's task was cancelled from outside, e.g. an
# in-process teammate killed with its lead, and it ends without a stopping phase.)


class IllegalRunTransition(IllegalMove):
    """A run state change RUN_TRANSITIONS does not allow: a bug in the runner, never input (so
    not a ShoalError, which the runner's best-effort writes suppress)."""

    def __init__(self, name: str, from_state: RunState, to_state: RunState) -> None:
        self.name = name
        self.from_state = from_state
        self.to_state = to_state
        allowed = sorted(s.value for s in RUN_TRANSITIONS[from_state])
        why = f"allowed: {', '.join(allowed)}" if allowed else f"{from_state.value} is terminal"
        message = (
            f"teammate {name}: illegal run state change {from_state.value} -> {to_state.value} "
            f"({why})"
        )
        super().__init__(message, name, from_state, to_state, RUN_TRANSITIONS[from_state])


RUN_MACHINE: Final = Machine(
    RUN_TRANSITIONS, refuse=lambda name, a, b, _: IllegalRunTransition(name, a, b), stay=False
)
"""A teammate's run; staying put is not a move (the caller says why a state is reached)."""
TERMINAL_RUN_STATES: Final = RUN_MACHINE.terminal


def move_run_state(name: str, current: RunState, target: RunState) -> RunState:
    """`target` if RUN_TRANSITIONS allows `current -> target`, else IllegalRunTransition.

    Staying put is not a move: the table has no self-loops, so the caller decides (and says
    why) when a state is already reached."""
    return RUN_MACHINE.check(name, current, target)
