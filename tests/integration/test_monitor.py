"""`shoal monitor SERVER`: real MCP servers over stdio, a real leader, real monitor processes.

Servers: the real `mcp-server-time` from PyPI (a test extra), and a small server written here
with the mcp SDK whose `emit` tool sends log notifications (and, started with `--crash`, kills
itself on its third call) and whose `broken` tool fails on every call.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from tests.conftest import Cli
from tests.polling import wait_until

NOTIFIER = """
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notifier")
calls = {"n": 0}


@server.tool()
async def emit(ctx: Context, n: int = 2) -> str:
    calls["n"] += 1
    for i in range(n):
        await ctx.info(f"tick {calls['n']}.{i}")
    if calls["n"] >= 3 and "--crash" in sys.argv:
        print("crashing on purpose", file=sys.stderr, flush=True)
        os._exit(4)
    return f"emitted {n}"


@server.tool()
def broken() -> str:
    raise ValueError("always fails")


server.run()
"""


MEMO = """
import asyncio

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server

URI = "memo://counter"
state = {"count": 0}
watchers: dict[str, list[ServerSession]] = {}


async def list_resources(ctx, params):
    return types.ListResourcesResult(
        resources=[types.Resource(name="counter", uri=URI, mime_type="text/plain")]
    )


async def read_resource(ctx, params):
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=URI, text=str(state["count"]))]
    )


async def subscribe(ctx, params):
    watchers.setdefault(str(params.uri), []).append(ctx.session)
    return types.EmptyResult()


async def unsubscribe(ctx, params):
    watchers.pop(str(params.uri), None)
    return types.EmptyResult()


async def list_tools(ctx, params):
    schema = {"type": "object", "properties": {}}
    return types.ListToolsResult(tools=[types.Tool(name="bump", input_schema=schema)])


async def call_tool(ctx, params):
    state["count"] += 1
    for session in watchers.get(URI, []):
        await session.send_resource_updated(URI)
    return types.CallToolResult(content=[types.TextContent(type="text", text=str(state["count"]))])


server = Server(
    "memo",
    on_list_resources=list_resources,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
    on_list_tools=list_tools,
    on_call_tool=call_tool,
)


async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


asyncio.run(main())
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory with `.mcp.json` naming three servers: time, notifier, crasher."""
    (tmp_path / "notifier.py").write_text(NOTIFIER)
    py = [sys.executable, "-W", "ignore"]
    config = {
        "mcpServers": {
            "time": {"command": py[0], "args": ["-m", "mcp_server_time", "--local-timezone",
                                                "UTC"]},
            "notifier": {"command": py[0], "args": [*py[1:], str(tmp_path / "notifier.py")]},
            "crasher": {"command": py[0],
                        "args": [*py[1:], str(tmp_path / "notifier.py"), "--crash"]},
        }
    }  # fmt: skip
    (tmp_path / ".mcp.json").write_text(json.dumps(config))
    return tmp_path


@pytest.fixture
def memo(project: Path) -> str:
    """A fourth server in the project's `.mcp.json`, `memo`: one resource, `memo://counter`,
    with subscriptions, and a tool `bump` that sends `notifications/resources/updated` for it
    to each session subscribed; its name."""
    (project / "memo.py").write_text(MEMO)
    path = project / ".mcp.json"
    config = json.loads(path.read_text())
    config["mcpServers"]["memo"] = {
        "command": sys.executable,
        "args": ["-W", "ignore", str(project / "memo.py")],
    }
    path.write_text(json.dumps(config))
    return "memo"


@pytest.fixture
def leader(cli: Cli, project: Path) -> Iterator[Cli]:
    """A running leader (detached) for the test's home; stopped at the end."""
    up = cli("up", "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", timeout=60)


def _monitor(cli: Cli, project: Path, *args: str) -> str:
    out = cli("monitor", *args, "--config", str(project / ".mcp.json"))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _task(cli: Cli, task_id: str) -> dict[str, Any]:
    out = cli("ps", "--all", "--json")
    assert out.returncode == 0, out.stderr
    return next(t for t in orjson.loads(out.stdout) if t["id"] == task_id)


def _lines(task: dict[str, Any]) -> list[dict[str, Any]]:
    text = Path(task["output_file"]).read_text()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def _kinds(cli: Cli, task_id: str) -> list[str]:
    return [line["kind"] for line in _lines(_task(cli, task_id))]


def test_notifications_and_tool_results_are_lines_and_stop_closes_politely(
    leader: Cli, project: Path
) -> None:
    """Every log notification the server sends during `emit` and every result is one JSON line;
    the record counts them; `stop` closes the session (last line `closed`), the task is killed
    without a notification, and the server process is gone."""
    task_id = _monitor(leader, project, "notifier", "--tool", "emit", "--every", "0.2",
                       "--args", '{"n": 2}')  # fmt: skip
    assert task_id.startswith("m")
    wait_until(lambda: _kinds(leader, task_id).count("tool-result") >= 2, timeout=60,
               what="two results of emit")  # fmt: skip
    lines = _lines(_task(leader, task_id))
    assert lines[0]["kind"] == "connected" and lines[0]["server"] == "notifier"
    ticks = [ln["params"]["data"] for ln in lines if ln["kind"] == "notification"]
    assert "tick 1.0" in ticks and "tick 1.1" in ticks
    assert all(ln["method"] == "notifications/message" for ln in lines
               if ln["kind"] == "notification")  # fmt: skip
    wait_until(lambda: _task(leader, task_id)["event_count"] >= 4, timeout=30)
    task = _task(leader, task_id)
    server_pids = [p.pid for p in psutil.Process(task["pid"]).children(recursive=True)]
    assert server_pids, "the server runs under the monitor"
    stopped = leader("stop", task_id)
    assert stopped.returncode == 0, stopped.stderr
    final = _task(leader, task_id)
    assert final["status"] == "killed"
    assert _lines(final)[-1]["kind"] == "closed"
    for pid in server_pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_a_server_with_subscriptions_has_its_resources_watched(
    memo: str, leader: Cli, project: Path
) -> None:
    """When the server offers resource subscriptions, the monitor subscribes to each resource
    (a `subscribed` line, ahead of any update), and each `resources/updated` the
    server sends (here, on every `bump`) is a `resource-updated` line naming the resource;
    every line is JSON, and `stop` still closes the session politely."""
    uri = "memo://counter"
    task_id = _monitor(leader, project, memo, "--tool", "bump", "--every", "0.3")

    def updates() -> int:
        lines = _lines(_task(leader, task_id))
        return sum(1 for ln in lines if ln["kind"] == "resource-updated" and ln["uri"] == uri)

    wait_until(lambda: updates() >= 2, timeout=60, what="two resource-updated lines")
    lines = _lines(_task(leader, task_id))
    kinds = [ln["kind"] for ln in lines]
    assert kinds[0] == "connected", kinds
    subscribed = [i for i, ln in enumerate(lines) if ln["kind"] == "subscribed"]
    assert [lines[i]["uri"] for i in subscribed] == [uri]
    first_update = next(i for i, ln in enumerate(lines) if ln["kind"] == "resource-updated")
    assert subscribed[0] < first_update
    assert "subscribe-error" not in kinds and "notification" not in kinds
    updated = [ln for ln in lines if ln["kind"] == "resource-updated"]
    assert all(ln["uri"] == uri and ln["params"]["uri"] == uri for ln in updated)
    wait_until(lambda: _task(leader, task_id)["event_count"] >= 4, timeout=30)
    stopped = leader("stop", task_id)
    assert stopped.returncode == 0, stopped.stderr
    final = _task(leader, task_id)
    assert final["status"] == "killed"
    assert _lines(final)[-1]["kind"] == "closed"


def test_the_real_time_server_answers_its_tool(leader: Cli, project: Path) -> None:
    """mcp-server-time's get_current_time, called every 0.3 s: its results are lines."""
    task_id = _monitor(leader, project, "time", "--tool", "get_current_time", "--every", "0.3",
                       "--args", '{"timezone": "UTC"}')  # fmt: skip
    wait_until(lambda: "tool-result" in _kinds(leader, task_id), timeout=60)
    result = next(ln for ln in _lines(_task(leader, task_id)) if ln["kind"] == "tool-result")
    assert result["structured"]["timezone"] == "UTC" and "datetime" in result["structured"]


def test_a_server_that_crashes_mid_stream_fails_the_task_with_its_stderr(
    leader: Cli, project: Path
) -> None:
    """The crasher dies on its third call: the task fails, naming the server, with the tail
    of its stderr; what it sent before is kept."""
    task_id = _monitor(leader, project, "crasher", "--tool", "emit", "--every", "0.2")
    wait_until(lambda: _task(leader, task_id)["status"] == "failed", timeout=60)
    task = _task(leader, task_id)
    assert "MCP server crasher exited" in task["error"]
    assert "crashing on purpose" in task["error"]
    kinds = [ln["kind"] for ln in _lines(task)]
    assert kinds.count("tool-result") == 2 and kinds[-1] == "server-exited"
    waited = leader("wait", task_id)
    assert waited.returncode == 1


def test_a_server_that_hangs_fails_the_task_as_hung_not_exited(leader: Cli, project: Path) -> None:
    """A server that is alive but silent (stopped with SIGSTOP once connected) misses a ping:
    the task fails saying the server hung, not that it exited."""
    task_id = _monitor(leader, project, "notifier")
    wait_until(lambda: "connected" in _kinds(leader, task_id), timeout=60)
    task = _task(leader, task_id)
    (server,) = psutil.Process(task["pid"]).children(recursive=True)
    server.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _task(leader, task_id)["status"] == "failed", timeout=60)
    finally:
        with contextlib.suppress(psutil.Error):
            server.send_signal(signal.SIGCONT)
    error = _task(leader, task_id)["error"]
    assert error.startswith("MCP server notifier hung: the server hung (no answer to a ping"), error
    last = _lines(_task(leader, task_id))[-1]
    assert last["kind"] == "server-exited" and last["hung"] is True


def test_a_tool_that_fails_on_every_call_is_recorded_and_the_monitor_goes_on(
    leader: Cli, project: Path
) -> None:
    """Each failed call is a `tool-error` line; the task keeps running and names the error."""
    task_id = _monitor(leader, project, "notifier", "--tool", "broken", "--every", "0.2")
    wait_until(lambda: _kinds(leader, task_id).count("tool-error") >= 3, timeout=60)
    task = _task(leader, task_id)
    assert task["status"] == "running"
    wait_until(lambda: (_task(leader, task_id).get("error") or "").startswith("broken:"),
               timeout=30)  # fmt: skip
    pill = leader("pill")
    assert "1 monitor" in pill.stdout, pill.stdout


def test_bad_requests_start_nothing(leader: Cli, project: Path, tmp_path: Path) -> None:
    """An unknown server (the known ones listed), --every without --tool, a malformed config
    and a missing one: exit 2, one line, and no task."""
    config = str(project / ".mcp.json")
    out = leader("monitor", "nope", "--config", config)
    assert out.returncode == 2 and "no MCP server 'nope'" in out.stderr
    assert "crasher, notifier, time" in out.stderr
    out = leader("monitor", "time", "--every", "5", "--config", config)
    assert out.returncode == 2 and "--every goes with --tool" in out.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = leader("monitor", "time", "--config", str(bad))
    assert out.returncode == 2 and str(bad) in out.stderr
    out = leader("monitor", "time", "--config", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "not found" in out.stderr
    listed = leader("ps", "--all", "--json")
    assert orjson.loads(listed.stdout) == []


def test_a_resumed_leader_takes_its_monitor_back(leader: Cli, project: Path) -> None:
    """kill -9 of the leader leaves the monitor running; the next leader adopts it (same
    pid), keeps counting its events, and stops it on `down`."""
    task_id = _monitor(leader, project, "notifier", "--tool", "emit", "--every", "0.3")
    wait_until(lambda: _task(leader, task_id)["event_count"] >= 1, timeout=60)
    pid = _task(leader, task_id)["pid"]
    state = json.loads(leader("team", "show", "--json").stdout)
    lead_pid = next(m["pid"] for m in state["members"] if m["name"] == "team-lead")
    os.kill(lead_pid, signal.SIGKILL)
    wait_until(lambda: not psutil.pid_exists(lead_pid) or
               psutil.Process(lead_pid).status() == "zombie", timeout=30)  # fmt: skip
    assert psutil.pid_exists(pid)
    up = leader("up", "--detach", "--quiet")
    assert up.returncode == 0, up.stderr
    before = _task(leader, task_id)["event_count"]
    wait_until(lambda: _task(leader, task_id)["event_count"] > before, timeout=60)
    assert _task(leader, task_id)["pid"] == pid and _task(leader, task_id)["status"] == "running"
    down = leader("down", timeout=60)
    assert down.returncode == 0, down.stderr
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
               timeout=30)  # fmt: skip
