"""core/git.py against a real temporary repository: worktrees in and out, a directory outside
any repository, and a failing command that reports git's own message."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from shoal.core import git
from shoal.core.errors import ShoalError


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with one commit (a worktree needs a HEAD to check out)."""
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    (path / "README").write_text("hello\n")
    _git(path, "add", "README")
    _git(
        path,
        "-c",
        "user.name=shoal",
        "-c",
        "user.email=shoal@example.invalid",
        "commit",
        "-q",
        "-m",
        "first",
    )
    return path


def test_toplevel_is_the_root_from_any_subdirectory(repo: Path) -> None:
    sub = repo / "a" / "b"
    sub.mkdir(parents=True)
    assert git.toplevel(repo) == repo.resolve()
    assert git.toplevel(sub) == repo.resolve()


@pytest.fixture
def plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory in no repository (git is told not to look above tmp_path)."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    path = tmp_path / "plain"
    path.mkdir()
    return path


def test_a_directory_outside_any_repository_has_no_toplevel(plain: Path, tmp_path: Path) -> None:
    assert git.toplevel(plain) is None
    assert git.toplevel(tmp_path / "missing") is None


def test_worktree_add_and_remove(repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "trees" / "alice"
    assert git.worktree_add(repo, path) == path
    assert (path / "README").read_text() == "hello\n"
    assert git.toplevel(path) == path.resolve()
    assert str(path.resolve()) in _git(repo, "worktree", "list")
    # Detached: no branch was made for it.
    assert _git(repo, "branch", "--list").count("\n") == 1
    (path / "README").write_text("changed\n")  # --force removes a dirty one too
    git.worktree_remove(path)
    assert not path.exists()
    assert str(path.resolve()) not in _git(repo, "worktree", "list")


def test_a_failing_add_raises_with_gits_message(repo: Path, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    with pytest.raises(git.GitError) as info:
        git.worktree_add(repo, taken)
    err = info.value
    assert isinstance(err, ShoalError)
    assert err.returncode not in (None, 0)
    assert "already exists" in err.stderr
    assert err.stderr in str(err) and "worktree add" in str(err)


def test_removing_something_that_is_not_a_worktree_raises(plain: Path) -> None:
    with pytest.raises(git.GitError) as info:
        git.worktree_remove(plain)
    assert info.value.stderr


def test_git_never_prompts(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    seen: dict[str, str] = {}
    real = subprocess.run

    def spy(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        env = kwargs["env"]
        assert isinstance(env, dict)
        seen.update(env)
        assert kwargs["stdin"] == subprocess.DEVNULL and kwargs["timeout"]
        return real(argv, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setenv("GIT_DIR", "/nonexistent")  # would send git elsewhere than `-C`
    monkeypatch.setattr(subprocess, "run", spy)
    assert git.toplevel(repo) == repo.resolve()
    assert seen["GIT_TERMINAL_PROMPT"] == "0" and "GIT_DIR" not in seen


def test_a_missing_git_and_a_timeout_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, repo: Path
) -> None:
    with monkeypatch.context() as patch:
        patch.setenv("PATH", str(repo / "no-bin-here"))
        with pytest.raises(git.GitNotInstalledError, match="not installed"):
            git.toplevel(repo)
    with pytest.raises(git.GitTimeoutError, match="within"):
        git.worktree_add(repo, repo.parent / "slow", timeout=0.0)
