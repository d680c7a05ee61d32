"""Shell completion: `shoal completion bash|zsh|fish` prints the script to source, and the
completers that fill in team names, member names and task ids from SHOAL_HOME.

click drives completion (`_SHOAL_COMPLETE={shell}_complete shoal ...` runs the command line
parser and asks these functions); they read files only and never fail (a completer that
cannot read a file offers nothing).
"""

from __future__ import annotations

import os
from typing import Any

import click
from click.shell_completion import CompletionItem

from shoal.cli.common import get_env

SHELLS = ("bash", "zsh", "fish")


def _layout(ctx: click.Context) -> Any:
    from shoal.core.paths import Layout

    env = get_env(ctx)
    return Layout(env.home_arg) if env.home_arg else env.layout


def _team(ctx: click.Context) -> str:
    from shoal.cli.common import DEFAULT_TEAM

    env = get_env(ctx)
    return env.team_arg or os.environ.get("SHOAL_TEAM") or DEFAULT_TEAM


def complete_team(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
    """Team names under SHOAL_HOME."""
    try:
        from shoal.teams.store import Teams

        names = Teams(_layout(ctx)).names()
    except Exception:  # (completion offers nothing rather than a traceback in the shell)
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_member(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
    """Member names of the team the command line names (else the default team)."""
    try:
        from shoal.teams.store import Teams

        team = Teams(_layout(ctx)).read(_team(ctx))
        names = [m.name for m in team.members]
    except Exception:
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def complete_task_id(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[Any]:
    """Task ids of the team's current session, live and finished, with their descriptions."""
    try:
        from shoal.orchestrator.session import current_session

        session = current_session(_layout(ctx), _team(ctx))
        if session is None:
            return []
        tasks = {**session.history(), **session.read_tasks_raw()}
    except Exception:
        return []
    return [
        CompletionItem(task_id, help=f"{t.get('status', '')} {t.get('description', '')}".strip())
        for task_id, t in sorted(tasks.items())
        if task_id.startswith(incomplete)
    ]


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish); it completes commands,
    options, team names, member names and task ids.

    \b
    bash:  eval "$(shoal completion bash)"       (in ~/.bashrc)
    zsh:   eval "$(shoal completion zsh)"        (in ~/.zshrc)
    fish:  shoal completion fish | source        (in ~/.config/fish/config.fish)
    """
    from click.shell_completion import get_completion_class

    from shoal.cli.main import cli

    cls = get_completion_class(shell)
    assert cls is not None  # (every choice has a class)
    click.echo(cls(cli, {}, "shoal", "_SHOAL_COMPLETE").source())
