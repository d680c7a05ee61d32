"""Teammates in tmux panes (libtmux): each pane runs the worker command from its creation.

Outside tmux the panes live on a dedicated server (`tmux -L shoal-{team}`, session
`shoal-{team}`); inside tmux ($TMUX set) in dedicated windows of the user's current session —
the user's own windows are never split. Windows are named `{team}`, `{team}-2`, ... (a new one
past the per-window cap) and marked with the window option `@shoal_team`, so a name clash with a
user's window never confuses shoal. `remain-on-exit` keeps a pane whose process died visible as
dead until `kill`/`close` removes it. This is the only module that imports libtmux, and every
tmux command shoal runs comes from here: through `_tmux`, except `exec_tmux`, which hands the
terminal over to a tmux client (`shoal attach`). `set_global_option` serves the status line.

No secret goes on a tmux command line (`ps` shows it to every user, and the first client's
stays the server's): secret variables (core/secretenv.py) reach a pane through a 0600 file
that its first process reads and removes (pane_secrets.py); the others go with `-e`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final, NoReturn

from libtmux import exc as tmux_exc
from libtmux.server import Server

from shoal.core import forkserver
from shoal.core.errors import NotFoundError, ShoalError, UsageError
from shoal.core.jsonio import LockTimeoutError, lock_for
from shoal.core.names import validate_name
from shoal.core.paths import Layout
from shoal.core.procs import is_alive, process_start_time, terminate
from shoal.core.secretenv import split_secrets
from shoal.teams.backends.base import BackendUnavailable, Handle, SpawnSpec
from shoal.teams.backends.process import fork_client, say_broken

STOP_GRACE_S = 5.0
SERVER_EXIT_WAIT_S = 5.0
DEFAULT_PANES_PER_WINDOW = 6
MIN_TMUX_VERSION = (3, 0)  # argv commands exec'd without a shell, -e, pane options
NOT_INSTALLED = "tmux is not installed (apt-get install tmux)"
# Size of the detached session of the dedicated server (a client resizes it when it attaches),
# large enough that a full window of tiled panes still fits.
DETACHED_SIZE = ("200", "60")
# Our variables a worker needs to behave as it would under the process backend (the pane
# otherwise gets the tmux server's environment). Not all of ours: tmux refuses a command line
# over 16 KiB, and a user's environment can be that large.
PANE_STUB: Final = Path(__file__).with_name("pane_stub.py")
"""The script a pane runs to get its worker forked onto its terminal."""
PANE_SECRETS: Final = Path(__file__).with_name("pane_secrets.py")
"""The script a pane with secrets runs first: it reads them from their file, then execs."""
SECRETS_ENV: Final = "SHOAL_PANE_SECRETS"
SECRETS_DIR: Final = "pane-secrets"
SECRETS_STALE_S: Final = 300.0
"""A secrets file no pane has read after this long is removed (its pane never started)."""
_FORWARDED = ("PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "LANG", "LC_ALL", "LC_CTYPE")
# stderr of a tmux client whose server is not (or no longer) running, or is just exiting
# because its last session went ("no current target" from list-panes -a).
_NO_SERVER = re.compile(
    r"no server running|error connecting to|server exited|lost server|no current target"
)
_GONE = re.compile(r"can't find (pane|window|session)")
_BASIC = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")
_COLOUR_NAMES = frozenset(
    {"default", "terminal", "orange", "pink", *_BASIC, *(f"bright{c}" for c in _BASIC)}
)
_COLOUR_NUMBER = re.compile(r"colou?r(\d{1,3})")
_COLOUR_HEX = re.compile(r"#[0-9a-fA-F]{6}")
_SEP = "\t"
_PANE_FORMAT = _SEP.join(
    (
        "#{socket_path}",
        "#{session_id}",
        "#{window_id}",
        "#{@shoal_team}",
        "#{@shoal_index}",
        "#{pane_id}",
        "#{pane_pid}",
        "#{pane_dead}",
        "#{pane_dead_status}",
        "#{@shoal_member}",
        "#{pane_title}",
    )
)


class TmuxError(ShoalError):
    """A tmux command failed; the message names the team or member and tmux's own words."""


class TmuxTimeout(TmuxError):
    """tmux did not answer within the time a caller allowed (e.g. a stopped server)."""


class TmuxRefused(TmuxError):
    """tmux ran a command and refused it; `why` is tmux's own words (else its exit status)."""

    def __init__(self, what: str, why: str) -> None:
        self.why = why
        super().__init__(f"{what}: tmux says: {why}")


def socket_name(team: str) -> str:
    """The socket name (`tmux -L`) of a team's dedicated server — shared with `shoal attach`.

    `$SHOAL_TMUX_SOCKET` overrides it (two homes with a team of the same name, tests)."""
    validate_name(team, "team name")
    return os.environ.get("SHOAL_TMUX_SOCKET") or f"shoal-{team}"


def session_name(team: str) -> str:
    """The session of a team on its dedicated server."""
    return f"shoal-{validate_name(team, 'team name')}"


def window_name(team: str, index: int) -> str:
    """`team` for the first window, `team-2`, `team-3`, ... for the overflow windows."""
    return team if index == 1 else f"{team}-{index}"


def is_tmux_colour(color: str) -> bool:
    """Whether tmux draws `color`: a basic or bright name, `colourN` (0-255), `#rrggbb`, or
    one of the X11 names shoal's palette uses. (tmux cannot check a colour kept in a user
    option for a format, so shoal checks it before spawning.)"""
    if m := _COLOUR_NUMBER.fullmatch(color):
        return int(m[1]) < 256
    return color in _COLOUR_NAMES or bool(_COLOUR_HEX.fullmatch(color))


@dataclass(frozen=True)
class PaneInfo:
    """One pane of a shoal window, as tmux reports it."""

    socket_path: str
    session_id: str
    window_id: str
    team: str
    index: int
    pane_id: str
    pid: int | None
    dead: bool
    dead_status: str
    member: str
    title: str


@dataclass(frozen=True)
class _Result:
    returncode: int
    stdout: list[str]
    stderr: str


def _tmux(server: Server, *args: str, timeout: float | None = None) -> _Result:
    """Run one tmux command line (commands separated by ";") on `server` through libtmux.

    With `timeout`, stop waiting after that many seconds (TmuxTimeout). libtmux itself waits
    without a limit, so the command runs on a daemon thread; a client stuck on a hung server
    ends when that server answers or goes."""
    if timeout is None:
        return _run_cmd(server, args)
    outcome: list[_Result | BaseException] = []

    def attempt() -> None:
        try:
            outcome.append(_run_cmd(server, args))
        except BaseException as exc:  # handed to the waiting caller, raised there
            outcome.append(exc)

    worker = threading.Thread(target=attempt, name="tmux-command", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise TmuxTimeout(f"tmux did not answer within {timeout:g}s: tmux {shlex.join(args)}")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _run_cmd(server: Server, args: tuple[str, ...]) -> _Result:
    """`server.cmd(*args)` with libtmux's and the OS's failures as shoal errors."""
    try:
        res = server.cmd(*args)
    except tmux_exc.TmuxCommandNotFound:
        raise BackendUnavailable(f"backend 'tmux' is not available: {NOT_INSTALLED}") from None
    except OSError as exc:
        raise TmuxError(f"cannot run tmux: {exc}") from None
    return _Result(int(res.returncode or 0), list(res.stdout), " ".join(res.stderr).strip())


def _check(res: _Result, what: str) -> list[str]:
    """stdout of a successful command, else a TmuxError saying `what` failed and why."""
    if res.returncode != 0:
        raise TmuxError(f"{what}: tmux says: {res.stderr or f'exit status {res.returncode}'}")
    return res.stdout


def set_global_option(socket_path: str, option: str, value: str, *, timeout: float) -> None:
    """`tmux -S socket_path set-option -g option value`: a global option of that server only
    (the status line's pill). Raises BackendUnavailable without tmux, TmuxTimeout when the
    server does not answer within `timeout` s, TmuxRefused with tmux's words otherwise."""
    res = _tmux(Server(socket_path=socket_path), "set-option", "-g", option, value, timeout=timeout)
    if res.returncode != 0:
        why = res.stderr or " ".join(res.stdout).strip() or f"exit code {res.returncode}"
        raise TmuxRefused(f"cannot set tmux option {option} on {socket_path}", why)


def get_global_option(socket_path: str, option: str, *, timeout: float) -> str:
    """`tmux -S socket_path show-options -gv option`: a global option's value on that server
    (errors as `set_global_option`)."""
    res = _tmux(Server(socket_path=socket_path), "show-options", "-gv", option, timeout=timeout)
    if res.returncode != 0:
        why = res.stderr or " ".join(res.stdout).strip() or f"exit code {res.returncode}"
        raise TmuxRefused(f"cannot read tmux option {option} on {socket_path}", why)
    return "\n".join(res.stdout)


def exec_tmux(argv: list[str]) -> NoReturn:
    """Replace this process with the tmux client `argv` (from `attach_command`).

    Not through `_tmux`: this one gets the terminal instead of having its output captured.
    What was printed is flushed first (exec drops Python's buffers)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)


def _server_gone(res: _Result) -> bool:
    return res.returncode != 0 and bool(_NO_SERVER.search(res.stderr))


def _parse_pane(line: str, *, shoal_only: bool = True) -> PaneInfo | None:
    """A line of `_PANE_FORMAT`; None for a malformed line or (if `shoal_only`) a pane outside
    the shoal windows."""
    parts = line.split(_SEP, 10)
    if len(parts) != 11 or not parts[5].startswith("%") or (shoal_only and not parts[3]):
        return None
    sock, session, window, team, index, pane, pid, dead, status, member, title = parts
    return PaneInfo(
        socket_path=sock,
        session_id=session,
        window_id=window,
        team=team,
        index=int(index) if index.isdigit() else 0,
        pane_id=pane,
        pid=int(pid) if pid.isdigit() else None,
        dead=dead == "1",
        dead_status=status,
        member=member,
        title=title,
    )


def _forwarded_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The variables the pane's command gets on top of the server's: our SHOAL_* and
    PATH-like ones, then the spec's."""
    env = {k: v for k, v in os.environ.items() if k.startswith("SHOAL_") or k in _FORWARDED}
    env.update(extra)
    return env


def _write_secrets(home: Path, team: str, name: str, values: Mapping[str, str]) -> Path:
    """A new 0600 file of `values` in the team's 0700 `pane-secrets/`, for the pane of
    member `name` to read and remove; files left by panes that never started go first."""
    layout = Layout(home)
    folder = layout.ensure(layout.team_dir(team) / SECRETS_DIR)
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > SECRETS_STALE_S:
                    os.unlink(entry.path)
    path = folder / f"{name}.{secrets.token_hex(8)}.json"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, json.dumps(dict(values)).encode())
    except BaseException:
        os.close(fd)
        path.unlink()
        raise
    os.close(fd)
    return path


def _pane_command(argv: list[str], env: Mapping[str, str]) -> list[str]:
    """The command arguments for new-window/split-window.

    tmux (>= 3.0) execs two or more arguments directly, without a shell, so the pane's pid is
    the worker's. A lone argument would go through `default-shell -c`; `exec` keeps the pid.
    """
    if not argv:
        raise UsageError("cannot start a teammate with an empty command")
    program = argv[0]
    if os.sep not in program:
        found = shutil.which(program, path=env.get("PATH", os.defpath))
        if found is None:
            raise ShoalError(f"cannot start teammate: command {program!r} not found on PATH")
        program = found
    if len(argv) == 1:
        return [f"exec {shlex.quote(program)}"]
    return [program, *argv[1:]]


def _forked_command(argv: list[str]) -> list[str] | None:
    """The pane command that has the fork server fork `argv` (a `python -m shoal worker`
    line) onto the pane's terminal: the pane stub, started without site-packages. None when
    the fork server is off or broken (the pane then starts `argv` itself)."""
    client = fork_client() if forkserver.forkable(argv) else None
    if client is None:
        return None
    try:
        address = client.ensure_started()
    except forkserver.ForkServerError as exc:
        say_broken(str(exc))
        return None
    return [sys.executable, "-S", "-I", str(PANE_STUB), address, *argv]


class TmuxBackend:
    """Panes in dedicated tmux windows; liveness from `#{pane_dead}`."""

    name: ClassVar[str] = "tmux"

    def __init__(
        self,
        socket_name: str | None = None,
        *,
        panes_per_window: int = DEFAULT_PANES_PER_WINDOW,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """`socket_name` overrides the dedicated server's socket (tests give each their own);
        `environ` stands in for os.environ when deciding whether we run inside tmux."""
        if panes_per_window < 1:
            raise UsageError(f"panes per window must be at least 1, not {panes_per_window}")
        self._socket_name = socket_name
        self._cap = panes_per_window
        self._environ = environ
        self._started: dict[int, float | None] = {}  # pane pid -> its start time

    # -- where the panes live ------------------------------------------------------------

    @property
    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def inside_tmux(self) -> bool:
        """True when this process runs inside tmux ($TMUX set): panes go to the user's server."""
        return bool(self._env.get("TMUX"))

    def dedicated_socket(self, team: str) -> str:
        """The socket name of the server used outside tmux."""
        return self._socket_name or socket_name(team)

    def _dedicated(self, team: str) -> Server:
        return Server(socket_name=self.dedicated_socket(team))

    def _user_server(self) -> Server:
        tmux_var = self._env.get("TMUX", "")
        path = tmux_var.rsplit(",", 2)[0] if tmux_var.count(",") >= 2 else ""
        if not path:
            raise TmuxError(f"$TMUX is not tmux's 'socket,pid,session' triple: {tmux_var!r}")
        return Server(socket_path=path)

    def _servers(self, team: str) -> list[Server]:
        """Every server that may hold the team's windows (the user's first when inside)."""
        servers = [self._user_server()] if self.inside_tmux() else []
        return [*servers, self._dedicated(team)]

    def _server_of(self, handle: Handle) -> Server | None:
        """The server of a handle: `window` is `{socket_path}:{window_id}` (pane ids are only
        unique per server)."""
        if handle.window and ":" in handle.window:
            return Server(socket_path=handle.window.rpartition(":")[0])
        if self.inside_tmux():
            return self._user_server()
        if self._socket_name:
            return Server(socket_name=self._socket_name)
        return None

    def panes(self, server: Server, team: str | None = None) -> list[PaneInfo]:
        """Panes of shoal windows on `server` (of `team` only, if given); [] without a server."""
        res = _tmux(server, "list-panes", "-a", "-F", _PANE_FORMAT)
        if _server_gone(res):
            return []
        lines = _check(res, "cannot list tmux panes")
        found = [p for p in map(_parse_pane, lines) if p is not None]
        return [p for p in found if team is None or p.team == team]

    def team_panes(self, team: str) -> list[PaneInfo]:
        """Every pane of the team's windows, on every server that may hold them."""
        return [p for server in self._servers(team) for p in self.panes(server, team)]

    # -- Backend protocol ----------------------------------------------------------------

    def available(self) -> tuple[bool, str]:
        if shutil.which("tmux") is None:
            return False, NOT_INSTALLED
        res = _tmux(Server(), "-V")
        if res.returncode != 0 or not res.stdout:
            return False, f"`tmux -V` failed: {res.stderr or res.returncode}"
        version = res.stdout[0].strip()
        match = re.search(r"(\d+)\.(\d+)", version)
        if match and (int(match[1]), int(match[2])) < MIN_TMUX_VERSION:
            need = ".".join(map(str, MIN_TMUX_VERSION))
            return False, f"{version} is too old; shoal needs tmux >= {need}"
        return True, version

    def spawn(self, spec: SpawnSpec) -> Handle:
        validate_name(spec.team, "team name")
        validate_name(spec.name, "member name")
        if not os.path.isdir(spec.cwd):
            raise ShoalError(
                f"cannot start teammate {spec.name!r}: working directory {spec.cwd} does not exist"
            )
        if not is_tmux_colour(spec.color):
            raise UsageError(
                f"member {spec.name!r} of team {spec.team!r} has colour {spec.color!r}, which "
                "tmux does not know (use a name like 'red', 'colour33' or '#rrggbb')"
            )
        env, secret = split_secrets(_forwarded_env(spec.env))
        for name, value in spec.secret_env.items():
            env.pop(name, None)
            secret[name] = value
        command = _forked_command(spec.argv) or _pane_command(spec.argv, env)
        secrets_file = None
        if secret:
            secrets_file = _write_secrets(spec.home, spec.team, spec.name, secret)
            env[SECRETS_ENV] = str(secrets_file)
            if len(command) == 1:  # (a shell line: `exec PROGRAM`)
                command = ["/bin/sh", "-c", command[0]]
            command = [sys.executable, "-S", "-I", str(PANE_SECRETS), *command]
        server = self._user_server() if self.inside_tmux() else self._dedicated(spec.team)
        try:
            with self._creation_lock(spec.home, spec.team):
                pane = self._create_pane(server, spec, env, command)
                try:
                    self._decorate(server, spec, pane)
                except ShoalError:
                    self._remove_pane(server, pane.pane_id, pane.pid, None)
                    raise
        except BaseException:
            if secrets_file is not None:  # (no pane will read it)
                with contextlib.suppress(FileNotFoundError):
                    secrets_file.unlink()
            raise
        assert pane.pid is not None  # tmux always reports the pid of a new pane
        self._started[pane.pid] = process_start_time(pane.pid)
        return Handle(
            backend=self.name,
            pid=pane.pid,
            pane_id=pane.pane_id,
            window=f"{pane.socket_path}:{pane.window_id}",
        )

    def is_alive(self, handle: Handle) -> bool:
        server = self._server_of(handle)
        if server is None or handle.pane_id is None:
            # No way to ask tmux: fall back to the pid (what a restarted leader may hold).
            return is_alive(handle.pid, self._started.get(handle.pid or -1))
        pane = self._find_pane(server, handle.pane_id, handle.pid)
        return pane is not None and not pane.dead

    def kill(self, handle: Handle) -> None:
        server = self._server_of(handle)
        pane = None
        if server is not None and handle.pane_id is not None:
            pane = self._find_pane(server, handle.pane_id, handle.pid)
        if pane is None:
            # The pane is gone; a process that outlived it (ignoring SIGHUP) still goes, but
            # only when we know it is the same process (pid + start time).
            started = self._started.pop(handle.pid or -1, None)
            if handle.pid is not None and started is not None:
                terminate(handle.pid, started, grace=STOP_GRACE_S, group=True)
            return
        assert server is not None
        started = self._started.pop(pane.pid or -1, None)
        self._remove_pane(server, pane.pane_id, None if pane.dead else pane.pid, started)

    def close(self, team: str) -> None:
        for server in self._servers(team):
            panes = self.panes(server, team)
            self._stop_processes(panes)
            for window in sorted({p.window_id for p in panes}):
                res = _tmux(server, "kill-window", "-t", window)
                if not (_server_gone(res) or _GONE.search(res.stderr)):
                    _check(res, f"cannot close tmux window {window} of team {team!r}")
            for pane in panes:
                self._started.pop(pane.pid or -1, None)
            if server.socket_name is not None and not self.panes(server):
                # No shoal window is left on the dedicated server: it goes too.
                res = _tmux(server, "kill-server")
                if not _server_gone(res):
                    _check(res, f"cannot stop the tmux server of team {team!r}")
                self._wait_server_gone(server, team)

    # -- helpers for ps/attach -----------------------------------------------------------

    def dead_panes(self, team: str) -> list[str]:
        """The team's dead panes, as `%N member (exit S)` (kept visible by remain-on-exit)."""
        return [
            f"{p.pane_id} {p.member or p.title} (exit {p.dead_status or '?'})"
            for p in self.team_panes(team)
            if p.dead
        ]

    def attach_command(self, team: str) -> list[str]:
        """The argv that shows the team's window: inside tmux select it (switching session if
        needed), outside attach to the team's dedicated server."""
        validate_name(team, "team name")
        tmux = shutil.which("tmux")
        if tmux is None:
            raise BackendUnavailable(f"backend 'tmux' is not available: {NOT_INSTALLED}")
        if self.inside_tmux():
            first = self._first_window(self.panes(self._user_server(), team))
            if first is not None:
                current = self._current_session(self._user_server(), required=False)
                verb = "select-window" if current == first.session_id else "switch-client"
                return [tmux, "-S", first.socket_path, verb, "-t", first.window_id]
        dedicated = self._dedicated(team)
        first = self._first_window(self.panes(dedicated, team))
        if first is None:
            raise NotFoundError(
                f"team {team!r} has no tmux window; spawn teammates with --backend tmux"
            )
        argv = [tmux, "-L", self.dedicated_socket(team), "attach-session"]
        argv += ["-t", f"{first.session_id}:{first.window_id}"]
        # From inside another tmux, attaching nests a client: tmux refuses unless $TMUX is unset.
        return ["env", "-u", "TMUX", *argv] if self.inside_tmux() else argv

    # -- internals -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _creation_lock(self, home: Path, team: str) -> Iterator[None]:
        """Pane creation for one team is serialised across threads and processes."""
        layout = Layout(home)
        team_dir = layout.ensure(layout.team_dir(team))
        lock = lock_for(team_dir / "tmux")
        try:
            lock.acquire()
        except LockTimeoutError:
            raise TmuxError(
                f"timed out waiting for {lock.lock_file} to create a pane for team {team!r}"
            ) from None
        try:
            yield
        finally:
            lock.release()

    @staticmethod
    def _find_pane(server: Server, pane_id: str, pid: int | None) -> PaneInfo | None:
        """The shoal pane `pane_id` — if it still runs `pid`: a server that exited and came
        back numbers its panes from %0 again, so an old handle must not find a new pane."""
        res = _tmux(server, "list-panes", "-a", "-F", _PANE_FORMAT)
        if _server_gone(res):
            return None
        for line in _check(res, f"cannot list tmux panes to find {pane_id}"):
            pane = _parse_pane(line)
            if pane is not None and pane.pane_id == pane_id:
                return pane if pid is None or pane.pid == pid else None
        return None

    @staticmethod
    def _first_window(panes: list[PaneInfo]) -> PaneInfo | None:
        return min(panes, key=lambda p: (p.index, p.window_id), default=None)

    def _current_session(self, server: Server, *, required: bool = True) -> str | None:
        """The session id of the pane we run in ($TMUX_PANE), else the one $TMUX names."""
        res = _tmux(server, "list-panes", "-a", "-F", "#{pane_id} #{session_id}")
        by_pane = dict(line.split(" ", 1) for line in _check(res, "cannot list tmux panes"))
        sessions = set(by_pane.values())
        pane = self._env.get("TMUX_PANE", "")
        if pane in by_pane:
            return by_pane[pane]
        index = self._env.get("TMUX", "").rsplit(",", 1)[-1]
        if index.isdigit() and f"${index}" in sessions:
            return f"${index}"
        if required:
            raise TmuxError(
                f"cannot find the current tmux session ($TMUX={self._env.get('TMUX')!r}); "
                "run shoal from a tmux pane or outside tmux"
            )
        return None

    def _create_pane(
        self, server: Server, spec: SpawnSpec, env: Mapping[str, str], command: list[str]
    ) -> PaneInfo:
        """Split a team window with room, else open a new one (the first pane runs the
        command from the window's creation)."""
        what = f"cannot create a tmux pane for member {spec.name!r} of team {spec.team!r}"
        cwd = os.path.abspath(spec.cwd)  # tmux would take a relative one from its own cwd
        options = ["-c", cwd, *(f"-e{k}={v}" for k, v in env.items())]
        fmt = ["-P", "-F", _PANE_FORMAT]
        panes = self.panes(server, spec.team)
        counts: dict[str, int] = {}
        for p in panes:
            counts[p.window_id] = counts.get(p.window_id, 0) + 1
        windows = sorted({(p.index, p.window_id, p.session_id) for p in panes})
        for _index, window, _session in windows:
            if counts[window] >= self._cap:
                continue
            res = _tmux(server, "split-window", "-d", "-t", window, *fmt, *options, *command)
            if res.returncode != 0 and "no space for new pane" in res.stderr:
                continue  # the window is too small for one more: overflow instead
            line = _check(res, what)
            _check(_tmux(server, "select-layout", "-t", window, "tiled"), what)
            return self._parsed(line, what)
        used = {index for index, _, _ in windows}
        index = next(i for i in range(1, len(used) + 2) if i not in used)
        # A unique temporary name lets the commands that follow target the new window in the
        # same tmux command list, so remain-on-exit is on before a fast-exiting worker can end.
        temp = f"shoal-new-{secrets.token_hex(6)}"
        name = window_name(spec.team, index)
        if windows:
            session = windows[0][2]
            create = ["new-window", "-d", "-t", f"{session}:", "-n", temp]
        elif self.inside_tmux():
            session = self._current_session(server) or ""
            create = ["new-window", "-d", "-t", f"{session}:", "-n", temp]
        else:
            session = f"={session_name(spec.team)}"
            create = ["new-session", "-d", "-s", session[1:], "-n", temp]
            create += ["-x", DETACHED_SIZE[0], "-y", DETACHED_SIZE[1]]
        target = f"{session}:={temp}"
        setup = [
            ("remain-on-exit", "on"),
            ("@shoal_team", spec.team),
            ("@shoal_index", str(index)),
            ("pane-border-status", "top"),
            ("pane-border-format", " #{pane_title} "),
            # tmux 3.3's border styles are per window, but expand formats per pane: each
            # pane's border takes the colour of its own @shoal_color.
            ("pane-border-style", "fg=#{@shoal_color}"),
            ("pane-active-border-style", "fg=#{@shoal_color},bold"),
        ]
        args = [*create, *fmt, *options, *command]
        for option, value in setup:
            args += [";", "set-option", "-w", "-t", target, option, value]
        args += [";", "rename-window", "-t", target, name]
        return self._parsed(_check(_tmux(server, *args), what), what)

    @staticmethod
    def _parsed(stdout: list[str], what: str) -> PaneInfo:
        """The pane a creating command printed (-P); a new window's own options are set after
        it prints, so its team may still be blank here."""
        for line in stdout:
            pane = _parse_pane(line, shoal_only=False)
            if pane is not None:
                return pane
        raise TmuxError(f"{what}: tmux printed no pane id ({stdout!r})")

    def _decorate(self, server: Server, spec: SpawnSpec, pane: PaneInfo) -> None:
        """Title = member name, border in the member's colour, member marker on the pane."""
        what = f"cannot set up the tmux pane of member {spec.name!r} of team {spec.team!r}"
        target = pane.pane_id
        args = ["select-pane", "-t", target, "-T", spec.name]
        for option, value in (("@shoal_member", spec.name), ("@shoal_color", spec.color)):
            args += [";", "set-option", "-p", "-t", target, option, value]
        _check(_tmux(server, *args), what)

    @staticmethod
    def _remove_pane(server: Server, pane_id: str, pid: int | None, started: float | None) -> None:
        """TERM the pane's process group (grace, KILL), then kill the pane itself."""
        if pid is not None:
            terminate(pid, started, grace=STOP_GRACE_S, group=True)
        res = _tmux(server, "kill-pane", "-t", pane_id)
        if not (_server_gone(res) or _GONE.search(res.stderr)):
            _check(res, f"cannot kill tmux pane {pane_id}")

    @staticmethod
    def _wait_server_gone(server: Server, team: str) -> None:
        """kill-server only asks the server to exit: wait (briefly, polling) until it has."""
        deadline = time.monotonic() + SERVER_EXIT_WAIT_S
        delay = 0.005
        while not _server_gone(_tmux(server, "list-sessions")):
            if time.monotonic() > deadline:
                raise TmuxError(f"the tmux server of team {team!r} did not exit")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _stop_processes(self, panes: list[PaneInfo]) -> None:
        """Stop the live processes of `panes` in parallel (each: TERM, grace, KILL)."""
        live = [p for p in panes if not p.dead and p.pid is not None]
        if not live:
            return

        def stop(pane: PaneInfo) -> None:
            assert pane.pid is not None
            terminate(pane.pid, self._started.get(pane.pid), grace=STOP_GRACE_S, group=True)

        with ThreadPoolExecutor(max_workers=min(16, len(live))) as pool:
            list(pool.map(stop, live))
