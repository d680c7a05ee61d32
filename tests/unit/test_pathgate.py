"""The path gate of the file tools, on both of its kernels: openat2 (this machine's) and the
per-component O_NOFOLLOW walk it falls back to where openat2 is missing (forced here)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.core import beneath
from shoal.core.pathgate import GateError, PathGate, expand_braces, pattern_parts
from shoal.workers.agent.tool_args import EditArgs, ReadArgs, WriteArgs
from shoal.workers.agent.tools import Workspace


@pytest.fixture(params=["openat2", "walk"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "walk":
        monkeypatch.setattr(beneath, "_openat2_ok", False)

        def never(*_args: object) -> int:
            raise AssertionError("openat2 was used although the walk was forced")

        monkeypatch.setattr(beneath, "_openat2", never)
    else:
        assert beneath.openat2_available(), "this machine's kernel has openat2 (Linux >= 5.6)"
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("inside\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "s.txt").write_text("outside\n")
    (root / "up").symlink_to(tmp_path / "out")
    (root / "a" / "in").symlink_to(root / "a" / "b")  # a link that stays inside
    return root


def _problem(call: object, problem: str) -> str:
    assert callable(call)
    with pytest.raises(GateError) as info:
        call()
    assert info.value.problem == problem, info.value
    return str(info.value)


def test_reads_beneath_the_root_and_no_link(kernel: str, tree: Path) -> None:
    gate = PathGate(tree)
    assert gate.read("a/b/f.txt").data == b"inside\n"
    assert gate.read(str(tree / "a" / "b" / "f.txt")).real == tree / "a" / "b" / "f.txt"
    assert gate.read("a/../a/b/f.txt").data == b"inside\n"  # (`..` that stays inside)
    assert "outside" in _problem(lambda: gate.read("up/s.txt"), "outside")
    assert "a/b/f.txt" in _problem(lambda: gate.read("a/in/f.txt"), "link")  # (names its target)
    _problem(lambda: gate.read("../out/s.txt"), "outside")
    _problem(lambda: gate.read("a/b/missing"), "missing")
    _problem(lambda: gate.read("a/b"), "directory")


def test_a_root_swapped_for_a_link_is_noticed(kernel: str, tree: Path, tmp_path: Path) -> None:
    gate = PathGate(tree)
    tree.rename(tmp_path / "moved")
    tree.symlink_to(tmp_path / "out")
    assert "changed" in _problem(lambda: gate.read("s.txt"), "outside")
    _problem(lambda: gate.write("new.txt", b"x"), "outside")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s.txt"]


def test_writes_make_parents_replace_and_keep_the_mode(kernel: str, tree: Path) -> None:
    gate = PathGate(tree, file_mode=0o600, dir_mode=0o700)
    done = gate.write("x/y/z.txt", b"new")
    assert not done.existed and (tree / "x" / "y" / "z.txt").read_bytes() == b"new"
    assert stat.S_IMODE((tree / "x").stat().st_mode) == 0o700
    assert stat.S_IMODE(done.st.st_mode) == 0o600
    target = tree / "a" / "b" / "f.txt"
    target.chmod(0o751)
    assert gate.write("a/b/f.txt", b"again").existed
    assert stat.S_IMODE(target.stat().st_mode) == 0o751 and target.read_bytes() == b"again"
    assert not [p for p in (tree / "a" / "b").iterdir() if p.name.endswith(".tmp")]
    _problem(lambda: gate.write("up/new.txt", b"x"), "outside")
    _problem(lambda: gate.write("a/in/new.txt", b"x"), "link")
    _problem(lambda: gate.write("a/in", b"x"), "link")  # (a link in the last component)


def test_a_failed_check_writes_nothing(kernel: str, tree: Path) -> None:
    def refuse(_real: Path, _st: os.stat_result | None) -> None:
        raise GateError("no", "other")

    with pytest.raises(GateError):
        PathGate(tree).write("a/b/f.txt", b"x", check=refuse)
    assert (tree / "a" / "b" / "f.txt").read_text() == "inside\n"
    assert sorted(p.name for p in (tree / "a" / "b").iterdir()) == ["f.txt"]


def test_protected_paths_and_roots_inside_them(kernel: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    worktree = home / "teams" / "t" / "worktrees" / "m"
    worktree.mkdir(parents=True)
    gate = PathGate(worktree, protected=(home, worktree / ".shoal"))
    gate.write("ok.txt", b"x")  # (a worktree under SHOAL_HOME is writable)
    for name in (".shoal/agents/x.md", ".git", "deep/.git/config", "sub/.GIT/hooks/x"):
        _problem(lambda n=name: gate.write(n, b"x"), "protected")
    assert sorted(p.name for p in worktree.iterdir()) == ["ok.txt"]
    loose = PathGate(tmp_path, confined=False, protected=(home,))
    _problem(lambda: loose.write(str(home / "config.toml"), b"x"), "protected")


def test_walks_list_only_what_read_would_open(kernel: str, tree: Path) -> None:
    gate = PathGate(tree)
    (tree / "a" / "b" / "g.py").write_text("x")
    (tree / "link.py").symlink_to(tree / "a" / "b" / "g.py")
    found = sorted(str(e.shown.relative_to(tree)) for e in gate.files(None, "**/*"))
    assert found == ["a/b/f.txt", "a/b/g.py"]
    assert [e.name for e in gate.files("a", "**/*.{py,rs}")] == ["g.py"]
    assert [e.name for e in gate.files(None, "*.py", anywhere=True)] == ["g.py"]
    _problem(lambda: list(gate.files("up", "*")), "outside")
    _problem(lambda: list(gate.files(None, "../*")), "pattern")
    _problem(lambda: list(gate.files(None, "/etc/*")), "pattern")
    _problem(lambda: list(gate.files("a/b/f.txt", "*")), "directory")


def test_a_fifo_or_socket_is_refused_without_blocking(kernel: str, tree: Path) -> None:
    os.mkfifo(tree / "pipe")
    assert "FIFO" in _problem(lambda: PathGate(tree).read("pipe"), "special")
    assert "FIFO" in _problem(lambda: PathGate(tree, confined=False).read("pipe"), "special")


def test_patterns() -> None:
    assert pattern_parts("src//./**/*.py") == ("src", "**", "*.py")
    assert expand_braces("a.{x,y}/{1,2}") == ["a.x/1", "a.x/2", "a.y/1", "a.y/2"]
    for bad in ("", "/abs", "~/x", "a/../b"):
        with pytest.raises(GateError):
            pattern_parts(bad)
    with pytest.raises(GateError, match="more than"):
        expand_braces("{a,b}" * 7)


def test_workspace_modes_and_absolute_paths(kernel: str, tree: Path) -> None:
    ws = Workspace(tree, mode="plan")
    assert "inside" in ws.read(ReadArgs(file_path=str(tree / "a" / "b" / "f.txt")))
    bypass = Workspace(tree, mode="bypassPermissions")
    assert "outside" in bypass.read(ReadArgs(file_path="up/s.txt"))  # (the user's choice)
    bypass.read(ReadArgs(file_path="a/b/f.txt"))
    bypass.edit(EditArgs(file_path="a/b/f.txt", old_string="inside", new_string="edited"))
    assert (tree / "a" / "b" / "f.txt").read_text() == "edited\n"
    bypass.write(WriteArgs(file_path=str(tree.parent / "out" / "n.txt"), content="n"))
    assert (tree.parent / "out" / "n.txt").read_text() == "n"
