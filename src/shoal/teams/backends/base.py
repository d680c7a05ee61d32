"""The one interface every way of running a teammate implements, and the `auto` choice.

A backend starts the worker command (`shoal worker --team T --name N`, built by the caller) —
or, for `in-process`, the same runner as a coroutine — and can tell whether it still runs
and stop it. Live handles (Popen objects, panes) stay in memory; what goes to disk is the
`Handle`'s plain data (backend name, pid, pane id).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from shoal.core.errors import ShoalError, UsageError

BACKEND_NAMES = ("auto", "process", "tmux", "iterm2", "in-process")


class BackendUnavailable(ShoalError):
    """The asked-for backend cannot run here (never silently replaced by another)."""


@dataclass(frozen=True)
class SpawnSpec:
    """What to start: one teammate of one team."""

    team: str
    name: str
    argv: list[str]
    cwd: str
    home: Path
    color: str = "blue"
    env: dict[str, str] = field(default_factory=dict)
    log_file: Path | None = None


@dataclass(frozen=True)
class Handle:
    """Plain data about a started teammate (what the team file and state.json keep)."""

    backend: str
    pid: int | None = None
    pane_id: str | None = None
    window: str | None = None


class Backend(Protocol):
    """A way to run teammates."""

    name: ClassVar[str]

    def available(self) -> tuple[bool, str]:
        """(usable here?, why) — the reason is shown to the user either way."""
        ...

    def spawn(self, spec: SpawnSpec) -> Handle:
        """Start the teammate; raises BackendUnavailable or ShoalError with the cause."""
        ...

    def is_alive(self, handle: Handle) -> bool:
        """True while the teammate's process (or pane, or coroutine) runs."""
        ...

    def kill(self, handle: Handle) -> None:
        """Stop the teammate now (TERM, grace, KILL; close its pane)."""
        ...

    def close(self, team: str) -> None:
        """Release what the backend holds for `team` (windows, servers) once it is empty."""
        ...


def detect(environ: dict[str, str] | None = None) -> tuple[str, str]:
    """The backend `auto` means here, and why: iTerm2 inside iTerm2, tmux inside tmux, else
    process."""
    env = os.environ if environ is None else environ
    if env.get("TERM_PROGRAM") == "iTerm.app" or env.get("ITERM_SESSION_ID"):
        return "iterm2", "running inside iTerm2 (TERM_PROGRAM=iTerm.app)"
    if env.get("TMUX"):
        return "tmux", "running inside tmux ($TMUX is set)"
    return "process", "not inside tmux or iTerm2: teammates run as background processes"


def get_backend(name: str) -> Backend:
    """The backend called `name` (not `auto`; resolve that with `detect` first)."""
    if name == "process":
        from shoal.teams.backends.process import ProcessBackend

        return ProcessBackend()
    if name == "tmux":
        from shoal.teams.backends.tmux import TmuxBackend

        return TmuxBackend()
    if name == "iterm2":
        from shoal.teams.backends.iterm2 import ITerm2Backend

        return ITerm2Backend()
    if name == "in-process":
        from shoal.teams.backends.inprocess import InProcessBackend

        return InProcessBackend.shared()
    raise UsageError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_NAMES)})")


def choose(name: str, environ: dict[str, str] | None = None) -> tuple[Backend, str]:
    """(backend, why) for `name`, refusing an unavailable one with its reason."""
    if name not in BACKEND_NAMES:
        raise UsageError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_NAMES)})")
    why = "asked for with --backend"
    if name == "auto":
        name, why = detect(environ)
    backend = get_backend(name)
    ok, reason = backend.available()
    if not ok:
        raise BackendUnavailable(f"backend {name!r} is not available: {reason}")
    return backend, why
