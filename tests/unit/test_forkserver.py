"""The fork server (core/forkserver.py): real forks of a real server process.

Its children run `python -m tests.support.forkee`, importable because the server starts in
this process's working directory (the repository root), as `python -m` would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from shoal.core.forkserver import ForkClient, ForkServerError, forkable
from tests.polling import wait_until

MODULE = "tests.support.forkee"


@pytest.fixture
def client() -> Iterator[ForkClient]:
    fc = ForkClient([MODULE])
    yield fc
    fc.close()


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", MODULE, *args]


def _ended(client: ForkClient, pid: int) -> int:
    def ended() -> tuple[int] | None:
        code = client.exit_code(pid)
        return None if code is None else (code,)  # (0 is an answer too)

    return wait_until(ended, timeout=30, what=f"pid {pid} to end")[0]


def _record(log: Path) -> dict[str, object]:
    def first() -> str | None:
        lines = log.read_text().splitlines() if log.exists() else []
        return lines[0] if lines else None

    record: dict[str, object] = json.loads(wait_until(first, timeout=30))
    return record


def test_a_child_runs_the_module_with_its_cwd_env_log_and_exit_code(
    client: ForkClient, tmp_path: Path
) -> None:
    log = tmp_path / "child.log"
    work = tmp_path / "work"
    work.mkdir()
    pid = client.spawn(_argv("3", "thread"), cwd=str(work), env={"FORKEE_MARK": "m1"}, log=str(log))
    assert _ended(client, pid) == 3
    record = _record(log)
    assert record["argv"] == ["3", "thread"]
    assert record["cwd"] == str(work)
    assert record["env"] == "m1"
    assert record["pid"] == pid and record["sid"] == pid  # (a session of its own)
    assert record["stdin"] == ""  # (/dev/null)
    assert log.read_text().splitlines()[1] == "thread done"  # (exit waited for the thread)
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_exit_codes_signals_and_many_children(client: ForkClient, tmp_path: Path) -> None:
    pids = [
        client.spawn(_argv(str(k)), cwd=str(tmp_path), env={}, log=str(tmp_path / f"{k}.log"))
        for k in range(20)
    ]
    assert [_ended(client, pid) for pid in pids] == list(range(20))
    sleeper = client.spawn(_argv("0", "sleep"), cwd=str(tmp_path), env={}, log=None)
    wait_until(lambda: psutil.Process(sleeper).status() != psutil.STATUS_ZOMBIE, timeout=10)
    os.kill(sleeper, signal.SIGTERM)
    assert _ended(client, sleeper) == -signal.SIGTERM


def test_the_command_line_shown_is_the_childs(client: ForkClient, tmp_path: Path) -> None:
    pid = client.spawn(_argv("0", "sleep"), cwd=str(tmp_path), env={}, log=None)
    try:

        def line() -> str | None:
            text = " ".join(psutil.Process(pid).cmdline())
            return text if "forkee" in text else None

        shown = wait_until(line, timeout=10)
        assert MODULE in shown and "sleep" in shown
    finally:
        os.kill(pid, signal.SIGKILL)
        _ended(client, pid)


def test_bad_requests_are_errors_that_name_the_cause(client: ForkClient, tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"working directory .*nowhere.* does not exist"):
        client.spawn(_argv("0"), cwd=str(tmp_path / "nowhere"), env={}, log=None)
    (tmp_path / "target").write_text("")
    (tmp_path / "link.log").symlink_to(tmp_path / "target")
    with pytest.raises(OSError, match=r"cannot open log .*link\.log"):
        client.spawn(_argv("0"), cwd=str(tmp_path), env={}, log=str(tmp_path / "link.log"))
    with pytest.raises(OSError, match=r"not a .* -m MODULE. command"):
        client.spawn(["/bin/true"], cwd=str(tmp_path), env={}, log=None)
    # (the server goes on serving after each refusal)
    pid = client.spawn(_argv("0"), cwd=str(tmp_path), env={}, log=None)
    assert _ended(client, pid) == 0


def test_children_outlive_the_server_and_a_dead_server_is_said(tmp_path: Path) -> None:
    client = ForkClient([MODULE])
    pid = client.spawn(_argv("0", "sleep"), cwd=str(tmp_path), env={}, log=None)
    server = psutil.Process(pid).parent()
    assert server is not None and "fork server" in " ".join(server.cmdline())
    server.kill()
    server.wait(10)
    try:
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # (it goes on)
        with pytest.raises(ForkServerError, match="fork server"):
            client.spawn(_argv("0"), cwd=str(tmp_path), env={}, log=None)
        assert client.broken is not None
    finally:
        os.kill(pid, signal.SIGKILL)
        client.close()


def test_forkable_lines() -> None:
    assert forkable([sys.executable, "-m", "shoal", "worker"]) == "shoal"
    assert forkable(["/usr/bin/python3-other", "-m", "shoal"]) is None
    assert forkable([sys.executable, "script.py"]) is None
