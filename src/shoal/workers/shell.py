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
import subprocess
from dataclasses import dataclass
from pathlib import Path

from shoal.core.output import create_output_file, tail_lines
from shoal.core.procs import is_alive, process_start_time, terminate

# "$0" is the exit file; the command follows as "$@". printf and the redirection are builtins,
# so recording the code costs no extra process.
_WRAPPER = 'trap : TERM INT HUP; "$@"; c=$?; printf "%s\\n" "$c" > "$0"; exit "$c"'

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
    """(display string, argv): one argument is a shell command line, several are an argv."""
    if len(command) == 1:
        return command[0], ["/bin/sh", "-c", command[0]]
    return shlex.join(command), list(command)


@dataclass
class ShellProcess:
    """A live handle on a started shell task (kept in memory only, never persisted)."""

    pid: int
    started_at: float
    popen: subprocess.Popen[bytes] | None  # None when adopted after a leader restart

    def poll(self) -> bool:
        """True while the task's process runs (reaping it when it is our child)."""
        if self.popen is not None:
            return self.popen.poll() is None
        return is_alive(self.pid, self.started_at)

    def returncode(self) -> int | None:
        """The wait status of our own child (negative for a signal), else None."""
        return None if self.popen is None else self.popen.returncode


def start(
    argv: list[str],
    output_file: Path,
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    root: Path | None = None,
) -> ShellProcess:
    """Start `argv` in its own session with stdout+stderr into a new `output_file`.

    The output file is created O_EXCL|O_NOFOLLOW (a planted file or symlink is refused). A
    command that cannot be executed still starts: the wrapper's shell reports the error into
    the output and records exit code 127 or 126.
    """
    fd = create_output_file(output_file, root)
    exit_file = exit_file_for(output_file)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(exit_file)
    try:
        popen = subprocess.Popen(
            ["/bin/sh", "-c", _WRAPPER, os.fspath(exit_file), *argv],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
    started = process_start_time(popen.pid)
    return ShellProcess(popen.pid, started if started is not None else 0.0, popen)


def adopt(pid: int, started_at: float | None) -> ShellProcess | None:
    """A handle on a task process left running by a previous leader, if it is still the same."""
    if not is_alive(pid, started_at):
        return None
    return ShellProcess(pid, started_at or 0.0, None)


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
    terminate(proc.pid, proc.started_at or None, grace=grace, group=True)
    if proc.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=1)


def kill_group_now(pid: int) -> None:
    """SIGKILL a whole task group at once (shutdown of a dead leader's leftovers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def looks_like_prompt(output_file: str | Path) -> str | None:
    """The last line of the output if it looks like an interactive prompt, else None."""
    lines = [ln for ln in tail_lines(output_file, n=5) if ln.strip()]
    if not lines:
        return None
    last = lines[-1].strip()
    return last if PROMPT_PATTERNS.search(last) else None
