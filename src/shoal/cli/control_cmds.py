"""`shoal group`, `parallel`, `pause`, `resume`, `restart`, `clean`, `send-input`, and the
queueing options of `shoal sh` (`--after`, `--priority`, `--group`, ...): the queue verbs of
pueue and GNU parallel. Each asks the leader (orchestrator/task_ops.py), but `clean
--sessions`, which removes old session directories itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from shoal.cli.common import DURATION, common_options, get_env, json_option, print_json
from shoal.core.errors import UsageError
from shoal.core.paths import Layout

F = TypeVar("F", bound=Callable[..., Any])

QUEUE_OPTIONS = (
    "after",
    "after_any",
    "timeout",
    "retries",
    "retry_delay",
    "delay",
    "priority",
    "label",
    "group",
    "stdin",
)


def queue_options(fn: F) -> F:
    """Add `sh`'s queueing options (the fields of a spec task, plus pueue's)."""
    options = [
        click.option(
            "--after",
            multiple=True,
            metavar="ID",
            help="Start once these tasks completed; if one fails or is killed, this one "
            "fails unstarted. Repeat, or separate ids with commas.",
        ),
        click.option(
            "--after-any",
            multiple=True,
            metavar="ID",
            help="Start once these tasks ended, however they ended.",
        ),
        click.option(
            "--timeout",
            type=DURATION,
            default=None,
            help="Kill it after DURATION of running (90, 1.5s, 5m).",
        ),
        click.option(
            "--retries",
            type=click.IntRange(min=0),
            default=0,
            help="Run a failed or timed-out task again, up to N more times (new ids).",
        ),
        click.option(
            "--retry-delay",
            type=DURATION,
            default=None,
            help="Wait DURATION before a retry, doubling for each further one.",
        ),
        click.option(
            "--delay", type=DURATION, default=None, help="Start no sooner than DURATION from now."
        ),
        click.option(
            "--priority", type=int, default=0, help="Higher starts first when slots are limited."
        ),
        click.option("--label", default=None, metavar="TEXT", help="A label shown by ps."),
        click.option(
            "--group", default=None, metavar="NAME", help="Run in group NAME (`shoal group add`)."
        ),
        click.option(
            "--stdin",
            is_flag=True,
            help="Give it a stdin pipe kept open for `shoal send-input` (else /dev/null).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _ids(values: tuple[str, ...]) -> list[str]:
    return [i for v in values for i in v.replace(",", " ").split() if i]


def queue_spec(options: dict[str, Any]) -> dict[str, Any]:
    """The request fields of `sh`'s queueing options (ids split; click parsed the durations)."""
    retries = options["retries"]
    retry_delay = options["retry_delay"]
    if retry_delay is not None and not retries:
        raise UsageError("--retry-delay needs --retries N")
    spec = {
        "after": _ids(options["after"]),
        "after_any": _ids(options["after_any"]),
        "timeout": options["timeout"],
        "retries": retries,
        "retry_delay": retry_delay,
        "delay": options["delay"],
        "priority": options["priority"],
        "label": options["label"],
        "group": options["group"],
        "stdin": options["stdin"],
    }
    return spec


def queue_notes(task: dict[str, Any]) -> str:
    """What ps adds to a shell task's description: label, group, priority, why it waits,
    attempts, pause."""
    notes: list[str] = []
    if task.get("label"):
        notes.append(f"label {task['label']}")
    if task.get("group", "default") != "default":
        notes.append(f"group {task['group']}")
    if task.get("priority"):
        notes.append(f"priority {task['priority']}")
    if task.get("attempt", 1) > 1:
        notes.append(f"attempt {task['attempt']} (retries {task.get('retry_of')})")
    if task.get("retried_as"):
        notes.append(f"retried as {task['retried_as']}")
    if task.get("status") == "pending" and task.get("pending_reason"):
        notes.append(task["pending_reason"])
    if task.get("status") == "failed" and task.get("error") and task.get("pid") is None:
        notes.append(task["error"])
    if task.get("status") == "killed" and (task.get("kill_reason") or "").startswith("timed out"):
        notes.append(task["kill_reason"])
    return f"  [{'; '.join(notes)}]" if notes else ""


def queue_status(task: dict[str, Any]) -> str | None:
    """`paused` for a paused task (ps's status column), else None."""
    if task.get("paused_at") is not None and task.get("status") in ("pending", "running"):
        return "paused"
    return None


def _call(op: str, args: dict[str, Any]) -> Any:
    from shoal.channel.client import call

    env = get_env(click.get_current_context())
    return call(env.layout, env.team(), op, args)


# -- groups ----------------------------------------------------------------------------------


@click.group()
@common_options
def group() -> None:
    """Task groups, each with its own parallelism (`shoal sh --group NAME`)."""


@group.command("add")
@click.argument("name")
@click.option(
    "--parallel",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="How many of its tasks run at once (0: no limit).",
)
@json_option
@common_options
def group_add(name: str, parallel: int, as_json: bool) -> None:
    """Add group NAME."""
    result = _call("group_add", {"name": name, "parallel": parallel})
    if as_json:
        print_json(result)
    else:
        click.echo(f"added group {result['name']} (parallel {_limit(result['parallel'])})")


@group.command("list")
@json_option
@common_options
def group_list(as_json: bool) -> None:
    """List the groups: parallelism, paused, running and queued tasks."""
    groups = _call("group_list", {})
    if as_json:
        print_json(groups)
        return
    click.echo(f"{'GROUP':<20} {'PARALLEL':>8} {'RUNNING':>7} {'PENDING':>7}  STATE")
    for g in groups:
        state = "paused" if g["paused"] else "running"
        click.echo(
            f"{g['name']:<20} {_limit(g['parallel']):>8} {len(g['running']):>7} "
            f"{len(g['pending']):>7}  {state}"
        )


@group.command("rm")
@click.argument("name")
@json_option
@common_options
def group_rm(name: str, as_json: bool) -> None:
    """Remove group NAME (refused while it has unfinished tasks)."""
    result = _call("group_rm", {"name": name})
    if as_json:
        print_json(result)
    else:
        click.echo(f"removed group {name}")


def _limit(parallel: int) -> str:
    return str(parallel) if parallel else "no limit"


@click.command()
@click.argument("count", type=click.IntRange(min=0))
@click.option("--group", "group_name", default="default", show_default=True, metavar="NAME")
@json_option
@common_options
def parallel(count: int, group_name: str, as_json: bool) -> None:
    """Let COUNT tasks of a group run at once (0: no limit); takes effect at once."""
    result = _call("parallel", {"parallel": count, "group": group_name})
    if as_json:
        print_json(result)
    else:
        click.echo(f"group {result['name']}: parallel {_limit(result['parallel'])}")


# -- pause and resume -------------------------------------------------------------------------


def _pause_command(op: str, doc: str) -> click.Command:
    @click.command(name=op, help=doc)
    @click.argument("task_ids", nargs=-1)
    @click.option("--group", "group_name", default=None, metavar="NAME", help="A whole group.")
    @json_option
    @common_options
    def command(task_ids: tuple[str, ...], group_name: str | None, as_json: bool) -> None:
        if bool(task_ids) == (group_name is not None):
            raise UsageError(f"{op} takes task ids or --group NAME (one of them)")
        tasks = _call(op, {"task_ids": list(task_ids), "group": group_name})
        if as_json:
            print_json(tasks)
            return
        done = "paused" if op == "pause" else "resumed"
        if group_name is not None:
            ids = " ".join(t["id"] for t in tasks)
            click.echo(f"group {group_name} {done}" + (f": {ids}" if ids else ""))
        else:
            for task in tasks:
                click.echo(f"{done} {task['id']}")

    return command


pause = _pause_command(
    "pause",
    "Pause tasks (SIGSTOP to each one's process group; a queued one is held), or a group "
    "(nothing more of it starts, its running tasks are paused). Paused time does not count "
    "against --timeout.",
)
resume = _pause_command(
    "resume", "Resume paused tasks (SIGCONT), or a group (it starts tasks again)."
)


# -- restart, clean, send-input -------------------------------------------------------------


@click.command()
@click.argument("task_ids", nargs=-1)
@click.option("--in-place", is_flag=True, help="Keep its id (its output starts afresh).")
@click.option(
    "--failed",
    is_flag=True,
    help="Every shell task that failed or timed out (not those already retried or restarted).",
)
@json_option
@common_options
def restart(task_ids: tuple[str, ...], in_place: bool, failed: bool, as_json: bool) -> None:
    """Run finished shell tasks again; prints the new tasks' ids.

    Give their ids, or --failed for every shell task of the session that failed or timed out
    and was neither retried nor restarted since. A task keeps the options it was started
    with, but --after, --after-any and --delay. With --json: the new task's record (a list
    of them with several ids or --failed)."""
    if bool(task_ids) == failed:
        raise UsageError("restart takes task ids or --failed (one of them)")
    ids = list(task_ids) if task_ids else _failed_shell_tasks()
    if not ids:
        if as_json:
            print_json([])
        else:
            click.echo("no failed shell task to restart")
        return
    tasks = [_call("restart", {"task_id": task_id, "in_place": in_place}) for task_id in ids]
    if as_json:
        print_json(tasks[0] if len(task_ids) == 1 else tasks)
    else:
        click.echo("\n".join(t["id"] for t in tasks))


def _failed_shell_tasks() -> list[str]:
    """The session's shell tasks that failed or timed out, in start order, but retried ones
    (their last attempt counts) and those a restart already ran again."""
    from shoal.cli.taskfiles import open_session, task_records

    env = get_env(click.get_current_context())
    tasks = task_records(open_session(env.layout, env.team()), include_history=True)
    restarted = {t.get("restarted_from") for t in tasks.values()}
    return [
        t["id"]
        for t in sorted(tasks.values(), key=lambda t: t.get("start_time", 0))
        if t.get("type") == "local_bash"
        and not t.get("retried_as")
        and t["id"] not in restarted
        and (
            t["status"] == "failed"
            or (t["status"] == "killed" and (t.get("kill_reason") or "").startswith("timed out"))
        )
    ]


@click.command()
@click.argument("task_ids", nargs=-1)
@click.option(
    "--successful-only", is_flag=True, help="Only tasks that completed (the failed ones stay)."
)
@click.option(
    "--sessions",
    "days",
    type=click.FloatRange(min=0),
    default=None,
    metavar="N",
    help="Instead: remove session directories older than N days (never a live one).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Also remove agents within their 30 s panel grace and tasks a view holds.",
)
@json_option
@common_options
def clean(
    task_ids: tuple[str, ...],
    successful_only: bool,
    days: float | None,
    force: bool,
    as_json: bool,
) -> None:
    """Remove finished tasks (and their output) from the session's listing.

    Every finished task, or those of TASK_IDS (refused while one runs), and with
    --successful-only only those that completed. With --sessions N, remove whole sessions
    not touched for N days instead. An agent that ended less than 30 s ago (its panel grace)
    and a task a view holds stay unless --force."""
    env = get_env(click.get_current_context())
    if days is not None:
        if task_ids or successful_only:
            raise UsageError("--sessions removes whole sessions: it takes no ids")
        removed = remove_old_sessions(env.layout, days)
        if as_json:
            print_json({"removed_sessions": removed})
        else:
            click.echo("\n".join(f"removed session {s}" for s in removed) or "no session to remove")
        return
    request = {"force": force, "task_ids": list(task_ids), "successful_only": successful_only}
    result = _call("clean", request)
    if as_json:
        print_json(result)
        return
    count = len(result["removed"])
    line = f"removed {count} finished task{'s' if count != 1 else ''}"
    kept = result.get("kept") or []
    if kept:
        line += (
            f"; kept {len(kept)} in their grace or held by a view ({', '.join(kept)}; "
            "--force removes them)"
        )
    click.echo(line)


def live_sessions(layout: Layout) -> set[str]:
    """Sessions a running leader leads (from each team file and each session's state)."""
    from shoal.orchestrator.liveness import leader_alive
    from shoal.teams.session import Session
    from shoal.teams.store import Teams

    live: set[str] = set()
    teams = Teams(layout)
    for name in teams.names():
        try:
            team_file = teams.read(name)
        except Exception:  # (a corrupt team file: its sessions are judged by their state)
            continue
        if team_file.lead_session_id and leader_alive(layout, name) is not None:
            live.add(team_file.lead_session_id)
    root = layout.home / "sessions"
    if root.is_dir():
        from shoal.core.procs import is_alive

        for entry in root.iterdir():
            try:
                leader = Session(layout, entry.name).read_state().leader
            except Exception:
                continue
            if leader is not None and is_alive(leader.pid, leader.started_at):
                live.add(entry.name)
    return live


def remove_old_sessions(layout: Layout, days: float) -> list[str]:
    """Remove session directories whose newest file is older than `days`; never one a live
    leader leads. Returns the removed session ids."""
    root = layout.home / "sessions"
    if not root.is_dir():
        return []
    live = live_sessions(layout)
    cutoff = time.time() - days * 86400
    removed: list[str] = []
    for entry in sorted(root.iterdir()):
        if entry.name in live or entry.is_symlink() or not entry.is_dir():
            continue
        if _newest_mtime(entry) < cutoff:
            shutil.rmtree(entry)
            removed.append(entry.name)
    return removed


def _newest_mtime(path: os.PathLike[str] | str) -> float:
    newest = os.lstat(path).st_mtime
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(top, name)).st_mtime)
            except FileNotFoundError:
                continue
    return newest


@click.command("send-input")
@click.argument("task_id")
@click.argument("text", required=False)
@click.option("--no-newline", "-n", is_flag=True, help="Do not add a newline after TEXT.")
@click.option("--eof", is_flag=True, help="Then close its stdin (it reads end of file).")
@json_option
@common_options
def send_input(task_id: str, text: str | None, no_newline: bool, eof: bool, as_json: bool) -> None:
    """Write TEXT and a newline to the stdin of running task TASK_ID (started with
    `shoal sh --stdin`); TEXT `-` reads standard input."""
    if text is None and not eof:
        raise UsageError("send-input takes TEXT (or --eof to close the task's stdin)")
    if text == "-":
        text = sys.stdin.read()
    args = {"task_id": task_id, "text": text or "", "newline": text is not None and not no_newline}
    result = _call("send_input", {**args, "eof": eof})
    if as_json:
        print_json(result)
        return
    said = f"wrote {result['written']} bytes to {result['task_id']}"
    click.echo(said + ("; closed its stdin" if result["closed"] else ""))
