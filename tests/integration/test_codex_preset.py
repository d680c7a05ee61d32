"""The `codex` exec preset: a teammate whose turns are Codex runs, its `exec --json` stream
parsed into progress, usage and the result, later turns resuming the first one's thread.

The `codex` run here is a stand-in: a small script that prints the real streams the Codex CLI
0.171.0 produced (tests/fixtures/codex-0.171.0-*.jsonl, recorded against a loopback Responses
API server) and records the arguments it was given. The real binary is not installed by the
test extras (a 400 MiB download), so these recordings are what the preset is checked against."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.polling import wait_until

TEAM = "cx"
FIXTURES = Path(__file__).parent.parent / "fixtures"
THREAD = "01a23d23-4c94-7463-936f-48bcb899e615"

FAKE = """
import json, sys
from pathlib import Path
here = Path(sys.argv[0]).parent
with open(sys.argv[1], "a") as log:
    log.write(json.dumps(sys.argv[2:]) + "\\n")
prompt = sys.argv[-1]
if "FAIL_400" in prompt:
    sys.stdout.write((here / "failed.jsonl").read_text())
    sys.exit(1)
if "CRASH" in prompt:
    print(json.dumps({"type": "thread.started", "thread_id": "t-crash"}))
    print(json.dumps({"type": "error", "message": "stream disconnected before completion"}))
    sys.exit(3)
name = "turn2.jsonl" if "resume" in sys.argv else "turn1.jsonl"
sys.stdout.write((here / name).read_text())
"""


@pytest.fixture
def leader(cli: Cli) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env={"SHOAL_POLL_INTERVAL": "0.1"})
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def _notifications(cli: Cli) -> list[str]:
    out = cli("events", "--team", TEAM, "--json")
    events: list[dict[str, Any]] = [json.loads(line) for line in out.stdout.splitlines()]
    return [
        e["message"]["text"]
        for e in events
        if e.get("type") == "message" and e["message"]["kind"] == "task_notification"
    ]


def _spawn(cli: Cli, tmp_path: Path) -> tuple[Path, str]:
    for name in ("turn1", "turn2", "failed"):
        (tmp_path / f"{name}.jsonl").write_text(
            (FIXTURES / f"codex-0.171.0-exec-{name}.jsonl").read_text()
        )
    fake = tmp_path / "fake_codex.py"
    fake.write_text(FAKE)
    calls = tmp_path / "calls.jsonl"
    spawned = cli(
        "spawn", "cx1", "--team", TEAM, "--agent", "codex",
        "--cmd", f"{sys.executable} {fake} {calls}",
        "--backend", "process", "--cwd", str(tmp_path), "--json",
    )  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    return calls, json.loads(spawned.stdout)["task_id"]


def test_codex_turns_are_parsed_and_resumed(leader: Cli, tmp_path: Path) -> None:
    assert leader("task", "add", "--team", TEAM, "first").returncode == 0
    calls, task_id = _spawn(leader, tmp_path)
    wait_until(lambda: len(_notifications(leader)) >= 1, timeout=30, what="the first turn")
    assert leader("task", "add", "--team", TEAM, "second").returncode == 0
    wait_until(lambda: len(_notifications(leader)) >= 2, timeout=30, what="the second turn")
    first, second = _notifications(leader)[:2]
    assert "<result>The command `echo hello` printed: hello</result>" in first
    assert "<total_tokens>2560</total_tokens>" in first and "<tool_uses>1</tool_uses>" in first
    # Codex reports the thread's running totals, never one request's: the latest input counted
    # is the second run's (3900 - 2500), the output the thread's (78).
    assert "remember that we ran `echo hello`" in second
    assert "<total_tokens>1478</total_tokens>" in second and "<tool_uses>0</tool_uses>" in second
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert argvs[0][:3] == ["exec", "--json", "--skip-git-repo-check"]
    assert "resume" not in argvs[0] and argvs[0][-1].endswith("Task #1: first")
    assert argvs[0][-2] == "--"  # (a prompt starting with - is not a flag)
    assert argvs[1][3:] == ["resume", THREAD, "--", argvs[1][-1]]
    (output_file,) = leader.home.glob(f"sessions/*/tasks/{task_id}.output")
    output = output_file.read_text()
    assert "● Bash(/bin/bash -lc 'echo hello')" in output and "  hello\n  (exit 0)" in output
    assert "[codex: 1 tool use(s), 2560 tokens]" in output
    assert '"type":"item.completed"' not in output  # the raw stream is kept beside it
    raw = output_file.with_name(output_file.name + ".codex.jsonl")
    assert raw.read_text().count('"type":"turn.completed"') == 2


def test_a_failed_or_cut_codex_turn_fails_its_task_with_the_reason(
    leader: Cli, tmp_path: Path
) -> None:
    # (a failed task is claimed again, up to three times: each of them is a notification)
    assert leader("task", "add", "--team", TEAM, "FAIL_400 please").returncode == 0
    assert leader("task", "add", "--team", TEAM, "CRASH now").returncode == 0
    _spawn(leader, tmp_path)

    def about(subject: str) -> list[str]:
        return [n for n in _notifications(leader) if f"&quot;{subject}&quot;" in n]

    wait_until(lambda: about("FAIL_400 please") and about("CRASH now"), timeout=30)
    failed, cut = about("FAIL_400 please")[0], about("CRASH now")[0]
    assert "<status>failed</status>" in failed and "Loopback says: invalid request" in failed
    assert "<status>failed</status>" in cut
    assert "codex exited with code 3 without turn.completed" in cut, cut
    assert "stream disconnected before completion" in cut
