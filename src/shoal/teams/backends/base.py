"""The one interface every way of running a teammate implements, and the `auto` choice.

A backend starts the worker command (`shoal worker --team T --name N`, built by the caller) —
or, for `in-process`, the same runner as a coroutine — and can tell whether it still runs
and stop it. Live handles (Popen objects, panes) stay in memory; what goes to disk is the
`Handle`'s plain data (backend name, pid, pane id).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, Protocol

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
    secret_env: dict[str, str] = field(default_factory=dict)
    """Variables whose values are secret whatever their names (`--env`): never on a command
    line (tmux gets them as its other secrets)."""
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


# What `auto` tries, in order (the seed's): iTerm2, then tmux, then background processes.
AUTO_ORDER: Final = ("iterm2", "tmux", "process")


def _outside(name: str, env: Mapping[str, str]) -> str | None:
    """Why `auto` does not consider `name` here (it is not around us), or None if it is."""
    in_iterm = env.get("TERM_PROGRAM") == "iTerm.app" or bool(env.get("ITERM_SESSION_ID"))
    if name == "iterm2" and not in_iterm:
        return "not inside iTerm2"
    if name == "tmux" and not env.get("TMUX"):
        return "not inside tmux"
    return None


def _inside(name: str, env: Mapping[str, str]) -> str:
    """How we know we run inside `name` (said when it is chosen, or tried and skipped)."""
    if name == "iterm2":
        how = "TERM_PROGRAM=iTerm.app" if env.get("TERM_PROGRAM") == "iTerm.app" else None
        return f"running inside iTerm2 ({how or '$ITERM_SESSION_ID is set'})"
    return "running inside tmux ($TMUX is set)"


def _usable(backend: Backend) -> tuple[bool, str]:
    """(usable?, why) as `auto` checks it: a backend's own `usable` (iTerm2 also connects to
    its API), else `available`."""
    check = getattr(backend, "usable", None) or backend.available
    result: tuple[bool, str] = check()
    return result


def detect(
    environ: Mapping[str, str] | None = None,
    provided: Mapping[str, Backend] | None = None,
) -> tuple[str, str]:
    """The backend `auto` means here, and why, going through AUTO_ORDER: iTerm2 inside iTerm2,
    tmux inside tmux, else process; one we run inside but cannot use (no iTerm2 Python API,
    no tmux binary) is skipped, and the reason says why, step by step."""
    env = os.environ if environ is None else environ
    steps: list[str] = []  # one line per backend passed over, in order
    unusable = False
    for name in AUTO_ORDER[:-1]:
        outside = _outside(name, env)
        if outside is not None:
            steps.append(f"{name}: {outside}")
            continue
        backend = (provided or {}).get(name) or _probe_backend(name, env)
        ok, reason = _usable(backend)
        if ok:  # (a backend we are not inside goes unsaid: "inside tmux" says it)
            return name, "; ".join([*(steps if unusable else ()), _inside(name, env)])
        unusable = True
        steps.append(f"{_inside(name, env)} but {name} cannot be used ({reason})")
    if not unusable:
        return "process", "not inside tmux or iTerm2: teammates run as background processes"
    return "process", "; ".join([*steps, "so process: teammates run as background processes"])


def _probe_backend(name: str, env: Mapping[str, str]) -> Backend:
    """The backend `name`, looking at `env` where it can (iTerm2 reads its session from it)."""
    if name == "iterm2":
        backend: Backend = _implementation(name)(environ=env)
        return backend
    return get_backend(name)


# Implementations by name, looked up when asked for (so this module imports none of them and
# only the chosen one's third-party library is loaded).
_IMPLEMENTATIONS: Final = {
    "process": "shoal.teams.backends.process:ProcessBackend",
    "tmux": "shoal.teams.backends.tmux:TmuxBackend",
    "iterm2": "shoal.teams.backends.iterm2:ITerm2Backend",
    "in-process": "shoal.teams.backends.inprocess:InProcessBackend",
}


def get_backend(name: str, provided: Mapping[str, Backend] | None = None) -> Backend:
    """The backend called `name` (not `auto`; resolve that with `detect` first). `provided`
    holds instances the caller owns (a swarm's own in-process backend), used instead."""
    if provided is not None and name in provided:
        return provided[name]
    backend: Backend = _implementation(name)()
    return backend


def _implementation(name: str) -> Any:
    """The class of backend `name`, imported now; UsageError for an unknown name."""
    target = _IMPLEMENTATIONS.get(name)
    if target is None:
        raise UsageError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_NAMES)})")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def choose(
    name: str,
    environ: Mapping[str, str] | None = None,
    provided: Mapping[str, Backend] | None = None,
) -> tuple[Backend, str]:
    """(backend, why) for `name`: `auto` falls through AUTO_ORDER (see `detect`); a backend
    asked for by name is refused with its reason when it cannot run, never replaced."""
    if name not in BACKEND_NAMES:
        raise UsageError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_NAMES)})")
    why = "asked for with --backend"
    if name == "auto":
        name, why = detect(environ, provided)
    if name == "iterm2" and not (provided and name in provided):
        backend = _probe_backend(name, os.environ if environ is None else environ)
    else:
        backend = get_backend(name, provided)
    ok, reason = backend.available()
    if not ok:
        raise BackendUnavailable(f"backend {name!r} is not available: {reason}")
    return backend, why
