"""Every git command shoal runs, as small typed functions: a timeout, never a prompt, and git's
own message in the error when one fails."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from shoal.core.errors import ShoalError

# Seconds a quick query may take, and a checkout of a whole tree (a big repository's worktree).
QUERY_TIMEOUT = 30.0
CHECKOUT_TIMEOUT = 300.0

# Variables that would point git at another repository than the one `-C` names (they are set
# when shoal runs from a git hook, for one).
_LOCATING_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")


class GitError(ShoalError):
    """A git command failed; `stderr` holds what git said (or why it could not run)."""

    def __init__(self, argv: Sequence[str], stderr: str, returncode: int | None = None) -> None:
        self.argv = list(argv)
        self.stderr = stderr
        self.returncode = returncode
        super().__init__(f"`{' '.join(self.argv)}` failed: {stderr}")


class GitNotInstalledError(GitError):
    """There is no `git` on PATH."""


class GitTimeoutError(GitError):
    """git did not finish within its timeout (it was killed)."""


# Settings that make git run nothing a repository's own config names: an fsmonitor hook, the
# hooks (`post-index-change` runs on a plain `git status` that refreshes the index).
SAFE_CONFIG: Final = ("-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}")


def safe_env() -> dict[str, str]:
    """The environment of every git that shoal runs: no system config (a machine's, not the
    user's), no variables that point at another repository, no prompt, no optional locks."""
    env = {k: v for k, v in os.environ.items() if k not in _LOCATING_VARS}
    env["GIT_TERMINAL_PROMPT"] = "0"  # a credential question would hang a headless leader
    env["LC_ALL"] = "C"  # git's messages untranslated, so `toplevel` can recognise one
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_OPTIONAL_LOCKS"] = "0"  # (a status does not rewrite the index)
    return env


_env = safe_env


def no_filters(cwd: str | os.PathLike[str], *, timeout: float = QUERY_TIMEOUT) -> dict[str, str]:
    """Environment variables that empty every filter driver the config of `cwd`'s repository
    defines (a `.gitattributes` `filter=x` runs `filter.x.clean` on a `git status`, and
    `filter.x.smudge` on a checkout): for the commands that only look or check out, so that
    what a tree's config says is never run. Given as GIT_CONFIG_KEY_n/VALUE_n, not `-c`, so a
    driver whose name holds a `=` cannot split its key from its value."""
    try:
        proc = subprocess.run(
            ["git", "-C", os.fspath(cwd), *SAFE_CONFIG, "config", "-z", "--get-regexp",
             r"^filter\."],
            stdin=subprocess.DEVNULL, capture_output=True, env=safe_env(), timeout=timeout,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names: set[str] = set()
    for entry in os.fsdecode(proc.stdout).split("\0"):
        key = entry.split("\n", 1)[0]
        if key.startswith("filter.") and key.count(".") >= 2:
            names.add(key[len("filter.") : key.rindex(".")])
    env: dict[str, str] = {}
    count = 0
    for name in sorted(names):
        for part, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")):
            env[f"GIT_CONFIG_KEY_{count}"] = f"filter.{name}.{part}"
            env[f"GIT_CONFIG_VALUE_{count}"] = value
            count += 1
    if count:
        env["GIT_CONFIG_COUNT"] = str(count)
    return env


def _run(
    cwd: str | os.PathLike[str],
    args: Sequence[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
) -> str:
    """Run `git -C cwd *args` (with `env` added to its environment); its stdout, or GitError
    with its stderr."""
    argv = ["git", "-C", os.fspath(cwd), *SAFE_CONFIG, *args]
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env={**_env(), **(env or {})},
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        raise GitNotInstalledError(argv, "git is not installed (or not on PATH)") from None
    except subprocess.TimeoutExpired:
        raise GitTimeoutError(argv, f"git did not finish within {timeout:g}s") from None
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace").strip()
        raise GitError(argv, stderr or f"exit code {proc.returncode}", proc.returncode)
    return os.fsdecode(proc.stdout)


def toplevel(cwd: str | os.PathLike[str], *, timeout: float = QUERY_TIMEOUT) -> Path | None:
    """The root of the work tree that `cwd` is in, or None when it is in none (or is not a
    directory). Any other failure (git missing, an unsafe repository) raises GitError."""
    if not Path(cwd).is_dir():
        return None
    try:
        out = _run(cwd, ["rev-parse", "--show-toplevel"], timeout=timeout)
    except GitError as exc:
        if "not a git repository" in exc.stderr:
            return None
        raise
    return Path(out.rstrip("\n"))


def worktree_add(
    repo: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    detach: bool = True,
    timeout: float = CHECKOUT_TIMEOUT,
) -> Path:
    """Check `repo`'s HEAD out into a new worktree at `path` (detached: no branch is created or
    taken, so any number of worktrees can share one commit). Returns `path`."""
    args = ["worktree", "add", *(["--detach"] if detach else []), os.fspath(path)]
    # (a checkout runs smudge filters: the repository's own config names none that runs)
    _run(repo, args, timeout=timeout, env=no_filters(repo))
    return Path(path)


def worktree_remove(
    path: str | os.PathLike[str], *, force: bool = True, timeout: float = QUERY_TIMEOUT
) -> None:
    """Remove the worktree at `path` from its repository and from disk (with `force`, even with
    changes in it: a member's worktree is the member's, and goes with it)."""
    args = ["worktree", "remove", *(["--force"] if force else []), os.fspath(path)]
    _run(path, args, timeout=timeout)


def has_commit(cwd: str | os.PathLike[str], *, timeout: float = QUERY_TIMEOUT) -> bool:
    """Whether the repository `cwd` is in has at least one commit (HEAD resolves)."""
    try:
        _run(cwd, ["rev-parse", "--verify", "--quiet", "HEAD"], timeout=timeout)
    except GitError as exc:
        if exc.returncode is not None:
            return False
        raise
    return True


def listed_files(root: str | os.PathLike[str], *, timeout: float = QUERY_TIMEOUT) -> list[str]:
    """The work tree's files as git sees them: tracked ones and untracked ones that no
    .gitignore excludes (paths relative to `root`, sorted)."""
    out = _run(
        root,
        ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--deduplicate"],
        timeout=timeout,
    )
    return sorted({p for p in out.split("\0") if p})
