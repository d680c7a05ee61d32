"""A shell task's process: the `sh` wrapper it runs under, starting it, the live handle on
it, and finding it again after a leader's restart.

The command runs in a process group of its own, output straight into its file, under a tiny
`sh` wrapper that records its exit code in `{task}.exit` next to the output file. A leader
that restarts after a crash no longer is the parent of the tasks it adopts, so the code must
outlive it on disk. The wrapper traps TERM/INT/HUP with a no-op (which children do not
inherit) so that, when the group is signalled, it outlives the command long enough to record
how the command ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shoal.core.errors import TaskError
from shoal.core.output import create_output_file
from shoal.core.paths import FILE_MODE
from shoal.core.procs import is_alive, process_start_time, terminate
from shoal.core.sandbox import Policy, spawn_confined
from shoal.workers.shell.output_cap import limit_blocks

# The wrapper: $1 the exit file, $2 the leader's umask, $3 the cwd, $4 the file size limit in
# 512-byte blocks (empty: none), then the command. It writes its pid and, at the end, the exit
# code into side files it creates 0600 itself (umask 077 for those two writes only: the command
# runs with the leader's umask), so the leader creates no file per task but the output. The
# limit (`ulimit -f`, soft and hard: the command cannot raise it) is what makes the output cap
# hard; a write past it by the wrapper itself (an error message into the full output file)
# ends it with 128+SIGXFSZ through its EXIT trap, as the command would end.
_WRAPPER = (
    '__shoal_exit=$1; umask 077; printf "%s\\n" "$$" > "${1%.exit}.pid"; '
    'trap \'__shoal_rc=$?; umask 077; printf "%s\\n" "$__shoal_rc" > "$__shoal_exit"\' EXIT; '
    "trap 'exit 143' TERM; trap 'exit 130' INT; trap 'exit 129' HUP; trap 'exit 153' XFSZ; "
    '[ -z "$4" ] || ulimit -f "$4" || exit 126; '
    'umask "$2"; cd -- "$3" || exit 126; shift 4; '
    'if [ "$1" = -c ]; then eval "$2"; else "$@"; fi'
)
_NAME = "shoal"
_DEFAULT_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGPIPE,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGALRM,
    signal.SIGXFSZ,  # (Python ignores it, and an ignored one is inherited: EFBIG only)
)
_SH = "/bin/sh"


def _process_umask() -> str:
    """This process's umask in octal (from /proc: setting it to read it would be a race
    with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"Umask:"):
                return f"{int(line.split()[1], 8):04o}"
    mask = os.umask(0o077)
    os.umask(mask)
    return f"{mask:04o}"


_UMASK = _process_umask()

# Shell exit code for "command not found" / "not executable".
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


def _side_file(output_file: str | os.PathLike[str], suffix: str) -> str:
    """`output_file` with its extension replaced by `suffix` (a string: the start path makes
    no Path)."""
    return os.path.splitext(os.fspath(output_file))[0] + suffix


def exit_file_for(output_file: str | Path) -> Path:
    """Where the wrapper records the exit code of the task writing `output_file`."""
    return Path(_side_file(output_file, ".exit"))


@dataclass
class ShellProcess:
    """A live handle on a started shell task (kept in memory only, never persisted)."""

    pid: int
    started_at: float | None  # None for a fresh child until the leader reads it
    child: bool  # False when adopted after a leader restart (then it is not ours to reap)
    status: int | None = None  # exit code (128+N for signal N) once reaped
    stdin: int | None = None  # the write end of its stdin FIFO (`sh --stdin`), kept open

    def close_stdin(self) -> bool:
        """Close the write end of its stdin (it reads EOF); False when it had none open."""
        if self.stdin is None:
            return False
        with contextlib.suppress(OSError):
            os.close(self.stdin)
        self.stdin = None
        return True

    def poll(self) -> bool:
        """True while the task's process runs (reaping it when it is our child)."""
        if self.status is not None:
            return False
        if self.child:
            try:
                pid, wait_status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.child = False
                return is_alive(self.pid, self.started_at)
            if pid == 0:
                return True
            code = os.waitstatus_to_exitcode(wait_status)
            self.status = code if code >= 0 else 128 - code
            return False
        return is_alive(self.pid, self.started_at)

    def returncode(self) -> int | None:
        """The exit code of our own child once reaped (128+N after signal N), else None."""
        return self.status


def start(
    argv: list[str],
    output_file: str | Path,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | Mapping[bytes, bytes] | None = None,
    root: Path | None = None,
    stdin: Path | None = None,
    sandbox: Policy | None = None,
    file_limit: int | None = None,
) -> ShellProcess:
    """Start `argv` in its own session with stdout+stderr into a new `output_file`.

    With `file_limit` (bytes, see `output_limit`) no file the task writes, its output first,
    can grow past it: a write there fails with EFBIG and the writer gets SIGXFSZ.

    Its stdin is /dev/null, or with `stdin` a FIFO made there (0600) whose write end the
    returned handle keeps open, so the task reads what is written to it and no EOF until
    that end is closed.

    The output file is created O_EXCL|O_NOFOLLOW (a planted file or symlink is refused). The
    process is made with posix_spawn (vfork-fast even from a large, threaded leader). A command
    that cannot be executed still starts: the wrapper's shell reports the error into the output
    and records exit code 127 or 126.

    With `sandbox` the wrapper and the command run confined to that policy (Landlock); the
    wrapper's side files are made here, empty, and are the only files it adds to the policy.
    """
    writer = open_stdin_fifo(stdin, create=True) if stdin is not None else None
    try:
        fd = create_output_file(output_file, root)
    except BaseException:
        if writer is not None:
            os.close(writer)
        raise
    exit_file = _side_file(output_file, ".exit")
    blocks = limit_blocks(file_limit)
    stdin_action = (
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
        if stdin is None
        # (does not block: the leader holds a writer open)
        else (os.POSIX_SPAWN_OPEN, 0, os.fspath(stdin), os.O_RDONLY | os.O_NOFOLLOW, 0)
    )
    # (no stale pid or exit file can be there: the output file was just created anew, and a
    # restart in place removes the side files before the output file)

    def spawn() -> int:
        return os.posix_spawn(
            _SH,
            [_SH, "-c", _WRAPPER, _NAME, exit_file, _UMASK, cwd or os.getcwd(), blocks, *argv],
            os.environb if env is None else env,  # bytes: no decoding and re-encoding
            file_actions=[
                stdin_action,
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            # A task starts with default signal handling and nothing blocked, whatever the
            # leader's threads have set (a shell cannot trap a signal ignored on entry).
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )

    try:
        if sandbox is None:
            pid = spawn()
        else:
            side = (exit_file, _side_file(output_file, ".pid"))
            for path in side:  # (the confined wrapper may write these, and create nothing)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o600))  # fmt: skip
            pid = spawn_confined(sandbox.widened(files=side), spawn)
    except BaseException:
        if writer is not None:
            os.close(writer)
        raise
    finally:
        os.close(fd)
    # The start time is read later (see Leader.record_start_times): reading /proc/{pid}/stat
    # now would wait for the child's exec and double the cost of a start.
    return ShellProcess(pid, None, child=True, stdin=writer)


def open_stdin_fifo(path: Path, *, create: bool) -> int:
    """The write end of a task's stdin FIFO, non-blocking (made 0600 first when `create`).

    Opened read-write: opening a FIFO write-only fails without a reader, and the leader must
    hold it open before the task opens its end (which then never blocks)."""
    if create:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.mkfifo(path, FILE_MODE)
        os.chmod(path, FILE_MODE, follow_symlinks=False)  # (mkfifo applies the umask)
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        raise TaskError(f"{path} is not a FIFO; the task's stdin cannot be written")
    return fd


# A gate in front of the wrapper: nothing runs until one line arrives on stdin (EOF, i.e. the
# spawner died first: nothing runs at all), then the command gets /dev/null as its stdin.
_GATE = "IFS= read -r __shoal_go || exit 125; exec </dev/null; "


def wrapped_argv(
    argv: Sequence[str],
    exit_file: Path,
    cwd: str | None = None,
    *,
    gated: bool = False,
    file_limit: int | None = None,
) -> list[str]:
    """The `sh` argv that runs `argv` (as `argv_for` makes it) under the wrapper, which records
    its pid and exit code in `exit_file` and its `.pid` sibling (0600; old ones removed here).

    For a caller that spawns the process itself, into an output file of its own (a teammate's
    commands). `gated`: the process waits for one line on its stdin before it runs anything, so
    the caller can record the pid first (a caller killed before that runs nothing).
    `file_limit`: as for `start`.
    """
    for side in (exit_file, pid_file_for(exit_file)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(side)
    script = (_GATE if gated else "") + _WRAPPER
    return [
        _SH, "-c", script, _NAME, os.fspath(exit_file), _UMASK, cwd or os.getcwd(),
        limit_blocks(file_limit), *argv,
    ]  # fmt: skip


def pid_file_for(output_file: str | Path) -> Path:
    """Where the wrapper records its pid (the task's process group id)."""
    return Path(_side_file(output_file, ".pid"))


def recorded_pid(output_file: str | Path) -> int | None:
    """The pid the wrapper recorded at start, or None."""
    try:
        return int(pid_file_for(output_file).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def adopt(pid: int, started_at: float | None, output_file: str | Path) -> ShellProcess | None:
    """A handle on a task process left running by a previous leader, if it is still the same.

    Without a recorded start time, the process must carry this task's exit-file path in its
    command line, so a reused pid is never adopted.
    """
    if not is_alive(pid, started_at):
        return None
    if started_at is None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            return None
        if os.fsencode(exit_file_for(output_file)) not in cmdline.split(b"\0"):
            return None
        started_at = process_start_time(pid)
    return ShellProcess(pid, started_at, child=False)


def locate(
    pid: int | None, started_at: float | None, output_file: str | Path
) -> tuple[bool, ShellProcess | None]:
    """(was it started?, a handle if it still runs) for a task a previous leader knew.

    A task counts as started when a pid was recorded or its output file exists (the leader
    creates it right before spawning and may have died before writing its state).
    """
    if pid is None:
        if not os.path.lexists(output_file):
            return False, None
        pid, started_at = recorded_pid(output_file), None
        if pid is None:
            return True, None
    return True, adopt(pid, started_at, output_file)


def recorded_exit(output_file: str | Path) -> int | None:
    """The exit code the wrapper recorded, or None if it recorded none (killed, or running)."""
    try:
        raw = exit_file_for(output_file).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def kill_leftover_group(pgid: int | None) -> bool:
    """SIGKILL what is left of a task's process group once its wrapper (the group leader,
    whose pid is the group id) is gone; True when something was left to kill.

    The group id cannot be taken by a new process while any member of the group lives, so a
    group found here is the task's. A live process with that pid is not the wrapper (that
    one would have been adopted): the pid was reused, and the group is left alone.
    """
    if pgid is None or pgid <= 1 or is_alive(pgid, None):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill(proc: ShellProcess, grace: float) -> None:
    """TERM the task's process group, wait up to `grace`, then KILL; no such process is fine.

    This one waits: for callers outside the leader's loop (tests, cleanup at exit). The loop
    uses `ShellKind.kill`, which never does.
    """
    terminate(proc.pid, proc.started_at, grace=grace, group=True)
    proc.poll()  # reap our child now (it is gone or a zombie), so no zombie lingers


# Exit code recorded for a task killed before the wrapper could record one (SIGKILL).
EXIT_KILLED = 137
