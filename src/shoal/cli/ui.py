"""`shoal pill` and `shoal ui`, and the live board behind `shoal ps --watch`.

`shoal pill` normally never gets here: `shoal.cli.main` answers it before click is imported
(`shoal.ui.pill_fast`); this command serves `--help`, `--json` and unusual spellings.
"""

from __future__ import annotations

import sys

import click

from shoal.cli.common import common_options, fail, get_env, json_option, print_json
from shoal.core.errors import UsageError
from shoal.core.paths import Layout


@click.command()
@click.option(
    "--detail", is_flag=True, help="Mixed kinds by kind (`1 shell, 1 team`), not in one count."
)
@json_option
@common_options
def pill(detail: bool, as_json: bool) -> None:
    """Print the pill label of the team's background tasks (nothing when none run).

    Meant for tmux's status line: `set -g status-right '#(shoal pill --team T)'`.
    """
    from shoal.ui.pill_fast import PillError, pill_text

    env = get_env(click.get_current_context())
    try:
        label = pill_text(env.layout.home, env.team_arg, detail=detail)
    except PillError as exc:
        fail(str(exc), exc.exit_code)
        return
    if as_json:
        print_json({"label": label})
    elif label:
        click.echo(label)


def watch_board(layout: Layout, team: str, *, events: int = 0) -> None:
    """Run the live board of `team` in this terminal until Ctrl-C (`shoal ps --watch`)."""
    from shoal.teams.store import Teams
    from shoal.ui.board import run_board
    from shoal.ui.source import FileSource

    Teams(layout).read(team)  # a missing or corrupt team file is an error, not an empty board
    run_board(FileSource(layout, team), events=events)


@click.command("ui")
@common_options
def ui() -> None:
    """Browse the team's tasks and members full-screen.

    Enter opens a task or member; s stops a task, m sends a message, a/r approve or reject a
    plan, f follows output, escape goes back, q quits.
    """
    from shoal.teams.store import Teams
    from shoal.ui.app import run_app
    from shoal.ui.source import FileSource

    env = get_env(click.get_current_context())
    team = env.team()
    Teams(env.layout).read(team)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("`shoal ui` needs a terminal; for plain output use `shoal ps --watch`")
    run_app(FileSource(env.layout, team))
