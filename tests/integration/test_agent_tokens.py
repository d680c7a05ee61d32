"""An agent's tokens, counted as the seed's ProgressTracker counts them, through a real leader
on the scripted model with known usage per request: the latest request's input (its cache
reads and writes included) plus every request's output, in the record's progress, its usage
and its notification, going on across a kill -9 of the runner and its resume, and across a
message that continues the finished agent."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.integration.test_agent_tasks import BYPASS, FAST, ended, events, record, script
from tests.polling import wait_until

TEAM = "ag"  # (the helpers of test_agent_tasks read this team)

# Four requests with 51, 52, 53 and 54 input tokens (summed, 210 of them: what was counted
# before), outputs 5 + 6 + 7 + 8; the second round waits for a gate file; a fifth request,
# after a message, reads 35 from the cache and writes 5 to it.
ROUNDS = """
final = "unscripted"

[[turn]]
usage = { input = 51, output = 5 }
[[turn.call]]
tool = "Bash"
args = { command = "echo one" }

[[turn]]
usage = { input = 52, output = 6 }
[[turn.call]]
tool = "Bash"
args = { command = "touch waiting; while [ ! -f go ]; do sleep 0.05; done" }

[[turn]]
usage = { input = 53, output = 7 }
[[turn.call]]
tool = "Bash"
args = { command = "echo three" }

[[turn]]
text = "done after {result_1}"
usage = { input = 54, output = 8 }

[[turn]]
text = "and then {prompt}"
usage = { input = 20, cache_read = 35, cache_write = 5, output = 9 }
"""


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def _counts(task: dict[str, Any]) -> tuple[int, int, int]:
    progress = task["progress"]
    return (
        progress["latest_input_tokens"],
        progress["cumulative_output_tokens"],
        progress["token_count"],
    )


def _notified_tokens(cli: Cli, task_id: str) -> str:
    (note,) = [
        str(e["notification"])
        for e in events(cli)
        if e.get("subtype") == "task_notification" and f"<task-id>{task_id}<" in e["notification"]
    ]
    return note.split("<total_tokens>", 1)[1].split("<", 1)[0]


def test_tokens_go_on_across_a_kill_9_and_a_resume(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, ROUNDS)
    out = leader(
        "agent", "--team", TEAM, *BYPASS, "--model", model, "--cwd", str(tmp_path),
        "--backend", "process", "go",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    wait_until(lambda: (tmp_path / "waiting").exists(), what="the agent's second round")

    def second_counted() -> dict[str, Any] | None:
        task = record(leader, task_id)
        counted = (task.get("progress") or {}).get("cumulative_output_tokens")
        return task if counted == 11 else None

    running = wait_until(second_counted, what="the second response's progress")
    assert _counts(running) == (52, 5 + 6, 52 + 11)
    os.kill(running["pid"], signal.SIGKILL)
    killed = ended(leader, task_id)
    assert killed["status"] == "failed" and _counts(killed) == (52, 11, 63)
    (tmp_path / "go").touch()
    # The resume reads the transcript back (the round in flight is redone, counted once).
    again = leader("agent", "--team", TEAM, "--resume", task_id, "-f")
    assert again.returncode == 0, again.stderr
    resumed = next(
        t for t in _agent_tasks(leader) if t["resumed_from"] == task_id and t["id"] != task_id
    )
    resumed = ended(leader, resumed["id"])
    assert resumed["result"] == "done after one"
    # The seed's count: the latest input (54) and every output (26); not 210 + 26.
    assert _counts(resumed) == (54, 26, 80)
    assert resumed["usage"]["total_tokens"] == 80
    assert _notified_tokens(leader, resumed["id"]) == "80"
    # A message continues the finished agent: a new task, whose count goes on.
    sent = leader("send", "--team", TEAM, resumed["id"], "more")
    assert sent.returncode == 0, sent.stderr
    last = ended(leader, sent.stdout.strip())
    assert last["result"] == "and then more"
    assert _counts(last) == (20 + 35 + 5, 26 + 9, 95)  # (input + cache read + cache write)
    assert last["usage"]["total_tokens"] == 95 and _notified_tokens(leader, last["id"]) == "95"


def _agent_tasks(cli: Cli) -> list[dict[str, Any]]:
    out = cli("ps", "--team", TEAM, "--all", "--json")
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return [r for r in rows if r["type"] == "local_agent"]
