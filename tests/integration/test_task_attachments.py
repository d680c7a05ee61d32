"""An agent's background command tells its agent what it wrote, round by round: through a
real leader, a real runner and a real shell task, on the scripted model, whose `{attached}`
shows what each request carried. Each piece of output reaches the model once, the cap names
what it left out, an end told in an attachment is not notified to the agent again, and a
leader killed -9 between its read and the runner's ack loses and repeats nothing."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.faults import PAUSE_AT_VAR, PAUSE_FILE_VAR
from shoal.core.notify import xml_escape
from shoal.core.procs import is_alive
from shoal.workers.agent.attachments import ATTACHMENT_CAP_BYTES
from tests.conftest import Cli
from tests.integration.test_agent_tasks import BYPASS, FAST, ended, events, record, script
from tests.polling import wait_until

TEAM = "ag"  # (the helpers of test_agent_tasks read this team)
TERMINAL = ("completed", "failed", "killed")

# The background command prints piece-N once the agent's turn N+1 lets it (go1, go2, ...);
# each turn's text shows what its request carried.
PIECES = """
final = "last: {attached}"

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "for i in 1 2 3; do until [ -e go$i ]; do sleep 0.02; done; echo piece-$i; touch printed$i; done", run_in_background = true }

[[turn]]
text = "r2: {attached}"
[[turn.call]]
tool = "Bash"
args = { command = "touch go1; until [ -e printed1 ]; do sleep 0.02; done" }

[[turn]]
text = "r3: {attached}"
[[turn.call]]
tool = "Bash"
args = { command = "touch go2; until [ -e printed2 ]; do sleep 0.02; done" }

[[turn]]
text = "r4: {attached}"
[[turn.call]]
tool = "Bash"
args = { command = "until [ -e resumed ]; do sleep 0.02; done; touch go3; until [ -e ended ]; do sleep 0.02; done" }

[[turn]]
text = "r5: {attached}"
[[turn.call]]
tool = "Bash"
args = { command = "true" }
"""  # noqa: E501


@pytest.fixture
def up(cli: Cli, home: Path) -> Iterator[Cli]:
    out = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert out.returncode == 0, out.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def rows(cli: Cli) -> list[dict[str, Any]]:
    out = cli("ps", "--team", TEAM, "--all", "--json")
    assert out.returncode == 0, out.stderr
    found: list[dict[str, Any]] = json.loads(out.stdout)
    return found


def shell_of(cli: Cli, agent: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        mine = [t for t in rows(cli) if t["type"] == "local_bash" and t.get("owner") == agent]
        return mine[0] if mine else None

    return wait_until(found, what=f"the background task of {agent}")


def conversation(task: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(every user prompt text, every model text) of the agent's transcript."""
    asked: list[str] = []
    said: list[str] = []
    for line in Path(task["transcript"]).read_text().splitlines():
        message = json.loads(line).get("message")
        if message is None:
            continue
        for part in message["parts"]:
            if part["part_kind"] == "user-prompt":
                content = part["content"]
                asked += [content] if isinstance(content, str) else [str(c) for c in content]
            elif part["part_kind"] == "text":
                said.append(part["content"])
    return asked, said


def start(cli: Cli, tmp_path: Path, text: str, backend: str) -> str:
    out = cli(
        "agent", "--team", TEAM, *BYPASS, "--model", script(tmp_path, text),
        "--backend", backend, "--cwd", str(tmp_path), "go",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def finish(cli: Cli, tmp_path: Path, agent: str) -> dict[str, Any]:
    """Let the background command print its last piece and end, then let the agent go on."""
    wait_until(lambda: (tmp_path / "printed3").exists(), what="the last piece")
    shell = shell_of(cli, agent)
    wait_until(lambda: record(cli, shell["id"])["status"] in TERMINAL, what="the command's end")
    (tmp_path / "ended").touch()
    return ended(cli, agent, timeout=60)


def check_each_piece_once(cli: Cli, task: dict[str, Any]) -> dict[str, Any]:
    """The pieces reached the model once each, in order, the end once, no notification of
    it; the shell's record says so. Returns the shell's record."""
    assert task["status"] == "completed", task
    asked, _said = conversation(task)
    attached = [text for text in asked if text.lstrip().startswith("<task-output>")]
    for piece in ("piece-1", "piece-2", "piece-3"):
        assert sum(text.count(piece) for text in attached) == 1, (piece, attached)
    assert "".join(attached).index("piece-1") < "".join(attached).index("piece-2")
    shell = shell_of(cli, task["id"])
    ends = [t for t in attached if "<status>completed</status>" in t and "<final/>" in t]
    assert len(ends) == 1 and shell["id"] in ends[0], attached
    assert xml_escape(f'Task "{shell["description"]}" completed successfully') in ends[0]
    assert not any(f"<task-id>{shell['id']}</task-id>" in t for t in asked if "<task-notif" in t)
    assert task["result"] == "last: (nothing attached)"  # (the end was told once, before)
    final = record(cli, shell["id"])
    assert final["completion_status_sent_in_attachment"] is True
    assert final["notified"] is True
    assert final["output_offset"] == Path(final["output_file"]).stat().st_size
    assert final["last_reported_total_lines"] == 3
    # Notified once all the same: the event stream has it (the lead reads it there).
    notes = [e for e in events(cli) if e.get("subtype") == "task_notification"]
    assert [e["task_id"] for e in notes].count(shell["id"]) == 1
    return shell


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_each_piece_of_a_background_commands_output_reaches_the_model_once(
    up: Cli, tmp_path: Path, backend: str
) -> None:
    (tmp_path / "resumed").touch()  # (no leader is killed here)
    agent = start(up, tmp_path, PIECES, backend)
    task = finish(up, tmp_path, agent)
    shell = check_each_piece_once(up, task)
    _asked, said = conversation(task)
    by_turn = {text.split(":", 1)[0]: text for text in said}
    assert by_turn["r2"] == "r2: (nothing attached)"  # (it had printed nothing yet)
    assert "piece-1" in by_turn["r3"] and "piece-2" not in by_turn["r3"]
    assert f"<task-id>{shell['id']}</task-id>" in by_turn["r3"]
    assert "<status>running</status>" in by_turn["r3"] and "1 new, 1 shown so far" in by_turn["r3"]
    assert "piece-2" in by_turn["r4"]
    assert "piece-3" in by_turn["r5"] and "<status>completed</status>" in by_turn["r5"]
    readable = Path(task["output_file"]).read_text()
    assert f"attached {shell['id']}: 1 new line(s); completed" in readable


CAPPED = """
[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "until [ -e go0 ]; do sleep 0.02; done; head -c 20000 /dev/zero | tr '\\\\0' x; echo; echo tail-end; touch printed; until [ -e go ]; do sleep 0.02; done", run_in_background = true }

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "touch go0; until [ -e printed ]; do sleep 0.02; done" }

[[turn]]
text = "seen: {attached}"
[[turn.call]]
tool = "Bash"
args = { command = "touch go" }
"""  # noqa: E501


def test_a_round_shows_the_latest_bytes_and_names_what_it_left_out(up: Cli, tmp_path: Path) -> None:
    agent = start(up, tmp_path, CAPPED, "in-process")
    task = ended(up, agent, timeout=60)
    assert task["status"] == "completed", task
    _asked, said = conversation(task)
    (seen,) = [t for t in said if t.startswith("seen: ")]
    shell = shell_of(up, agent)
    skipped = 20000 + 1 + len("tail-end\n") - ATTACHMENT_CAP_BYTES
    assert f"<skipped>{skipped:,} bytes (from byte 0) left out" in seen, seen
    # (no agent has TaskOutput: it is told the Bash command that reads them)
    assert f"tail -c +1 {shell['output_file']} | head -c {skipped}" in seen
    output = re.search(r"<output>(.*?)</output>", seen, re.DOTALL)
    assert output is not None and output.group(1).endswith("x\ntail-end\n")
    assert len(output.group(1).encode()) == ATTACHMENT_CAP_BYTES
    assert record(up, shell["id"])["output_offset"] == 20000 + 1 + len("tail-end\n")


def test_a_leader_killed_between_its_read_and_the_ack_loses_and_repeats_nothing(
    cli: Cli, tmp_path: Path
) -> None:
    """The leader stops itself in its third answer to the runner (which carries the ack of
    piece-1 and reads piece-2) and is killed there: piece-2 never reached the runner, and the
    ack of piece-1 was not written. The next leader gets the ack again and reads piece-2
    once."""
    gate = tmp_path / "paused"
    env = {**FAST, PAUSE_AT_VAR: "attachments-read#3", PAUSE_FILE_VAR: str(gate)}
    out = cli("up", "--team", TEAM, "--detach", "--quiet", env=env)
    assert out.returncode == 0, out.stderr
    try:
        agent = start(cli, tmp_path, PIECES, "process")
        wait_until(gate.exists, timeout=60, what="the leader to stop in its third answer")
        pid = int(gate.read_text())
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not is_alive(pid, None), what="the killed leader to be gone")
        again = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
        assert again.returncode == 0, again.stderr
        (tmp_path / "resumed").touch()
        task = finish(cli, tmp_path, agent)
        check_each_piece_once(cli, task)
        _asked, said = conversation(task)
        by_turn = {text.split(":", 1)[0]: text for text in said}
        assert by_turn["r4"] == "r4: (nothing attached)"  # (the answer that never came)
        assert "piece-2" in by_turn["r5"] and "piece-1" not in by_turn["r5"]
    finally:
        cli("down", "--team", TEAM)
