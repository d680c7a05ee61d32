"""Tests that need tmux skip without it, except in CI, where a missing tmux fails them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TMUX_REQUIRED_IN_CI, require_tmux


@pytest.fixture
def no_tmux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH on which no tmux is found."""
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_missing_tmux_fails_in_ci(no_tmux: None, monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as failed:
        require_tmux()
    assert str(failed.value) == TMUX_REQUIRED_IN_CI
    assert TMUX_REQUIRED_IN_CI == "tmux is required in CI: install it (apt-get install tmux)"


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_missing_tmux_skips_outside_ci(
    no_tmux: None, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="needs tmux"):
        require_tmux()


def test_installed_tmux_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "tmux"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    require_tmux()
