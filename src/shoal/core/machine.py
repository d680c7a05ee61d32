"""One state-machine helper for every state machine in shoal: the states (an enum), one table
of legal moves, and one refusal (`IllegalMove`).

Tasks, task-list items, a teammate's run and phases, and a batch run's tasks and attempts each
declare a `Machine` from their table; the check, the terminal states and the wording of a
refusal live here once. A machine's own error class (for callers that catch it by name, or
that need its exit code) is a subclass of `IllegalMove` built by `Machine.refuse`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)


class IllegalMove(Exception):
    """A move a machine's table does not allow; nothing changed. `subject` names what tried to
    move (a task id, a teammate), `allowed` the moves there were."""

    def __init__(
        self,
        message: str,
        subject: str,
        current: StrEnum,
        target: StrEnum,
        allowed: frozenset[StrEnum],
    ) -> None:
        super().__init__(message)
        self.subject = subject
        self.current = current
        self.target = target
        self.allowed = allowed


def describe(subject: str, current: StrEnum, target: StrEnum, allowed: frozenset[StrEnum]) -> str:
    """The usual wording of a refusal: `SUBJECT: illegal move A -> B (allowed: ...)`."""
    names = ", ".join(sorted(s.value for s in allowed))
    why = f"allowed: {names}" if names else f"{current.value} is final"
    return f"{subject}: illegal move {current.value} -> {target.value} ({why})"


Refusal = Callable[[str, S, S, frozenset[S]], IllegalMove]
"""Builds a machine's refusal from (subject, current, target, allowed)."""


class Machine(Generic[S]):
    """States `S` with the moves `table` allows. `stay`: moving to the state one is in is no
    move (allowed); without it, the caller must not ask (the table has no self-loops)."""

    def __init__(
        self,
        table: Mapping[S, Iterable[S]],
        *,
        refuse: Refusal[S] | None = None,
        stay: bool = True,
    ) -> None:
        self.table: dict[S, frozenset[S]] = {s: frozenset(n) for s, n in table.items()}
        self.terminal: frozenset[S] = frozenset(s for s, n in self.table.items() if not n)
        self.stay = stay
        self._refuse = refuse or (
            lambda subject, a, b, allowed: IllegalMove(
                describe(subject, a, b, allowed), subject, a, b, allowed
            )
        )

    def allowed(self, current: S) -> frozenset[S]:
        """The states `current` may move to."""
        return self.table[current]

    def can(self, current: S, target: S) -> bool:
        """True when `current -> target` is allowed."""
        return (self.stay and target == current) or target in self.table[current]

    def check(self, subject: str, current: S, target: S) -> S:
        """`target`, if `current -> target` is allowed; else the machine's refusal."""
        if not self.can(current, target):
            raise self._refuse(subject, current, target, self.table[current])
        return target

    def is_terminal(self, state: S) -> bool:
        """True for a state with no way out."""
        return state in self.terminal
