"""`shoal worker`: the teammate entry point every backend runs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from shoal.cli.common import common_options, get_env
from shoal.workers.teammate.worker import WorkerOptions

F = TypeVar("F", bound=Callable[..., Any])


def _options(fn: F) -> F:
    """The worker's own options (`WorkerOptions.argv` writes a command line of them)."""
    for opt in reversed(
        [
            click.option("--name", required=True, help="Member name to join as."),
            click.option(
                "--agent",
                type=click.Choice(["scripted", "exec", "llm", "claude", "codex"]),
                default="scripted",
                show_default=True,
                help="The brain.",
            ),
            click.option("--model", default=None, help="The llm brain's model."),
            click.option(
                "--script",
                type=click.Path(dir_okay=False),
                default=None,
                help="Script of a scripted brain (TOML or JSON).",
            ),
            click.option("--cmd", default=None, help="argv template of an exec brain."),
            click.option("--plan-mode", is_flag=True, help="Ask the lead to approve plans."),
            click.option("--sandbox", is_flag=True, help="Run its commands in a sandbox."),
            click.option("--task-id", default=None, help="The lead's task id of this teammate."),
            click.option(
                "--output",
                type=click.Path(dir_okay=False),
                default=None,
                help="Output file of the teammate's commands.",
            ),
            click.option(
                "--cwd", type=click.Path(file_okay=False), default=None, help="Working directory."
            ),
            click.option(
                "--joined",
                is_flag=True,
                hidden=True,
                help="Already joined by the spawner (in-process batches).",
            ),
            click.option(
                "--output-cap",
                type=click.IntRange(min=0),
                default=None,
                hidden=True,
                help="Bytes the output file may reach (default: $SHOAL_OUTPUT_CAP, else 5 GiB).",
            ),
            click.option(
                "--backend",
                default="process",
                show_default=True,
                help="The backend this worker runs under (recorded in the team file).",
            ),
        ]
    ):
        fn = opt(fn)
    return fn


@click.command()
@_options
@common_options
def worker(**params: object) -> None:
    """Run as teammate NAME of the team (backends start this; rarely run by hand).

    It joins, watches the inbox, tells the lead it is ready, then works until shut down."""
    from shoal.workers.teammate.worker import run_worker

    env = get_env(click.get_current_context())
    opts = WorkerOptions(team=env.team(), **params)  # type: ignore[arg-type]
    sys.exit(run_worker(env.layout, opts))
