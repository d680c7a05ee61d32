"""`shoal dream`: start a memory consolidation (a `d...` task of the team's leader)."""

from __future__ import annotations

import os

import click

from shoal.cli.common import common_options, get_env, json_option, print_json


@click.command()
@click.option(
    "--model",
    default=None,
    help="anthropic:NAME, openai:NAME, scripted:FILE (default: $SHOAL_MODEL, `model` in "
    "config.toml, else the embedded dream script).",
)
@click.option(
    "--sessions",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Review the newest N sessions (default: every session since the last consolidation).",
)
@json_option
@common_options
def dream(model: str | None, sessions: int | None, as_json: bool) -> None:
    """Consolidate memory from recent sessions; prints the dream's task id.

    An agent reads the transcripts and events of recent sessions and rewrites the memory
    files (the project's .shoal/memory/ if it exists, else SHOAL_HOME/memory/). Refused while
    another dream runs."""
    from shoal.channel.client import call
    from shoal.workers.agent.models import ModelSpec

    env = get_env(click.get_current_context())
    if model is not None:
        ModelSpec.parse(model)  # an unknown provider is a usage error (exit 2), here and now
    spec = {"model": model, "sessions": sessions, "cwd": os.getcwd()}
    task = call(env.layout, env.team(), "dream", {"spec": spec})
    if as_json:
        print_json(task)
        return
    click.echo(task["id"])
    click.echo(
        f"shoal: dreaming over {task['sessions_reviewing']} session(s) into {task['memory_dir']}",
        err=True,
    )
