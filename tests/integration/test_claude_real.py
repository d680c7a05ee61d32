"""The `claude` preset with the real Claude Code CLI (npm's @anthropic-ai/claude-code on
Node 22, installed by .ci/run into .ci/node/), its API calls answered by a loopback server
speaking the Anthropic Messages streaming format — a stand-in for Anthropic's service, which
cannot be reached from here. A teammate whose turns are real Claude Code runs: the second
resumes the first's session, and the lead's notifications carry its usage and result."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli, in_ci
from tests.polling import wait_until
from tests.support.anthropic_stream import AnthropicStream

TEAM = "real"
NODE_BIN = Path(__file__).resolve().parents[2] / ".ci" / "node" / "node_modules" / ".bin"


@pytest.fixture
def claude_bin() -> Path:
    claude = NODE_BIN / "claude"
    if not claude.exists():
        why = f"Claude Code is not installed at {claude} (.ci/run installs it with npm)"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    return claude


@pytest.fixture
def server() -> Iterator[AnthropicStream]:
    srv = AnthropicStream(
        "Bash", {"command": "echo hello >> note.txt; cat note.txt", "description": "note"},
        "DONE: ",
    )  # fmt: skip
    try:
        yield srv
    finally:
        srv.close()


def _notifications(cli: Cli) -> list[str]:
    out = cli("events", "--team", TEAM, "--json")
    events = [json.loads(line) for line in out.stdout.splitlines()]
    return [
        e["message"]["text"]
        for e in events
        if e.get("type") == "message" and e["message"]["kind"] == "task_notification"
    ]


def test_a_teammate_runs_real_claude_code_and_resumes_it(
    cli: Cli, tmp_path: Path, claude_bin: Path, server: AnthropicStream
) -> None:
    scratch = tmp_path / "claude-home"
    scratch.mkdir()
    env = {
        "PATH": f"{NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(scratch),
        "ANTHROPIC_BASE_URL": server.url,
        "ANTHROPIC_API_KEY": "test-key",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "SHOAL_POLL_INTERVAL": "0.1",
    }
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=env)
    assert up.returncode == 0, up.stderr
    try:
        assert cli("task", "add", "--team", TEAM, "first note").returncode == 0
        spawned = cli(
            "spawn", "cc", "--team", TEAM, "--agent", "claude", "--backend", "process",
            "--cmd", f"{claude_bin} --allowedTools Bash,Read", "--cwd", str(tmp_path),
        )  # fmt: skip
        assert spawned.returncode == 0, spawned.stderr
        wait_until(lambda: _notifications(cli), timeout=90, what="the first Claude Code turn")
        assert cli("task", "add", "--team", TEAM, "second note").returncode == 0
        wait_until(lambda: len(_notifications(cli)) >= 2, timeout=90, what="the second turn")
    finally:
        cli("down", "--team", TEAM)
    first, second = _notifications(cli)[:2]
    assert "<result>DONE: hello</result>" in first, first
    assert "<result>DONE: hello\nhello</result>" in second, second
    for xml in (first, second):
        assert "<tool_uses>1</tool_uses>" in xml and "<total_tokens>0</total_tokens>" not in xml
    assert (tmp_path / "note.txt").read_text() == "hello\nhello\n"
    # The second turn resumed the session: its requests carry the first turn's conversation.
    tool_turns: list[dict[str, Any]] = [b for p, b in server.requests if b.get("tools")]
    assert len(tool_turns[-1]["messages"]) > len(tool_turns[0]["messages"])
