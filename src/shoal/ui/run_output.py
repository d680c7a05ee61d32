"""Tasks' own output in `shoal run`'s log: a failing task's last lines, framed and named, and
`--output tag|group` (every line prefixed with its task's name as it comes, or each task's
output whole when it ends).

Output files are read here, never through the leader: a shell task's output goes straight to
its file, and `tag` follows the files as they grow (a small thread polling their sizes; the
leader's loop does not wait for a terminal).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from shoal.core.errors import ShoalError
from shoal.core.output import read_output_delta, tail_lines
from shoal.ui.status import one_line

OutputMode = Literal["none", "tag", "group"]
OUTPUT_MODES: Final[tuple[OutputMode, ...]] = ("none", "tag", "group")
DEFAULT_FAILURE_LINES: Final = 50
TAG_SEP: Final = "\t"  # as `parallel --tag`
FOLLOW_INTERVAL_S: Final = 0.1
READ_CHUNK: Final = 1 << 20
# A failing task's tail is looked for in at most this much of the end of its output.
TAIL_WINDOW_MIN: Final = 64 * 1024
TAIL_BYTES_PER_LINE: Final = 2048
REASON_WIDTH: Final = 200

Write = Callable[[str], None]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def read_tail(path: str, lines: int) -> list[str] | None:
    """The last `lines` lines of an output file; None when it cannot be read (never made,
    removed, or a link)."""
    try:
        os.lstat(path)
        return tail_lines(path, lines, max(TAIL_WINDOW_MIN, lines * TAIL_BYTES_PER_LINE))
    except (OSError, ShoalError):
        return None


def iter_lines(path: str) -> Iterator[str]:
    """Every line of an output file, read in chunks (an output may be large)."""
    offset, rest = 0, b""
    while True:
        try:
            data, offset = read_output_delta(path, offset, READ_CHUNK)
        except (OSError, ShoalError):
            return
        if not data:
            break
        *whole, rest = (rest + data).split(b"\n")
        for line in whole:
            yield _text(line)
    if rest:
        yield _text(rest)


def verdict_label(status: str, reason: str | None) -> str:
    """`FAILED (exit code 1)`, `TIMED OUT (timed out after 5m)`, `ok`."""
    if status == "succeeded":
        return "ok"
    label = status.replace("_", " ").upper()
    if not reason:
        return label
    return f"{label} ({one_line(reason, REASON_WIDTH, line_sep=' ⏎ ')})"  # (a header is one line)


def failure_frame(name: str, label: str, path: str | None, lines: int) -> list[str]:
    """The framed tail of a failed task: a header naming the task, its verdict and the file,
    the lines, and a closing line. Empty when `lines` is 0."""
    if lines <= 0:
        return []
    tail = read_tail(path, lines) if path else None
    if tail is None:
        where = f"of {path}" if path else "of the task"
        return [f"--- {name}: {label}: no output to show ({where} cannot be read) ---"]
    if not tail:
        return [f"--- {name}: {label}: {path} is empty ---"]
    return [
        f"--- {name}: {label}: last {len(tail)} line(s) of {path} ---",
        *tail,
        f"--- end of {name} ---",
    ]


@dataclass
class _Followed:
    name: str
    path: str
    offset: int = 0
    rest: bytes = b""


class Follower:
    """`--output tag`: the lines of every running attempt's output file as they are written,
    each prefixed with its task's name. A line is printed once it is whole; an attempt's
    last partial line when it ends. `write` is called with this object's lock held and must
    not call back into it."""

    def __init__(self, write: Write, lock: threading.RLock) -> None:
        self.write = write
        self.lock = lock
        self.files: dict[str, _Followed] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, name: str, path: str) -> None:
        """Follow the output of `name`'s running attempt (a new attempt replaces the last)."""
        with self.lock:
            old = self.files.pop(name, None)
            if old is not None:
                self._drain(old, final=True)
            self.files[name] = _Followed(name, path)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shoal-run-tag", daemon=True)
            self._thread.start()

    def end(self, name: str) -> bool:
        """`name`'s attempt ended: print the rest of its output. False if it was not followed
        (an agent task: its output file is known only now)."""
        with self.lock:
            followed = self.files.pop(name, None)
            if followed is None:
                return False
            self._drain(followed, final=True)
            return True

    def close(self) -> None:
        """Print what is left of every file and stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self.lock:
            for followed in list(self.files.values()):
                self._drain(followed, final=True)
            self.files.clear()

    def _run(self) -> None:
        while not self._stop.wait(FOLLOW_INTERVAL_S):
            # Never blocks for long: `close` may be called with the lock held, and joins.
            if not self.lock.acquire(timeout=FOLLOW_INTERVAL_S):
                continue
            try:
                for followed in list(self.files.values()):
                    self._drain(followed, final=False)
            finally:
                self.lock.release()

    def _drain(self, f: _Followed, *, final: bool) -> None:
        while True:
            try:
                data, f.offset = read_output_delta(f.path, f.offset, READ_CHUNK)
            except (OSError, ShoalError):
                data = b""
            if not data:
                break
            *whole, f.rest = (f.rest + data).split(b"\n")
            for line in whole:
                self.write(f"{f.name}{TAG_SEP}{_text(line)}")
        if final and f.rest:
            self.write(f"{f.name}{TAG_SEP}{_text(f.rest)}")
            f.rest = b""
