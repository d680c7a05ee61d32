"""`shoal attach`: show the team's tmux window (the one place shoal hands the terminal to tmux)."""

from __future__ import annotations

import shlex

import click

from shoal.cli.common import common_options, get_env
from shoal.teams.backends.base import BackendUnavailable


@click.command()
@common_options
@click.option(
    "--print", "print_only", is_flag=True, help="Print the tmux command instead of running it."
)
@click.pass_context
def attach(ctx: click.Context, print_only: bool) -> None:
    """Open the team's tmux window: attach to its server, or select it when inside tmux."""
    from shoal.teams.backends.tmux import TmuxBackend, exec_tmux

    team = get_env(ctx).team()
    backend = TmuxBackend()
    ok, reason = backend.available()
    if not ok:
        raise BackendUnavailable(f"backend 'tmux' is not available: {reason}")
    argv = backend.attach_command(team)
    if print_only:
        click.echo(shlex.join(argv))
        return
    exec_tmux(argv)
