"""The pill in tmux's status line: the command `shoal up` offers to run inside tmux.

tmux runs `#(...)` through `/bin/sh -c` every `status-interval` seconds and shows its first
line. The command names this very shoal (absolute path) and its home and team, so it works from
a tmux server whose PATH or environment differs from the shell's. Setting it runs tmux through
`shoal.teams.backends.tmux`, like every tmux command shoal runs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shoal.core.errors import ShoalError


@dataclass(frozen=True)
class TmuxStatusHint:
    """How to show the pill in the status line of the tmux server this process runs under."""

    socket: str
    """The tmux server's socket (first field of $TMUX)."""
    status_right: str
    """The value for `status-right`, e.g. `#(/usr/bin/shoal --home /h pill --team t)`."""

    @property
    def argv(self) -> list[str]:
        """The tmux command that sets it (globally, for that server only), as shown to the user;
        `install_tmux_status` runs the same command."""
        return ["tmux", "-S", self.socket, "set-option", "-g", "status-right", self.status_right]

    @property
    def command(self) -> str:
        """`argv` as one line to show the user or paste into a shell."""
        return shlex.join(self.argv)


def shoal_argv() -> list[str]:
    """How to run this shoal from elsewhere: its console script, else `python -m shoal`."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "shoal" and script.exists():
        return [str(script.resolve())]
    found = shutil.which("shoal")
    if found:
        return [found]
    return [sys.executable, "-m", "shoal"]


def pill_command(home: str | os.PathLike[str], team: str) -> str:
    """The shell command line that prints the pill of `team` under `home`."""
    return shlex.join([*shoal_argv(), "--home", os.fspath(home), "pill", "--team", team])


def tmux_status_hint(
    home: str | os.PathLike[str],
    team: str,
    env: Mapping[str, str] | None = None,
    *,
    socket: str | None = None,
) -> TmuxStatusHint | None:
    """The status-line setting for `team` on the tmux server this process runs under ($TMUX),
    or on `socket` (e.g. a dedicated `-L shoal-{team}` server's); None when there is neither."""
    if socket is None:
        tmux = (os.environ if env is None else env).get("TMUX", "")
        socket = tmux.split(",", 1)[0]
    if not socket:
        return None
    # `#` starts a tmux format; a literal one in a path must be doubled.
    return TmuxStatusHint(
        socket=socket, status_right="#(" + pill_command(home, team).replace("#", "##") + ")"
    )


def install_tmux_status(hint: TmuxStatusHint, *, timeout: float = 10.0) -> None:
    """Run `hint.argv`; a failure raises ShoalError with tmux's own message."""
    # Imported here: the hint alone needs no libtmux (it costs a tenth of a second to load).
    from shoal.teams.backends.base import BackendUnavailable
    from shoal.teams.backends.tmux import TmuxRefused, TmuxTimeout, set_global_option

    try:
        set_global_option(hint.socket, "status-right", hint.status_right, timeout=timeout)
    except BackendUnavailable:
        raise ShoalError(
            "tmux is not installed (or not on PATH); cannot set its status line"
        ) from None
    except TmuxTimeout:
        raise ShoalError(f"tmux did not answer within {timeout:g}s on {hint.socket}") from None
    except TmuxRefused as exc:
        raise ShoalError(f"could not set tmux's status line ({hint.command}): {exc.why}") from None
