"""Fixtures of the reliability tests: a team with an inbox, the processes a test starts, and a
small tmpfs a test can fill to the last byte.

`home` (a private SHOAL_HOME, exported to children) comes from tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core.paths import Layout
from shoal.teams.store import Teams
from tests.reliability.crashkit import Processes


@pytest.fixture
def bob_team(home: Path) -> Teams:
    """Team `t` with member `bob` (joined with this process's pid)."""
    teams = Teams(Layout(home))
    teams.create("t")
    teams.join("t", "bob", pid=os.getpid())
    return teams


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Starts child processes; every one still running is killed when the test ends."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.close()


DISK_BYTES = 8 * 1024 * 1024


class Disk:
    """A tmpfs mounted at `root`, which `fill` uses up and `free` gives back."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / "filler"

    def fill(self) -> None:
        """Write until the filesystem says ENOSPC (then nothing more fits, not even a file)."""
        chunk = b"\0" * 65536
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (65536, 4096, 1):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, chunk[:size])
        finally:
            os.close(fd)
        # Inodes too: a tmpfs may still create empty files when its blocks are gone.
        for i in range(100_000):
            try:
                (self.root / f"inode{i}").touch()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)
        for extra in self.root.glob("inode*"):
            extra.unlink()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    root = tmp_path / "disk"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},nr_inodes=4096", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield Disk(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
