"""A teammate's commands, as its status file lists them while they matter.

A teammate runs each command in a process group of its own (new session), under the shell
wrapper of `workers/shell.py`, which records the command's pid and exit code in side files. The
teammate lists every command of its current turn in its status file (`"commands"`: pid, process
group, process start time, list task, side files) until it has settled the turn's task. When the
teammate dies, whoever notices (its leader, a new leader adopting its session, `shoal down`)
reads that list: a live group is killed — pid and start time checked, so a reused pid is never
hit — before the task goes back to the list, and a task whose last command had finished gets the
outcome its recorded exit code says, instead of running a second time.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError

from shoal.core.errors import ShoalError
from shoal.core.procs import is_alive
from shoal.teams.store import Teams
from shoal.teams.taskitems import TaskItem
from shoal.teams.tasklist import TaskList
from shoal.workers.shell import process as shell

# The key of a status file that lists the teammate's commands.
STATUS_KEY = "commands"
# The most of a failed command's output kept as its task's `last_error` (as the runner keeps).
LAST_ERROR_CHARS = 500
# The most of a command's output a turn's result carries.
RESULT_TAIL_BYTES = 4000

# How a failed command reads in a turn's result (`command_failed` writes it, `exit_code_of`
# reads it back): readers that only get the text still learn the real exit code.
_EXIT_CODE_RE: Final = re.compile(
    r"^(?:command failed with exit code|[^:\s][^:\n]* exited with code) (-?\d+)(?::|$)"
)


def command_failed(command: str | None, code: int, tail: str) -> str:
    """The result text of a turn ended by a failed command (its name, when known, first)."""
    head = (
        f"{command} exited with code {code}" if command else f"command failed with exit code {code}"
    )
    return f"{head}: {tail}" if tail else head


def exit_code_of(result: str) -> int | None:
    """The exit code a failed turn's result text reports (see `command_failed`), if any."""
    match = _EXIT_CODE_RE.match(result)
    return int(match.group(1)) if match else None


def tail_since(path: Path, start: int) -> str:
    """What was written to `path` past offset `start` (its last RESULT_TAIL_BYTES), stripped."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(start, size - RESULT_TAIL_BYTES))
        return fh.read().decode("utf-8", "replace").strip()


class CommandRecord(BaseModel):
    """One command of a teammate's turn, as its status file lists it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    pid: int  # the wrapper's pid: the leader of the command's process group
    pgid: int
    started_at: float | None  # the wrapper's process start time (see core/procs)
    task_id: int | None  # the list task of the turn (None: a turn on a message)
    exit_file: str  # where the wrapper records the exit code (its pid: the `.pid` sibling)
    output_file: str
    output_offset: int = 0  # the output file's size when the command started
    final: bool = True  # the last step of its turn: its success is the turn's
    allow_fail: bool = False  # a failure of it does not fail the turn

    def recorded_exit(self) -> int | None:
        """The exit code the wrapper recorded, or None (still running, or killed)."""
        return shell.recorded_exit(self.exit_file)

    def group_alive(self) -> bool:
        """Whether the command's wrapper (its group's leader) still runs, the same process."""
        return is_alive(self.pid, self.started_at)

    def kill(self) -> bool:
        """SIGKILL the command's process group if its wrapper is still the process recorded;
        True when a signal was sent. KILL, not TERM: its teammate is gone and the task goes
        back to the list right after, so the command must not run one instruction more."""
        if not self.group_alive():
            return False
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def remove_side_files(self) -> None:
        """Remove the wrapper's side files (the command's task is settled)."""
        for path in (Path(self.exit_file), shell.pid_file_for(self.exit_file)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def side_file(output_file: Path, token: str) -> Path:
    """The exit file of one command of the teammate writing `output_file`."""
    return output_file.with_name(f"{output_file.stem}.cmd-{token}.exit")


def records_of(status: Mapping[str, Any] | None) -> list[CommandRecord]:
    """The commands a status file lists (an entry that does not validate is skipped: the
    file is written by another process, and one bad entry must not hide the others)."""
    raw = (status or {}).get(STATUS_KEY)
    records: list[CommandRecord] = []
    for entry in raw if isinstance(raw, list) else ():
        with contextlib.suppress(ValidationError, TypeError):
            records.append(CommandRecord.model_validate(entry))
    return records


class Outcome(StrEnum):
    """What a dead teammate's task comes to, from its last command."""

    COMPLETED = "completed"  # the turn's last command exited 0
    FAILED = "failed"  # a command failed: the turn had failed
    INTERRUPTED = "interrupted"  # killed, or the turn had more to do: run it again


def outcome(record: CommandRecord) -> tuple[Outcome, int | None]:
    """(outcome, exit code) of the task whose last command is `record` (its group killed or
    gone: nothing can change the exit file any more)."""
    code = record.recorded_exit()
    if code is None:
        return Outcome.INTERRUPTED, None
    if code != 0 and not record.allow_fail:
        return Outcome.FAILED, code
    return (Outcome.COMPLETED if record.final else Outcome.INTERRUPTED), code


def failure_text(record: CommandRecord, code: int) -> str:
    """The `last_error` of a task whose command failed (the words a live runner would use)."""
    with contextlib.suppress(OSError):
        tail = tail_since(Path(record.output_file), record.output_offset)
        return command_failed(None, code, tail)[-LAST_ERROR_CHARS:]
    return command_failed(None, code, "")


@dataclass
class Settled:
    """What `settle_member` did."""

    killed: list[CommandRecord] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)

    def labels(self, member: str) -> list[str]:
        """The killed groups in words: `member:pgid N` each."""
        return [f"{member}:pgid {r.pgid}" for r in self.killed]

    def describe(self, member: str) -> str:
        """One clause per thing done, for the leader's notes ('' when nothing was)."""
        parts = []
        if self.killed:
            parts.append(f"killed its commands ({', '.join(self.labels(member))})")
        if self.completed:
            parts.append(
                "its finished tasks "
                + ", ".join(map(str, self.completed))
                + " completed from their exit codes"
            )
        if self.failed:
            parts.append(
                "its tasks " + ", ".join(map(str, self.failed)) + " failed (exit code recorded)"
            )
        return "; ".join(parts)


def settle_member(
    teams: Teams, team: str, name: str, status: Mapping[str, Any] | None = None
) -> Settled:
    """For a teammate known to be dead: kill the groups of the commands its status file lists,
    then settle each of its in-progress tasks whose last command had ended from the exit code
    recorded (0: completed; a failure: back to pending with it counted). Tasks it leaves
    in progress are the caller's to release (`TaskList.release_member`)."""
    if status is None:
        status = teams.read_status(team, name)
    records = records_of(status)
    done = Settled()
    if not records:
        return done
    done.killed = [r for r in records if r.kill()]
    last: dict[int, CommandRecord] = {}
    for record in records:  # (listed in the order they ran: the last of a task decides)
        if record.task_id is not None:
            last[record.task_id] = record
    tasks = TaskList(teams, team)
    for task_id, record in last.items():
        with contextlib.suppress(ShoalError):
            verdict = settle_from(tasks, task_id, name, record)
            if verdict is Outcome.COMPLETED:
                done.completed.append(task_id)
            elif verdict is Outcome.FAILED:
                done.failed.append(task_id)
    return done


def settle_and_release(
    teams: Teams, team: str, name: str, status: Mapping[str, Any] | None = None
) -> tuple[Settled, list[TaskItem]]:
    """The list tasks of member `name`, known to be gone: `settle_member` first (its commands'
    groups killed, finished tasks settled from their exit codes; a status file it cannot read
    settles nothing), then its other unfinished tasks back to pending. What each did."""
    settled = Settled()
    with contextlib.suppress(ShoalError, OSError):
        settled = settle_member(teams, team, name, status)
    return settled, TaskList(teams, team).release_member(name)


def settle_previous_run(teams: Teams, team: str, name: str) -> None:
    """A previous run under this name that died (its status file names another pid, no
    longer alive) may have left commands running and tasks finished but not marked: kill
    the one, settle the other, before this run's first write replaces that file."""
    with contextlib.suppress(ShoalError, OSError):
        previous = teams.read_status(team, name)
        pid = (previous or {}).get("pid")
        if not (previous or {}).get(STATUS_KEY) or not isinstance(pid, int):
            return
        if pid != os.getpid() and not is_alive(pid, None):
            # (its unfinished tasks go back too: else they would block this run's claims)
            settle_and_release(teams, team, name, previous)


def settle_from(tasks: TaskList, task_id: int, name: str, record: CommandRecord) -> Outcome | None:
    """Settle `name`'s claim on task `task_id` from `record`, the last command of its turn
    (its group killed or gone): completed when it exited 0 as the turn's last step, back to
    pending with a failure counted when it failed. An interrupted one is left to the caller.
    The outcome, or None when nothing was written (interrupted, or the claim no longer
    `name`'s)."""
    verdict, code = outcome(record)
    if verdict is Outcome.INTERRUPTED:
        return None
    error = failure_text(record, code or 0) if verdict is Outcome.FAILED else None
    item = tasks.settle_claim(task_id, name, completed=verdict is Outcome.COMPLETED, error=error)
    return verdict if item is not None else None


def kill_left_commands(teams: Teams, team: str) -> list[str]:
    """Kill the command groups that dead members of `team` left running (their status files
    say which); `member:pgid N` for each group killed. For `shoal down`, once the teammates
    are stopped: a live member's commands are its own."""
    status_dir = teams.layout.status_dir(team)
    try:
        names = sorted(n[: -len(".json")] for n in os.listdir(status_dir) if n.endswith(".json"))
    except OSError:
        return []
    members: dict[str, tuple[int | None, float | None]] = {}
    with contextlib.suppress(ShoalError):
        members = {m.name: (m.pid, m.pid_started_at) for m in teams.read(team).members}
    killed: list[str] = []
    for name in names:
        with contextlib.suppress(ShoalError):
            status = teams.read_status(team, name)
            records = records_of(status)
            if not records:
                continue
            pid, started = members.get(name, ((status or {}).get("pid"), None))
            if isinstance(pid, int) and is_alive(pid, started):
                continue
            killed += [f"{name}:pgid {r.pgid}" for r in records if r.kill()]
    return killed


def dump(records: Sequence[CommandRecord]) -> list[dict[str, Any]]:
    """The status file's `commands` list."""
    return [r.model_dump(mode="json") for r in records]
