"""The dream's parts without a leader: the consolidation lock, the phase table, the
memory-confined workspace (refusals by code, atomic writes under SIGKILL), the session scan
and the automatic dream's gate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from shoal.core.errors import ShoalError, UnsafePathError, UsageError
from shoal.core.procs import current_identity
from shoal.core.tasks import DreamPhase, DreamTaskState, new_task_id
from shoal.core.taskupdates import update_task
from shoal.workers.agent.tool_args import (
    EditArgs,
    GlobArgs,
    GrepArgs,
    ReadArgs,
    ToolFailure,
    WriteArgs,
)
from shoal.workers.dream.memory import (
    LOCK_NAME,
    ConsolidationLock,
    DreamBusyError,
    DreamConfig,
    Holder,
    auto_dream_due,
    check_memory_dir,
    memory_dir,
    sessions_since,
)
from shoal.workers.dream.workspace import DreamWorkspace
from tests.polling import wait_until


def make_session(root: Path, name: str, *, mtime: float | None = None) -> Path:
    """A session directory with one transcript and an event stream."""
    path = root / name
    (path / "transcripts").mkdir(parents=True)
    (path / "events.jsonl").write_text('{"v":1,"subtype":"task_terminated"}\n')
    (path / "transcripts" / "a1.jsonl").write_text('{"v":1,"message":"use tabs"}\n')
    if mtime is not None:
        for f in (path / "events.jsonl", path / "transcripts" / "a1.jsonl"):
            os.utime(f, (mtime, mtime))
    return path


def me(task_id: str = "d00000001") -> Holder:
    pid, started = current_identity()
    return Holder(task_id, "team", pid, started)


DEAD = Holder("d00000009", "other", 2**22 + 12345, 1.0)


# -- the lock ---------------------------------------------------------------------------------


def test_lock_taken_refused_while_held_and_released(tmp_path: Path) -> None:
    lock = ConsolidationLock(tmp_path)
    assert lock.last_consolidated() is None
    before = time.time()
    assert lock.acquire(me()) is None  # no lock before: no prior mtime
    assert (tmp_path / LOCK_NAME).stat().st_mtime >= before - 1  # stamped when taken
    with pytest.raises(DreamBusyError, match="d00000001"):
        lock.acquire(me("d00000002"))
    held = lock.holder()
    assert held is not None and held.task_id == "d00000001"
    assert lock.release("d00000002", 5.0) is False  # not its lock: nothing changes
    assert lock.holder() == held
    assert lock.release("d00000001", 1_000_000.0) is True
    assert lock.holder() is None
    assert lock.last_consolidated() == 1_000_000.0
    assert lock.acquire(me("d00000002")) == 1_000_000.0
    assert orjson.loads((tmp_path / LOCK_NAME).read_bytes())["prior_mtime"] == 1_000_000.0


def test_lock_rollback_to_never_and_dead_or_stale_holders(tmp_path: Path) -> None:
    lock = ConsolidationLock(tmp_path)
    (tmp_path / LOCK_NAME).write_bytes(b"")
    os.utime(tmp_path / LOCK_NAME, (777.0, 777.0))
    assert lock.acquire(me()) == 777.0
    # Its holder dies without a rollback: the next taker inherits its prior mtime.
    (tmp_path / LOCK_NAME).write_bytes(Holder(**{**DEAD.__dict__, "prior_mtime": 777.0}).dump())
    assert lock.holder() is None  # a holder whose processes are gone does not hold it
    assert lock.acquire(me()) == 777.0
    assert lock.release("d00000001", None) is True  # rolled back with no prior: never
    assert lock.last_consolidated() is None
    lock.acquire(me("d00000003"))
    # A live holder declared stale (its own leader settled it) is taken over.
    assert lock.acquire(me("d00000004"), stale=lambda h: h.task_id == "d00000003") is None


def test_lock_symlink_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("x")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / LOCK_NAME).symlink_to(target)
    with pytest.raises(UnsafePathError, match="symlink"):
        ConsolidationLock(tmp_path / "m").acquire(me())
    assert target.read_text() == "x"


def test_lock_body_is_json_naming_the_runner(tmp_path: Path) -> None:
    lock = ConsolidationLock(tmp_path)
    lock.acquire(me())
    lock.started("d00000001", os.getpid(), None)
    body = orjson.loads((tmp_path / LOCK_NAME).read_bytes())
    assert body["task_id"] == "d00000001" and body["runner_pid"] == os.getpid()


# -- the phase table --------------------------------------------------------------------------


def test_dream_phase_moves_only_forward() -> None:
    task = DreamTaskState(id=new_task_id("dream"), description="d", output_file="/x")
    assert task.phase is DreamPhase.STARTING
    updating = update_task(task, phase=DreamPhase.UPDATING)
    assert updating.phase is DreamPhase.UPDATING
    with pytest.raises(ShoalError, match="illegal phase change updating -> starting"):
        update_task(updating, phase=DreamPhase.STARTING)


# -- the memory directory ---------------------------------------------------------------------


def test_memory_dir_choice_and_symlink_refusal(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    assert memory_dir(home, project) == home / "memory"
    assert check_memory_dir(home / "memory", home).is_dir()
    (project / ".shoal").mkdir()
    real = tmp_path / "real"
    real.mkdir()
    (project / ".shoal" / "memory").symlink_to(real)
    chosen = memory_dir(home, project)
    assert chosen == project / ".shoal" / "memory"  # a link there counts (and is refused)
    with pytest.raises(UnsafePathError, match="symlink"):
        check_memory_dir(chosen, home)
    assert list(real.iterdir()) == []


# -- the workspace ----------------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> DreamWorkspace:
    memory = tmp_path / "memory"
    memory.mkdir()
    (memory / "MEMORY.md").write_text("old\n")
    session = make_session(tmp_path / "sessions", "s1")
    return DreamWorkspace(cwd=memory, mode="acceptEdits", readable=(session,))


def test_workspace_refuses_writes_outside_memory(ws: DreamWorkspace, tmp_path: Path) -> None:
    transcript = tmp_path / "sessions" / "s1" / "transcripts" / "a1.jsonl"
    outside = tmp_path / "outside.md"
    (ws.cwd / "link.md").symlink_to(outside)
    ws.read(ReadArgs(file_path=str(transcript)))  # the sessions are readable
    refusals = {
        "../outside.md": "outside the memory directory",
        str(outside): "outside the memory directory",
        "link.md": "outside the memory directory",  # a link out of it
        str(transcript): "the sessions are read-only",
        "notes.txt": r"only memory files \(\*\.md\)",
        LOCK_NAME: r"only memory files",
    }
    for name, why in refusals.items():
        with pytest.raises(ToolFailure, match=why):
            ws.write(WriteArgs(file_path=name, content="x"))
    with pytest.raises(ToolFailure, match="read-only"):
        ws.edit(EditArgs(file_path=str(transcript), old_string="tabs", new_string="spaces"))
    with pytest.raises(ToolFailure, match="outside"):
        ws.read(ReadArgs(file_path="/etc/hostname"))
    assert not outside.exists()
    assert "tabs" in transcript.read_text()
    assert ws.touched == []


def test_workspace_writes_atomically_and_tracks_files(ws: DreamWorkspace) -> None:
    ws.read(ReadArgs(file_path="MEMORY.md"))
    ws.edit(EditArgs(file_path="MEMORY.md", old_string="old", new_string="new"))
    ws.write(WriteArgs(file_path="topics/style.md", content="tabs\n"))
    assert (ws.cwd / "MEMORY.md").read_text() == "new\n"
    assert (ws.cwd / "topics" / "style.md").read_text() == "tabs\n"
    assert ws.touched == ["MEMORY.md", "topics/style.md"]
    assert sorted(p.name for p in ws.cwd.iterdir()) == ["MEMORY.md", "topics"]  # no temp files


def test_workspace_memory_dir_swapped_for_a_link(ws: DreamWorkspace, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = tmp_path / "moved"
    ws.cwd.rename(moved)
    ws.cwd.symlink_to(elsewhere)
    with pytest.raises(ToolFailure, match=r"outside|changed"):
        ws.write(WriteArgs(file_path="new.md", content="x"))
    assert list(elsewhere.iterdir()) == []


def test_workspace_search_covers_memory_and_sessions(ws: DreamWorkspace) -> None:
    found = ws.grep(GrepArgs(pattern="tabs|old"))
    assert "MEMORY.md" in found and "a1.jsonl" in found
    listed = ws.glob(GlobArgs(pattern="**/*"))
    assert "events.jsonl" in listed and "MEMORY.md" in listed


WRITER = """
import sys
from pathlib import Path
from shoal.workers.agent.tool_args import ReadArgs, WriteArgs
from shoal.workers.dream.workspace import DreamWorkspace
ws = DreamWorkspace(cwd=Path(sys.argv[1]), mode="acceptEdits")
n = 0
while True:
    ws.read(ReadArgs(file_path="big.md"))
    ws.write(WriteArgs(file_path="big.md", content=("ab"[n % 2]) * 4_000_000))
    n += 1
    if n == 1:
        Path(sys.argv[1], "started").touch()
"""


def test_memory_file_never_torn_by_sigkill(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    memory.mkdir()
    old = "o" * 4_000_000
    (memory / "big.md").write_text(old)
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(memory)])
    try:
        wait_until(lambda: (memory / "started").exists(), timeout=30, what="the writer to write")
        seen: set[str] = set()
        for _ in range(20):  # whatever instant a reader looks, the file is whole
            text = (memory / "big.md").read_text()
            seen.add(text[0])
            assert len(text) == 4_000_000 and text == text[0] * len(text)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    text = (memory / "big.md").read_text()
    assert text in (old, "a" * 4_000_000, "b" * 4_000_000)
    assert seen <= {"a", "b"}


# -- sessions and the automatic dream -----------------------------------------------------------


def test_sessions_since_and_the_auto_gate(tmp_path: Path) -> None:
    home = tmp_path
    root = home / "sessions"
    now = time.time()
    make_session(root, "old", mtime=now - 7200)
    for name in ("s1", "s2", "current"):
        make_session(root, name)
    (root / "linked").symlink_to(root / "s1")  # (a planted link is not a session)
    (root / "empty").mkdir()
    assert next(s.session_id for s in sessions_since(root, None)) == "old"
    assert sorted(s.session_id for s in sessions_since(root, None)) == [
        "current",
        "old",
        "s1",
        "s2",
    ]
    memory = check_memory_dir(home / "memory", home)
    lock = ConsolidationLock(memory)
    lock.acquire(me())
    lock.release("d00000001", now - 3600)
    assert sorted(s.session_id for s in sessions_since(root, now - 3600)) == ["current", "s1", "s2"]
    on = DreamConfig(auto=True, min_sessions=3, min_hours=0.5)
    assert auto_dream_due(on, memory, root, now=now) == (
        "3 sessions and 1 hours since the last consolidation"
    )
    assert auto_dream_due(DreamConfig(), memory, root, now=now) is None  # off
    many = DreamConfig(auto=True, min_sessions=4, min_hours=0.5)
    assert auto_dream_due(many, memory, root, now=now) is None
    soon = DreamConfig(auto=True, min_sessions=1, min_hours=2)
    assert auto_dream_due(soon, memory, root, now=now) is None
    # Released already: a second release (a settle seen again) changes nothing.
    assert lock.release("d00000001", None) is False
    assert auto_dream_due(on, memory, root, now=now) == (
        "3 sessions and 1 hours since the last consolidation"
    )
    lock.acquire(me())
    lock.release("d00000001", None)  # (rolled back to never: any number of hours)
    assert auto_dream_due(on, memory, root, now=now) == ("4 sessions and no consolidation yet")


def test_dream_config_values(tmp_path: Path) -> None:
    assert DreamConfig.load(tmp_path) == DreamConfig(auto=False, min_sessions=5, min_hours=24.0)
    (tmp_path / "config.toml").write_text(
        "auto_dream = true\ndream_min_sessions = 2\ndream_min_hours = 1.5\n"
    )
    assert DreamConfig.load(tmp_path) == DreamConfig(auto=True, min_sessions=2, min_hours=1.5)
    (tmp_path / "config.toml").write_text('auto_dream = "yes"\n')
    with pytest.raises(UsageError, match="auto_dream must be true or false"):
        DreamConfig.load(tmp_path)
    (tmp_path / "config.toml").write_text("dream_min_sessions = -1\n")
    with pytest.raises(UsageError, match="must not be negative"):
        DreamConfig.load(tmp_path)
