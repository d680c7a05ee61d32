"""`local_agent` tasks through the real CLI and a real leader, on the scripted model: on each
backend an agent runs its tools, its record gets result, usage and progress, its notification
<result> and <usage>; a message to a running agent is drained at its next tool round, to a
finished one it resumes it; stop, limits, kill -9 and resume, and the bad inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.teams.session import current_session
from tests.conftest import Cli, group_gone
from tests.polling import wait_until

TEAM = "ag"
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}
BYPASS = ("--permission-mode", "bypassPermissions")  # (the permission tests ask)
BACKENDS = [
    "process",
    pytest.param("tmux", marks=pytest.mark.tmux),
    "in-process",
]


@pytest.fixture
def leader(cli: Cli, home: Path, tmux_socket: str) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def script(tmp_path: Path, text: str, name: str = "script.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return f"scripted:{path}"


def record(cli: Cli, task_id: str) -> dict[str, Any]:
    out = cli("ps", "--team", TEAM, "--all", "--json")
    assert out.returncode == 0, out.stderr
    tasks: list[dict[str, Any]] = json.loads(out.stdout)
    (task,) = [t for t in tasks if t["id"] == task_id]
    return task


def ended(cli: Cli, task_id: str, timeout: float = 30) -> dict[str, Any]:

    def final() -> dict[str, Any] | None:
        task = record(cli, task_id)
        return task if task["status"] in ("completed", "failed", "killed") else None

    return wait_until(final, timeout=timeout, what=f"agent {task_id} to end")


def events(cli: Cli) -> list[dict[str, Any]]:
    out = cli("events", "--team", TEAM, "--json")
    return [json.loads(line) for line in out.stdout.splitlines()]


WRITE_AND_READ = """
[[turn]]
text = "Writing the file."
[[turn.call]]
tool = "Write"
args = { file_path = "note.txt", content = "{prompt}" }
[[turn.call]]
tool = "Bash"
args = { command = "cat note.txt", description = "show the note" }

[[turn]]
text = "The note says {last}"
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_agent_runs_its_tools_and_reports(
    leader: Cli, tmp_path: Path, home: Path, backend: str
) -> None:
    model = script(tmp_path, WRITE_AND_READ)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--backend", backend,
        "--cwd", str(tmp_path), "--json", "hello from the prompt",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    started = json.loads(out.stdout)
    assert started["type"] == "local_agent" and started["backend"] == backend
    task = ended(leader, started["id"])
    assert task["status"] == "completed", task
    assert (tmp_path / "note.txt").read_text() == "hello from the prompt"
    assert task["result"] == "The note says hello from the prompt"
    assert task["usage"]["tool_uses"] == 2 and task["usage"]["total_tokens"] > 0
    assert task["progress"]["tool_use_count"] == 2
    assert task["agent_id"] == task["id"] and task["resumed_from"] is None
    readable = Path(task["output_file"]).read_text()
    assert "> hello from the prompt" in readable and "● Bash(show the note)" in readable
    session = current_session(Layout(home), TEAM)
    assert session is not None
    assert (session.dir / "transcripts" / f"{task['agent_id']}.jsonl").stat().st_size > 0
    (note,) = [e for e in events(leader) if e.get("subtype") == "task_notification"]
    assert "<result>The note says hello from the prompt</result>" in note["notification"]
    assert "<tool_uses>2</tool_uses>" in note["notification"]
    kinds = [e.get("subtype") for e in events(leader) if e.get("task_id") == task["id"]]
    assert kinds[0] == "task_started" and "task_terminated" in kinds


WAIT_THEN_ECHO = """
[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "touch started; while [ ! -f go ]; do sleep 0.05; done", description = "wait" }

[[turn]]
text = "latest: {prompt}"
"""


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_a_message_to_a_running_agent_is_drained_at_its_next_round(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    model = script(tmp_path, WAIT_THEN_ECHO)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--backend", backend,
        "--cwd", str(tmp_path), "first",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    wait_until(lambda: (tmp_path / "started").exists(), what="the agent's first tool call")
    sent = leader("send", "--team", TEAM, task_id, "the queued one")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == task_id  # queued for this task, not a new one
    assert "the queued one" in record(leader, task_id)["pending_messages"]
    (tmp_path / "go").touch()
    task = ended(leader, task_id)
    assert task["status"] == "completed", task
    assert task["result"] == "latest: the queued one"
    assert task["pending_messages"] == []


def test_a_message_to_a_finished_agent_resumes_it(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, '[[turn]]\ntext = "turn {turn}: {prompt}"\n')
    out = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "--cwd", str(tmp_path), "one")
    assert out.returncode == 0, out.stderr
    first = ended(leader, out.stdout.strip())
    assert first["result"] == "turn 1: one"
    sent = leader("send", "--team", TEAM, first["id"], "two")
    assert sent.returncode == 0, sent.stderr
    second = ended(leader, sent.stdout.strip())
    assert second["id"] != first["id"]
    assert second["resumed_from"] == first["id"] and second["agent_id"] == first["agent_id"]
    assert second["transcript"] == first["transcript"]
    # The script's final answer once its one turn is used: the conversation went on.
    assert second["status"] == "completed" and second["result"] != "turn 1: two"
    again = leader("agent", "--team", TEAM, "--resume", second["id"], "three", "--json")
    assert again.returncode == 0, again.stderr
    third = ended(leader, json.loads(again.stdout)["task_id"])
    assert third["resumed_from"] == second["id"]


def test_foreground_exit_codes_and_limits(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, '[[turn]]\ntext = "ok {prompt}"\n')
    ok = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "-f", "fine")
    assert ok.returncode == 0, ok.stderr
    assert "ok fine" in ok.stdout
    looping = script(
        tmp_path,
        '[[turn]]\n[[turn.call]]\ntool = "Bash"\nargs = { command = "true" }\n' * 5,
        "loop.toml",
    )
    capped = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", looping, "--max-turns", "2", "-f", "go"
    )  # fmt: skip
    assert capped.returncode == 1, (capped.stdout, capped.stderr)
    assert "max turns (2)" in capped.stderr


def test_stop_kills_the_agent_and_its_command(leader: Cli, tmp_path: Path) -> None:
    model = script(
        tmp_path,
        '[[turn]]\n[[turn.call]]\ntool = "Bash"\n'
        'args = { command = "echo $$ > pid; sleep 300", timeout = 600000 }\n',
    )
    out = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "--cwd", str(tmp_path), "go")
    task_id = out.stdout.strip()
    pid_file = tmp_path / "pid"
    pid = wait_until(
        lambda: pid_file.read_text().strip() or None if pid_file.exists() else None,
        what="the agent's command",
    )
    stopped = leader("stop", "--team", TEAM, task_id)
    assert stopped.returncode == 0, stopped.stderr
    task = ended(leader, task_id)
    assert task["status"] == "killed"
    wait_until(lambda: group_gone(int(pid)), timeout=10, what="the agent's command to die")


def test_kill_9_of_the_runner_then_resume(leader: Cli, tmp_path: Path) -> None:
    model = script(
        tmp_path,
        '[[turn]]\ntext = "looking"\n[[turn.call]]\ntool = "Bash"\n'
        'args = { command = "echo seen" }\n\n'
        '[[turn]]\n[[turn.call]]\ntool = "Bash"\n'
        'args = { command = "echo $$ > loop.pid; touch waiting; '
        'while [ ! -f go ]; do sleep 0.05; done" }\n\n'
        '[[turn]]\ntext = "finished after {result_1}"\n',
    )
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--cwd", str(tmp_path),
        "--backend", "process", "go",
    )  # fmt: skip
    task_id = out.stdout.strip()
    wait_until(lambda: (tmp_path / "waiting").exists(), what="the agent's second round")
    pid = record(leader, task_id)["pid"]
    os.kill(pid, signal.SIGKILL)
    task = ended(leader, task_id)
    assert task["status"] == "failed"
    assert f"--resume {task_id}" in task["error"]
    # The command it was running (a group of its own) did not outlive it.
    loop_pid = int((tmp_path / "loop.pid").read_text())
    wait_until(lambda: group_gone(loop_pid), timeout=10, what="the runner's command to die")
    (tmp_path / "go").touch()
    again = leader("agent", "--team", TEAM, "--resume", task_id, "-f")
    assert again.returncode == 0, again.stderr
    assert "finished after seen" in again.stdout


def test_bad_input(leader: Cli, tmp_path: Path) -> None:
    unknown = leader("agent", "--team", TEAM, *BYPASS, "--model", "gemini:x", "hi")
    assert unknown.returncode == 2 and "anthropic:, openai:, scripted:, replay:" in unknown.stderr
    no_key = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", "anthropic:claude-x", "hi",
        env={"ANTHROPIC_API_KEY": ""},
    )  # fmt: skip
    assert no_key.returncode == 1 and "ANTHROPIC_API_KEY" in no_key.stderr
    assert "Traceback" not in no_key.stderr
    tools = leader("agent", "--team", TEAM, "--tools", "Read,Teleport", "hi")
    assert tools.returncode == 2 and "Teleport" in tools.stderr
    empty = leader("agent", "--team", TEAM, "")
    assert empty.returncode == 2
    missing = leader("agent", "--team", TEAM, *BYPASS, "--model", "scripted:nope.toml", "hi")
    assert missing.returncode == 1 and "nope.toml" in missing.stderr
    stdin = leader("agent", "--team", TEAM, "-", input="")
    assert stdin.returncode == 2
    nobody = leader("send", "--team", TEAM, "a00000000", "hi")
    assert nobody.returncode == 1 and "a00000000" in nobody.stderr
    listed = leader("ps", "--team", TEAM, "--all", "--json")
    assert json.loads(listed.stdout) == []  # nothing was created


def test_no_leader(cli: Cli) -> None:
    out = cli("agent", "--team", "nobody", "hi")
    assert out.returncode == 1 and "shoal up" in out.stderr


TEAM_WORK = """
[[turn]]
[[turn.call]]
tool = "TaskCreate"
args = { subject = "Write the report", description = "from {prompt}" }
[[turn.call]]
tool = "TaskGet"
args = { taskId = "99" }
[[turn.call]]
tool = "SendMessage"
args = { to = "bob", message = "hello bob" }
[[turn.call]]
tool = "Teleport"
args = { where = "mars" }

[[turn]]
[[turn.call]]
tool = "TaskList"
args = {}

[[turn]]
text = "list: {last} | missing: {result_2}"
"""


def test_team_tools_and_tool_errors(leader: Cli, tmp_path: Path) -> None:
    joined = leader("team", "join", TEAM, "bob", "--pid", str(os.getpid()))
    assert joined.returncode == 0, joined.stderr
    model = script(tmp_path, TEAM_WORK)
    out = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "the notes")
    assert out.returncode == 0, out.stderr
    task = ended(leader, out.stdout.strip())
    assert task["status"] == "completed", task
    assert task["result"].startswith("list: #1 [pending] Write the report")
    assert "no task" in task["result"].split("missing: ")[1].lower()
    listed = leader("task", "list", "--team", TEAM, "--json")
    assert [t["description"] for t in json.loads(listed.stdout)] == ["from the notes"]
    inbox = leader("inbox", "--team", TEAM, "bob", "--json")
    (message,) = json.loads(inbox.stdout)  # (signed by the agent that sent it, not the lead)
    agent_id = out.stdout.strip()
    assert message["from"] == agent_id
    assert message["text"] == f"[message from agent {agent_id}]\nhello bob"


def test_agents_lists_definitions_and_type_uses_one(
    leader: Cli, tmp_path: Path, home: Path
) -> None:
    agents_dir = tmp_path / ".shoal" / "agents"
    agents_dir.mkdir(parents=True)
    model = script(tmp_path, '[[turn]]\ntext = "reviewed {prompt}"\n')
    (agents_dir / "reviewer.md").write_text(
        f"---\nname: reviewer\ndescription: Reviews\ntools: Read\nmodel: {model}\n---\nBe strict.\n"
    )
    (agents_dir / "bad.md").write_text("---\nname: bad\n---\n")
    assert leader("trust", str(tmp_path)).returncode == 0  # (a project's own need trust)
    listed = leader("agents", "--cwd", str(tmp_path), "--json")
    assert listed.returncode == 0, listed.stderr
    names = {d["name"]: d for d in json.loads(listed.stdout)}
    assert set(names) == {"general-purpose", "fork", "reviewer"}
    assert names["reviewer"]["source"] == str(agents_dir / "reviewer.md")
    assert f"{agents_dir / 'bad.md'}:2: description: missing" in listed.stderr
    out = leader("agent", "--team", TEAM, "--type", "reviewer", "--cwd", str(tmp_path), "pr 7")
    assert out.returncode == 0, out.stderr
    task = ended(leader, out.stdout.strip())
    assert task["result"] == "reviewed pr 7" and task["agent_type"] == "reviewer"
    assert task["tools"] == ["Read"] and task["custom"] and task["instructions"] == "Be strict."
    unknown = leader("agent", "--team", TEAM, "--type", "nope", "hi")
    assert unknown.returncode == 2 and "unknown agent type 'nope'" in unknown.stderr


GATED = """
[[turn]]
[[turn.call]]
tool = "Write"
args = { file_path = "a.txt", content = "one" }

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "echo two > b.txt" }

[[turn]]
text = "write: {result_1} | bash: {result_2}"
"""


def waiting_on(cli: Cli, task_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: record(cli, task_id).get("waiting_for"), what=f"{task_id} to ask the lead"
    )


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_default_mode_asks_the_lead(leader: Cli, tmp_path: Path, backend: str) -> None:
    model = script(tmp_path, GATED)
    out = leader(
        "agent", "--team", TEAM, "--model", model, "--cwd", str(tmp_path),
        "--backend", backend, "go",
    )  # fmt: skip
    task_id = out.stdout.strip()
    first = waiting_on(leader, task_id)
    assert first["tool"] == "Write" and first["request_id"] == f"{task_id}.1"
    assert not (tmp_path / "a.txt").exists()
    assert f"shoal approve {task_id}.1 (Write)" in leader("ps", "--team", TEAM).stdout
    ok = leader("approve", "--team", TEAM, f"{task_id}.1")
    assert ok.returncode == 0, ok.stderr
    second = wait_until(
        lambda: (w := record(leader, task_id).get("waiting_for")) and w["tool"] == "Bash" and w,
        what="the second request",
    )
    no = leader("reject", "--team", TEAM, second["request_id"], "--feedback", "not that")
    assert no.returncode == 0, no.stderr
    task = ended(leader, task_id)
    assert (tmp_path / "a.txt").read_text() == "one" and not (tmp_path / "b.txt").exists()
    assert "the lead rejected Bash: not that" in task["result"]
    stale = leader("approve", "--team", TEAM, f"{task_id}.1")
    assert stale.returncode == 1 and "not running" in stale.stderr


PLANNED = """
[[turn]]
[[turn.call]]
tool = "Write"
args = { file_path = "a.txt", content = "early" }
[[turn.call]]
tool = "ExitPlanMode"
args = { plan = "write a.txt" }

[[turn]]
[[turn.call]]
tool = "Write"
args = { file_path = "a.txt", content = "planned" }

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "echo commanded > b.txt" }

[[turn]]
text = "before: {result_1}"
"""


def test_plan_mode_refuses_writes_until_the_plan_is_approved(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, PLANNED)
    out = leader(
        "agent", "--team", TEAM, "--model", model, "--cwd", str(tmp_path),
        "--permission-mode", "plan", "go",
    )  # fmt: skip
    task_id = out.stdout.strip()
    plan = waiting_on(leader, task_id)
    assert plan["tool"] == "ExitPlanMode" and plan["input"]["plan"] == "write a.txt"
    assert leader("approve", "--team", TEAM, plan["request_id"]).returncode == 0
    write = wait_until(
        lambda: (w := record(leader, task_id).get("waiting_for")) and w["tool"] == "Write" and w,
        what="the write after the plan to ask (default mode now)",
    )
    assert leader("approve", "--team", TEAM, write["request_id"]).returncode == 0
    # Its commands leave plan's sandbox (nothing writable) for default's (the tree) too.
    bash = wait_until(
        lambda: (w := record(leader, task_id).get("waiting_for")) and w["tool"] == "Bash" and w,
        what="the command after the plan to ask",
    )
    assert leader("approve", "--team", TEAM, bash["request_id"]).returncode == 0
    task = ended(leader, task_id)
    assert "plan" in task["result"] and "refused" in task["result"]
    assert (tmp_path / "a.txt").read_text() == "planned"
    assert (tmp_path / "b.txt").read_text() == "commanded\n"


MCP_TIME = """
[[turn]]
[[turn.call]]
tool = "mcp__time__get_current_time"
args = { timezone = "UTC" }
[[turn.call]]
tool = "mcp__broken__anything"
args = {}

[[turn]]
text = "time: {result_1} | broken: {result_2}"
"""


def test_mcp_tools_from_a_real_server(leader: Cli, tmp_path: Path) -> None:
    """The real `mcp-server-time` from PyPI (a test extra), beside a server that exits at
    start: its tools are left out (a call to one is a tool error), and the output says why."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "time": {"command": sys.executable, "args": ["-m", "mcp_server_time",
                                                     "--local-timezone", "UTC"]},
        "broken": {"command": "false"},
    }}))  # fmt: skip
    model = script(tmp_path, MCP_TIME)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--mcp-config", str(config), "now?"
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task = ended(leader, out.stdout.strip(), timeout=60)
    assert task["status"] == "completed", task
    time_part, broken_part = task["result"].split(" | broken: ")
    assert '"timezone": "UTC"' in time_part and '"datetime"' in time_part
    assert "tool_use_error" in broken_part or "Unknown tool" in broken_part
    readable = Path(task["output_file"]).read_text()
    assert "MCP server broken could not start (false)" in readable


# A real MCP server (the mcp SDK's FastMCP over stdio) whose `die` tool kills its process
# in the middle of the call.
DYING_SERVER = """
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("dying")


@server.tool()
def die() -> str:
    print("dying now", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def ok() -> str:
    return "fine"


server.run()
"""

MCP_DYING = """
[[turn]]
[[turn.call]]
tool = "mcp__dying__die"
args = {}

[[turn]]
[[turn.call]]
tool = "mcp__dying__ok"
args = {}

[[turn]]
text = "die: {result_1} | ok: {result_2}"
"""


def test_an_mcp_server_that_dies_mid_call_is_a_tool_error(leader: Cli, tmp_path: Path) -> None:
    server = tmp_path / "dying_server.py"
    server.write_text(DYING_SERVER)
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"dying": {"command": sys.executable, "args": [str(server)]}}})
    )
    model = script(tmp_path, MCP_DYING)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--mcp-config", str(config), "go"
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task = ended(leader, out.stdout.strip(), timeout=90)
    assert task["status"] == "completed", task
    died, after = task["result"].split(" | ok: ")
    assert "MCP server dying failed during die" in died and "dying now" in died, died
    assert "MCP server dying failed during ok" in after, after


def test_a_bad_mcp_config_is_refused(leader: Cli, tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"time": {"args": []}}}')
    out = leader("agent", "--team", TEAM, "--mcp-config", str(config), "hi")
    assert out.returncode == 2 and f"MCP config {config}: time.command" in out.stderr
    config.write_text("{not json")
    out = leader("agent", "--team", TEAM, "--mcp-config", str(config), "hi")
    assert out.returncode == 2 and f"MCP config {config}" in out.stderr


FORKING = """
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "a fork", prompt = "go deeper" }

[[turn]]
text = "got: {last}"
"""


def test_a_fork_inherits_and_cannot_fork_again(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, FORKING)
    out = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "--fork", "top")
    assert out.returncode == 0, out.stderr
    parent = ended(leader, out.stdout.strip(), timeout=60)
    assert parent["status"] == "completed", parent
    assert "a fork cannot fork again" in parent["result"]
    listed = json.loads(leader("ps", "--team", TEAM, "--all", "--json").stdout)
    (child,) = [t for t in listed if t.get("forked_from") == parent["id"]]
    assert child["agent_type"] == "fork" and child["permission_mode"] == "bubble"
    assert child["model"] == parent["model"] and child["status"] == "completed"
    assert child["agent_id"] != parent["agent_id"]


def test_forking_is_on_by_config_and_off_by_flag(leader: Cli, home: Path, tmp_path: Path) -> None:
    model = script(tmp_path, FORKING)
    (home / "config.toml").write_text("fork = true\n")
    out = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "top")
    assert out.returncode == 0, out.stderr
    parent = ended(leader, out.stdout.strip(), timeout=60)
    assert parent["fork"] and parent["status"] == "completed", parent
    out = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "--no-fork", "top")
    unforked = ended(leader, out.stdout.strip(), timeout=60)
    assert not unforked["fork"], unforked
    listed = json.loads(leader("ps", "--team", TEAM, "--all", "--json").stdout)
    kinds = {t.get("parent_agent"): t["agent_type"] for t in listed if t.get("parent_agent")}
    assert kinds[parent["id"]] == "fork" and kinds[unforked["id"]] != "fork", kinds
    (home / "config.toml").write_text('fork = "yes"\n')
    out = leader("agent", "--team", TEAM, "--model", model, "top")
    assert out.returncode == 2, out
    assert "config.toml: fork must be true or false, not 'yes'" in out.stderr


SUBAGENT = """
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "helper", prompt = "say hi", subagent_type = "general-purpose" }

[[turn]]
text = "parent saw: {last}"
"""


def test_a_subagent_runs_on_the_parents_model(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, SUBAGENT)
    out = leader("agent", "--team", TEAM, *BYPASS, "--model", model, "top")
    parent = ended(leader, out.stdout.strip(), timeout=60)
    assert parent["status"] == "completed", parent
    # The child runs the same script, but has no Agent tool: its call is a tool error.
    assert "parent saw: agent a" in parent["result"]
    assert "Agent" in parent["result"] and "tool" in parent["result"].lower()
    listed = json.loads(leader("ps", "--team", TEAM, "--all", "--json").stdout)
    (child,) = [t for t in listed if t["id"] != parent["id"]]
    assert child["model"] == parent["model"] and child["subagent"]
    assert child["status"] == "completed"


TURNS = """
[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "echo $$ > pid; sleep 300", timeout = 600000 }

[[turn]]
text = "went on with: {prompt}"
"""


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_stop_turn_ends_the_turn_and_the_agent_waits(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    model = script(tmp_path, TURNS)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--cwd", str(tmp_path),
        "--backend", backend, "go",
    )  # fmt: skip
    task_id = out.stdout.strip()
    pid_file = tmp_path / "pid"
    pid = wait_until(
        lambda: pid_file.read_text().strip() or None if pid_file.exists() else None,
        what="the turn's command",
    )
    stopped = leader("stop", "--team", TEAM, "--turn", task_id)
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: group_gone(int(pid)), timeout=10, what="the turn's command to die")
    output = Path(record(leader, task_id)["output_file"])
    wait_until(lambda: "[turn stopped" in output.read_text(), what="the turn to stop")
    assert record(leader, task_id)["status"] == "running"  # it waits for a message
    sent = leader("send", "--team", TEAM, task_id, "the next thing")
    assert sent.returncode == 0 and sent.stdout.strip() == task_id, sent.stderr
    task = ended(leader, task_id)
    assert task["status"] == "completed", task
    assert task["result"] == "went on with: the next thing"
    shell = leader("sh", "--team", TEAM, "--", "sleep 30").stdout.strip()
    not_agent = leader("stop", "--team", TEAM, "--turn", shell)
    assert not_agent.returncode == 1 and "--turn" in not_agent.stderr, not_agent.stderr
    unknown = leader("stop", "--team", TEAM, "--turn", "b00000000")
    assert unknown.returncode == 2 and "no task 'b00000000'" in unknown.stderr


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_a_message_sent_into_a_stopped_turn_is_not_lost(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    # Sent during the turn's command, it waits for the next tool round; the turn is stopped
    # before there is one, so the agent goes on with it at once.
    model = script(tmp_path, TURNS)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--cwd", str(tmp_path),
        "--backend", backend, "go",
    )  # fmt: skip
    task_id = out.stdout.strip()
    pid_file = tmp_path / "pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command")
    sent = leader("send", "--team", TEAM, task_id, "sent mid-turn")
    assert sent.returncode == 0 and sent.stdout.strip() == task_id, sent.stderr
    stopped = leader("stop", "--team", TEAM, "--turn", task_id)
    assert stopped.returncode == 0, stopped.stderr
    task = ended(leader, task_id)
    assert task["status"] == "completed", task
    assert task["result"] == "went on with: sent mid-turn"


LLM_TEAMMATE = """
[[turn]]
[[turn.call]]
tool = "TaskList"
args = {}

[[turn]]
[[turn.call]]
tool = "SendMessage"
args = { to = "team-lead", message = "seen: {result_1}" }

[[turn]]
text = "did turn {turn}"
"""


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_an_llm_teammate_works_the_list_with_the_team_tools(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    added = leader("task", "add", "--team", TEAM, "write docs")
    assert added.returncode == 0, added.stderr
    model = script(tmp_path, LLM_TEAMMATE)
    spawned = leader(
        "spawn", "ana", "--team", TEAM, "--agent", "llm", "--model", model,
        "--backend", backend, "--cwd", str(tmp_path),
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr

    def done() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = json.loads(
            leader("task", "list", "--team", TEAM, "--json").stdout
        )
        return items if items[0]["status"] == "completed" else None

    (item,) = wait_until(done, timeout=30, what="ana to complete the task")
    assert item["owner"] == "ana"
    sent = [
        e for e in events(leader)
        if e.get("type") == "message" or e.get("subtype") == "message_received"
    ]  # fmt: skip
    texts = json.dumps(sent)
    assert "seen: #1 [in_progress] write docs (owner ana)" in texts
    bad = leader("spawn", "bo", "--team", TEAM, "--agent", "llm", "--model", "gemini:x")
    assert bad.returncode == 2 and "unknown model" in bad.stderr


def test_foreground_says_how_to_answer_a_permission_request(
    leader: Cli, tmp_path: Path, home: Path
) -> None:
    """Without a terminal, `agent -f` prints how to answer; answered elsewhere, it goes on."""
    model = script(
        tmp_path, '[[turn]]\n[[turn.call]]\ntool = "Bash"\nargs = { command = "echo hi" }\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "agent", "--team", TEAM, "--model", model, "-f", "go"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SHOAL_HOME": str(home)},
    )
    try:
        listed = wait_until(
            lambda: json.loads(leader("ps", "--team", TEAM, "--json").stdout) or None,
            what="the agent task",
        )
        request = waiting_on(leader, listed[0]["id"])
        assert leader("approve", "--team", TEAM, request["request_id"]).returncode == 0
        out, err = proc.communicate(timeout=60)
        assert "hi" in out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "waits for consent to Bash(command='echo hi')" in err
    assert f"shoal approve {request['request_id']}" in err


NESTED = """
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "helper", prompt = "wait", subagent_type = "general-purpose" }

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "touch child_waiting; while [ ! -f gate ]; do sleep 0.05; done" }

[[turn]]
text = "done"
"""


def test_a_subagent_dies_with_its_parent(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, NESTED)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--cwd", str(tmp_path),
        "--backend", "process", "top",
    )  # fmt: skip
    parent_id = out.stdout.strip()
    # (two runner processes start one after the other: on a loaded machine that takes a while)
    wait_until(
        lambda: (tmp_path / "child_waiting").exists(),
        timeout=90,
        what=lambda: "the subagent's command; " + leader("ps", "--team", TEAM, "--all").stdout,
    )
    listed = json.loads(leader("ps", "--team", TEAM, "--json").stdout)
    (child,) = [t for t in listed if t.get("parent_agent") == parent_id]
    assert child["permission_mode"] == "bypassPermissions"  # inherited from its parent
    os.kill(record(leader, parent_id)["pid"], signal.SIGKILL)
    assert ended(leader, parent_id)["status"] == "failed"
    final = ended(leader, child["id"])
    assert final["status"] == "killed"
    assert final["error"] == f"its parent agent {parent_id} ended"
