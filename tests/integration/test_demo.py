"""`shoal demo`: the README's first command, end to end with real teammates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Cli


@pytest.mark.parametrize("backend", ["process", pytest.param("tmux", marks=pytest.mark.tmux)])
def test_demo_does_real_work_and_leaves_nothing(
    cli: Cli, home: Path, tmp_path: Path, backend: str
) -> None:
    work = tmp_path / "project"
    (work / "src").mkdir(parents=True)
    (work / "src" / "a.py").write_text("x = 1  # TODO: more\n" * 3)
    (work / "src" / "b.py").write_text("y = 2\n")
    (work / "notes.md").write_text("# FIXME later\n")
    socket = f"shoal-demo-{tmp_path.name}"
    out = subprocess.run(
        [sys.executable, "-m", "shoal", "demo", "--backend", backend],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SHOAL_HOME": str(home), "SHOAL_TMUX_SOCKET": socket},
    )
    assert out.returncode == 0, out.stderr
    for who in ("ana", "ben", "cai"):
        assert f"{who} is ready" in out.stdout
    assert f"with backend {backend}" in out.stdout
    for subject in (
        "List the files",
        "Count files per extension",
        "Find the largest files",
        "Count TODO and FIXME markers",
        "Write the report",
    ):
        assert subject in out.stdout
    assert "2 py" in out.stdout  # the report: two .py files found
    assert "a.py:3" in out.stdout  # three marker lines in a.py
    assert "no teammate process or pane is left" in out.stdout
    assert json.loads(cli("team", "list", "--json").stdout) == []
    workers = subprocess.run(["pgrep", "-f", f"--home {home} worker"], capture_output=True)
    assert workers.stdout == b""
    if backend == "tmux":
        gone = subprocess.run(["tmux", "-L", socket, "ls"], capture_output=True)
        assert gone.returncode != 0
    # The demo only read the project.
    assert sorted(p.name for p in work.rglob("*")) == ["a.py", "b.py", "notes.md", "src"]


@pytest.mark.parametrize(
    "backend", ["process", "in-process", pytest.param("tmux", marks=pytest.mark.tmux)]
)
def test_the_coordinator_demo_goes_through_the_four_phases(
    cli: Cli, home: Path, tmp_path: Path, backend: str
) -> None:
    socket = f"shoal-cdemo-{tmp_path.name}"[-60:]
    out = subprocess.run(
        [sys.executable, "-m", "shoal", "demo", "--coordinator", "--backend", backend],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SHOAL_HOME": str(home), "SHOAL_TMUX_SOCKET": socket},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for phase in ("Phase 1, research", "Phase 2, synthesis", "Phase 3, implementation",
                  "Phase 4, verification"):  # fmt: skip
        assert phase in text, text
    rows = [line for line in text.splitlines() if " tokens " in line]
    assert len(rows) == 6, text  # two researchers, three implementers, one verifier
    assert sum("read-only" in r for r in rows) == 3
    assert sum("lease #" in r for r in rows) == 3 and "docs/**" in text
    assert "waits for the lease of" in text  # the two writers of calc/ops.py took turns
    assert all("completed" in r for r in rows), rows
    assert "ran the tests (verified: OK)" in text
    assert "no worker process or pane is left" in text
    assert json.loads(cli("team", "list", "--json").stdout) == []
    runners = subprocess.run(["pgrep", "-af", "shoal.workers.agent.entry"],
                             capture_output=True)  # fmt: skip
    assert str(home) not in runners.stdout.decode()  # (its runners' job files are under it)
    assert [p for p in tmp_path.iterdir() if p != home] == []  # (its project was elsewhere)
    if backend == "tmux":
        assert "watch them: shoal attach --team" in text
        gone = subprocess.run(["tmux", "-L", socket, "ls"], capture_output=True)
        assert gone.returncode != 0  # (no pane, no server left)
