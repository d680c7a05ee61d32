"""Shared fixtures: a SHOAL_HOME per test, a CLI runner in a real process, child processes, and
the `tmux` marker (tests that need tmux: skipped without it, failed without it in CI).

Waiting for a condition: `tests.polling.wait_until`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.teams.store import Teams

# A step of a leader's loop that raises fails the test (in every leader a test starts, in this
# process or in a child): without it, the error would only be a note in the event stream.
os.environ["SHOAL_STRICT_STEPS"] = "1"

# A suite started in the background of a script (`cmd &` without job control) inherits SIGINT
# ignored, and an ignored signal stays ignored across exec: every child would then ignore the
# Ctrl-C that the tests of `--follow`, `--listen` and `--watch` send. The tests' children get
# the default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The machine is shared and noisy: timing is never part of a property.
settings.register_profile("shoal", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shoal")

TMUX_REQUIRED_IN_CI = "tmux is required in CI: install it (apt-get install tmux)"


def in_ci() -> bool:
    """The tests run in CI: the environment variable CI is "true" or "1"."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require_tmux() -> None:
    """Skip the calling test when tmux is not installed; in CI fail it instead, since a skipped
    tmux suite there would pass without testing anything."""
    if shutil.which("tmux") is not None:
        return
    if in_ci():
        pytest.fail(TMUX_REQUIRED_IN_CI, pytrace=False)
    pytest.skip("needs tmux, which is not installed")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "tmux: needs tmux (skipped when it is missing, failed when it is missing in CI)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check for tmux before a `tmux`-marked test's fixtures start any tmux server."""
    if item.get_closest_marker("tmux") is not None:
        require_tmux()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh SHOAL_HOME for this test (exported, so child processes use it too), beside
    the test's tmp_path rather than in it: agents work in tmp_path, and a home inside an
    agent's tree is carved out of what its sandboxed commands may write (no new top-level
    files there), as for a user who runs shoal in ~ with ~/.shoal."""
    path = tmp_path.with_name(tmp_path.name + "-home")
    path.mkdir(mode=0o700)
    monkeypatch.setenv("SHOAL_HOME", str(path))
    monkeypatch.delenv("SHOAL_TEAM", raising=False)
    monkeypatch.delenv("SHOAL_WATCHER", raising=False)
    return path


@pytest.fixture
def layout(home: Path) -> Layout:
    return Layout(home)


@pytest.fixture
def teams(layout: Layout) -> Teams:
    return Teams(layout)


class Cli:
    """Runs `python -m shoal ...` as a real process with the test's SHOAL_HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "SHOAL_HOME": str(self.home), **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "shoal", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            env=full_env,
        )


@pytest.fixture
def cli(home: Path) -> Cli:
    return Cli(home)


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start long-sleeping child processes (stand-ins for members); all killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def pid_gone(pid: int) -> bool:
    """True once process `pid` no longer runs."""
    return not is_alive(pid, None)


def group_gone(pgid: int) -> bool:
    """True once no live process is left in process group `pgid` (zombies awaiting init's
    reaping do not count)."""
    import psutil

    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return True


@pytest.fixture
def tmux_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A private tmux server for the leader's panes (killed at the end), as from a plain
    terminal."""
    sock = f"shoal-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("SHOAL_TMUX_SOCKET", sock)
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("TMUX_PANE", raising=False)
    yield sock
    subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, check=False)
    tmpdir = os.environ.get("TMUX_TMPDIR") or "/tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(tmpdir, f"tmux-{os.getuid()}", sock))


@pytest.fixture
def stopper() -> Iterator[list[subprocess.Popen[str]]]:
    """Runs started in the background are interrupted (and waited for) at teardown."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def ray_head() -> Iterator[Any]:
    """One real Ray head on loopback for the session's `ray_head`-marked tests (one xdist
    group: `--dist loadgroup` puts them on one worker, so one head serves them)."""
    from tests.ray_cluster import RayHead

    head = RayHead()
    try:
        yield head
    finally:
        head.stop()
