"""`shoal ps`, `logs`, `follow`, `stop` and `events`: a team's background tasks, listed, read
and stopped (`stop` goes through the leader; the rest read the session's files).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Final

import click
import orjson

from shoal.cli.common import (
    common_options,
    complete_task_id,
    get_env,
    json_option,
    print_json,
)
from shoal.cli.control_cmds import queue_notes, queue_status
from shoal.cli.taskfiles import (
    POLL_S,
    copy_output,
    exit_code,
    find_task,
    open_session,
    print_output,
    task_records,
)
from shoal.core.errors import EXIT_FAILED, ShoalError, UsageError
from shoal.core.paths import Layout
from shoal.core.taskstatus import is_terminal_task_status
from shoal.teams.session_files import SessionFiles, current_session_files
from shoal.ui.status import type_label

# `logs --json` carries at most the last this many bytes of output.
LOGS_JSON_MAX_BYTES = 8 * 1024 * 1024
# Plain `ps` lists the tasks that ended this recently (older ones: one line, `ps --all`).
RECENT_S: Final = 600.0


def _age(task: dict[str, Any], now: float) -> str:
    """How long ago the task was started (or queued), as ps shows it: 4.2s, 3.1m, 2.0h."""
    secs = max(0.0, now - task.get("start_time", now))
    if secs < 60:
        return f"{secs:.1f}s"
    if secs < 3600:
        return f"{secs / 60:.1f}m"
    if secs < 86400:
        return f"{secs / 3600:.1f}h"
    return f"{secs / 86400:.1f}d"


def _waiting(task: dict[str, Any]) -> str:
    """What an agent waits on or has spent (see ui/status.py's agent_notes)."""
    from shoal.ui.status import agent_notes

    return agent_notes(task)


def _ended_well(task: dict[str, Any]) -> bool:
    return bool(task["status"] == "completed")


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Include finished tasks already evicted.")
@click.option(
    "--watch", "-w", is_flag=True, help="A live board of members and tasks (Ctrl-C ends it)."
)
@json_option
@common_options
def ps(show_all: bool, watch: bool, as_json: bool) -> None:
    """List the team's tasks (with --watch, a live board redrawn as they change).

    Without --all, tasks that ended in the last 10 minutes are listed too, and older ones are
    counted in one line. AGE is how long ago a task was started (or queued). With --json: the
    tasks the leader still holds (with --all, every one).
    """
    env = get_env(click.get_current_context())
    if watch:
        if as_json or show_all:
            raise UsageError("--watch shows the live board; it takes neither --json nor --all")
        from shoal.cli.ui import watch_board

        watch_board(env.layout, env.team())
        return
    session = current_session_files(env.layout, env.team())
    tasks = task_records(session, include_history=show_all) if session else {}
    if as_json:
        print_json(sorted(tasks.values(), key=lambda t: t.get("start_time", 0)))
        return
    now = time.time()
    older: list[dict[str, Any]] = []
    if session is not None and not show_all:
        for task_id, t in session.history().items():
            if task_id in tasks:
                continue
            if now - (t.get("end_time") or 0) <= RECENT_S:
                tasks[task_id] = t
            else:
                older.append(t)
    rows = sorted(tasks.values(), key=lambda t: t.get("start_time", 0))
    if not rows and not older:
        click.echo("no tasks" + ("" if show_all else " (finished ones: `shoal ps --all`)"))
        return
    if not rows:
        click.echo(f"no task runs or ended in the last {RECENT_S / 60:g} minutes")
        click.echo(_older_line(older))
        return
    click.echo(f"{'ID':<10} {'TYPE':<10} {'STATUS':<12} {'AGE':>7}  DESCRIPTION")
    from shoal.ui.steps import nest_steps, step_prefix, workflow_progress

    for t, _step in nest_steps(rows, lambda r: r):  # (a workflow's steps under it)
        status = queue_status(t) or t["status"]
        code = exit_code(t)
        if status == "failed" and code is not None:
            status = f"failed({code})"
        click.echo(
            f"{t['id']:<10} {type_label(t):<10} {status:<12} "
            f"{_age(t, now):>7}  {step_prefix(t)}{t.get('description', '')}"
            f"{workflow_progress(t)}{_waiting(t)}{queue_notes(t)}"
        )
    if older:
        click.echo(_older_line(older))


def _older_line(older: list[dict[str, Any]]) -> str:
    """`ps`'s one line for the tasks that ended before the last RECENT_S."""
    failed = sum(not _ended_well(t) for t in older)
    but = f", {failed} of them not completed" if failed else ""
    return f"{len(older)} more finished earlier{but}: `shoal ps --all`"


def _only_running(session: SessionFiles, team: str) -> str:
    """The id of the one task of the session that runs (for `logs` with no id); a UsageError
    naming them when none or several do."""
    live = sorted(
        (t for t in session.read_tasks_raw().values() if t["status"] == "running"),
        key=lambda t: t.get("start_time", 0),
    )
    if len(live) == 1:
        return str(live[0]["id"])
    if not live:
        raise UsageError(f"no task of team {team!r} runs: name one (`shoal ps --all`)")
    raise UsageError(f"{len(live)} tasks run, name one: {' '.join(t['id'] for t in live)}")


def _header(task: dict[str, Any]) -> str:
    """`==> ID STATUS (exit code N): DESCRIPTION <==`, as `tail` heads each of several files."""
    code = exit_code(task)
    how = f" (exit code {code})" if code is not None else ""
    return f"==> {task['id']} {task['status']}{how}: {task.get('description', '')} <=="


def _task_code(task: dict[str, Any]) -> int:
    """What `logs` of one task exits with: 0 while it runs or once it completed, else its own
    exit code (as `sh --foreground` does), 1 when it has none."""
    if not is_terminal_task_status(task["status"]) or task["status"] == "completed":
        return 0
    code = exit_code(task)
    return code if code is not None and 0 < code < 256 else EXIT_FAILED


def _say_end(task: dict[str, Any]) -> None:
    """One stderr line for a task that did not complete (stdout stays the task's output)."""
    if _task_code(task):
        code = exit_code(task)
        how = f"exit code {code}" if code is not None else task.get("error") or "no exit code"
        click.echo(f"shoal: task {task['id']} {task['status']} ({how})", err=True)


@click.command()
@click.argument("task_ids", nargs=-1, shell_complete=complete_task_id)
@click.option("--follow", "-f", is_flag=True, help="Keep printing output until the task ends.")
@json_option
@common_options
def logs(task_ids: tuple[str, ...], follow: bool, as_json: bool) -> None:
    """Print the output of tasks, each under a header with its status and exit code.

    With one TASK_ID (or none, when exactly one task runs) the output is printed bare, as the
    task wrote it, and the exit code is the task's own once it ended without completing (1
    when it has none): `shoal logs ID` fails as the task did. With several, each output comes
    under a `==> ID STATUS (exit code N): DESCRIPTION <==` line, and the exit code is 1 when
    any did not complete.

    With --json: the task's record with its output so far as `output` (text, undecodable
    bytes replaced; the last 8 MiB, `output_truncated` says if there was more); a list of
    them for several ids; the exit code is then 0, the records saying how each ended.
    """
    env = get_env(click.get_current_context())
    team = env.team()
    session = open_session(env.layout, team)
    if follow and (as_json or len(task_ids) > 1):
        raise UsageError("--follow follows one task; it takes one id and no --json")
    given = list(task_ids) or [_only_running(session, team)]
    tasks = [find_task(session, task_id) for task_id in given]  # (all found before any prints)
    if as_json:
        from shoal.core.output import output_size, tail

        records = []
        for task in tasks:
            size = output_size(task["output_file"])
            text = tail(task["output_file"], LOGS_JSON_MAX_BYTES) if size else ""
            records.append({**task, "output": text, "output_truncated": size > LOGS_JSON_MAX_BYTES})
        print_json(records[0] if len(task_ids) <= 1 else records)  # (exit 0: the records say)
        return
    if len(tasks) == 1:
        final = print_output(session, tasks[0]["id"], stream=follow)
        _say_end(final)
        sys.exit(_task_code(final))
    for index, task in enumerate(tasks):
        click.echo(("\n" if index else "") + _header(task))
        sys.stdout.flush()
        copy_output(task["output_file"], 0)
    sys.exit(EXIT_FAILED if any(_task_code(t) for t in tasks) else 0)


@click.command()
@click.argument("task_id", required=False, shell_complete=complete_task_id)
@common_options
def follow(task_id: str | None) -> None:
    """Print the output of a task as it grows, until it ends (`shoal logs -f`).

    With no TASK_ID, the one task that runs. The exit code is the task's own once it ended
    without completing, as for `shoal logs`.
    """
    env = get_env(click.get_current_context())
    team = env.team()
    session = open_session(env.layout, team)
    task = find_task(session, task_id or _only_running(session, team))
    final = print_output(session, task["id"], stream=True)
    _say_end(final)
    sys.exit(_task_code(final))


@click.command()
@click.argument("task_ids", nargs=-1, shell_complete=complete_task_id)
@click.option("--all", "stop_all", is_flag=True, help="Every task that runs or is queued.")
@click.option(
    "--group", "group_name", default=None, metavar="NAME", help="The tasks of group NAME."
)
@click.option(
    "--turn", is_flag=True, help="Stop only an agent's current turn; it waits for a message."
)
@json_option
@common_options
def stop(
    task_ids: tuple[str, ...], stop_all: bool, group_name: str | None, turn: bool, as_json: bool
) -> None:
    """Stop running tasks (TERM to each one's process group, then KILL; an agent with its
    commands).

    Give their ids, or --all (every task that runs or is queued), or --group NAME (those of
    one group). With --turn, only an agent's turn in progress: it waits for the next message
    (`shoal send TASK_ID ...`). Each is stopped at once; the command returns when all ended.
    A task that cannot be stopped (it already finished) is said on stderr and the exit code
    is 1; the others are stopped all the same.
    """
    env = get_env(click.get_current_context())
    team = env.team()
    if sum((bool(task_ids), stop_all, group_name is not None)) != 1:
        raise UsageError("stop takes task ids, --all or --group NAME (one of them)")
    if task_ids:
        session = current_session_files(env.layout, team)
        ids = [
            find_task(session, i)["id"] if session is not None else i for i in task_ids
        ]  # (all found before any is stopped)
    else:
        session = open_session(env.layout, team)
        ids = [
            t["id"]
            for t in session.read_tasks_raw().values()
            if not is_terminal_task_status(t["status"])
            and (group_name is None or t.get("group", "default") == group_name)
            and not t.get("worker_of")  # (a coordinator's worker ends with its coordinator)
        ]
        if not ids:
            which = f"group {group_name!r}" if group_name is not None else f"team {team!r}"
            if as_json:
                print_json([])
            else:
                click.echo(f"no task of {which} runs or is queued")
            return
    stopped, refused = _stop_each(env.layout, team, ids, turn)
    if len(ids) == 1 and task_ids and refused:
        raise refused[0][1]
    if as_json:
        print_json(stopped[0] if len(ids) == 1 and task_ids else stopped)
    else:
        for task in stopped:
            if turn:
                click.echo(f"stopped the turn of {task['id']}; it waits for the next message")
            else:
                click.echo(f"stopped {task['id']}")
    for task_id, exc in refused:
        click.echo(f"shoal: error: {task_id}: {exc}", err=True)
    if refused:
        sys.exit(max(exc.exit_code for _, exc in refused))


def _stop_each(
    layout: Layout, team: str, ids: list[str], turn: bool
) -> tuple[list[dict[str, Any]], list[tuple[str, ShoalError]]]:
    """Ask the leader to stop every task of `ids` at once (one request each), and collect the
    answers as they come: the stopped tasks' final records, and the refusals."""
    from shoal.channel.client import DEFAULT_TIMEOUT_S, Channel, ControlError

    stopped: list[dict[str, Any]] = []
    refused: list[tuple[str, ShoalError]] = []
    with Channel(layout, team) as channel:
        pending = {
            channel.send("stop", {"task_id": task_id, "turn": turn}): task_id for task_id in ids
        }
        deadline = time.monotonic() + DEFAULT_TIMEOUT_S
        while pending:
            if time.monotonic() > deadline:
                raise ControlError(
                    f"the leader of team {team!r} did not answer within {DEFAULT_TIMEOUT_S:g}s "
                    f"(still stopping: {' '.join(pending.values())})"
                )
            for request_id in list(pending):
                try:
                    done, task = channel.answer(request_id, POLL_S / len(pending))
                except ControlError as exc:
                    if exc.exit_code == EXIT_FAILED and "stopped before answering" in str(exc):
                        raise
                    refused.append((pending.pop(request_id), exc))
                    continue
                if done:
                    pending.pop(request_id)
                    stopped.append(task)
    order = {task_id: n for n, task_id in enumerate(ids)}
    stopped.sort(key=lambda t: order.get(t["id"], len(order)))
    return stopped, refused


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
    session = open_session(env.layout, env.team())
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
