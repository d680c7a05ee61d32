"""What an agent is told of a command it starts in the background names only tools it has:
no background agent has TaskOutput, and Read reaches the output file only where its mode's
gate lets it. The model then does what it was told (a real leader, a real agent, a real
shell task), and reads the output so far."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.integration.test_agent_tasks import FAST, TEAM, record, script
from tests.polling import wait_until

# Turn 2 takes the output file from turn 1's reply and reads it once the command wrote.
FOLLOWS_THE_REPLY = """
[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "echo early-output; while [ ! -e go ]; do sleep 0.05; done", run_in_background = true }

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = '''f=$(echo '{result_1}' | sed -n 's/.* is in \\(.*\\) (.*/\\1/p'); until grep -q early-output "$f"; do sleep 0.05; done; cat "$f"''' }

[[turn]]
text = "{result_1} ||| {result_2}"
"""  # noqa: E501


def _run(cli: Cli, tmp_path: Path, mode: str) -> dict[str, Any]:
    """The agent's final record, every permission it asks for approved."""
    model = script(tmp_path, FOLLOWS_THE_REPLY)
    out = cli("agent", "--team", TEAM, "--permission-mode", mode, "--model", model,
              "--cwd", str(tmp_path), "go")  # fmt: skip
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()

    def ended_approving() -> dict[str, Any] | None:
        task = record(cli, task_id)
        waiting = task.get("waiting_for")
        if waiting:
            ok = cli("approve", "--team", TEAM, waiting["request_id"])
            assert ok.returncode == 0, ok.stderr
        return task if task["status"] in ("completed", "failed", "killed") else None

    return wait_until(ended_approving, timeout=60, what=f"agent {task_id} to end")


@pytest.mark.parametrize(
    ("mode", "how"),
    [("bypassPermissions", "(the Read tool reads it)"), ("acceptEdits", "(Bash `tail ")],
)
def test_the_background_reply_names_only_tools_the_agent_has(
    cli: Cli, tmp_path: Path, mode: str, how: str
) -> None:
    assert cli("up", "--team", TEAM, "-d", "-q", env=FAST).returncode == 0
    try:
        task = _run(cli, tmp_path, mode)
        assert task["status"] == "completed", task.get("error")
        reply, read = task["result"].split(" ||| ")
        assert "TaskOutput" not in reply and how in reply, reply
        rows = json.loads(cli("ps", "--team", TEAM, "--all", "--json").stdout)
        (shell,) = [t for t in rows if t["type"] == "local_bash" and t.get("owner") == task["id"]]
        assert f"started background task {shell['id']};" in reply
        assert f" is in {shell['output_file']} (" in reply
        assert read.splitlines() == ["early-output"], read  # (what turn 2 read there)
    finally:
        cli("down", "--team", TEAM)
