"""`shoal workflow SPEC`: a `shoal run` spec run by the team's leader as one task (`w...`)."""

from __future__ import annotations

import os

import click

from shoal.cli.common import common_options, get_env, json_option, print_json


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@json_option
@common_options
def workflow(spec_path: str, as_json: bool) -> None:
    """Run the tasks of SPEC (a `shoal run` spec) as steps of one background task of the
    team's leader; prints its id.

    The spec is checked first, as `shoal run` checks it: an error is reported with its
    file:line and exit code 2, and nothing is started. Agent steps (`prompt`, `[[member]]`)
    are refused: a workflow's steps are the leader's shell tasks. `shoal ps` lists the steps
    under the workflow, `shoal stop ID` stops it and its running steps, and its one
    notification at the end has the counts and the path of its JSON report.
    """
    from shoal.channel.client import call
    from shoal.orchestrator.batch.workflow import load_spec

    env = get_env(click.get_current_context())
    spec = load_spec(spec_path)  # (a SpecError: exit 2 before the leader is asked)
    task = call(env.layout, env.team(), "workflow", {"spec_path": os.fspath(spec.path)})
    if as_json:
        print_json(task)
    else:
        click.echo(task["id"])
