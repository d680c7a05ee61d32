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
import resource
import shlex
import signal
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shoal.core.errors import ShoalError, TaskError
from shoal.core.events import TaskStalled, task_started, task_terminated
from shoal.core.notify import stall_notification_xml, stall_summary
from shoal.core.output import create_output_file, output_size, read_output_delta, tail, tail_lines
from shoal.core.paths import FILE_MODE
from shoal.core.procs import Termination, is_alive, process_start_time, terminate
from shoal.core.sandbox import Policy, spawn_confined
from shoal.core.secretenv import lost_env_error
from shoal.core.taskrecords import ShellResult
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    LocalShellTaskState,
    TaskStatus,
    TaskType,
    missing_env,
)
from shoal.workers.agent.attachments import note_owned
from shoal.workers.kinds import Poll, TaskStore

# The wrapper: "$1" is the exit file, "$2" the working directory, then either a command line
# to eval (mode "-c") or an argv to run; "$0" names it in error messages. It records its pid
# first (so a leader that dies right after spawning can still find the task), and its exit
# status from an EXIT trap; a TERM, INT or HUP makes it exit 128+N through that trap too
# (after a foreground child has ended). All of it is builtins, so the wrapper costs no extra
# process: a command line runs in it directly.
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

PROMPT_PATTERNS = re.compile(
    r"(\(y/n\)|\[y/n\]|\(yes/no\)|press (enter|any key)|continue\?|overwrite\?"
    r"|^(do you|would you|shall i|are you sure|ready to)\b.*\?)",
    re.IGNORECASE,
)


def _side_file(output_file: str | os.PathLike[str], suffix: str) -> str:
    """`output_file` with its extension replaced by `suffix` (a string: the start path makes
    no Path)."""
    return os.path.splitext(os.fspath(output_file))[0] + suffix


def exit_file_for(output_file: str | Path) -> Path:
    """Where the wrapper records the exit code of the task writing `output_file`."""
    return Path(_side_file(output_file, ".exit"))


def argv_for(command: list[str]) -> tuple[str, list[str]]:
    """(display string, argv): one argument is a shell command line (argv ["-c", line]),
    several are an argv run as it is."""
    if len(command) == 1:
        return command[0], ["-c", command[0]]
    return shlex.join(command), list(command)


def spawn_logged(
    argv: list[str], env: Mapping[bytes, bytes] | Mapping[str, str], log: str | os.PathLike[str]
) -> int:
    """Start `argv` in a session of its own, stdin /dev/null, stdout and stderr appended to
    `log` (created 0600; a symlink there is refused); its pid. The one way a kind starts a
    helper process of its own (an agent's runner, a dream's, an MCP monitor)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        return os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(fd)


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
    blocks = _limit_blocks(file_limit)
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
        _limit_blocks(file_limit), *argv,
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


def looks_like_prompt(output_file: str | Path) -> str | None:
    """The last line of the output if it looks like an interactive prompt, else None."""
    lines = [ln for ln in tail_lines(output_file, n=5) if ln.strip()]
    if not lines:
        return None
    last = lines[-1].strip()
    return last if PROMPT_PATTERNS.search(last) else None


# Exit code recorded for a task killed before the wrapper could record one (SIGKILL).
EXIT_KILLED = 137

# The output cap is hard: a task runs under a file size limit (RLIMIT_FSIZE) of its cap plus
# OUTPUT_CAP_SLACK, set by its wrapper before the command runs, so the kernel refuses every byte
# past that (EFBIG, and SIGXFSZ to the writer) however loaded the machine is. The limit holds
# for every file the task's processes write, not only its output. The leader still looks at
# the size and kills a task at the cap (with the reason), the slack being the room for that
# look; a task the limit stopped first is given the same reason (`cap_reached`).
OUTPUT_CAP_SLACK: Final = 64 << 10
_FSIZE_BLOCK = 512  # (`ulimit -f` counts 512-byte blocks)

# The leader's look: a task whose file grows fast is looked at again before it could write
# half of max(CAP_SLACK_SHARE of the cap, CAP_SLACK_MIN) bytes, at most every
# CAP_CHECK_FLOOR_S; a quiet one only at the loop's full ticks. A new task is looked at once
# right after it starts.
CAP_SLACK_SHARE = 0.1
CAP_SLACK_MIN = 64 << 20
CAP_CHECK_FLOOR_S = 0.01


def output_limit(cap: int) -> int:
    """The file size limit (bytes) of a task whose output cap is `cap`: cap + OUTPUT_CAP_SLACK,
    in whole 512-byte blocks, never above this process's hard RLIMIT_FSIZE (a child cannot be
    given more; RLIM_INFINITY bounds nothing)."""
    limit = max(cap, 0) + OUTPUT_CAP_SLACK
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    return limit - limit % _FSIZE_BLOCK


def _limit_blocks(limit: int | None) -> str:
    """The wrapper's `ulimit -f` argument for `limit` bytes ("" for no limit)."""
    return "" if limit is None else str(limit // _FSIZE_BLOCK)


def cap_reason(size: int, cap: int) -> str:
    """Why a task whose output reached `size` bytes was ended by the cap."""
    if size > cap:
        return f"output reached {size} bytes, over the cap of {cap} bytes"
    return (
        f"output reached {size} bytes, the file size limit (RLIMIT_FSIZE) of the leader, "
        f"below the cap of {cap} bytes"
    )


def cap_reached(output_file: str | Path, cap: int) -> str | None:
    """The cap's reason for a task that ended with its output at the file size limit (its
    writes were refused: by SIGXFSZ, or a writer that ignores it and failed on EFBIG), else
    None."""
    size = output_size(output_file)
    return cap_reason(size, cap) if size >= output_limit(cap) else None


def cap_slack(cap: int) -> int:
    """How far past `cap` the leader's look aims to catch a fast writer (the file size limit
    stops it at OUTPUT_CAP_SLACK past the cap before that)."""
    return max(int(cap * CAP_SLACK_SHARE), CAP_SLACK_MIN)


def next_cap_check(cap: int, rate: float, interval: float) -> float | None:
    """Seconds until a file growing at `rate` bytes/s must be looked at again (half the time
    it needs to write the slack, at least CAP_CHECK_FLOOR_S), or None when the loop's full
    tick every `interval` s comes soon enough."""
    if rate <= 0:
        return None
    due = cap_slack(cap) / (2 * rate)
    return None if due >= interval else max(CAP_CHECK_FLOOR_S, due)


class ShellKind:
    """`local_bash` tasks for the leader's loop: start, reap, output, stalls and kills.

    Live handles (the processes, the kills in progress) stay here in memory; the task records
    in the store hold only plain data. A kill is a state: TERM to the group and a deadline;
    a later REAP poll sends what is due (TERM once more, then KILL) and finishes the task once
    its process is gone, so no step ever waits out a grace period.
    """

    types = frozenset({TaskType.LOCAL_BASH})

    def __init__(self) -> None:
        self.procs: dict[str, ShellProcess] = {}
        self.killing: dict[str, Termination] = {}
        self._exited: set[str] = set()
        self._growth: dict[str, tuple[int, float]] = {}  # task -> (size, since when)
        self._output: dict[str, tuple[str, int]] = {}  # task -> (output file, offset read)
        # Output-cap watch of fast writers only: task -> when to look again, and the size
        # seen last (with when), from which the growth rate is measured.
        self._cap_due: dict[str, float] = {}
        self._sizes: dict[str, tuple[int, float]] = {}
        self._next_stall_check = 0.0

    # -- the protocol ------------------------------------------------------------------------

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, LocalShellTaskState)
        lost = missing_env(task)
        if lost:  # (never run without them: the command would see them unset)
            why = lost_env_error(task.id, lost, "shoal sh")
            store.move_task(task.id, TaskStatus.FAILED, error=why, result=ShellResult(code=-1))
            store.emit(task_started(store.get(task.id) or task))
            return
        try:
            proc = start(
                list(task.argv),
                task.output_file,
                cwd=task.cwd,
                env=_environ(store.environ, {**(task.env or {}), **(task.env_values or {})}),
                # (the session's tasks/ directory was checked against symlinks when it was
                # made; the file itself is opened O_EXCL|O_NOFOLLOW)
                stdin=Path(task.stdin_fifo) if task.stdin_fifo else None,
                sandbox=Policy.from_json(task.sandbox) if task.sandbox is not None else None,
                file_limit=output_limit(store.limits.output_cap),
            )
        except (ShoalError, OSError, ValueError) as exc:
            store.move_task(task.id, TaskStatus.FAILED, error=str(exc), result=ShellResult(code=-1))
        else:
            store.move_task(
                task.id,
                TaskStatus.RUNNING,
                pid=proc.pid,
                pid_started_at=proc.started_at,
                start_time=time.time(),
            )
            self._watch(task.id, proc, store)
            # (its agent asks for its output from its next round on)
            note_owned(task, exit_file_for(task.output_file))
        store.emit(task_started(store.get(task.id) or task))

    def poll(
        self, store: TaskStore, now: float, what: Poll, only: Iterable[str] | None = None
    ) -> None:
        # Looked at from the live handles: a quiet task costs a waitpid and a stat per pass,
        # and its record is read only when something happened.
        ids = list(self.procs) if only is None else [i for i in only if i in self.procs]
        if what is Poll.REAP:
            for task_id in ids:
                self._reap(task_id, store)
            if self._cap_due:  # (every pass, quick ones too: a fast writer cannot wait)
                self._check_fast_writers(store, now)
        elif what is Poll.OUTPUT:
            for task_id in ids:
                self._record_start_time(task_id, store)
                self._read_output(task_id, store, now)
        elif now >= self._next_stall_check:  # (every stall interval, not every pass)
            self._next_stall_check = now + store.limits.stall_check_interval
            for task_id in ids:
                task = store.get(task_id)
                if isinstance(task, LocalShellTaskState):
                    self._check_stall(task, store, now)

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        if task.is_terminal or task.id in self.killing:
            return
        proc = self.procs.get(task.id)
        if proc is not None and not proc.poll():  # it ended already: that is its result
            self._finish(task.id, proc, store)
            return
        store.set_task(task.id, kill_reason=reason)
        if proc is None:
            self._finish(task.id, None, store, killed=True)
            return
        ending = Termination(proc.pid, proc.started_at, grace=store.limits.kill_grace, group=True)
        self.killing[task.id] = ending
        if not ending.begin():
            proc.poll()
            self._finish(task.id, proc, store, killed=True)
            return
        if isinstance(task, LocalShellTaskState) and task.paused_at is not None:
            # A stopped group acts on the TERM only once it is continued.
            self.signal_group(task.id, signal.SIGCONT)
        store.wake()  # (the pidfd says when it ends; the deadline is in next_due)

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """A task of an earlier leader: watch it if it still runs, else give it the exit code
        its wrapper recorded. One that never started is left pending (the caller queues it)."""
        assert isinstance(task, LocalShellTaskState)
        started, proc = locate(task.pid, task.pid_started_at, task.output_file)
        if not started:
            return
        if task.status == TaskStatus.PENDING:
            store.move_task(
                task.id,
                TaskStatus.RUNNING,
                pid=proc.pid if proc else recorded_pid(task.output_file),
                pid_started_at=proc.started_at if proc else None,
            )
        if proc is not None:
            if task.stdin_fifo and os.path.exists(task.stdin_fifo):
                with contextlib.suppress(OSError, ShoalError):
                    proc.stdin = open_stdin_fifo(Path(task.stdin_fifo), create=False)
            self._watch(task.id, proc, store)
            store.note(f"adopted {task.id} (pid {proc.pid}): {task.command}")
        else:
            self._finish(task.id, None, store, ended_unattended=True)

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        return {}

    def live(self) -> Iterable[str]:
        return list(self.procs)

    def signalled(self) -> Iterable[str]:
        exited, self._exited = self._exited, set()
        now = time.monotonic()
        due = {i for i, k in self.killing.items() if k.next_due() <= now}
        return [i for i, p in self.procs.items() if i in exited or i in due or p.status is not None]

    def on_exit(self, key: str) -> bool:
        if key in self.procs:
            self._exited.add(key)
            return True
        return False

    def next_due(self) -> float | None:
        kills = min((k.next_due() for k in self.killing.values()), default=None)
        caps = min(self._cap_due.values(), default=None)
        if kills is None or caps is None:
            return caps if kills is None else kills
        return min(kills, caps)

    def running(self) -> int:
        return len(self.procs)

    # -- what `shoal pause/resume/send-input` ask of a live task ------------------------------

    def signal_group(self, task_id: str, signum: int) -> bool:
        """Send `signum` to the task's process group; False when it has no live process."""
        proc = self.procs.get(task_id)
        if proc is None:
            return False
        try:
            os.killpg(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def write_stdin(self, task_id: str, data: bytes) -> int:
        """Write `data` to the task's stdin without blocking; the bytes written. TaskError
        when it has no open stdin, or its pipe is full (the task does not read)."""
        proc = self.procs.get(task_id)
        if proc is None or proc.stdin is None:
            raise TaskError(f"task {task_id} has no open stdin (start it with `shoal sh --stdin`)")
        try:
            return os.write(proc.stdin, data)
        except BlockingIOError:
            raise TaskError(
                f"the stdin pipe of task {task_id} is full (it is not reading); nothing written"
            ) from None

    def close_stdin(self, task_id: str) -> bool:
        """Close the task's stdin (it reads EOF); False when it had none open."""
        proc = self.procs.get(task_id)
        return proc is not None and proc.close_stdin()

    def was_started(self, task: AnyTaskState) -> bool:
        """Whether an earlier leader got as far as starting `task` (see `locate`)."""
        assert isinstance(task, LocalShellTaskState)
        return locate(task.pid, task.pid_started_at, task.output_file)[0]

    # -- the steps ---------------------------------------------------------------------------

    def _watch(self, task_id: str, proc: ShellProcess, store: TaskStore) -> None:
        task = store.get(task_id)
        assert isinstance(task, LocalShellTaskState)
        self.procs[task_id] = proc
        self._output[task_id] = (task.output_file, task.output_offset)
        now = time.monotonic()
        self._sizes[task_id] = (task.output_offset, now)
        self._cap_due[task_id] = now + CAP_CHECK_FLOOR_S  # (its first look: see CAP_SLACK_MIN)
        store.watch_pid(task_id, proc.pid)

    def _reap(self, task_id: str, store: TaskStore) -> None:
        proc = self.procs[task_id]
        alive = proc.poll()
        ending = self.killing.get(task_id)
        if ending is not None:
            if ending.advance(alive=alive):
                self._finish(task_id, proc, store, killed=True)
        elif not alive:
            self._finish(task_id, proc, store)

    def _record_start_time(self, task_id: str, store: TaskStore) -> None:
        """Note a fresh task's start time (pid reuse protection) once it has exec'd."""
        proc = self.procs[task_id]
        if proc.started_at is None:
            proc.started_at = process_start_time(proc.pid)
            if proc.started_at is not None:
                store.set_task(task_id, pid_started_at=proc.started_at)

    def _read_delta(self, task: LocalShellTaskState, store: TaskStore) -> None:
        """Advance the task's reported offset over new output (8 MiB a read). Not of an
        agent's task: its agent is the reader, and the offset moves when an attachment
        reached it (workers/agent/attachments.py)."""
        if task.agent_task is not None:
            return
        data, offset = read_output_delta(task.output_file, task.output_offset)
        if not data:
            return
        lines = data.count(b"\n")
        store.set_task(
            task.id,
            output_offset=offset,
            last_reported_total_lines=task.last_reported_total_lines + lines,
        )
        if task.id in self._output:
            self._output[task.id] = (task.output_file, offset)

    def _read_output(self, task_id: str, store: TaskStore, now: float) -> None:
        path, offset = self._output[task_id]
        size = output_size(path)  # (one stat when nothing was written)
        if size <= offset:
            return
        task = store.get(task_id)
        if not isinstance(task, LocalShellTaskState):
            return
        if task.agent_task is None:
            self._read_delta(task, store)
        else:  # (only looked at here: its agent's attachments move its offset)
            self._output[task_id] = (path, size)
        self._check_cap(task_id, size, now, store)

    def _check_fast_writers(self, store: TaskStore, now: float) -> None:
        """Look at the size of each fast writer whose next look is due."""
        for task_id, due in list(self._cap_due.items()):
            if due <= now and task_id in self._output:
                self._check_cap(task_id, output_size(self._output[task_id][0]), now, store)

    def _check_cap(self, task_id: str, size: int, now: float, store: TaskStore) -> None:
        """Kill a task whose output passed the cap; else, from how fast its file grew since
        it was last looked at, say when to look again (sooner than the next full tick, for a
        task that could otherwise write past the cap's slack)."""
        if task_id in self.killing:
            self._cap_due.pop(task_id, None)
            return
        limits = store.limits
        cap = limits.output_cap
        if size > cap:
            self._cap_due.pop(task_id, None)
            reason = cap_reason(size, cap)
            task = store.get(task_id)
            if task is not None:
                self.kill(task, store, reason)
                store.note(f"killed {task_id}: {reason}")
            return
        last_size, last_seen = self._sizes.get(task_id, (size, now))
        self._sizes[task_id] = (size, now)
        # A quiet task is looked at every full tick, so its growth happened within one tick
        # of now, however long ago the size was last recorded.
        elapsed = min(max(now - last_seen, CAP_CHECK_FLOOR_S / 10), limits.poll_interval or 1.0)
        due = next_cap_check(cap, (size - last_size) / elapsed, limits.poll_interval or 1.0)
        if due is None:
            self._cap_due.pop(task_id, None)
        else:
            self._cap_due[task_id] = now + due

    def _check_stall(self, task: LocalShellTaskState, store: TaskStore, now: float) -> None:
        """Every stall interval: a task silent for `stall_after` at a prompt is reported once."""
        limits = store.limits
        if task.kind == "monitor":
            return
        size = output_size(task.output_file)
        last_size, since = self._growth.get(task.id, (-1, now))
        if size != last_size:
            self._growth[task.id] = (size, now)
            return
        if task.stall_notified or now - since < limits.stall_after:
            return
        prompt = looks_like_prompt(task.output_file)
        if prompt is None:
            return
        store.set_task(task.id, stall_notified=True)
        text = stall_notification_xml(task, tail(task.output_file, 1024))
        summary = stall_summary(task.description)
        store.emit(TaskStalled(task_id=task.id, prompt=prompt, notification=text, summary=summary))
        store.notify_owner(task, text, summary, status="running", msg_id=None)

    def _finish(
        self,
        task_id: str,
        proc: ShellProcess | None,
        store: TaskStore,
        *,
        killed: bool = False,
        ended_unattended: bool = False,
    ) -> None:
        """Give an ended task its final state (from its wait status, else its exit file)."""
        ended = self.procs.pop(task_id, None)
        if ended is not None:
            ended.close_stdin()
        self.killing.pop(task_id, None)
        self._output.pop(task_id, None)
        self._growth.pop(task_id, None)
        self._cap_due.pop(task_id, None)
        self._sizes.pop(task_id, None)
        self._exited.discard(task_id)
        store.unwatch_pid(task_id)
        task = store.get(task_id)
        if not isinstance(task, LocalShellTaskState) or task.is_terminal:
            return
        # A task's children never outlive it: what its wrapper left behind (a `cmd &`, or
        # everything, when the wrapper itself was killed) goes with it.
        pgid = proc.pid if proc is not None else task.pid or recorded_pid(task.output_file)
        leftovers = kill_leftover_group(pgid)
        if leftovers:
            store.note(f"killed what {task_id} left running in its process group {pgid}")
        # Our own child: its wait status is the wrapper's (= the command's) exit code. A task
        # adopted after a restart has only what the wrapper recorded on disk.
        code = proc.returncode() if proc is not None else None
        if code is None:
            code = recorded_exit(task.output_file)
        self._read_delta(task, store)
        reason = task.kill_reason
        if not killed and not reason:
            reason = cap_reached(task.output_file, store.limits.output_cap)
            if reason:
                store.set_task(task_id, kill_reason=reason)
                store.note(f"{task_id} ended at the file size limit: {reason}")
        if killed or reason:
            result = ShellResult(code=code if code is not None else EXIT_KILLED, interrupted=True)
            store.move_task(task_id, TaskStatus.KILLED, result=result)
            if not reason or reason == STOPPED_ON_REQUEST:
                # A kill the user asked for is not news: no notification, no 137 "failure".
                store.mark_notified(task_id)
                final = store.get(task_id)
                assert final is not None
                store.emit(task_terminated(final))
            return
        if code is None:
            error = (
                "ended while no leader was running and recorded no exit code"
                if ended_unattended
                else "ended without recording an exit code (killed?)"
            )
            if leftovers:
                error += "; the processes it left in its group were killed"
            store.move_task(task_id, TaskStatus.FAILED, result=ShellResult(code=-1), error=error)
        elif code == 0:
            store.move_task(task_id, TaskStatus.COMPLETED, result=ShellResult(code=0))
        else:
            store.move_task(task_id, TaskStatus.FAILED, result=ShellResult(code=code))

    def kill_all_now(self, grace: float) -> None:
        """Kill every task process, waiting (for cleanup at exit, when no loop runs)."""
        for proc in list(self.procs.values()):
            kill(proc, grace)


def _environ(base: dict[bytes, bytes], extra: dict[str, str] | None) -> dict[bytes, bytes]:
    """The leader's environment (as at its start) plus a task's own variables."""
    if not extra:
        return base
    return {**base, **{os.fsencode(k): os.fsencode(v) for k, v in extra.items()}}


def new_task(
    command: list[str],
    *,
    task_id: str,
    output_file: str,
    owner: str,
    agent_id: str | None = None,
    description: str | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    env_values: dict[str, str] | None = None,
    env_names: Iterable[str] = (),
    kind: str = "bash",
    background: bool = True,
    tool_use_id: str | None = None,
    **queueing: Any,
) -> LocalShellTaskState:
    """Build (and check) a pending shell task; a bad request is a TaskError naming it.

    `env` is written with the task; `env_values` (`--env`) are kept in memory only, their
    names with the task (`env_names`: names whose values a restart of an earlier task lost).

    `queueing`: the task's fields for when and where it starts (label, group, priority,
    after, after_any, not_before, timeout, retries, retry_delay, stdin_fifo, ...)."""
    if not command or not all(isinstance(a, str) for a in command) or not command[0]:
        raise TaskError("no command given (usage: shoal sh -- CMD ARGS...)")
    if cwd is not None and not os.path.isdir(cwd):
        raise TaskError(f"working directory {cwd!r} does not exist")
    if kind not in ("bash", "monitor"):
        raise TaskError(f"unknown shell task kind {kind!r} (bash or monitor)")
    display, argv = argv_for(command)
    return LocalShellTaskState(
        id=task_id,
        description=description or display,
        command=display,
        argv=tuple(argv),
        cwd=cwd or os.getcwd(),
        env=env or None,
        env_names=tuple(dict.fromkeys([*env_names, *(env_values or {})])),
        env_values=env_values or None,
        output_file=output_file,
        owner=owner,
        agent_id=agent_id,
        kind=kind,
        is_backgrounded=background,
        tool_use_id=tool_use_id,
        **queueing,
    )
