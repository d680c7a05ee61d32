"""`shoal monitor SERVER`: a long-lived MCP client task (`m...`) of the team's leader.

The server is one of an MCP config (`.mcp.json` format); checked here and by the leader
before the task exists: the config loads, it names SERVER, `--every` goes with `--tool`.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from shoal.cli.common import common_options, get_env, json_option, parse_json_arg, print_json
from shoal.core.errors import UsageError

CONFIG_NAMES = (".mcp.json", os.path.join(".shoal", "mcp.json"))


def _config(explicit: str | None) -> Path:
    """--config FILE, else ./.mcp.json, else ./.shoal/mcp.json."""
    if explicit:
        return Path(os.path.abspath(explicit))
    for name in CONFIG_NAMES:
        if Path(name).is_file():
            return Path(os.path.abspath(name))
    raise UsageError(
        "no MCP config here (.mcp.json or .shoal/mcp.json): pass --config FILE "
        '({"mcpServers": {"NAME": {"command": ..., "args": [...]}}})'
    )


@click.command()
@click.argument("server")
@click.option(
    "--config",
    default=None,
    type=click.Path(dir_okay=False),
    help="The MCP config (default: ./.mcp.json, else ./.shoal/mcp.json).",
)
@click.option("--tool", default=None, help="Also call this tool of the server every --every s.")
@click.option("--every", type=float, default=None, help="Seconds between calls of --tool (60).")
@click.option("--args", "tool_args", default=None, metavar="JSON", help="The tool's arguments.")
@json_option
@common_options
def monitor(
    server: str,
    config: str | None,
    tool: str | None,
    every: float | None,
    tool_args: str | None,
    as_json: bool,
) -> None:
    """Watch MCP server SERVER: every notification and resource update it sends (and, with
    --tool, each result of that tool called every --every seconds) becomes one JSON line of
    the task's output (`shoal logs -f ID`). `shoal stop ID` closes the session politely; a
    server that exits fails the task with its stderr's tail. Prints the task's id."""
    from shoal.orchestrator.client import call
    from shoal.workers.monitor import check_monitor

    env = get_env(click.get_current_context())
    path = _config(config)
    parsed = parse_json_arg(tool_args, "--args") if tool_args is not None else {}
    if not isinstance(parsed, dict):
        raise UsageError("--args must be a JSON object (the tool's arguments)")
    if tool_args is not None and tool is None:
        raise UsageError("--args goes with --tool")
    check_monitor(path, server, tool, every)
    request = {
        "server": server,
        "config": str(path),
        "tool": tool,
        "every": every,
        "args": parsed,
        "cwd": os.getcwd(),
    }
    task = call(env.layout, env.team(), "monitor", request)
    if as_json:
        print_json(task)
    else:
        click.echo(task["id"])
