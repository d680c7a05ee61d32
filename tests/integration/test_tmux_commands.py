"""The tmux commands outside pane management, against real tmux servers with their own sockets:
the status line (`set_global_option`, `install_tmux_status`) and `exec_tmux` (`shoal attach`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.errors import ShoalError
from shoal.teams.backends.base import BackendUnavailable
from shoal.teams.backends.tmux import TmuxRefused, TmuxTimeout, set_global_option
from shoal.ui.tmux import install_tmux_status, tmux_status_hint

pytestmark = pytest.mark.tmux


def tmux(sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run tmux against a test server (`-S path`), directly: what a user would see."""
    return subprocess.run(
        ["tmux", "-S", sock, *args], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[str]:
    """A tmux server of our own (its own socket), killed at teardown."""
    path = str(tmp_path / "tmux.sock")
    started = tmux(path, "-f", "/dev/null", "new-session", "-d", "-s", "t")
    assert started.returncode == 0, started.stderr
    try:
        yield path
    finally:
        tmux(path, "kill-server")


@pytest.fixture
def stopped(sock: str) -> Iterator[str]:
    """The server of `sock`, stopped (SIGSTOP) so that it answers nothing; resumed afterwards."""
    pid = int(tmux(sock, "display-message", "-p", "#{pid}").stdout)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield sock
    finally:
        os.kill(pid, signal.SIGCONT)


def test_set_global_option_sets_it_on_that_server_only(sock: str) -> None:
    set_global_option(sock, "status-right", "#(echo shoal)", timeout=10)
    assert tmux(sock, "show-options", "-gv", "status-right").stdout.strip() == "#(echo shoal)"


def test_set_global_option_errors(
    sock: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TmuxRefused) as info:
        set_global_option(sock, "no-such-option", "1", timeout=10)
    assert "no-such-option" in info.value.why and "tmux says" in str(info.value)
    with pytest.raises(TmuxRefused, match=r"error connecting to|no server running"):
        set_global_option(str(tmp_path / "none.sock"), "status-right", "x", timeout=10)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendUnavailable, match="tmux is not installed"):
        set_global_option(sock, "status-right", "x", timeout=10)


def test_set_global_option_gives_up_on_a_hung_server(stopped: str) -> None:
    with pytest.raises(TmuxTimeout, match=r"within 0\.3s"):
        set_global_option(stopped, "status-right", "x", timeout=0.3)


def test_install_tmux_status_messages(
    stopped: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The messages `shoal up` prints as a warning: tmux's own words, or what went wrong."""
    hung = tmux_status_hint("/h", "t", socket=stopped)
    assert hung is not None
    with pytest.raises(ShoalError) as info:
        install_tmux_status(hung, timeout=0.3)
    assert str(info.value) == f"tmux did not answer within 0.3s on {stopped}"
    missing = tmux_status_hint("/h", "t", socket=str(tmp_path / "none.sock"))
    assert missing is not None
    with pytest.raises(ShoalError) as info:
        install_tmux_status(missing)
    prefix = f"could not set tmux's status line ({missing.command}): "
    assert str(info.value).startswith(prefix)
    assert str(tmp_path / "none.sock") in str(info.value)[len(prefix) :]
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ShoalError) as info:
        install_tmux_status(missing)
    assert str(info.value) == "tmux is not installed (or not on PATH); cannot set its status line"


def test_exec_tmux_replaces_the_process_after_flushing(sock: str) -> None:
    """What was printed before comes out first; then tmux runs in the very same process."""
    code = (
        "import os, sys\n"
        "from shoal.teams.backends.tmux import exec_tmux\n"
        "print(os.getpid(), end=' ')\n"
        "sys.stderr.write('err ')\n"
        f"exec_tmux(['tmux', '-S', {sock!r}, 'display-message', '-p', '#{{session_name}}'])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out == f"{proc.pid} t\n" and err == "err "
