"""`dream` tasks through the real CLI and real leaders, offline on scripted models over
generated sessions: a dream reviews the sessions since the last consolidation and rewrites
the memory files; its record (phase, files, turns), its lock (stamped on completion, rolled
back when killed or dead), the automatic dream at a leader's start, and the bad inputs — a
second dream, a kill mid-update, a dead runner found on resume, a symlinked memory directory,
writes outside the memory directory."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli, pid_gone
from tests.polling import wait_until

TEAM = "dr"
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}
PRIOR = 1_000_000.0  # a last consolidation long ago (the lock's mtime before a dream)
LOCK = ".consolidate.lock"


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "-d", "-q", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def make_sessions(home: Path, count: int, *, prefix: str = "s") -> list[Path]:
    """Session directories as leaders leave them: a transcript and an event stream each."""
    made = []
    for n in range(count):
        path = home / "sessions" / f"{prefix}{n}"
        (path / "transcripts").mkdir(parents=True)
        (path / "transcripts" / "a0000000.jsonl").write_text(
            json.dumps({"v": 1, "message": {"parts": [{"content": f"decision {n}: use tabs"}]}})
            + "\n"
        )
        (path / "events.jsonl").write_text(
            json.dumps({"v": 1, "type": "system", "subtype": "task_terminated", "task_id": "b1"})
            + "\n"
        )
        made.append(path)
    return made


def memory(home: Path, prior: float | None = PRIOR, **files: str) -> Path:
    """SHOAL_HOME/memory with `files`, and a lock last stamped at `prior`."""
    path = home / "memory"
    path.mkdir(mode=0o700, exist_ok=True)
    for name, text in files.items():
        (path / f"{name}.md").write_text(text)
    if prior is not None:
        (path / LOCK).touch()
        os.utime(path / LOCK, (prior, prior))
    return path


def script(tmp_path: Path, text: str, name: str = "dream.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return f"scripted:{path}"


def record(cli: Cli, task_id: str) -> dict[str, Any]:
    out = cli("ps", "--team", TEAM, "--all", "--json")
    assert out.returncode == 0, out.stderr
    tasks: list[dict[str, Any]] = json.loads(out.stdout)
    (task,) = [t for t in tasks if t["id"] == task_id]
    return task


def dreams(cli: Cli) -> list[dict[str, Any]]:
    out = cli("ps", "--team", TEAM, "--all", "--json")
    assert out.returncode == 0, out.stderr
    return [t for t in json.loads(out.stdout) if t["type"] == "dream"]


def ended(cli: Cli, task_id: str, timeout: float = 60) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        task = record(cli, task_id)
        return task if task["status"] in ("completed", "failed", "killed") else None

    return wait_until(final, timeout=timeout, what=f"dream {task_id} to end")


def start(cli: Cli, *args: str) -> dict[str, Any]:
    out = cli("dream", "--team", TEAM, "--json", *args)
    assert out.returncode == 0, out.stderr
    task: dict[str, Any] = json.loads(out.stdout)
    return task


CONSOLIDATE = """
[[turn]]
text = "Reading the first session and the memory."
[[turn.call]]
tool = "Read"
args = {{ file_path = "{transcript}" }}
[[turn.call]]
tool = "Read"
args = {{ file_path = "MEMORY.md" }}

[[turn]]
text = "Rewriting the memory."
[[turn.call]]
tool = "Edit"
args = {{ file_path = "MEMORY.md", old_string = "spaces", new_string = "tabs" }}
[[turn.call]]
tool = "Write"
args = {{ file_path = "decisions.md", content = "# Decisions\\n\\n{{result_1}}\\n" }}

[[turn]]
text = "Merged the decisions into memory."
"""


def test_dream_rewrites_memory_from_the_sessions(leader: Cli, home: Path, tmp_path: Path) -> None:
    sessions = make_sessions(home, 3)
    mem = memory(home, MEMORY="# Memory\n\nindent with spaces\n")
    transcript = sessions[0] / "transcripts" / "a0000000.jsonl"
    model = script(tmp_path, CONSOLIDATE.format(transcript=transcript))
    task = start(leader, "--model", model)
    assert task["id"].startswith("d") and task["prior_mtime"] == PRIOR
    # (the leader's own session counts too, once it has written an event)
    assert {"s0", "s1", "s2"} <= set(task["sessions"])
    assert task["sessions_reviewing"] == len(task["sessions"]) <= 4
    done = ended(leader, task["id"])
    assert done["status"] == "completed", done
    assert done["phase"] == "updating"
    assert done["files_touched"] == ["MEMORY.md", "decisions.md"]
    assert [(t["text"], t["tool_use_count"]) for t in done["turns"]] == [
        ("Reading the first session and the memory.", 2),
        ("Rewriting the memory.", 2),
        ("Merged the decisions into memory.", 0),
    ]
    assert done["result"] == "Merged the decisions into memory."
    assert (mem / "MEMORY.md").read_text() == "# Memory\n\nindent with tabs\n"
    assert "decision 0: use tabs" in (mem / "decisions.md").read_text()
    # The lock is stamped with the dream's end and held by nobody.
    stamped = (mem / LOCK).stat().st_mtime
    assert done["start_time"] <= stamped <= done["end_time"] + 1
    assert (mem / LOCK).read_bytes() == b""
    # The lead hears of its end.
    out = leader("events", "--team", TEAM, "--json")
    ends = [json.loads(line) for line in out.stdout.splitlines()]
    (told,) = [
        e
        for e in ends
        if e.get("subtype") == "task_notification" and e.get("task_id") == task["id"]
    ]
    assert "<status>completed</status>" in told["notification"]
    assert "<result>Merged the decisions into memory.</result>" in told["notification"]
    # Nothing happened since: the next dream has no session to review.
    again = start(leader)
    assert not {"s0", "s1", "s2"} & set(again["sessions"]) and again["prior_mtime"] == stamped
    assert ended(leader, again["id"])["status"] == "completed"
    # --sessions N reviews the newest N whatever the lock says.
    assert start(leader, "--sessions", "2")["sessions_reviewing"] == 2


def test_the_default_model_is_the_embedded_dream_script(leader: Cli, home: Path) -> None:
    make_sessions(home, 2)
    mem = memory(home)
    out = leader("dream", "--team", TEAM)
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    assert f"session(s) into {mem}" in out.stderr
    done = ended(leader, task_id)
    assert done["status"] == "completed", done
    assert "dream_script.toml" in done["model"]
    log = (mem / "sessions.md").read_text()
    assert "s0/events.jsonl:1" in log and "s1/events.jsonl:1" in log


# A dream that writes one memory file, reads a session file, then waits (its model holds the
# next turn until the file `go` exists): killed there, it is mid-update.
BLOCKS = """
[[turn]]
text = "Updating the first file."
[[turn.call]]
tool = "Read"
args = {{ file_path = "A.md" }}
[[turn.call]]
tool = "Write"
args = {{ file_path = "A.md", content = "{new}" }}

[[turn]]
text = "Reading more."
[[turn.call]]
tool = "Read"
args = {{ file_path = "{more}" }}

[[turn]]
text = "Updating the second file."
wait_for = "{go}"
[[turn.call]]
tool = "Read"
args = {{ file_path = "B.md" }}
[[turn.call]]
tool = "Write"
args = {{ file_path = "B.md", content = "never" }}
"""
NEW_A = "new A " * 1000


def blocking(home: Path, tmp_path: Path) -> str:
    (session,) = make_sessions(home, 1)
    more = session / "transcripts" / "more.jsonl"
    more.write_text("more\n")
    return script(tmp_path, BLOCKS.format(new=NEW_A, more=more, go=tmp_path / "go"))


def waiting_mid_update(cli: Cli, task_id: str) -> dict[str, Any] | None:
    task = record(cli, task_id)
    in_turn = [t["text"] for t in task["turns"]] == ["Updating the first file.", "Reading more."]
    return task if task["phase"] == "updating" and in_turn else None


def test_second_dream_refused_then_kill_mid_update_rolls_back(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    model = blocking(home, tmp_path)
    mem = memory(home, A="old A", B="old B")
    first = start(leader, "--model", model)
    mid = wait_until(
        lambda: waiting_mid_update(leader, first["id"]), timeout=60, what="the dream to block"
    )
    assert mid["files_touched"] == ["A.md"]
    # A second dream, while the first runs: refused, naming the first; nothing registered.
    second = leader("dream", "--team", TEAM)
    assert second.returncode == 1
    assert f"a dream is already running: {first['id']}" in second.stderr
    assert [d["id"] for d in dreams(leader)] == [first["id"]]
    # Killed mid-update: the lock's mtime is the prior one again; each file old or new.
    stop = leader("stop", "--team", TEAM, first["id"])
    assert stop.returncode == 0, stop.stderr
    done = ended(leader, first["id"])
    assert done["status"] == "killed"
    assert (mem / LOCK).stat().st_mtime == PRIOR
    assert (mem / LOCK).read_bytes() == b""
    assert (mem / "A.md").read_text() == NEW_A  # (written whole before the kill)
    assert (mem / "B.md").read_text() == "old B"
    assert sorted(p.name for p in mem.iterdir()) == [LOCK, "A.md", "B.md"]  # no temp files
    assert pid_gone(done["pid"])
    # The lock is free again: the next dream is not refused.
    retry = start(leader, "--model", script(tmp_path, 'final = "nothing to do"', "noop.toml"))
    assert retry["prior_mtime"] == PRIOR
    assert ended(leader, retry["id"])["status"] == "completed"


def test_dead_dream_found_on_resume_rolls_the_lock_back(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    model = blocking(home, tmp_path)
    mem = memory(home, A="old A", B="old B")
    assert cli("up", "--team", TEAM, "-d", "-q", env=FAST).returncode == 0
    try:
        task = start(cli, "--model", model)
        wait_until(lambda: waiting_mid_update(cli, task["id"]), timeout=60, what="the dream")
        holder = json.loads((mem / LOCK).read_bytes())
        assert holder["task_id"] == task["id"]
        # The leader and the dream's runner die without a word.
        os.kill(holder["pid"], signal.SIGKILL)
        wait_until(lambda: pid_gone(holder["pid"]), what="the leader to die")
        os.kill(holder["runner_pid"], signal.SIGKILL)
        wait_until(lambda: pid_gone(holder["runner_pid"]), what="the runner to die")
        assert (mem / LOCK).stat().st_mtime != PRIOR  # (the holder's write moved it)
        up = cli("up", "--team", TEAM, "-d", "-q", env=FAST)
        assert up.returncode == 0, up.stderr
        done = ended(cli, task["id"])
        assert done["status"] == "failed"
        assert "without an outcome" in done["error"]
        assert (mem / LOCK).stat().st_mtime == PRIOR
        assert (mem / "B.md").read_text() == "old B"
        retry = start(cli, "--model", script(tmp_path, 'final = "ok"', "noop.toml"))
        assert ended(cli, retry["id"])["status"] == "completed"
    finally:
        cli("down", "--team", TEAM)


def test_leader_dies_the_dream_goes_on_and_is_adopted(cli: Cli, home: Path, tmp_path: Path) -> None:
    model = blocking(home, tmp_path)
    mem = memory(home, A="old A", B="old B")
    assert cli("up", "--team", TEAM, "-d", "-q", env=FAST).returncode == 0
    try:
        task = start(cli, "--model", model)
        wait_until(lambda: waiting_mid_update(cli, task["id"]), timeout=60, what="the dream")
        holder = json.loads((mem / LOCK).read_bytes())
        os.kill(holder["pid"], signal.SIGKILL)  # the leader dies; the runner goes on
        wait_until(lambda: pid_gone(holder["pid"]), what="the leader to die")
        assert cli("up", "--team", TEAM, "-d", "-q", env=FAST).returncode == 0
        # Adopted, still running, still holding the lock: a second dream is refused.
        assert record(cli, task["id"])["status"] == "running"
        refused = cli("dream", "--team", TEAM)
        assert refused.returncode == 1 and task["id"] in refused.stderr
        (tmp_path / "go").touch()  # (lets its model answer)
        done = ended(cli, task["id"])
        assert done["status"] == "completed", done
        assert (mem / "B.md").read_text() == "never"
        assert done["files_touched"] == ["A.md", "B.md"]
        assert (mem / LOCK).stat().st_mtime >= done["start_time"]
        assert (mem / LOCK).read_bytes() == b""
    finally:
        cli("down", "--team", TEAM)


def test_symlinked_memory_directory_is_refused(leader: Cli, home: Path, tmp_path: Path) -> None:
    make_sessions(home, 2)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (home / "memory").symlink_to(target)
    out = leader("dream", "--team", TEAM)
    assert out.returncode == 1, out
    assert f"memory directory {home / 'memory'} is not usable" in out.stderr
    assert "symlink" in out.stderr
    assert list(target.iterdir()) == []  # nothing written: no lock, no memory file
    assert dreams(leader) == []


OUTSIDE = """
[[turn]]
text = "Trying to write outside."
[[turn.call]]
tool = "Write"
args = {{ file_path = "../escaped.md", content = "x" }}
[[turn.call]]
tool = "Write"
args = {{ file_path = "{transcript}", content = "x" }}
[[turn.call]]
tool = "Edit"
args = {{ file_path = "{transcript}", old_string = "tabs", new_string = "spaces" }}
[[turn.call]]
tool = "Write"
args = {{ file_path = "notes.txt", content = "x" }}
[[turn.call]]
tool = "Bash"
args = {{ command = "touch {home}/escaped-by-bash" }}

[[turn]]
text = "Refused, all of them."
"""


def test_writes_outside_the_memory_directory_are_refused(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    (session,) = make_sessions(home, 1)
    transcript = session / "transcripts" / "a0000000.jsonl"
    before = transcript.read_text()
    mem = memory(home)
    model = script(tmp_path, OUTSIDE.format(transcript=transcript, home=home))
    done = ended(leader, start(leader, "--model", model)["id"])
    assert done["status"] == "completed", done
    assert done["files_touched"] == [] and done["phase"] == "starting"
    assert not (home / "escaped.md").exists() and not (home / "escaped-by-bash").exists()
    assert transcript.read_text() == before
    assert sorted(p.name for p in mem.iterdir()) == [LOCK]
    output = Path(done["output_file"]).read_text()
    assert output.count("a dream writes only inside its memory directory") == 2
    assert "only memory files (*.md)" in output
    assert "Bash" in output  # (no such tool: an error for the model, never run)


def test_auto_dream_at_leader_start(cli: Cli, home: Path) -> None:
    (home / "config.toml").write_text(
        "auto_dream = true\ndream_min_sessions = 3\ndream_min_hours = 1\n"
    )
    make_sessions(home, 1)
    mem = memory(home)
    # One session (and the leader's own, once it has written events): too few, no dream.
    assert cli("up", "--team", TEAM, "-d", "-q", env=FAST).returncode == 0
    try:
        assert dreams(cli) == []
    finally:
        assert cli("down", "--team", TEAM).returncode == 0
    # Two more sessions: the next start dreams on its own, over all four.
    make_sessions(home, 2, prefix="t")
    assert cli("up", "--team", TEAM, "-d", "-q", env=FAST).returncode == 0
    try:
        (auto,) = dreams(cli)
        assert auto["description"].startswith("auto dream: 4 sessions and "), auto
        assert {"s0", "t0", "t1"} <= set(auto["sessions"])
        done = ended(cli, auto["id"])
        assert done["status"] == "completed", done
        assert (mem / LOCK).stat().st_mtime > PRIOR
    finally:
        assert cli("down", "--team", TEAM).returncode == 0
    # Consolidated less than dream_min_hours ago: no dream, however many sessions.
    make_sessions(home, 3, prefix="u")
    assert cli("up", "--team", TEAM, "-d", "-q", env=FAST).returncode == 0
    try:
        assert [d["id"] for d in dreams(cli)] == [auto["id"]]
    finally:
        cli("down", "--team", TEAM)
