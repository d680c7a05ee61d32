"""start_detached: a real background leader, ready when it returns; refused while one runs;
a leader that dies or is slow to start is a LeaderStartError naming its log."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.core.errors import ConflictError, ShoalError
from shoal.core.paths import Layout
from shoal.orchestrator.detach import LeaderStartError, leader_log_path, start_detached
from shoal.orchestrator.down import bring_down
from shoal.orchestrator.liveness import leader_alive, leader_ready
from shoal.teams.session import current_session


def test_start_detached_returns_a_ready_leader(layout: Layout) -> None:
    started = start_detached(layout, "d", quiet=True)
    try:
        assert leader_ready(layout, "d") == started.pid
        session = current_session(layout, "d")
        assert session is not None and started.session_id == session.id
        assert started.log_path == leader_log_path(layout, "d") and started.log_path.is_file()
        assert started.notes == ()
        with pytest.raises(ConflictError, match=f"already runs.*pid {started.pid}"):
            start_detached(layout, "d")
    finally:
        assert bring_down(layout, "d").leader_pid == started.pid
    assert leader_alive(layout, "d") is None


def test_a_leader_not_ready_in_time_is_stopped(layout: Layout) -> None:
    with pytest.raises(LeaderStartError) as info:
        start_detached(layout, "slow", timeout=0.0)
    err = info.value
    assert str(err.log_path) in str(err) and "did not become ready within 0s" in str(err)
    assert leader_alive(layout, "slow") is None


def test_a_leader_that_dies_at_start_reports_its_log(layout: Layout, home: Path) -> None:
    (home / "sessions").write_text("not a directory")  # it cannot start a session
    with pytest.raises(LeaderStartError) as info:
        start_detached(layout, "dies")
    err = info.value
    assert isinstance(err, ShoalError) and err.returncode not in (None, 0)
    assert str(err).startswith(f"the leader exited at start (code {err.returncode}): ")
    assert "sessions" in str(err)  # the tail of its log says why
    assert err.log_path.read_text().strip()
