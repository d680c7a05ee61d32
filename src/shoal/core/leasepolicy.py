"""From a write-set lease to a sandbox policy: the directories and files a lease's globs
may write in a tree (never `.git` or `.shoal`, nothing that leads outside the tree), the home
directory kept out, and an agent's policy for its permission mode (sandbox.py applies it)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from shoal.core.sandbox import PROTECTED, Policy

_GLOB_CHARS: Final = frozenset("*?[{")


def _literal_prefix(glob: str) -> tuple[list[str], list[str]]:
    """(the literal leading segments, the rest) of a relative glob."""
    parts = glob.split("/")
    for i, part in enumerate(parts):
        if _GLOB_CHARS & set(part):
            return parts[:i], parts[i:]
    return parts, []


def _holds_protected(path: Path, root: Path) -> bool:
    """Whether granting `path` would grant `.git`/`.shoal` of the tree (or is one)."""
    if path == root or root.is_relative_to(path):
        return True
    rel = path.relative_to(root).parts if path.is_relative_to(root) else ()
    return bool(set(rel) & set(PROTECTED)) or any((path / p).exists() for p in PROTECTED)


def lease_paths(root: Path, write_set: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """(dirs, files, notes): what Landlock can grant for a lease, by hierarchy. `dir/**` is the
    directory; a literal path is that file (or directory); `**` is every top-level entry but
    `.git` and `.shoal`; another glob is the files it matches now, plus its deepest literal
    directory when that holds no `.git`/`.shoal`. What cannot be granted is in `notes`."""
    from shoal.core.writeset import covers

    root = root.resolve()
    dirs: list[str] = []
    files: list[str] = []
    notes: list[str] = []

    def grant(path: Path) -> None:
        real = path.resolve()  # (a symlink in the tree must not grant what it points at)
        if real != root and not real.is_relative_to(root):
            notes.append(f"{path.relative_to(root)}: leads outside the tree; not writable")
            return
        if _holds_protected(real, root) and real.is_dir():
            return
        (dirs if real.is_dir() else files).append(str(real))

    for glob in write_set:
        literal, rest = _literal_prefix(glob)
        if set(literal) & set(PROTECTED):
            notes.append(f"{glob}: .git and .shoal are never writable")
            continue
        base = root.joinpath(*literal)
        if not rest:
            if base.exists():
                grant(base)
            else:
                notes.append(f"{glob}: not there yet, so a command cannot create it (Write can)")
            continue
        if rest == ["**"] and not literal:
            for entry in sorted(root.iterdir()):
                if entry.name not in PROTECTED:
                    grant(entry)
            notes.append("**: commands cannot create new files at the top of the tree")
            continue
        if rest == ["**"]:
            if base.is_dir():
                grant(base)
            else:
                notes.append(f"{glob}: {base} is not there yet, so a command cannot create it")
            continue
        if base.is_dir() and not _holds_protected(base, root):
            grant(base)
            continue
        # The matching files there now (bounded: a lease glob over a huge tree is rare).
        if base.is_dir():
            for count, path in enumerate(_walk_files(base, root)):
                if count >= 10_000:
                    notes.append(f"{glob}: more than 10,000 files; the rest are read-only")
                    break
                if covers([glob], path.relative_to(root).as_posix()):
                    grant(path)
        notes.append(f"{glob}: only the files it matches now; a command cannot create new ones")
    return dirs, files, notes


def _walk_files(base: Path, root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in PROTECTED]
        for name in filenames:
            yield Path(dirpath) / name


def agent_policy(
    cwd: Path,
    mode: str,
    write_set: Sequence[str] | None,
    *,
    scratchpad: Path | None = None,
    tmp: Path | None = None,
    network: bool | None = None,
    extra: Sequence[str] = (),
    unix: bool = False,
    home: Path | None = None,
) -> Policy:
    """The sandbox of an agent's commands. Plan mode: nothing writable but the devices. A
    worker (`write_set` not None): its lease, the scratchpad, its tmp and `extra`, and no TCP
    unless `network`. Any other agent: its whole working tree, the scratchpad, its tmp and
    `extra`, with network."""
    if mode == "plan":
        return Policy(network=bool(network) if write_set is not None else True, unix=unix)
    own = [str(p) for p in (scratchpad, tmp) if p is not None] + [
        os.path.expanduser(p) for p in extra
    ]
    dirs: list[str]
    files: list[str]
    notes: list[str]
    if write_set is None:
        dirs, files, notes = [str(cwd.resolve())], [], []
        network = True if network is None else network
    else:
        dirs, files, notes = lease_paths(cwd, write_set)
    if home is not None:
        dirs, files, cut = without_home(dirs, files, home)
        notes += cut
    return Policy(
        tuple(dict.fromkeys([*dirs, *own])),
        tuple(files),
        bool(network),
        notes=tuple(notes),
        unix=unix,
    )


def without_home(
    dirs: Sequence[str], files: Sequence[str], home: Path
) -> tuple[list[str], list[str], list[str]]:
    """`dirs` and `files` less SHOAL_HOME (the control channel: a command that could write
    there could drive the leader): a granted directory that holds the home is granted entry by
    entry along the way down to it instead, and a note says where new entries then cannot be
    made. (The scratchpad, kept in the home, is granted on its own.)"""
    real = Path(os.path.realpath(home))
    kept_dirs: list[str] = []
    notes: list[str] = []
    for raw in dirs:
        granted = Path(os.path.realpath(raw))
        if granted != real and real not in granted.parents and granted not in real.parents:
            kept_dirs.append(raw)
            continue
        if granted == real or real in granted.parents:
            continue  # (inside the home: never)
        current = granted
        for part in real.relative_to(granted).parts:
            try:
                entries = sorted(os.listdir(current))
            except OSError:
                break
            kept_dirs += [str(current / e) for e in entries if e != part]
            notes.append(f"{current}: no new entries (SHOAL_HOME {real} lies beneath)")
            current = current / part
    kept_files = [
        f
        for f in files
        if not (Path(os.path.realpath(f)) == real or real in Path(os.path.realpath(f)).parents)
    ]
    return kept_dirs, kept_files, notes
