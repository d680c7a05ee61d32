"""`shoal chat` in a real tmux pane (its own tmux server): lines go to the session's agent and
its transcript prints; Ctrl+B twice moves a running query to the background and gives a fresh
prompt, its end is told when it comes, `/fg ID` brings it back and continues it; `/tasks`,
`/stop` and the errors of bad commands."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.teams.session_files import current_session_files
from tests.conftest import Cli
from tests.polling import wait_until

TEAM = "chat"
SLOW = """
final = "answer to: {prompt}"

[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "sleep 2; echo slept" }
"""

pytestmark = pytest.mark.tmux


class Pane:
    """A tmux pane running one command, driven with send-keys and read with capture-pane."""

    def __init__(self, socket: str, command: str) -> None:
        self.socket = socket
        subprocess.run(
            ["tmux", "-L", socket, "new-session", "-d", "-s", "chat", "-x", "160", "-y", "50",
             command],
            check=True,
        )  # fmt: skip

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "-L", self.socket, "send-keys", "-t", "chat", *keys], check=True)

    def screen(self) -> str:
        out = subprocess.run(
            ["tmux", "-L", self.socket, "capture-pane", "-p", "-J", "-S", "-200", "-t", "chat"],
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout

    def wait_for(self, text: str, timeout: float = 30) -> str:
        wait_until(lambda: text in self.screen(), timeout=timeout, what=repr(text))
        return self.screen()


@pytest.fixture
def pane(cli: Cli, home: Path, tmp_path: Path) -> Iterator[Pane]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env={"SHOAL_POLL_INTERVAL": "0.1"})
    assert up.returncode == 0, up.stderr
    script = tmp_path / "slow.toml"
    script.write_text(SLOW)
    socket = f"shoal-chat-{tmp_path.name}"[-60:]
    command = " ".join(
        shlex.quote(a)
        for a in ["env", f"SHOAL_HOME={home}", sys.executable, "-m", "shoal", "chat",
                  "--team", TEAM, "--model", f"scripted:{script}",
                  "--permission-mode", "bypassPermissions", "--cwd", str(tmp_path)]
    )  # fmt: skip
    shown = Pane(socket, f"{command}; echo CHAT-EXITED $?; sleep 60")
    try:
        shown.wait_for("/help for the commands")
        yield shown
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
        cli("down", "--team", TEAM)


def _tasks(cli: Cli) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads(cli("ps", "--team", TEAM, "--all", "--json").stdout)
    return rows


def test_a_query_runs_goes_to_the_background_and_comes_back(pane: Pane, cli: Cli) -> None:
    pane.keys("first question", "Enter")
    pane.wait_for("● Bash(sleep 2; echo slept)", timeout=30)
    pane.keys("C-b", "C-b")
    screen = pane.wait_for("moved to the background")
    backgrounded = screen.split("moved to the background")[0].split("[")[-1].strip()
    assert backgrounded.startswith("a"), screen
    # A fresh prompt at once, while the query goes on; its end is told when it comes.
    pane.keys("/tasks", "Enter")
    pane.wait_for(f"{backgrounded}  running")
    screen = pane.wait_for(f"◆ {backgrounded} completed", timeout=30)
    assert f"(in the background: answer to: first question; /fg {backgrounded})" in screen
    pane.keys("second question", "Enter")  # (a new conversation)
    pane.wait_for("answer to: second question", timeout=30)
    rows = {t["id"]: t for t in _tasks(cli)}
    assert rows[backgrounded]["agent_type"] == "main-session"
    pane.keys(f"/fg {backgrounded}", "Enter")
    pane.wait_for(f"[{backgrounded} is in the foreground]")
    pane.keys("and a third", "Enter")
    pane.wait_for("answer to: and a third")
    continued = [t for t in _tasks(cli) if t.get("resumed_from") == backgrounded]
    assert len(continued) == 1 and continued[0]["agent_type"] == "main-session"
    pane.keys("/fg a00000000", "Enter")
    pane.wait_for("no task a00000000 in this session")
    pane.keys("/nonsense", "Enter")
    pane.wait_for("unknown command /nonsense")
    pane.keys("C-d")
    pane.wait_for("CHAT-EXITED 0")


def test_chat_resumes_a_coordinator_in_its_stored_mode(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env={"SHOAL_POLL_INTERVAL": "0.1"})
    assert up.returncode == 0, up.stderr
    socket = f"shoal-chat-r-{tmp_path.name}"[-60:]
    try:
        script = tmp_path / "plain.toml"
        script.write_text('final = "coordinated: {prompt}"\n')
        out = cli("agent", "--team", TEAM, "--coordinator", "--backend", "in-process",
                  "--model", f"scripted:{script}", "first")  # fmt: skip
        assert out.returncode == 0, out.stderr
        coord = out.stdout.strip()
        wait_until(lambda: next(t for t in _tasks(cli) if t["id"] == coord)["status"]
                   == "completed", what="the coordinator")  # fmt: skip
        command = " ".join(shlex.quote(a) for a in [
            "env", f"SHOAL_HOME={home}", sys.executable, "-m", "shoal", "chat", "--team", TEAM,
            "--no-coordinator", "--resume", coord])  # fmt: skip
        pane = Pane(socket, f"{command}; sleep 60")
        pane.wait_for("entered coordinator mode to match the resumed session")
        pane.wait_for("coordinated: ")  # (its conversation so far)
        pane.keys("again", "Enter")
        pane.wait_for("coordinated: again")
        (resumed,) = [t for t in _tasks(cli) if t.get("resumed_from") == coord]
        assert resumed["coordinator"]
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
        cli("down", "--team", TEAM)


def test_chat_needs_a_terminal(cli: Cli) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "shoal", "chat", "--team", TEAM],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "SHOAL_HOME": str(cli.home)},
        timeout=60,
    )
    assert out.returncode == 2 and "needs a terminal" in out.stderr


GATED = """
final = "answer to: {{prompt}}"

[[turn]]
wait_for = "{gate}"
[[turn.call]]
tool = "Bash"
args = {{ command = "echo gated" }}
"""


def test_the_record_and_the_pill_follow_a_query_to_the_background_and_back(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env={"SHOAL_POLL_INTERVAL": "0.1"})
    assert up.returncode == 0, up.stderr
    gate = tmp_path / "go"
    script = tmp_path / "gated.toml"
    script.write_text(GATED.format(gate=gate))
    socket = f"shoal-chat-b-{tmp_path.name}"[-60:]
    command = " ".join(
        shlex.quote(a)
        for a in ["env", f"SHOAL_HOME={home}", sys.executable, "-m", "shoal", "chat",
                  "--team", TEAM, "--model", f"scripted:{script}",
                  "--permission-mode", "bypassPermissions", "--cwd", str(tmp_path)]
    )  # fmt: skip
    pane = Pane(socket, f"{command}; sleep 60")

    def records() -> list[dict[str, Any]]:
        session = current_session_files(Layout(home), TEAM)  # (state.json, as ps reads it)
        return list(session.read_tasks_raw().values()) if session is not None else []

    def query() -> dict[str, Any]:
        (row,) = [t for t in records() if t.get("agent_type") == "main-session"]
        return row

    def pill() -> str:
        return cli("pill", "--team", TEAM).stdout.strip()

    try:
        pane.wait_for("/help for the commands")
        pane.keys("the question", "Enter")
        # In its chat's foreground: held there, and not a background task for the pill.
        wait_until(lambda: records() and query()["retain"], what="the query held")
        row = query()
        task_id = str(row["id"])
        assert row["status"] == "running" and row["is_backgrounded"] is False
        assert pill() == ""
        pane.keys("C-b", "C-b")
        pane.wait_for(f"[{task_id} moved to the background")
        assert query()["is_backgrounded"] is True
        assert pill() == "1 local agent"
        ps = cli("ps", "--team", TEAM).stdout
        assert "[main session, in the background]" in ps, ps
        wait_until(lambda: not query()["retain"], what="the chat to let go of it")
        pane.keys(f"/fg {task_id}", "Enter")
        pane.wait_for(f"[{task_id} is in the foreground]")
        assert query()["is_backgrounded"] is False
        assert pill() == ""
        pane.keys("C-b", "C-b")
        wait_until(lambda: query()["is_backgrounded"] is True, what="backgrounded again")
        gate.touch()
        screen = pane.wait_for(f"◆ {task_id} completed", timeout=30)
        assert "(in the background: answer to: the question" in screen
        assert pill() == ""  # (ended: nothing runs in the background)
        # Its end is told once: one notification event, one line in the chat.
        out = cli("events", "--team", TEAM, "--json")
        told = [
            e
            for e in map(json.loads, out.stdout.splitlines())
            if e.get("subtype") == "task_notification" and e.get("task_id") == task_id
        ]
        assert len(told) == 1, told
        pane.keys("/tasks", "Enter")
        pane.wait_for(f"{task_id}  completed")
        assert pane.screen().count(f"◆ {task_id} completed") == 1
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)
        cli("down", "--team", TEAM)
