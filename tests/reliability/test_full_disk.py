"""A full disk loses nothing and says so. SHOAL_HOME is a small tmpfs mounted by the test and
filled to the last byte: every CLI write path fails with one line naming the path and "no space
left", exit 1, and leaves nothing half written; a leader whose tasks end while the disk is full
keeps their records in memory and writes them once space is back.

Mounting needs root (CAP_SYS_ADMIN); where it is not permitted the tests are skipped and say so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from tests.conftest import Cli
from tests.polling import wait_until
from tests.reliability.conftest import Disk

TEAM = "t"


@pytest.fixture
def full_home(disk: Disk, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = disk.root / "home"
    home.mkdir()
    monkeypatch.setenv("SHOAL_HOME", str(home))
    return home


def assert_no_space(out: subprocess.CompletedProcess[str], home: Path) -> None:
    """One error line naming a path under `home` and saying there is no space; exit 1."""
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("shoal: error: no space left on device writing "), lines[0]
    assert str(home) in lines[0], lines[0]
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr


def leftovers(home: Path) -> list[Path]:
    """Temp files and torn JSON anywhere under `home` (what a half-done write leaves)."""
    found: list[Path] = []
    for path in home.rglob("*"):
        if path.is_file() and (".tmp" in path.name or path.parent.name == "tmp"):
            found.append(path)
        elif path.is_file() and path.suffix == ".json":
            try:
                json.loads(path.read_bytes())
            except ValueError:
                found.append(path)
    return found


def test_cli_writes_fail_cleanly_on_a_full_disk(full_home: Path, disk: Disk) -> None:
    cli = Cli(full_home)
    teams = Teams(Layout(full_home))
    teams.create(TEAM)
    teams.join(TEAM, "bob", pid=os.getpid())
    assert cli("send", "--team", TEAM, "bob", "waiting").returncode == 0
    assert cli("task", "add", "--team", TEAM, "before").returncode == 0
    team_before = Layout(full_home).team_file(TEAM).read_bytes()
    disk.fill()

    assert_no_space(cli("send", "--team", TEAM, "bob", "hello"), full_home)
    assert_no_space(cli("task", "add", "--team", TEAM, "during"), full_home)
    assert_no_space(cli("team", "create", "other"), full_home)
    assert_no_space(cli("team", "join", TEAM, "carol", "--pid", str(os.getpid())), full_home)
    # Reading the inbox moves a message (no new blocks) and logs it as handled (a write): it
    # either works or says why, never a traceback; the message is never lost.
    read = cli("inbox", "--team", TEAM, "bob", "--json")
    assert "internal error" not in read.stderr and "Traceback" not in read.stderr, read.stderr
    if read.returncode != 0:
        assert_no_space(read, full_home)

    disk.free()
    assert leftovers(full_home) == []
    assert Layout(full_home).team_file(TEAM).read_bytes() == team_before
    listed = cli("task", "list", "--team", TEAM, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [t["subject"] for t in json.loads(listed.stdout)] == ["before"]
    assert not (full_home / "teams" / "other").exists()
    if read.returncode != 0:  # the message still waits, once
        again = cli("inbox", "--team", TEAM, "bob", "--json")
        assert again.returncode == 0, again.stderr
        assert [m["text"] for m in json.loads(again.stdout)] == ["waiting"]


def test_leader_keeps_task_records_through_a_full_disk(full_home: Path, disk: Disk) -> None:
    cli = Cli(full_home)
    fast = {"SHOAL_POLL_INTERVAL": "0.1"}
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=fast)
    assert up.returncode == 0, up.stderr
    try:
        gate = disk.root.parent / "gate"
        ids: list[str] = []
        for _ in range(3):
            sh = cli("sh", "--team", TEAM, "--", f"while [ ! -f {gate} ]; do sleep 0.05; done")
            assert sh.returncode == 0, sh.stderr
            ids.append(sh.stdout.split()[0])
        disk.fill()
        gate.touch()  # the tasks end while nothing can be written
        refused = cli("sh", "--team", TEAM, "--", "true")
        assert refused.returncode == 1, refused.stdout
        assert "no space left" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr

        disk.free()

        def ended() -> list[dict[str, Any]] | None:
            out = cli("ps", "--team", TEAM, "--all", "--json")
            if out.returncode != 0:
                return None
            tasks = [t for t in json.loads(out.stdout) if t["id"] in ids]
            done = len(tasks) == 3 and all(t["status"] == "completed" for t in tasks)
            return tasks if done else None

        tasks = wait_until(ended, timeout=30, what="every task's final record")
        assert [t["result"]["code"] for t in tasks] == [0, 0, 0]
        events = cli("events", "--team", TEAM, "--json")
        assert events.returncode == 0, events.stderr
        texts = [json.loads(line).get("text") or "" for line in events.stdout.splitlines()]
        assert any("keeps what it cannot write in memory" in t for t in texts), texts
        assert any(t.startswith("there is space again") for t in texts), texts
    finally:
        down = cli("down", "--team", TEAM)
    assert down.returncode == 0, down.stderr
    assert leftovers(full_home) == []
