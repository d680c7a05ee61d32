"""The seed's task fields, each doing what it says, through a real leader and real agents on
the scripted model: `pending_messages` drains one message at a time as the agent takes it,
the progress `summary` follows the agent's work round by round, every ToolActivity has its
time, `messages` keeps the conversation's last 50, `disk_loaded` marks messages read back
from a transcript; a view's hold (`retain`) keeps a task past its eviction and ends with the
view; an old record's dropped teammate field still loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.core.tasks import InProcessTeammateTaskState, parse_task_state
from shoal.orchestrator.holds import ViewHold
from shoal.teams.session_files import current_session_files
from tests.conftest import Cli
from tests.polling import wait_until

TEAM = "fields"
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}
BYPASS = ("--permission-mode", "bypassPermissions")


@pytest.fixture
def leader(cli: Cli) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def tasks(home: Path, *, history: bool = False) -> dict[str, dict[str, Any]]:
    """The session's records as state.json (and, asked, the history) has them now."""
    session = current_session_files(Layout(home), TEAM)
    if session is None:
        return {}
    found = dict(session.history()) if history else {}
    found.update(session.read_tasks_raw())
    return found


def live(home: Path, task_id: str) -> dict[str, Any] | None:
    return tasks(home).get(task_id)


def start_agent(cli: Cli, tmp_path: Path, script: str, prompt: str, *extra: str) -> str:
    path = tmp_path / "script.toml"
    path.write_text(script)
    out = cli("agent", "--team", TEAM, "--model", f"scripted:{path}", *BYPASS, *extra, prompt)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def ended(home: Path, task_id: str, timeout: float = 30) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        task = tasks(home, history=True).get(task_id)
        done = task is not None and task["status"] in ("completed", "failed", "killed")
        return task if done else None

    return wait_until(final, timeout=timeout, what=f"task {task_id} to end")


def stepped(tmp_path: Path) -> str:
    """Three rounds, each answered once its file exists (go1, go2, go3)."""
    return f"""
[[turn]]
wait_for = "{tmp_path / "go1"}"
text = "Looking at the first file."
[[turn.call]]
tool = "Bash"
args = {{ command = "echo one", description = "first look" }}

[[turn]]
wait_for = "{tmp_path / "go2"}"
text = "Now the second one."
[[turn.call]]
tool = "Glob"
args = {{ pattern = "*.toml" }}

[[turn]]
wait_for = "{tmp_path / "go3"}"
text = "All done after: {{prompt}}"
"""


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_pending_messages_drain_one_by_one_as_the_summary_follows_the_work(
    leader: Cli, home: Path, tmp_path: Path, backend: str
) -> None:
    started = time.time()
    task_id = start_agent(leader, tmp_path, stepped(tmp_path), "begin", "--backend", backend)

    def summary() -> str:
        return str(((live(home, task_id) or {}).get("progress") or {}).get("summary") or "")

    def pending() -> list[str]:
        return list((live(home, task_id) or {}).get("pending_messages") or [])

    wait_until(lambda: "waiting for the model" in summary(), what="the first request out")
    assert leader("send", "--team", TEAM, task_id, "first note").returncode == 0
    assert pending() == ["first note"]  # (the leader's record is written before it answers)
    (tmp_path / "go1").touch()
    # The first round's tool ran and the next request took the note: it leaves the queue
    # while the agent runs on, and the summary says what the agent said this round.
    wait_until(lambda: not pending(), what="the first note drained")
    wait_until(lambda: "Looking at the first file." in summary(), what="the first summary")
    assert live(home, task_id)["status"] == "running"  # type: ignore[index]
    assert leader("send", "--team", TEAM, task_id, "second note").returncode == 0
    assert pending() == ["second note"]
    (tmp_path / "go2").touch()
    wait_until(lambda: not pending(), what="the second note drained")
    wait_until(lambda: "Now the second one." in summary(), what="the summary to move on")
    (tmp_path / "go3").touch()
    final = ended(home, task_id)
    assert final["status"] == "completed", final
    assert final["result"] == "All done after: second note"
    # Every activity says when it was made.
    progress = final["progress"]
    activities = [progress["last_activity"], *progress["recent_activities"]]
    assert [a["tool_name"] for a in progress["recent_activities"]] == ["Bash", "Glob"]
    for activity in activities:
        assert started <= activity["at"] <= time.time(), activity
    # The conversation as views show it: both notes reached it as user messages.
    said = [(m["role"], m["kind"], m["text"]) for m in final["messages"]]
    assert ("user", "text", "begin") in said
    assert ("user", "text", "first note") in said and ("user", "text", "second note") in said
    assert ("assistant", "tool_use", "Bash(first look)") in said
    assert said[-1] == ("assistant", "text", "All done after: second note")
    assert all(isinstance(m["at"], float) for m in final["messages"])
    assert final["disk_loaded"] is False


def test_messages_keep_the_last_fifty_and_cut_long_texts(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    turns = "".join(
        f'[[turn]]\ntext = "step {n} {"x" * (300 if n == 30 else 0)}"\n'
        f'[[turn.call]]\ntool = "Glob"\nargs = {{ pattern = "*.none" }}\n\n'
        for n in range(1, 31)
    )
    task_id = start_agent(leader, tmp_path, 'final = "finished"\n' + turns, "count to thirty")
    final = ended(home, task_id)
    assert final["status"] == "completed", final.get("error")
    messages = final["messages"]
    # 1 prompt + 30 rounds of a text and a call + the answer = 62: the last 50 are kept.
    assert len(messages) == 50, len(messages)
    assert messages[-1]["text"] == "finished"
    assert all(m["text"] != "count to thirty" for m in messages)  # (the oldest went)
    long = next(m for m in messages if m["text"].startswith("step 30 "))
    assert len(long["text"]) == 201 and long["text"].endswith("…")


def test_a_resumed_agent_has_its_conversation_read_back_from_disk(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    first = start_agent(leader, tmp_path, 'final = "heard: {prompt}"\n', "the first words")
    assert ended(home, first)["status"] == "completed"
    out = leader("agent", "--team", TEAM, "--resume", first, "more words")
    assert out.returncode == 0, out.stderr
    second = out.stdout.strip()
    final = ended(home, second)
    assert final["resumed_from"] == first and final["disk_loaded"] is True
    texts = [m["text"] for m in final["messages"]]
    assert texts == ["the first words", "heard: the first words", "more words", "heard: more words"]


def test_a_view_that_opens_an_old_record_reads_its_messages_back(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    assert cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST).returncode == 0
    try:
        task_id = start_agent(cli, tmp_path, 'final = "heard: {prompt}"\n', "old words")
        assert ended(home, task_id)["status"] == "completed"
    finally:
        assert cli("down", "--team", TEAM).returncode == 0
    # A record written by a shoal that kept no messages (its panel grace not over yet).
    session = current_session_files(Layout(home), TEAM)
    assert session is not None
    state = json.loads(session.state_file.read_text())
    state["tasks"][task_id]["messages"] = []
    session.state_file.write_text(json.dumps(state))
    assert cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST).returncode == 0
    hold = ViewHold(Layout(home), TEAM, "test")
    try:
        assert tasks(home)[task_id]["messages"] == []
        hold.show(task_id)
        record = wait_until(
            lambda: (t := live(home, task_id)) is not None and t["disk_loaded"] and t,
            what="the messages read back",
        )
        assert [m["text"] for m in record["messages"]] == ["old words", "heard: old words"]
        assert record["retain"] is True
    finally:
        hold.close()
        cli("down", "--team", TEAM)


HOLDER = """
import sys, time
from shoal.core.paths import Layout
from shoal.orchestrator.holds import ViewHold
hold = ViewHold(Layout(sys.argv[1]), sys.argv[2], "viewer")
hold.show(sys.argv[3])
print("holding", flush=True)
time.sleep(120)
"""


def gated(cli: Cli, gate: Path) -> str:
    """A shell task that ends once `gate` exists."""
    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    out = cli("sh", "--team", TEAM, "--", "sh", "-c", wait)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_view_holds_a_task_past_its_eviction_and_a_dead_view_lets_go(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    task_id = gated(leader, tmp_path / "end")
    viewer = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home), TEAM, task_id],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SHOAL_HOME": str(home)},
    )
    try:
        wait_until(lambda: (live(home, task_id) or {}).get("retain"), what="the view's hold")
        (tmp_path / "end").touch()
        final = ended(home, task_id)
        assert final["notified"] or wait_until(lambda: live(home, task_id)["notified"])  # type: ignore[index]
        # Ended and notified, a shell leaves the registry a round later (0.1 s here): held,
        # it stays, round after round.
        held_until = time.monotonic() + 1.5
        while time.monotonic() < held_until:
            assert task_id in tasks(home), "a held task was evicted"
            time.sleep(0.1)
        assert tasks(home)[task_id]["retain"] is True
    finally:
        viewer.send_signal(signal.SIGKILL)
        viewer.wait()
    # The view is gone without a word: its hold goes with it, and so does the task.
    wait_until(lambda: task_id not in tasks(home), what="the task evicted once unheld")
    assert tasks(home, history=True)[task_id]["retain"] is False


def test_a_released_hold_frees_the_task_and_an_evicted_one_cannot_be_held(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    task_id = gated(leader, tmp_path / "end")
    hold = ViewHold(Layout(home), TEAM, "test")
    try:
        hold.show(task_id)
        wait_until(lambda: (live(home, task_id) or {}).get("retain"), what="the hold")
        (tmp_path / "end").touch()
        ended(home, task_id)
        hold.show(None)  # (the view shows something else)
        wait_until(lambda: task_id not in tasks(home), what="the released task evicted")
        hold.show(task_id)
        wait_until(lambda: hold.error, what="the refusal")
        assert "has ended and left the registry" in str(hold.error)
    finally:
        hold.close()


def test_a_teammate_record_of_an_older_shoal_still_loads() -> None:
    raw = {
        "id": "t0000abcd",
        "type": "in_process_teammate",
        "description": "old",
        "output_file": "/tmp/x.output",
        "identity": {
            "agent_id": "bob@old",
            "agent_name": "bob",
            "team_name": "old",
            "parent_session_id": "s",
        },
        "prompt": "p",
        "pending_user_messages": ["a message the record once copied"],
    }
    task = parse_task_state(raw)
    assert isinstance(task, InProcessTeammateTaskState)
    assert "pending_user_messages" not in task.model_dump()
    assert "pending_user_messages" not in InProcessTeammateTaskState.model_fields


TASK_LIST_SCRIPT = """
final = "planned"

[[turn]]
[[turn.call]]
tool = "TaskCreate"
args = {{ subject = "read the code" }}
[[turn.call]]
tool = "TaskCreate"
args = {{ subject = "fix the bug" }}

[[turn]]
wait_for = "{gate}"
[[turn.call]]
tool = "TaskUpdate"
args = {{ taskId = "1", status = "completed" }}
"""


def test_a_remote_job_reports_its_agents_task_list_as_it_changes(
    home: Path, tmp_path: Path
) -> None:
    from shoal.workers.remote.verdicts import MARKER, todo_of

    gate = tmp_path / "go"
    script = tmp_path / "todo.toml"
    script.write_text(TASK_LIST_SCRIPT.format(gate=gate))
    work = tmp_path / "work"
    work.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "shoal", "remote", "job", "--type", "remote-agent",
         "--model", f"scripted:{script}", "--", "make a plan"],
        cwd=work, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "SHOAL_HOME": str(home), **FAST},
    )  # fmt: skip
    assert job.stdout is not None
    markers: dict[str, str] = {}
    seen: list[tuple[dict[str, str], ...]] = []
    try:
        for line in job.stdout:
            found = MARKER.match(line.rstrip("\n"))
            if found is None:
                continue
            markers[found.group(1)] = found.group(2).strip()
            todo = todo_of(markers)  # (what the task's leader makes of it, each poll)
            if found.group(1) == "todo" and todo is not None:
                seen.append(todo)
                gate.touch()  # (the agent goes on once its first list was told)
        assert job.wait(timeout=60) == 0
    finally:
        job.kill()
    first, last = seen[0], seen[-1]
    assert first == (
        {"content": "read the code", "status": "pending"},
        {"content": "fix the bug", "status": "pending"},
    )
    assert last[0] == {"content": "read the code", "status": "completed"}
    assert markers["result"] == '"planned"'
