"""Background shell tasks: a process group per task, output straight into its file.

The command runs under a tiny `sh` wrapper that records its exit code in `{task}.exit` next to
the output file. A leader that restarts after a crash no longer is the parent of the tasks it
adopts, so the code must outlive it on disk. The wrapper traps TERM/INT/HUP with a no-op (which
children do not inherit) so that, when the group is signalled, it outlives the command long
enough to record how the command ended.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shoal.core.output import create_output_file, tail_lines
from shoal.core.paths import FILE_MODE
from shoal.core.procs import is_alive, process_start_time, terminate

# The wrapper: "$1" is the exit file, "$2" the working directory, then either a command line
# to eval (mode "-c") or an argv to run; "$0" names it in error messages. It records its pid
# first (so a leader that dies right after spawning can still find the task), and its exit
# status from an EXIT trap; a TERM, INT or HUP makes it exit 128+N through that trap too
# (after a foreground child has ended). All of it is builtins, so the wrapper costs no extra
# process: a command line runs in it directly.
_WRAPPER = (
    '__shoal_exit=$1; printf "%s\\n" "$$" > "${1%.exit}.pid"; '
    'trap \'printf "%s\\n" "$?" > "$__shoal_exit"\' EXIT; '
    "trap 'exit 143' TERM; trap 'exit 130' INT; trap 'exit 129' HUP; "
    'cd -- "$2" || exit 126; shift 2; '
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
)
_SH = "/bin/sh"
_SIDE_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# Shell exit code for "command not found" / "not executable".
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126

PROMPT_PATTERNS = re.compile(
    r"(\(y/n\)|\[y/n\]|\(yes/no\)|press (enter|any key)|continue\?|overwrite\?"
    r"|^(do you|would you|shall i|are you sure|ready to)\b.*\?)",
    re.IGNORECASE,
)


def exit_file_for(output_file: str | Path) -> Path:
    """Where the wrapper records the exit code of the task writing `output_file`."""
    path = Path(output_file)
    return path.with_name(path.stem + ".exit")


def argv_for(command: list[str]) -> tuple[str, list[str]]:
    """(display string, argv): one argument is a shell command line (argv ["-c", line]),
    several are an argv run as it is."""
    if len(command) == 1:
        return command[0], ["-c", command[0]]
    return shlex.join(command), list(command)


@dataclass
class ShellProcess:
    """A live handle on a started shell task (kept in memory only, never persisted)."""

    pid: int
    started_at: float | None  # None for a fresh child until the leader reads it
    child: bool  # False when adopted after a leader restart (then it is not ours to reap)
    status: int | None = None  # exit code (128+N for signal N) once reaped

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
    output_file: Path,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | Mapping[bytes, bytes] | None = None,
    root: Path | None = None,
) -> ShellProcess:
    """Start `argv` in its own session with stdout+stderr into a new `output_file`.

    The output file is created O_EXCL|O_NOFOLLOW (a planted file or symlink is refused). The
    process is made with posix_spawn (vfork-fast even from a large, threaded leader). A command
    that cannot be executed still starts: the wrapper's shell reports the error into the output
    and records exit code 127 or 126.
    """
    fd = create_output_file(output_file, root)
    exit_file = exit_file_for(output_file)
    try:
        for side in (exit_file, pid_file_for(output_file)):
            # Made here, empty and private: the wrapper's `>` keeps the mode of a file that
            # exists, where it would otherwise create one with the task's umask (0644).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(side)
            os.close(os.open(side, _SIDE_FILE_FLAGS, FILE_MODE))
        pid = os.posix_spawn(
            _SH,
            [_SH, "-c", _WRAPPER, _NAME, os.fspath(exit_file), cwd or os.getcwd(), *argv],
            os.environb if env is None else env,  # bytes: no decoding and re-encoding
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            # A task starts with default signal handling and nothing blocked, whatever the
            # leader's threads have set (a shell cannot trap a signal ignored on entry).
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )
    finally:
        os.close(fd)
    # The start time is read later (see Leader.record_start_times): reading /proc/{pid}/stat
    # now would wait for the child's exec and double the cost of a start.
    return ShellProcess(pid, None, child=True)


def pid_file_for(output_file: str | Path) -> Path:
    """Where the wrapper records its pid (the task's process group id)."""
    path = Path(output_file)
    return path.with_name(path.stem + ".pid")


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


def kill(proc: ShellProcess, grace: float) -> None:
    """TERM the task's process group, wait up to `grace`, then KILL; no such process is fine."""
    terminate(proc.pid, proc.started_at, grace=grace, group=True)
    proc.poll()  # reap our child now (it is gone or a zombie), so no zombie lingers


def looks_like_prompt(output_file: str | Path) -> str | None:
    """The last line of the output if it looks like an interactive prompt, else None."""
    lines = [ln for ln in tail_lines(output_file, n=5) if ln.strip()]
    if not lines:
        return None
    last = lines[-1].strip()
    return last if PROMPT_PATTERNS.search(last) else None
