"""The documentation: the site builds with `--strict` (a broken link or anchor fails), and
every shell block of the README and the guides runs, or says why it does not.

A page's blocks run in order in one working directory, a small project (a Makefile with
`all` and `test`, one passing pytest file), with a SHOAL_HOME and a tmux server of the test's
own. A TOML block whose first line is a comment naming a file (`# ci.toml`) is written there
first, so the shell blocks after it can use it. A block preceded by `<!-- not run: WHY -->`
is not run; every other `sh` block must exit 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted((DOCS / "guides").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>[^>]*\S)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")
FILE_COMMENT = re.compile(r"^#\s*(?P<name>[\w.-]+\.(toml|txt|json))\s*$")
MAKEFILE = "all:\n\t@echo built\n\ntest:\n\t@echo tested\n"
TEST_FILE = "def test_ok() -> None:\n    assert 1 + 1 == 2\n"


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, its text, its line and why it is not run."""

    lang: str
    text: str
    line: int
    not_run: str | None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        marker = NOT_RUN.match(lines[start - 1]) if start > 0 else None
        why = marker.group("why") if marker else None
        found.append(Block(opening.group("lang"), "\n".join(body) + "\n", start + 1, why))
        i += 1
    return found


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """mkdocs with --strict: a broken link, a missing page or a bad anchor fails the build."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("shoal sh", "shoal run", "shoal spawn", "shoal task add"):
        assert command in cli_page, f"the generated CLI reference lacks {command!r}"


def test_every_shell_block_is_run_or_says_why() -> None:
    """A guide's `sh` block is either runnable or carries its reason; a reason is words."""
    for page in PAGES:
        for block in blocks(page):
            if block.lang == "sh" and block.not_run is not None:
                assert len(block.not_run.split()) >= 2, f"{page}:{block.line}: say why"


def _shoal_on_path() -> str:
    """A PATH on which `shoal` is this interpreter's shoal."""
    bindir = Path(sys.executable).parent
    assert (bindir / "shoal").exists() or shutil.which("shoal"), "shoal is not installed"
    return f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"


def _stop_everything(home: Path, env: dict[str, str]) -> None:
    """Stop every leader a page's blocks left running (a block may end with one up)."""
    teams = home / "teams"
    for team in sorted(p.name for p in teams.iterdir()) if teams.is_dir() else []:
        subprocess.run(
            [sys.executable, "-m", "shoal", "down", "--team", team],
            env=env,
            capture_output=True,
            timeout=60,
        )


@pytest.mark.tmux
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_shell_blocks_run(
    page: Path, tmp_path: Path, home: Path, tmux_socket: str
) -> None:
    runnable = [b for b in blocks(page) if b.lang == "sh" and b.not_run is None]
    if not runnable:
        assert all(b.not_run for b in blocks(page) if b.lang == "sh")
        return
    work = tmp_path / "project"
    (work / "tests").mkdir(parents=True)
    (work / "Makefile").write_text(MAKEFILE)
    (work / "tests" / "test_ok.py").write_text(TEST_FILE)
    env = {
        **os.environ,
        "PATH": _shoal_on_path(),
        "SHOAL_HOME": str(home),
        "SHOAL_TMUX_SOCKET": tmux_socket,
        "NO_COLOR": "1",
    }
    for name in ("TMUX", "TMUX_PANE", "SHOAL_TEAM", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS"):
        env.pop(name, None)
    try:
        for block in blocks(page):
            first = block.text.splitlines()[0] if block.text.strip() else ""
            named = FILE_COMMENT.match(first)
            if block.lang in ("toml", "json", "text") and named and block.not_run is None:
                (work / named.group("name")).write_text(block.text)
                continue
            if block.lang != "sh" or block.not_run is not None:
                continue
            out = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.text],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            where = f"{page.relative_to(ROOT)}:{block.line}"
            said = out.stdout + out.stderr
            assert out.returncode == 0, f"{where} exited {out.returncode}:\n{said}"
    finally:
        _stop_everything(home, env)
