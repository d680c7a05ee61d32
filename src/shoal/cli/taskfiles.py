"""A team's tasks as the CLI reads them: the session's files (state.json and its history),
a task found by any unique prefix of its id, its exit code, and its output copied to stdout.

Read-only commands (ps, logs, wait, events) read these files rather than ask the leader.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from shoal.channel.client import leader_alive
from shoal.core.errors import NotFoundError
from shoal.core.ids import resolve_task_id
from shoal.core.paths import Layout
from shoal.core.taskstatus import is_terminal_task_status
from shoal.teams.lead import NoLeaderError
from shoal.teams.session_files import SessionFiles, current_session_files

POLL_S = 0.05


def open_session(layout: Layout, team: str) -> SessionFiles:
    """The team's current session; NotFoundError naming `shoal up` when it has none (and
    the team's own NotFoundError when there is no such team)."""
    session = current_session_files(layout, team)
    if session is None:
        raise NotFoundError(
            f"team {team!r} has no session yet; start its leader with `shoal up --team {team}`"
        )
    return session


def task_records(session: SessionFiles, *, include_history: bool) -> dict[str, dict[str, Any]]:
    """Tasks by id: the registry snapshot, plus evicted ones when asked (a poller keeps a
    `_SessionView` instead)."""
    out: dict[str, dict[str, Any]] = {}
    if include_history:
        out.update(session.history())
    out.update(session.read_tasks_raw())
    return out


def find_task(session: SessionFiles, task_id: str) -> dict[str, Any]:
    """The record of task `task_id` (any unique prefix of its id), live or finished;
    UnknownTaskError (exit 2) naming the team when there is none."""
    tasks = task_records(session, include_history=True)
    return tasks[resolve_task_id(tasks, task_id, team=session.team_name())]


def full_task_id(layout: Layout, team: str, given: str) -> str:
    """The id of the team's task that `given` is a unique prefix of (itself when none is, or
    there is no session to look in: the leader then says what is wrong); an ambiguous
    prefix is a UsageError listing the candidates."""
    session = current_session_files(layout, team)
    if session is None:
        return given
    try:
        return resolve_task_id(task_records(session, include_history=True), given)
    except NotFoundError:
        return given  # (the leader's answer names what is wrong, as for any unknown id)


def copy_output(path: str, offset: int) -> int:
    """Write what task output file `path` holds past `offset` to stdout; the new offset."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return offset
    out = sys.stdout.buffer
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 16):
            out.write(chunk)
            offset += len(chunk)
    finally:
        os.close(fd)
    out.flush()
    return offset


def exit_code(task: dict[str, Any]) -> int | None:
    """The exit code in a task's result, if it has one: a shell task's result is a table with
    `code`, a teammate's is the text it ended with (or nothing)."""
    result = task.get("result")
    code = result.get("code") if isinstance(result, dict) else None
    return code if isinstance(code, int) else None


def print_output(
    session: SessionFiles,
    task_id: str,
    *,
    stream: bool,
    on_poll: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Print the task's output (following it while it runs when `stream`); the final record."""
    team: str | None = None
    task = find_task(session, task_id)
    path = task["output_file"]
    offset = 0
    while True:
        offset = copy_output(path, offset)
        if not stream or is_terminal_task_status(task["status"]):
            return task
        time.sleep(POLL_S)
        task = find_task(session, task_id)
        if on_poll is not None:
            on_poll(task)
        if team is None:
            team = session.team_name()  # read once, only when following
        if not is_terminal_task_status(task["status"]) and (
            leader_alive(session.layout, team) is None
        ):
            raise NoLeaderError(team, f"task {task_id} cannot finish without one")
