"""The pill in tmux's status line: `shoal up --tmux-status` puts it in front of the user's
`status-right` (what was there stays); `shoal down` restores what was there.

tmux runs `#(...)` through `/bin/sh -c` every `status-interval` seconds and shows its first
line. The command names this very shoal (absolute path) and its home and team, so it works from
a tmux server whose PATH or environment differs from the shell's. Setting it runs tmux through
`shoal.teams.backends.tmux`, like every tmux command shoal runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson

from shoal.core.errors import ShoalError
from shoal.core.jsonio import atomic_write, dumps

_GONE: Final = re.compile(r"no server running|error connecting to|No such file")


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


def install_tmux_status(
    hint: TmuxStatusHint, *, saved: Path | None = None, timeout: float = 10.0
) -> str:
    """Prepend the pill to the server's `status-right`, keeping what was there (done once: a
    second install changes nothing), and return the new value. With `saved`, what was there is
    written to that file for `restore_tmux_status`. A failure raises ShoalError with tmux's
    own message."""
    from shoal.teams.backends.tmux import get_global_option, set_global_option

    with _tmux_errors(hint, timeout):
        previous = get_global_option(hint.socket, "status-right", timeout=timeout)
        if hint.status_right in previous:
            return previous
        value = f"{hint.status_right} {previous}" if previous else hint.status_right
        set_global_option(hint.socket, "status-right", value, timeout=timeout)
    if saved is not None:
        record = {"socket": hint.socket, "pill": hint.status_right, "previous": previous}
        atomic_write(saved, dumps(record, pretty=True))
    return value


def restore_tmux_status(saved: Path, *, timeout: float = 10.0) -> str | None:
    """Take the pill out of the `status-right` it was put in front of (recorded in `saved`),
    leaving what the user set since; return the socket restored, or None when nothing was
    installed. The record is removed once done (or when its server is gone)."""
    from shoal.teams.backends.tmux import TmuxRefused, get_global_option, set_global_option

    try:
        record = orjson.loads(saved.read_bytes())
        socket, pill, previous = record["socket"], record["pill"], record["previous"]
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        saved.unlink(missing_ok=True)
        raise ShoalError(
            f"{saved} is not a tmux status record; left status-right as it is"
        ) from None
    hint = TmuxStatusHint(socket=str(socket), status_right=str(pill))
    try:
        with _tmux_errors(hint, timeout):
            current = get_global_option(hint.socket, "status-right", timeout=timeout)
            if current == (f"{pill} {previous}" if previous else pill):
                value = str(previous)
            else:  # (changed since: only the pill comes out)
                value = current.replace(f"{pill} ", "").replace(str(pill), "")
            if value != current:
                set_global_option(hint.socket, "status-right", value, timeout=timeout)
    except ShoalError as exc:
        cause = exc.__cause__
        if isinstance(cause, TmuxRefused) and _GONE.search(cause.why):
            saved.unlink(missing_ok=True)  # (its server is gone, and its status line with it)
            return None
        raise
    saved.unlink(missing_ok=True)
    return hint.socket


@contextlib.contextmanager
def _tmux_errors(hint: TmuxStatusHint, timeout: float) -> Iterator[None]:
    """tmux's failures as one ShoalError each, naming the server and tmux's own words."""
    # Imported here: the hint alone needs no libtmux (it costs a tenth of a second to load).
    from shoal.teams.backends.base import BackendUnavailable
    from shoal.teams.backends.tmux import TmuxRefused, TmuxTimeout

    try:
        yield
    except BackendUnavailable:
        raise ShoalError(
            "tmux is not installed (or not on PATH); cannot set its status line"
        ) from None
    except TmuxTimeout:
        raise ShoalError(f"tmux did not answer within {timeout:g}s on {hint.socket}") from None
    except TmuxRefused as exc:
        raise ShoalError(f"could not set tmux's status line ({hint.command}): {exc.why}") from exc
