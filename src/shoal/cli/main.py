"""The `shoal` command: the top-level group, error reporting and exit codes."""

from __future__ import annotations

import sys
from typing import Any

import click

from shoal import __version__
from shoal.cli.common import Env, common_options
from shoal.core.errors import EXIT_INTERRUPTED, ShoalError


class ShoalGroup(click.Group):
    """A group that turns ShoalError into one `shoal: error:` line and its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ShoalError as exc:
            click.echo(f"shoal: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("shoal: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=ShoalGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="shoal")
@common_options
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Run many workers at once from one terminal.

    Teams share nothing but files under SHOAL_HOME: a lock-guarded team file and one
    maildir inbox per member.
    """
    ctx.ensure_object(Env)


def _register() -> None:
    from shoal.cli import attach, leader, mail, tasklist, tasks, team

    cli.add_command(team.team)
    cli.add_command(tasklist.task)
    cli.add_command(mail.send)
    cli.add_command(mail.inbox)
    cli.add_command(leader.up)
    cli.add_command(leader.down)
    from shoal.cli import run

    cli.add_command(run.run)
    cli.add_command(attach.attach)
    for command in (tasks.sh, tasks.ps, tasks.logs, tasks.stop, tasks.wait, tasks.events):
        cli.add_command(command)
    from shoal.cli import swarm, worker

    for command in (swarm.spawn, swarm.approve, swarm.reject, swarm.demo, worker.worker):
        cli.add_command(command)

    from shoal.cli import ui

    cli.add_command(ui.pill)
    cli.add_command(ui.ui)


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="shoal")
