"""The `claude` exec preset: a teammate whose turns are Claude Code runs, its stream-json
parsed into progress, usage and the result, the second turn resuming the first's session.

The `claude` run here is a stand-in: a small script that prints the real stream Claude Code
2.1.197 produced (tests/fixtures/, recorded against a loopback Anthropic server) and records
the arguments it was given."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.polling import wait_until

TEAM = "cc"
FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude-code-2.1.197-stream-json.jsonl"
SESSION = "7dc9b9b8-a665-4029-97df-29c90776806d"

FAKE = """
import json, sys
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(sys.argv[2:]) + "\\n")
sys.stdout.write(open(sys.argv[0].replace("fake_claude.py", "stream.jsonl")).read())
"""


@pytest.fixture
def leader(cli: Cli) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env={"SHOAL_POLL_INTERVAL": "0.1"})
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def _events(cli: Cli) -> list[dict[str, Any]]:
    out = cli("events", "--team", TEAM, "--json")
    return [json.loads(line) for line in out.stdout.splitlines()]


def _notifications(cli: Cli) -> list[str]:
    return [
        e["message"]["text"]
        for e in _events(cli)
        if e.get("type") == "message" and e["message"]["kind"] == "task_notification"
    ]


def test_claude_turns_are_parsed_and_resumed(leader: Cli, tmp_path: Path) -> None:
    (tmp_path / "stream.jsonl").write_text(FIXTURE.read_text())
    fake = tmp_path / "fake_claude.py"
    fake.write_text(FAKE)
    calls = tmp_path / "calls.jsonl"
    cmd = f"{sys.executable} {fake} {calls}"
    assert leader("task", "add", "--team", TEAM, "first").returncode == 0
    spawned = leader(
        "spawn", "cc1", "--team", TEAM, "--agent", "claude", "--cmd", cmd,
        "--backend", "process", "--cwd", str(tmp_path), "--json",
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    wait_until(lambda: len(_notifications(leader)) >= 1, timeout=30, what="the first turn")
    assert leader("task", "add", "--team", TEAM, "second").returncode == 0
    wait_until(lambda: len(_notifications(leader)) >= 2, timeout=30, what="the second turn")
    first, second = _notifications(leader)[:2]
    assert "<result>DONE: hello</result>" in second
    assert "<result>DONE: hello</result>" in first
    # Counted as the seed counts: the latest request's input (120: its assistant event; the
    # result's 330 sums the three requests), plus the outputs (21: the result's; the assistant
    # events show only the first token of each), the earlier turn's too on the resumed one.
    assert "<total_tokens>141</total_tokens>" in first and "<tool_uses>2</tool_uses>" in first
    assert "<total_tokens>162</total_tokens>" in second
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert argvs[0][:4] == ["-p", "--output-format", "stream-json", "--verbose"]
    assert "--resume" not in argvs[0] and argvs[0][-2] == "--"  # (then the prompt, whole)
    assert argvs[0][-1].endswith("Task #1: first")
    assert argvs[1][4:] == ["--resume", SESSION, "--", argvs[1][-1]]
    task_id = json.loads(spawned.stdout)["task_id"]
    (output_file,) = leader.home.glob(f"sessions/*/tasks/{task_id}.output")
    output = output_file.read_text()
    line = "[claude: 3 turn(s), 141 tokens (120 in the latest request, 21 out), $0.0013]"
    assert "● Bash(" in output and line in output
    assert '"type":"assistant"' not in output  # the raw stream is kept beside it
    raw = output_file.with_name(output_file.name + ".claude.jsonl")
    assert raw.read_text().count('"type":"result"') == 2
