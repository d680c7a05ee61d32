"""`shoal sh`, `ps`, `logs`, `stop`, `wait` and `events`: background tasks of a team's leader.

`sh` and `stop` change state, so they go through the leader; the rest read the session files.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TextIO

import click
import orjson

from shoal.channel.client import DEFAULT_TIMEOUT_S, Channel, ControlError, leader_alive
from shoal.cli.common import (
    common_options,
    complete_task_id,
    get_env,
    json_option,
    print_json,
)
from shoal.cli.control_cmds import queue_notes, queue_options, queue_spec, queue_status
from shoal.core.cmdsize import command_problem, spec_problem
from shoal.core.errors import (
    EXIT_FAILED,
    NotFoundError,
    ShoalError,
    TimedOutError,
    UsageError,
)
from shoal.core.ids import resolve_task_id
from shoal.core.paths import Layout
from shoal.core.taskstatus import is_terminal_task_status, retry_due
from shoal.teams.session_files import HistoryReader, SessionFiles, current_session_files
from shoal.ui.status import type_label

POLL_S = 0.05
# `wait` reads the session's files again only when they changed (or after this long, in case a
# change left every stat field as it was), and asks whether the leader lives this often.
WAIT_REREAD_S: Final = 1.0
WAIT_ALIVE_S: Final = 0.5
# `sh --batch` sends its tasks in requests of at most this many (or this many bytes of specs):
# each answer carries the started tasks' records, and a message is capped at 1 MiB.
BATCH_CHUNK_TASKS = 500
BATCH_CHUNK_BYTES = 128 * 1024
# `logs --json` carries at most the last this many bytes of output.
LOGS_JSON_MAX_BYTES = 8 * 1024 * 1024


def _session(layout: Layout, team: str) -> SessionFiles:
    session = current_session_files(layout, team)
    if session is None:
        raise NotFoundError(
            f"team {team!r} has no session yet; start its leader with `shoal up --team {team}`"
        )
    return session


def _tasks(session: SessionFiles, *, include_history: bool) -> dict[str, dict[str, Any]]:
    """Tasks by id: the registry snapshot, plus evicted ones when asked (a poller keeps a
    `_SessionView` instead)."""
    out: dict[str, dict[str, Any]] = {}
    if include_history:
        out.update(session.history())
    out.update(session.read_tasks_raw())
    return out


def _find(session: SessionFiles, task_id: str) -> dict[str, Any]:
    """The record of task `task_id` (any unique prefix of its id), live or finished."""
    tasks = _tasks(session, include_history=True)
    return tasks[resolve_task_id(tasks, task_id)]


def full_task_id(layout: Layout, team: str, given: str) -> str:
    """The id of the team's task that `given` is a unique prefix of (itself when none is, or
    there is no session to look in: the leader then says what is wrong); an ambiguous
    prefix is a UsageError listing the candidates."""
    session = current_session_files(layout, team)
    if session is None:
        return given
    try:
        return resolve_task_id(_tasks(session, include_history=True), given)
    except NotFoundError:
        return given  # (the leader's answer names what is wrong, as for any unknown id)


def _age(task: dict[str, Any]) -> str:
    end = task.get("end_time") or time.time()
    secs = max(0.0, end - task.get("start_time", end))
    if secs < 60:
        return f"{secs:.1f}s"
    if secs < 3600:
        return f"{secs / 60:.1f}m"
    return f"{secs / 3600:.1f}h"


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--description", "-d", default=None, help="What the task does (default: the command)."
)
@click.option(
    "--agent",
    default=None,
    metavar="NAME",
    help="Member that owns the task: it is notified, and the task dies with it.",
)
@click.option(
    "--cwd",
    default=None,
    type=click.Path(file_okay=False),
    help="Working directory (default: the current one).",
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A variable of the task's environment. The value is never written to disk, only the "
    "name: a task not yet started, a retry or a restart after a leader restart fails, naming "
    "the --env KEY=VALUE to give again.",
)
@click.option("--monitor", is_flag=True, help="A long-running monitor (exempt from stall checks).")
@click.option(
    "--batch",
    type=click.File("r"),
    default=None,
    metavar="FILE",
    help="Start one task per line of FILE ('-': standard input); blank and # lines skipped.",
)
@click.option(
    "--foreground",
    "-f",
    is_flag=True,
    help="Stream the output; exit 0 when the task completes, 1 (naming its code) when not.",
)
@queue_options
@json_option
@common_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def sh(
    description: str | None,
    agent: str | None,
    cwd: str | None,
    env_pairs: tuple[str, ...],
    monitor: bool,
    batch: TextIO | None,
    foreground: bool,
    as_json: bool,
    command: tuple[str, ...],
    **queueing: Any,
) -> None:
    """Run COMMAND as a background task; prints its id.

    One argument is a shell command line (`shoal sh -- 'make && make test'`); several are run
    as they are (`shoal sh -- pytest -x tests/`). With --batch, every line of FILE is a
    command line and the ids are printed one per line, in order.
    """
    from shoal.channel.client import call

    env = get_env(click.get_current_context())
    extra: dict[str, str] = {}
    for pair in env_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, not {pair!r}")
        extra[key] = value
    if batch is not None and (command or foreground):
        raise UsageError("--batch takes its commands from FILE: give no COMMAND, no --foreground")
    if batch is None and not command:
        raise UsageError("no command given (usage: shoal sh -- CMD ARGS...)")
    spec = {
        "description": description,
        "agent": agent,
        "cwd": os.path.abspath(cwd) if cwd else os.getcwd(),
        "env": extra or None,
        "kind": "monitor" if monitor else "bash",
        "background": not foreground,
        **queue_spec(queueing),
    }
    team = env.team()
    if batch is not None:
        source = "standard input" if batch.name == "<stdin>" else batch.name
        specs: list[dict[str, Any]] = []
        for number, raw in enumerate(batch.read().splitlines(), 1):
            line = raw.strip()
            if line and not line.startswith("#"):
                specs.append({**spec, "command": [line]})
                _check_size(specs[-1], f"line {number} of {source}: ")  # all before any starts
        if not specs:
            raise UsageError("--batch: no commands in the file")
        started: list[dict[str, Any]] = []
        for chunk in _chunks(specs):
            try:
                started += call(env.layout, team, "sh", {"batch": chunk})
            except ShoalError as exc:
                if not started:
                    raise
                _print_started(started, as_json)
                raise ShoalError(
                    f"{exc} (the first {len(started)} of {len(specs)} tasks were started; "
                    "their ids are above)"
                ) from None
        _print_started(started, as_json)
        return
    one = {**spec, "command": list(command)}
    _check_size(one)
    if not foreground:
        task = call(env.layout, team, "sh", one)
        if as_json:
            print_json(task)
        else:
            click.echo(task["id"])
        return
    final = _run_in_foreground(env.layout, team, one)
    code = _exit_code(final)
    if final["status"] != "completed":
        # The task's own exit code (128+N after signal N), as `timeout` and `nohup` pass it on;
        # 1 when it has none (it never started, or its end is known only as a status).
        how = f"exit code {code}" if code is not None else final.get("error") or "no exit code"
        click.echo(f"shoal: task {final['id']} {final['status']} ({how})", err=True)
        sys.exit(code if code is not None and 0 < code < 256 else EXIT_FAILED)


def _run_in_foreground(layout: Layout, team: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Start the task, stream its output until the leader answers that it has ended (an
    `await` request on the same reply inbox: no state.json poll, which lags up to 0.2 s), and
    return its final record."""
    with Channel(layout, team) as channel:
        done, task = channel.answer(channel.send("sh", spec), DEFAULT_TIMEOUT_S)
        if not done:
            raise ControlError(
                f"the leader of team {team!r} did not answer within {DEFAULT_TIMEOUT_S:g}s"
            )
        end = channel.send("await", {"task_id": task["id"]})
        path, offset = task["output_file"], 0
        while True:
            offset = _copy_output(path, offset)
            try:
                done, final = channel.answer(end, POLL_S)
            except ControlError:
                if leader_alive(layout, team) is not None:
                    raise
                raise ShoalError(
                    f"the leader of team {team!r} is not running, so task "
                    f"{task['id']} cannot finish; start it with `shoal up`"
                ) from None
            if done:
                _copy_output(path, offset)
                return dict(final)


def _copy_output(path: str, offset: int) -> int:
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


def _waiting(task: dict[str, Any]) -> str:
    """What an agent waits on or has spent (see ui/status.py's agent_notes)."""
    from shoal.ui.status import agent_notes

    return agent_notes(task)


def _exit_code(task: dict[str, Any]) -> int | None:
    """The exit code in a task's result, if it has one: a shell task's result is a table with
    `code`, a teammate's is the text it ended with (or nothing)."""
    result = task.get("result")
    code = result.get("code") if isinstance(result, dict) else None
    return code if isinstance(code, int) else None


def _check_size(spec: dict[str, Any], where: str = "") -> None:
    """Refuse a task too big to start or to ask the leader for (UsageError, nothing sent). The
    leader checks again with the environment its tasks inherit, which only it knows."""
    problem = command_problem(spec["command"], env=spec["env"]) or spec_problem(spec)
    if problem is not None:
        raise UsageError(where + problem)


def _chunks(specs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Batch specs split into requests whose answers (the started tasks) stay well under the
    mailbox's message cap."""
    chunks: list[list[dict[str, Any]]] = [[]]
    size = 0
    for spec in specs:
        n = len(orjson.dumps(spec))
        if chunks[-1] and (len(chunks[-1]) >= BATCH_CHUNK_TASKS or size + n > BATCH_CHUNK_BYTES):
            chunks.append([])
            size = 0
        chunks[-1].append(spec)
        size += n
    return chunks


def _print_started(started: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json(started)
    else:
        click.echo("\n".join(t["id"] for t in started))


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Include finished tasks already evicted.")
@click.option(
    "--watch", "-w", is_flag=True, help="A live board of members and tasks (Ctrl-C ends it)."
)
@json_option
@common_options
def ps(show_all: bool, watch: bool, as_json: bool) -> None:
    """List the team's tasks (with --watch, a live board redrawn as they change)."""
    env = get_env(click.get_current_context())
    if watch:
        if as_json or show_all:
            raise UsageError("--watch shows the live board; it takes neither --json nor --all")
        from shoal.cli.ui import watch_board

        watch_board(env.layout, env.team())
        return
    session = current_session_files(env.layout, env.team())
    tasks = _tasks(session, include_history=show_all) if session else {}
    rows = sorted(tasks.values(), key=lambda t: t.get("start_time", 0))
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no tasks" + ("" if show_all else " (finished ones: `shoal ps --all`)"))
        return
    click.echo(f"{'ID':<10} {'TYPE':<10} {'STATUS':<12} {'AGE':>7}  DESCRIPTION")
    from shoal.ui.steps import nest_steps, step_prefix, workflow_progress

    for t, _step in nest_steps(rows, lambda r: r):  # (a workflow's steps under it)
        status = queue_status(t) or t["status"]
        code = _exit_code(t)
        if status == "failed" and code is not None:
            status = f"failed({code})"
        click.echo(
            f"{t['id']:<10} {type_label(t):<10} {status:<12} "
            f"{_age(t):>7}  {step_prefix(t)}{t.get('description', '')}{workflow_progress(t)}"
            f"{_waiting(t)}{queue_notes(t)}"
        )


def _follow(
    session: SessionFiles,
    task_id: str,
    *,
    stream: bool,
    on_poll: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Print the task's output (following it while it runs when `stream`); the final record."""
    team: str | None = None
    task = _find(session, task_id)
    path = task["output_file"]
    offset = 0
    while True:
        offset = _copy_output(path, offset)
        if not stream or is_terminal_task_status(task["status"]):
            return task
        time.sleep(POLL_S)
        task = _find(session, task_id)
        if on_poll is not None:
            on_poll(task)
        if team is None:
            team = session.team_name()  # read once, only when following
        if not is_terminal_task_status(task["status"]) and (
            leader_alive(session.layout, team) is None
        ):
            raise ShoalError(
                f"the leader of team {team!r} is not running, so task "
                f"{task_id} cannot finish; start it with `shoal up`"
            )


@click.command()
@click.argument("task_id", shell_complete=complete_task_id)
@click.option("--follow", "-f", is_flag=True, help="Keep printing output until the task ends.")
@json_option
@common_options
def logs(task_id: str, follow: bool, as_json: bool) -> None:
    """Print the output of task TASK_ID.

    With --json: the task's record with its output so far as `output` (text, undecodable
    bytes replaced; the last 8 MiB, `output_truncated` says if there was more).
    """
    env = get_env(click.get_current_context())
    session = _session(env.layout, env.team())
    if as_json:
        if follow:
            raise UsageError("--json prints the output once; it does not --follow")
        from shoal.core.output import output_size, tail

        task = _find(session, task_id)
        size = output_size(task["output_file"])
        text = tail(task["output_file"], LOGS_JSON_MAX_BYTES) if size else ""
        print_json({**task, "output": text, "output_truncated": size > LOGS_JSON_MAX_BYTES})
        return
    _follow(session, _find(session, task_id)["id"], stream=follow)


@click.command()
@click.argument("task_id", shell_complete=complete_task_id)
@click.option(
    "--turn", is_flag=True, help="Stop only an agent's current turn; it waits for a message."
)
@json_option
@common_options
def stop(task_id: str, turn: bool, as_json: bool) -> None:
    """Stop running task TASK_ID (TERM to its process group, then KILL; an agent with its
    commands). With --turn, only the agent's turn in progress: it waits for the next message
    (`shoal send TASK_ID ...`)."""
    from shoal.channel.client import call

    env = get_env(click.get_current_context())
    team = env.team()
    task_id = full_task_id(env.layout, team, task_id)
    task = call(env.layout, team, "stop", {"task_id": task_id, "turn": turn})
    if as_json:
        print_json(task)
    elif turn:
        click.echo(f"stopped the turn of {task['id']}; it waits for the next message")
    else:
        click.echo(f"stopped {task['id']}")


@click.command()
@click.argument("task_ids", nargs=-1, shell_complete=complete_task_id)
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds.")
@json_option
@common_options
def wait(task_ids: tuple[str, ...], timeout: float | None, as_json: bool) -> None:
    """Wait for tasks to finish (default: every task of the session since the last `wait`,
    those that already ended included).

    Exit code 0 when all completed, 1 when any failed or was killed (however long before the
    call it ended), 124 when --timeout expired first.
    """
    env = get_env(click.get_current_context())
    team = env.team()
    session = _session(env.layout, team)
    view = _SessionView(session)
    seen_mark = view.marks()  # (before the read: a write after it is seen)
    tasks = view.tasks()
    if task_ids:
        ids = [resolve_task_id(tasks, task_id) for task_id in task_ids]
    else:
        seen = _waited(session)
        ids = [
            k for k, t in tasks.items() if k not in seen and _waitable(t) and not t.get("retry_of")
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
        if not as_json and not task_ids:
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
    raise ShoalError(
        f"the leader of team {team!r} is not running; "
        "start it with `shoal up` to finish these tasks"
    )


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


@click.command()
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they happen.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per line, as events.jsonl has them."
)
@common_options
def events(follow: bool, as_json: bool) -> None:
    """Print the session's event stream: one human line per event (--json: the records)."""
    from shoal.ui.event_lines import event_line

    env = get_env(click.get_current_context())
    session = _session(env.layout, env.team())
    path = session.events_file
    offset = 0
    out = sys.stdout.buffer
    pending = b""
    while True:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            record = orjson.loads(line)
            if as_json:
                out.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
            elif isinstance(record, dict):
                out.write((event_line(record) or "").encode() + b"\n")
        out.flush()
        if not follow:
            return
        time.sleep(0.1)
