"""A dream's view of the file system: Read, Glob and Grep over its memory directory and the
sessions it reviews; Write and Edit inside the memory directory only, atomically.

The confinement is code, not prompt: every path is resolved (`..` and symlinks followed)
and compared with the roots fixed when the dream started, so a link planted later, or a
memory directory swapped for a link mid-run, leads nowhere. Writes go to a temp file in the
same directory and are renamed into place, so a dream killed at any instant leaves each
memory file old or new, never torn.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shoal.core.errors import ShoalError, UnsafePathError
from shoal.core.jsonio import atomic_write
from shoal.core.paths import check_path, ensure_dir
from shoal.workers.agent.tools import (
    EditArgs,
    GlobArgs,
    GrepArgs,
    ToolFailure,
    Workspace,
    WriteArgs,
    edited,
)
from shoal.workers.dream.memory import LOCK_NAME

DREAM_TOOLS: Final = ("Read", "Write", "Edit", "Glob", "Grep")
MEMORY_SUFFIX: Final = ".md"


def _within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


@dataclass
class DreamWorkspace(Workspace):
    """The workspace of one dream (its cwd is the memory directory)."""

    readable: tuple[Path, ...] = ()
    """The session directories under review (read-only)."""
    touched: list[str] = field(default_factory=list)
    """Memory files written so far, relative to the memory directory, in first-write order."""
    on_write: Callable[[str], None] | None = None
    root: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.cwd.resolve()
        self.readable = tuple(p.resolve() for p in self.readable)

    def path(self, name: str) -> Path:
        """`name` (relative to the memory directory) resolved; refused unless it is in the
        memory directory or a session under review."""
        raw = Path(os.path.expanduser(name))
        resolved = (raw if raw.is_absolute() else self.root / raw).resolve()
        if not any(_within(resolved, r) for r in (self.root, *self.readable)):
            raise ToolFailure(
                f"{name} is outside the memory directory {self.root} and the sessions under "
                "review; a dream reads only those"
            )
        return resolved

    def _writable(self, name: str, verb: str) -> Path:
        """The memory file `name` may be written: inside the memory directory (itself still a
        real directory), a Markdown file, not the lock."""
        path = self.path(name)
        if not _within(path, self.root) or path == self.root:
            raise ToolFailure(
                f"{verb} {path}: a dream writes only inside its memory directory {self.root}; "
                "the sessions are read-only"
            )
        if path.name == LOCK_NAME or path.suffix != MEMORY_SUFFIX:
            raise ToolFailure(f"{verb} {path}: a dream writes only memory files (*{MEMORY_SUFFIX})")
        try:
            check_path(self.cwd, "dir")
            if self.cwd.resolve() != self.root:
                raise UnsafePathError(f"{self.cwd} no longer leads to {self.root}")
        except UnsafePathError as exc:
            raise ToolFailure(f"{verb} {path}: the memory directory changed ({exc})") from None
        return path

    def _save(self, path: Path, text: str) -> None:
        try:
            # (sub-directories of the memory directory: made 0700, none of them a link)
            ensure_dir(path.parent, self.root)
            atomic_write(path, text.encode())
        except ShoalError as exc:
            raise ToolFailure(f"cannot write {path}: {exc}") from None
        rel = str(path.relative_to(self.root))
        if rel not in self.touched:
            self.touched.append(rel)
        if self.on_write is not None:
            self.on_write(rel)

    def write(self, args: WriteArgs) -> str:
        path = self._writable(args.file_path, "Write")
        if path.is_dir():
            raise ToolFailure(f"{path} is a directory")
        existed = path.exists()
        if existed:
            self._check_fresh(path, "Write")
        self._save(path, args.content)
        self._remember(path)
        return f"{'updated' if existed else 'created'} {path} ({len(args.content)} characters)"

    def edit(self, args: EditArgs) -> str:
        path = self._writable(args.file_path, "Edit")
        if not path.is_file():
            raise ToolFailure(f"file not found: {path}")
        self._check_fresh(path, "Edit")
        text, count = edited(path.read_text(), args, path)
        self._save(path, text)
        self._remember(path)
        return f"edited {path} ({count if args.replace_all else 1} replacement(s))"

    def glob(self, args: GlobArgs) -> str:
        """Glob; without a path, over the memory directory and every session under review."""
        if args.path is not None:
            return super().glob(args)
        found = [
            super(DreamWorkspace, self).glob(args.model_copy(update={"path": str(base)}))
            for base in (self.root, *self.readable)
        ]
        hits = [text for text in found if not text.startswith("no files match")]
        return "\n".join(hits) if hits else f"no files match {args.pattern}"

    def grep(self, args: GrepArgs) -> str:
        """Grep; without a path, over the memory directory and every session under review."""
        if args.path is not None:
            return super().grep(args)
        found = [
            super(DreamWorkspace, self).grep(args.model_copy(update={"path": str(base)}))
            for base in (self.root, *self.readable)
        ]
        hits = [text for text in found if not text.startswith("no matches")]
        return "\n".join(hits) if hits else f"no matches for {args.pattern}"
