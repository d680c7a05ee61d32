"""`shoal wait`: block until tasks end, reading the session's files as they change; the exit
code says whether they all completed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Final

import click
import orjson

from shoal.channel.client import leader_alive
from shoal.cli.common import (
    DURATION,
    common_options,
    complete_task_id,
    get_env,
    json_option,
    print_json,
)
from shoal.cli.taskfiles import POLL_S, open_session
from shoal.core.errors import (
    EXIT_FAILED,
    TimedOutError,
    UsageError,
)
from shoal.core.ids import resolve_task_id
from shoal.core.taskstatus import is_terminal_task_status, retry_due
from shoal.teams.lead import NoLeaderError
from shoal.teams.session_files import HistoryReader, SessionFiles

# `wait` reads the session's files again only when they changed (or after this long, in case a
# change left every stat field as it was), and asks whether the leader lives this often.
WAIT_REREAD_S: Final = 1.0
WAIT_ALIVE_S: Final = 0.5


@click.command()
@click.argument("task_ids", nargs=-1, shell_complete=complete_task_id)
@click.option(
    "--timeout", type=DURATION, default=None, help="Give up after DURATION (90, 1.5s, 5m)."
)
@click.option(
    "--group",
    "group_name",
    default=None,
    metavar="NAME",
    help="Wait for the tasks of group NAME (those no earlier `wait` reported).",
)
@json_option
@common_options
def wait(
    task_ids: tuple[str, ...], timeout: float | None, group_name: str | None, as_json: bool
) -> None:
    """Wait for tasks to finish (default: every task of the session since the last `wait`,
    those that already ended included).

    Exit code 0 when all completed, 1 when any failed or was killed (however long before the
    call it ended), 124 when --timeout expired first.
    """
    env = get_env(click.get_current_context())
    team = env.team()
    if task_ids and group_name is not None:
        raise UsageError("wait takes task ids or --group NAME, not both")
    session = open_session(env.layout, team)
    view = _SessionView(session)
    seen_mark = view.marks()  # (before the read: a write after it is seen)
    tasks = view.tasks()
    if task_ids:
        ids = [resolve_task_id(tasks, task_id, team=team) for task_id in task_ids]
    else:
        if group_name is not None and group_name not in session.group_names():
            raise UsageError(f"no group {group_name!r} in team {team!r} (see `shoal group list`)")
        seen = _waited(session)
        ids = [
            k
            for k, t in tasks.items()
            if k not in seen
            and _waitable(t)
            and not t.get("retry_of")
            and (group_name is None or t.get("group", "default") == group_name)
        ]
    deadline = None if timeout is None else time.monotonic() + timeout
    done: dict[str, dict[str, Any]] = {}
    # (the leader is asked at once, then twice a second: with none, `wait` says so before any
    # --timeout runs out)
    next_alive = time.monotonic()
    next_read = next_alive + WAIT_REREAD_S
    try:
        while True:
            for task_id in ids:
                t = None if task_id in done else _settled(tasks, task_id)
                if t is not None:
                    done[task_id] = t
                    if not as_json:
                        last = (
                            f" (attempt {t.get('attempt')}: {t['id']})"
                            if t["id"] != task_id
                            else ""
                        )
                        click.echo(f"{task_id} {t['status']}{last}")
            if len(done) == len(ids):
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimedOutError(
                    f"timed out after {timeout:g}s waiting for "
                    + " ".join(i for i in ids if i not in done)
                )
            # (the session's files are parsed again only once they changed, not twenty times
            # a second: a long queue's state.json is big)
            while True:
                time.sleep(POLL_S)
                now = time.monotonic()
                if now >= next_alive:
                    next_alive = now + WAIT_ALIVE_S
                    if leader_alive(env.layout, team) is None:
                        _dead_leader(view, ids, done, team)
                        break  # (its last writes settled them all)
                mark = view.marks()
                if mark != seen_mark or now >= next_read:
                    seen_mark, next_read = mark, now + WAIT_REREAD_S
                    break
                if deadline is not None and now > deadline:
                    break
            tasks = view.tasks()
    finally:
        _mark_waited(session, done)
    if as_json:
        print_json([done[i] for i in ids])
    failed = [i for i in ids if done[i]["status"] != "completed"]
    if failed:
        if not as_json and not task_ids:  # (with ids, each one's line said how it ended)
            click.echo(f"{len(failed)} of {len(ids)} tasks did not complete: {' '.join(failed)}",
                       err=True)  # fmt: skip
        sys.exit(EXIT_FAILED)


WAITED_FILE: Final = "waited.json"
"""The ids a `wait` has reported ended, per session: a later `wait` with no ids skips them."""


def _stat_mark(path: Path) -> tuple[int, int, int, int] | None:
    """What changes whenever the leader writes `path` (state.json is replaced whole, the
    history appended to): its inode, times and size; None while it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


class _SessionView:
    """The session's tasks as a poller (`wait`) sees them: state.json parsed again only once
    its own stat changed, the history read as it grows. (A long queue's state.json is big, and
    the history grows with every ended task: re-parsing state.json on each of those appends
    was most of a `wait`'s CPU.)"""

    def __init__(self, session: SessionFiles) -> None:
        self.session = session
        self.history = HistoryReader(session)
        self._state: dict[str, dict[str, Any]] = {}
        self._state_mark: tuple[int, int, int, int] | None = None

    def marks(self) -> tuple[Any, ...]:
        return _stat_mark(self.session.state_file), _stat_mark(self.session.history_file)

    def tasks(self, *, fresh: bool = False) -> dict[str, dict[str, Any]]:
        """Tasks by id, the history's overridden by state.json's (as `_tasks` has them).
        `fresh`: parse state.json again whatever its stat says."""
        mark = _stat_mark(self.session.state_file)  # (before the read: a later write is seen)
        if fresh or mark is None or mark != self._state_mark:
            self._state = self.session.read_tasks_raw()
            self._state_mark = mark
        out = dict(self.history.read())
        out.update(self._state)
        return out


def _dead_leader(
    view: _SessionView, ids: list[str], done: dict[str, dict[str, Any]], team: str
) -> None:
    """The leader is gone: unless its last writes settled every task waited for (read once
    more: it may have written them as it stopped), a ShoalError saying so."""
    tasks = view.tasks(fresh=True)
    if all(i in done or _settled(tasks, i) is not None for i in ids):
        return
    raise NoLeaderError(team, "the tasks waited for cannot finish without one")


def _settled(tasks: dict[str, dict[str, Any]], task_id: str) -> dict[str, Any] | None:
    """The final record of task `task_id`, following its retries (`retried_as`) to the last
    attempt; None while that one runs or is about to be retried."""
    t = tasks.get(task_id)
    seen = {task_id}
    while t is not None and t.get("retried_as") and t["retried_as"] not in seen:
        seen.add(t["retried_as"])
        t = tasks.get(t["retried_as"])
    if t is None or not is_terminal_task_status(t["status"]):
        return None
    if retry_due(t["status"], t.get("retries") or 0, t.get("pid"), bool(t.get("notified")),
                 t.get("kill_reason")):  # fmt: skip
        return None  # (the leader starts its next attempt at its next tick)
    return t


def _waitable(task: dict[str, Any]) -> bool:
    """A task a `wait` with no ids waits for: any, but a live teammate's (it ends only when
    the team shuts it down) and a coordinator's worker (its coordinator waits for it)."""
    if task.get("type") == "in_process_teammate" and not is_terminal_task_status(task["status"]):
        return False
    return not task.get("worker_of")


def _waited(session: Any) -> set[str]:
    try:
        raw = orjson.loads((session.dir / WAITED_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return set()
    return set(raw.get("ids", [])) if isinstance(raw, dict) else set()


def _mark_waited(session: Any, done: dict[str, dict[str, Any]]) -> None:
    """Add what this `wait` saw end (with their last attempts) to the session's waited ids
    (under their lock)."""
    if not done:
        return
    from shoal.core.jsonio import atomic_write, dumps, lock_for

    path = session.dir / WAITED_FILE
    with lock_for(path):
        ids = _waited(session) | set(done) | {t["id"] for t in done.values()}
        atomic_write(path, dumps({"ids": sorted(ids)}))
