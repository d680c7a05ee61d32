"""`shoal monitor SERVER`: a long-lived MCP client task (`m...`) of the team's leader.

The server is one of an MCP config (`.mcp.json` format); checked here and by the leader
before the task exists: the config loads, it names SERVER, `--every` goes with `--tool`.
A project's own config (found here, not named with --config) runs its command as the user,
so it is used only in a trusted directory (`shoal trust`, or --trust for this run).
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from shoal.cli.common import (
    DURATION,
    common_options,
    get_env,
    json_option,
    parse_json_arg,
    print_json,
)
from shoal.cli.trust import settle, trust_option
from shoal.core.errors import UsageError

CONFIG_NAMES = (".mcp.json", os.path.join(".shoal", "mcp.json"))


def _config(explicit: str | None, home: Path, trust_run: bool) -> Path:
    """--config FILE (the user's choice), else ./.mcp.json, else ./.shoal/mcp.json when this
    directory is trusted (a UsageError naming the file and the fixes when it is not)."""
    if explicit:
        return Path(os.path.abspath(explicit))
    from shoal.core import trust

    here = Path(os.getcwd())
    granted = settle(home, here, trust.MONITOR_SOURCES, trust_run)
    view = trust.grant(home, here) if granted else trust.view(home, here)
    for name in CONFIG_NAMES:
        found = view.project.select((Path(name).as_posix(),))
        if not found:
            continue
        if found[0].data is None:
            raise UsageError(f"{found[0].path} is {found[0].refused}: pass --config FILE")
        if not view.trusted:
            raise UsageError(
                f"{name} is this project's and its servers run as you, but {view.root} is not "
                f"trusted: {trust.trust_command(view.root)}, or --trust for this run, or "
                "--config FILE"
            )
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
    help="The MCP config (default: ./.mcp.json, else ./.shoal/mcp.json, when trusted).",
)
@trust_option
@click.option("--tool", default=None, help="Also call this tool of the server every --every s.")
@click.option(
    "--every", type=DURATION, default=None, help="Time between calls of --tool (default 60s)."
)
@click.option("--args", "tool_args", default=None, metavar="JSON", help="The tool's arguments.")
@json_option
@common_options
def monitor(
    server: str,
    config: str | None,
    tool: str | None,
    every: float | None,
    tool_args: str | None,
    trust_run: bool,
    as_json: bool,
) -> None:
    """Watch MCP server SERVER as a background task; prints its id.

    Every notification and resource update it sends (and, with --tool, each result of that
    tool called every --every seconds) becomes one JSON line of the task's output
    (`shoal logs -f ID`). `shoal stop ID` closes the session politely; a
    server that exits fails the task with its stderr's tail. Prints the task's id."""
    from shoal.channel.client import call
    from shoal.workers.monitor.kind import check_monitor

    env = get_env(click.get_current_context())
    path = _config(config, env.layout.home, trust_run)
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
