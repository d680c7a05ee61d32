"""`shoal sh` (and `shoal add`): start background tasks of a team's leader, one, a batch from a
file, or one in the foreground whose output is streamed and whose exit code is the task's.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

import click
import orjson

from shoal.channel.client import DEFAULT_TIMEOUT_S, Channel, ControlError, leader_alive
from shoal.cli.common import (
    common_options,
    get_env,
    json_option,
    print_json,
)
from shoal.cli.control_cmds import queue_options, queue_spec
from shoal.cli.taskfiles import POLL_S, copy_output, exit_code
from shoal.core.cmdsize import command_problem, spec_problem
from shoal.core.errors import (
    EXIT_FAILED,
    ShoalError,
    UsageError,
)
from shoal.core.paths import Layout
from shoal.teams.lead import NoLeaderError

# `sh --batch` sends its tasks in requests of at most this many (or this many bytes of specs):
# each answer carries the started tasks' records, and a message is capped at 1 MiB.
BATCH_CHUNK_TASKS = 500
BATCH_CHUNK_BYTES = 128 * 1024


@click.command(context_settings={"allow_interspersed_args": False})
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
    help="Stream the output and exit with the task's own code (128+N after signal N; 1 "
    "when it has none).",
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
    as they are (`shoal sh -- pytest -x tests/`). Options go before COMMAND: what follows its
    first word (or `--`) is the command's, a later `--` included, and an unknown option
    before it is refused. With --batch, every line of FILE is a command line and the ids are
    printed one per line, in order.
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
    code = exit_code(final)
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
            offset = copy_output(path, offset)
            try:
                done, final = channel.answer(end, POLL_S)
            except ControlError:
                if leader_alive(layout, team) is not None:
                    raise
                raise NoLeaderError(team, f"task {task['id']} cannot finish without one") from None
            if done:
                copy_output(path, offset)
                return dict(final)


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
