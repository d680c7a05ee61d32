"""Teammates in iTerm2 split panes, through the official `iterm2` Python API (macOS only).

The new pane runs the worker command from its creation (a profile customisation with a custom
command), never typed into a shell. `iterm2` is imported lazily, so this module imports on
Linux, where `available()` says why the backend cannot run. Only the pure parts (availability,
profile settings, colours) can be exercised off macOS.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

from shoal.core.errors import ShoalError, UsageError
from shoal.core.names import validate_name
from shoal.core.procs import is_alive, process_start_time, terminate
from shoal.teams.backends.base import BackendUnavailable, Handle, SpawnSpec

STOP_GRACE_S = 5.0
INSTALL_HINT = "pip install 'shoal[iterm2]'"
API_HINT = "enable it in iTerm2 > Settings > General > Magic > Enable Python API"
# Variables of ours the worker needs: an iTerm2 pane starts from iTerm2's environment, not ours.
_FORWARDED = ("PATH", "VIRTUAL_ENV", "PYTHONPATH")

# The named colours shoal's palette uses (xterm's 16, plus the X11 names tmux also accepts).
_NAMED_RGB: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0),
    "red": (205, 0, 0),
    "green": (0, 205, 0),
    "yellow": (205, 205, 0),
    "blue": (0, 0, 238),
    "magenta": (205, 0, 205),
    "cyan": (0, 205, 205),
    "white": (229, 229, 229),
    "orange": (255, 165, 0),
    "pink": (255, 192, 203),
}
_XTERM_16: tuple[tuple[int, int, int], ...] = (
    (0, 0, 0), (205, 0, 0), (0, 205, 0), (205, 205, 0),
    (0, 0, 238), (205, 0, 205), (0, 205, 205), (229, 229, 229),
    (127, 127, 127), (255, 0, 0), (0, 255, 0), (255, 255, 0),
    (92, 92, 255), (255, 0, 255), (0, 255, 255), (255, 255, 255),
)  # fmt: skip
_CUBE_LEVELS = (0, 95, 135, 175, 215, 255)


def color_rgb(color: str) -> tuple[int, int, int]:
    """RGB of a shoal colour: a name, `colourNNN`/`colorNNN` (xterm 256) or `#rrggbb`."""
    name = color.strip().lower()
    if name in _NAMED_RGB:
        return _NAMED_RGB[name]
    if m := re.fullmatch(r"colou?r(\d{1,3})", name):
        n = int(m[1])
        if n < 16:
            return _XTERM_16[n]
        if n < 232:
            n -= 16
            return (_CUBE_LEVELS[n // 36], _CUBE_LEVELS[n // 6 % 6], _CUBE_LEVELS[n % 6])
        if n < 256:
            grey = 8 + 10 * (n - 232)
            return (grey, grey, grey)
    if m := re.fullmatch(r"#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})", name):
        return (int(m[1], 16), int(m[2], 16), int(m[3], 16))
    raise UsageError(f"unknown colour {color!r} (a name like 'red', 'colour33' or '#rrggbb')")


def worker_environment(spec: SpawnSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables the pane's command is started with: our SHOAL_* and PATH-like ones, then
    the spec's own."""
    env = os.environ if environ is None else environ
    picked = {k: v for k, v in env.items() if k.startswith("SHOAL_") or k in _FORWARDED}
    return {**picked, **spec.env, **spec.secret_env}


def worker_command(spec: SpawnSpec, environ: Mapping[str, str] | None = None) -> str:
    """The pane's command line: `env K=V ... argv` (env execs the worker, keeping its pid)."""
    if not spec.argv:
        raise UsageError("cannot start a teammate with an empty command")
    variables = [f"{k}={v}" for k, v in sorted(worker_environment(spec, environ).items())]
    argv = ["/usr/bin/env", *variables, *spec.argv] if variables else list(spec.argv)
    return shlex.join(argv)


def build_profile_settings(
    spec: SpawnSpec, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The profile customisations of a teammate's pane (raw iTerm2 profile keys, as
    `iterm2.LocalWriteOnlyProfile(values=...)` takes them)."""
    red, green, blue = color_rgb(spec.color)
    return {
        "Custom Command": "Yes",  # set_use_custom_command("Yes")
        "Command": worker_command(spec, environ),  # set_command(...)
        "Custom Directory": "Yes",  # INITIAL_WORKING_DIRECTORY_CUSTOM
        "Working Directory": spec.cwd,
        "Name": spec.name,
        "Badge Text": spec.name,
        "Use Tab Color": True,
        "Tab Color": {
            "Red Component": red / 255.0,
            "Green Component": green / 255.0,
            "Blue Component": blue / 255.0,
            "Alpha Component": 1.0,
            "Color Space": "sRGB",
        },
    }


def _session_uuid(environ: Mapping[str, str]) -> str | None:
    """The session id of the pane we run in: $ITERM_SESSION_ID is `w0t0p0:UUID`."""
    value = environ.get("ITERM_SESSION_ID", "")
    return value.rpartition(":")[2] or None


class ITerm2Backend:
    """Split panes of the current iTerm2 session; liveness from the API and the pid."""

    name: ClassVar[str] = "iterm2"

    def __init__(
        self, *, platform: str | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        """`platform` and `environ` stand in for sys.platform and os.environ (tests)."""
        self._platform = sys.platform if platform is None else platform
        self._environ = environ
        self._started: dict[str, float | None] = {}  # session id -> start time of its pid
        self._spawned: dict[str, dict[str, Handle]] = {}  # team -> session id -> handle

    @property
    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def available(self) -> tuple[bool, str]:
        if self._platform != "darwin":
            return False, f"iTerm2 panes need macOS; this is {self._platform}"
        if importlib.util.find_spec("iterm2") is None:
            return False, f"the iterm2 package is not installed ({INSTALL_HINT})"
        if self._env.get("TERM_PROGRAM") != "iTerm.app" and not self._env.get("ITERM_SESSION_ID"):
            shown = self._env.get("TERM_PROGRAM") or "unset"
            return False, f"not running inside iTerm2 (TERM_PROGRAM is {shown})"
        return True, "inside iTerm2, with the iterm2 Python API"

    def usable(self) -> tuple[bool, str]:
        """`available`, and the API answers a connection (what `auto` checks before it
        chooses iTerm2: an API that is installed but switched off falls through to tmux)."""
        ok, reason = self.available()
        if not ok:
            return ok, reason

        async def hello(connection: Any) -> None:
            return None

        try:
            self._run("cannot connect to iTerm2's Python API", hello)
        except ShoalError as exc:
            return False, str(exc)
        return True, reason

    def _api(self) -> Any:
        ok, reason = self.available()
        if not ok:
            raise BackendUnavailable(f"backend 'iterm2' is not available: {reason}")
        return importlib.import_module("iterm2")

    def _run(self, what: str, coro: Any) -> Any:
        """Run `coro(connection)` on a fresh API connection; failures name `what`."""
        iterm2 = self._api()
        try:
            return iterm2.Connection().run_until_complete(coro, retry=False)
        except ShoalError:
            raise
        except Exception as exc:  # the API raises connection, websocket and RPC errors alike
            raise ShoalError(f"{what}: iTerm2 API error: {exc} ({API_HINT})") from None

    def spawn(self, spec: SpawnSpec) -> Handle:
        iterm2 = self._api()
        validate_name(spec.team, "team name")
        validate_name(spec.name, "member name")
        if not os.path.isdir(spec.cwd):
            raise ShoalError(
                f"cannot start teammate {spec.name!r}: working directory {spec.cwd} does not exist"
            )
        settings = build_profile_settings(spec)
        current = _session_uuid(self._env)

        async def split(connection: Any) -> tuple[str, int | None]:
            app = await iterm2.async_get_app(connection)
            session = app.get_session_by_id(current) if current else None
            if session is None:
                window = app.current_terminal_window
                if window is None:
                    raise ShoalError(f"cannot start teammate {spec.name!r}: no iTerm2 window")
                session = window.current_tab.current_session
            profile = iterm2.LocalWriteOnlyProfile(values=settings)
            pane = await session.async_split_pane(vertical=True, profile_customizations=profile)
            await pane.async_set_name(spec.name)
            pid = await pane.async_get_variable("pid")
            return str(pane.session_id), int(pid) if pid else None

        session_id, pid = self._run(f"cannot start teammate {spec.name!r} in iTerm2", split)
        self._started[session_id] = None if pid is None else process_start_time(pid)
        handle = Handle(backend=self.name, pid=pid, pane_id=session_id)
        self._spawned.setdefault(spec.team, {})[session_id] = handle
        return handle

    def _session_exists(self, session_id: str) -> bool:
        iterm2 = self._api()

        async def exists(connection: Any) -> bool:
            app = await iterm2.async_get_app(connection)
            return app.get_session_by_id(session_id) is not None

        return bool(self._run(f"cannot look up iTerm2 session {session_id}", exists))

    def is_alive(self, handle: Handle) -> bool:
        if handle.pane_id is None or not self._session_exists(handle.pane_id):
            return False
        if handle.pid is None:
            return True
        return is_alive(handle.pid, self._started.get(handle.pane_id))

    def kill(self, handle: Handle) -> None:
        iterm2 = self._api()
        if handle.pane_id is None:
            return
        session_id = handle.pane_id
        started = self._started.pop(session_id, None)
        if handle.pid is not None and started is not None:
            # Only a process known by pid + start time is signalled (never a reused pid);
            # closing the session hangs up whatever runs in it in any case.
            terminate(handle.pid, started, grace=STOP_GRACE_S, group=True)

        async def close(connection: Any) -> None:
            app = await iterm2.async_get_app(connection)
            session = app.get_session_by_id(session_id)
            if session is not None:
                await session.async_close(force=True)

        self._run(f"cannot close iTerm2 session {session_id}", close)

    def close(self, team: str) -> None:
        """Close the panes this backend opened for `team` (iTerm2 has no per-team window)."""
        for handle in self._spawned.pop(team, {}).values():
            self.kill(handle)
