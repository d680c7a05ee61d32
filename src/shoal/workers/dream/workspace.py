"""A dream's view of the file system: Read, Glob and Grep over its memory directory and the
sessions it reviews; Write and Edit inside the memory directory only, atomically.

The confinement is code, not prompt: every path goes through the file tools' path gate
(core/pathgate.py) with the roots fixed when the dream started, resolved beneath them with no
symlink followed, so a link planted later, or a memory directory swapped for a link mid-run,
leads nowhere; Glob and Grep list only what the gate would let Read. Writes go to a temp file
in the same directory and are renamed into place, so a dream killed at any instant leaves
each memory file old or new, never torn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from shoal.core.pathgate import PathGate, Written
from shoal.core.paths import DIR_MODE, FILE_MODE
from shoal.workers.agent.tool_args import GlobArgs, GrepArgs, ToolFailure
from shoal.workers.agent.tools import Workspace
from shoal.workers.dream.memory import LOCK_NAME

DREAM_TOOLS: Final = ("Read", "Write", "Edit", "Glob", "Grep")
MEMORY_SUFFIX: Final = ".md"


@dataclass
class DreamWorkspace(Workspace):
    """The workspace of one dream (its cwd is the memory directory)."""

    readable: tuple[Path, ...] = ()
    """The session directories under review (read-only)."""
    touched: list[str] = field(default_factory=list)
    """Memory files written so far, relative to the memory directory, in first-write order."""
    on_write: Callable[[str], None] | None = None
    root: Path = field(init=False)
    _gate: PathGate = field(init=False, repr=False)
    _touch_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.root = self.cwd.resolve()
        self.readable = tuple(p.resolve() for p in self.readable)
        self._gate = PathGate(
            self.root,
            (self.root,),
            read_only=self.readable,
            where=(
                f"the memory directory {self.root} and the sessions under review; a dream "
                "reads only those"
            ),
            file_mode=FILE_MODE,
            dir_mode=DIR_MODE,
        )

    @property
    def gate(self) -> PathGate:
        """One gate for the whole dream: its roots are fixed when it starts."""
        return self._gate

    def _refusal_note(self) -> str:
        return ""

    def _before_write(self, name: str, verb: str) -> None:
        """A memory file: inside the memory directory, a Markdown file, not the lock."""
        with self._gated():
            spot = self.gate.locate(name)
        if spot.root != self.root or not spot.parts:
            raise ToolFailure(
                f"{verb} {spot.shown}: a dream writes only inside its memory directory "
                f"{self.root}; the sessions are read-only"
            )
        if spot.shown.name == LOCK_NAME or spot.shown.suffix != MEMORY_SUFFIX:
            raise ToolFailure(
                f"{verb} {spot.shown}: a dream writes only memory files (*{MEMORY_SUFFIX})"
            )

    def _after_write(self, done: Written) -> None:
        rel = str(done.shown.relative_to(self.root))
        with self._touch_lock:  # (tool calls run on threads)
            if rel not in self.touched:
                self.touched.append(rel)
        if self.on_write is not None:
            self.on_write(rel)

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
