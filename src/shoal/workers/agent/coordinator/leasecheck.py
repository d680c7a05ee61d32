"""What a worker's Bash command changed outside its lease.

Before and after each command: in a git repository, the files `git status --porcelain` lists
(with their mtime and size, so a file that was already dirty and changed again counts too);
elsewhere, an mtime scan of the working directory bounded to MAX_SCANNED files. The paths that
changed and that the write set does not cover are the violation.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from shoal.core.writeset import covers

MAX_SCANNED: Final = 10_000
SKIPPED_DIRS: Final = frozenset({".git", "node_modules", "__pycache__", ".venv", ".mypy_cache"})
GIT_TIMEOUT_S: Final = 30.0

# path (relative, posix) -> (mtime_ns, size), or None for a path that is gone
Snapshot = dict[str, tuple[int, int] | None]


def _stat(root: Path, rel: str) -> tuple[int, int] | None:
    try:
        st = os.stat(root / rel)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.resolve().relative_to(root).as_posix()
    except (ValueError, RuntimeError, OSError):  # (outside; a symlink loop)
        return None


def _git(root: Path, args: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
    """Run git on the tree a worker may have written to, so that it runs nothing the tree's
    config names (no fsmonitor, hooks or filter drivers: see core/git.py) and, where the
    kernel has Landlock, confined too: nothing writable, no network."""
    from shoal.core import sandbox
    from shoal.core.git import SAFE_CONFIG, no_filters, safe_env
    from shoal.core.secretenv import is_secret

    argv = ["git", *SAFE_CONFIG, *args]
    # (no secret in its environment either: whatever it might still run has none to leak)
    env = {k: v for k, v in safe_env().items() if not is_secret(k)}
    env.update(no_filters(root, timeout=GIT_TIMEOUT_S))
    if sandbox.abi() < 1:
        return subprocess.run(argv, cwd=root, stdin=subprocess.DEVNULL, capture_output=True,
                              env=env, timeout=GIT_TIMEOUT_S, check=False)  # fmt: skip
    with sandbox.popen_confined(
        sandbox.Policy(network=False), argv, cwd=root, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=GIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _git_dirty(root: Path) -> list[str] | None:
    """The paths `git status --porcelain` lists (relative to `root`), or None outside git."""
    try:
        # (submodules not entered: their own config, filters included, is never read)
        done = _git(root, ["status", "--porcelain", "-z", "--untracked-files=all",
                           "--ignore-submodules=all", "."])  # fmt: skip
        if done.returncode != 0:
            return None
        prefix = os.fsdecode(_git(root, ["rev-parse", "--show-prefix"]).stdout).strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    paths: list[str] = []
    entries = done.stdout.decode("utf-8", "replace").split("\0")
    skip = False
    for entry in entries:
        if skip:  # (the old name of a rename)
            skip = False
            continue
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:]
        if "R" in status or "C" in status:
            skip = True
        if prefix and path.startswith(prefix):
            path = path[len(prefix) :]
        paths.append(path)
    return paths


def _scan(root: Path, skip: Sequence[Path]) -> Snapshot:
    found: Snapshot = {}
    skipped = {p.resolve() for p in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [
            d for d in dirnames if d not in SKIPPED_DIRS and (here / d).resolve() not in skipped
        ]
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            found[rel] = _stat(root, rel)
            if len(found) >= MAX_SCANNED:
                return found
    return found


def snapshot(cwd: Path, skip: Sequence[Path] = ()) -> Snapshot:
    """The state to compare after a command (see the module's docstring); the directories in
    `skip` (shoal's own home, when it is inside the project) are left out."""
    root = cwd.resolve()
    dirty = _git_dirty(root)
    if dirty is None:
        return _scan(root, skip)
    ignored = [rel for p in skip if (rel := _relative(p, root)) is not None]
    dirty = [d for d in dirty if not any(d == i or d.startswith(i + "/") for i in ignored)]
    snap: Snapshot = {rel: _stat(root, rel) for rel in dirty}
    snap["\0git"] = None  # (marks a git snapshot: paths absent from it were clean)
    return snap


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """Paths whose state differs between the two snapshots."""
    keys = (set(before) | set(after)) - {"\0git"}
    if "\0git" in before:  # git: a path listed in neither was clean both times
        return sorted(k for k in keys if before.get(k, ()) != after.get(k, ()))
    return sorted(k for k in keys if before.get(k) != after.get(k))


def outside(
    before: Snapshot,
    after: Snapshot,
    write_set: Sequence[str],
    elsewhere: Callable[[str], bool] | None = None,
) -> list[str]:
    """Changed paths the write set does not cover (nor, when given, `elsewhere`: another
    worker's lease)."""
    return [
        p
        for p in changed(before, after)
        if not covers(write_set, p) and not (elsewhere is not None and elsewhere(p))
    ]


def others_cover(
    session_dir: Path, holder: str, cwd: Path, since: float = 0.0
) -> Callable[[str], bool]:
    """Whether a changed path (relative to `cwd`) is in another worker's lease, live or
    released after `since` (when the command began): that writer's change, not a violation
    of this worker's. Read from the session's leases.json."""
    import orjson

    try:
        data = orjson.loads((session_dir / "leases.json").read_bytes())
        leases = list((data.get("leases") or {}).items())
        leases += [
            (str(r.get("holder")), r)
            for r in data.get("released") or ()
            if isinstance(r, dict) and float(r.get("released_at") or 0) >= since
        ]
    except (OSError, ValueError, TypeError, AttributeError):
        leases = []
    root = cwd.resolve()
    others: list[tuple[Path, list[str]]] = [
        (Path(lease.get("cwd") or root).resolve(), list(lease.get("write_set") or ()))
        for who, lease in leases
        if who != holder and isinstance(lease, dict)
    ]

    def covered(rel: str) -> bool:
        full = root / rel
        for base, write_set in others:
            inner = _relative(full, base)
            if inner is not None and covers(write_set, inner):
                return True
        return False

    return covered
