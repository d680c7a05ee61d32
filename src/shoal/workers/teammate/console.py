"""A teammate's console: its work as it happens, one human-readable line per event.

The worker writes these lines to its stdout: in a tmux or iTerm2 pane they are what the pane
shows; under the process backend stdout is the member's log file
(`teams/{team}/logs/{name}.log`), so the same lines land there. In-process teammates share the
leader's stdout and keep their console off.

    14:02:11 ready    ana of team t, backend tmux, inbox watched by inotify
    14:02:12 received text from team-lead: echo hello
    14:02:12 busy     working on echo hello
    14:02:12 step     run: echo hello
    14:02:12 output   hello
    14:02:12 exit     exit code 0
    14:02:12 sent     task_notification to team-lead: completed: hello
    14:02:12 idle
    14:02:20 received shutdown_request from team-lead: the lead is shutting down
    14:02:20 shutdown approved; leaving the team
    14:02:20 stopped  exit code 0

Colour on a terminal unless NO_COLOR is set; plain text otherwise. Each line is one write of a
line-buffered stream: nothing waits for the disk (no fsync), so the message path does not slow.
A command's output is not piped through the worker (it goes straight to the output file);
`OutputFollower` reads what the file gains while the command runs and shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, TextIO

# Tag column width: the longest tags (received, shutdown, stopping) fit.
TAG_WIDTH: Final = 8
# A preview (a message, a result) is one line of at most this many characters.
PREVIEW_CHARS: Final = 120
# One line of a command's output is cut to this many characters.
OUTPUT_LINE_CHARS: Final = 500
# How often a running command's output file is read for new lines (seconds).
FOLLOW_INTERVAL_S: Final = 0.05
# The most read from a command's output file at once; a command more than FOLLOW_BEHIND bytes
# ahead of what was shown is skipped forward (the pane is for reading, the file keeps it all).
FOLLOW_CHUNK: Final = 64 << 10
FOLLOW_BEHIND: Final = 256 << 10

# SGR codes per tag (on a terminal only).
_STYLES: Final = {
    "ready": "1;32",
    "received": "36",
    "sent": "32",
    "busy": "33",
    "idle": "2",
    "step": "1",
    "task": "1;34",
    "output": "",
    "exit": "32",
    "failed": "31",
    "plan": "35",
    "approval": "35",
    "shutdown": "1;35",
    "stopping": "35",
    "stopped": "1;35",
    "abort": "1;31",
    "killed": "1;31",
    "error": "1;31",
}
_DIM: Final = "2"
# Escape sequences and other control characters: a line must not move the cursor or recolour
# the pane (a tab is kept).
_CONTROL: Final = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: a window title, a link
    r"|\x1b[@-_]"
    r"|[\x00-\x08\x0b-\x1f\x7f]"
)


def wants_colour(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour when `stream` is a terminal and NO_COLOR is not set (https://no-color.org)."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (ValueError, OSError):  # closed, or not a real stream
        return False


def clean(text: str) -> str:
    """`text` without escape sequences or control characters (carriage returns included)."""
    return text if text.isprintable() else _CONTROL.sub("", text)


def preview(text: str | None, limit: int = PREVIEW_CHARS) -> str:
    """One line of `text`: whitespace runs (newlines too) become one space, cut at `limit`."""
    if not text:
        return ""
    flat = " ".join(clean(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class Console:
    """Writes one line per event to a stream; off (writes nothing) without one."""

    def __init__(
        self,
        stream: TextIO | None,
        *,
        colour: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._stream = stream
        self._colour = colour
        self._clock = clock
        self._second = -1  # the second `_stamp` was formatted for (once a second, not a line)
        self._stamp = ""

    @classmethod
    def off(cls) -> Console:
        """A console that writes nothing (in-process teammates: stdout is the leader's)."""
        return cls(None)

    @classmethod
    def for_stdout(cls, environ: Mapping[str, str] | None = None) -> Console:
        """The worker's console on its stdout, line-buffered (a pane, or the process
        backend's log file, sees each line as it is written), coloured on a terminal."""
        stream = sys.stdout
        if stream is None:  # (no fd 1 at all: nowhere to show anything)
            return cls.off()
        if isinstance(stream, io.TextIOWrapper):
            # (a message may hold what the stream's encoding cannot say: never fail on it)
            stream.reconfigure(line_buffering=True, errors="replace")
        return cls(stream, colour=wants_colour(stream, environ))

    @property
    def enabled(self) -> bool:
        """Whether lines are written at all (callers skip work for a console that is off)."""
        return self._stream is not None

    def line(self, tag: str, text: str = "") -> None:
        """Write `HH:MM:SS tag text` (a failed write is dropped: the console never stops the
        teammate)."""
        stream = self._stream
        if stream is None:
            return
        second = int(self._clock())
        if second != self._second:
            self._second, self._stamp = second, time.strftime("%H:%M:%S", time.localtime(second))
        stamp = self._stamp
        body = clean(text)
        padded = f"{tag:<{TAG_WIDTH}}" if body else tag
        if self._colour:
            style = _STYLES.get(tag, "")
            label = f"\x1b[{style}m{padded}\x1b[0m" if style else padded
            out = f"\x1b[{_DIM}m{stamp}\x1b[0m {label} {body}"
        else:
            out = f"{stamp} {padded} {body}"
        with contextlib.suppress(OSError, ValueError):
            stream.write(out.rstrip() + "\n")

    def transcript(self, text: str) -> None:
        """Readable transcript text as it is (an agent's: what the model said, its tool calls
        and their results), already in lines of its own."""
        stream = self._stream
        if stream is None or not text:
            return
        with contextlib.suppress(OSError, ValueError):
            stream.write(text if text.endswith("\n") else text + "\n")

    # -- events --------------------------------------------------------------------------------

    def ready(self, name: str, team: str, backend: str, watcher: str) -> None:
        self.line("ready", f"{name} of team {team}, backend {backend}, inbox watched by {watcher}")

    def received(self, kind: str, sender: str, what: str) -> None:
        self.line("received", f"{kind} from {sender}" + (f": {preview(what)}" if what else ""))

    def sent(self, kind: str, to: str, what: str | None = None) -> None:
        self.line("sent", f"{kind} to {to}" + (f": {preview(what)}" if what else ""))

    def busy(self, what: str) -> None:
        self.line("busy", preview(what))

    def idle(self) -> None:
        self.line("idle")

    def step(self, what: str) -> None:
        self.line("step", preview(what, OUTPUT_LINE_CHARS))

    def task(self, what: str) -> None:
        self.line("task", preview(what))

    def output(self, line: str) -> None:
        text = line if len(line) <= OUTPUT_LINE_CHARS else line[: OUTPUT_LINE_CHARS - 1] + "…"
        self.line("output", text)

    def exited(self, code: int) -> None:
        self.line("exit" if code == 0 else "failed", f"exit code {code}")

    def follow(self, path: Path, offset: int) -> OutputFollower:
        """An `OutputFollower` of `path` from `offset` onto this console."""
        return OutputFollower(self, path, offset)


class OutputFollower:
    """Shows what a running command appends to its output file, line by line, while it runs.

    The command writes the file itself (its output never passes through the worker); this
    reads what the file gained every FOLLOW_INTERVAL_S and once more when the command ends.
    """

    def __init__(self, console: Console, path: Path, offset: int) -> None:
        self.console = console
        self.path = path
        self.offset = offset
        self._partial = b""
        self._resync = False  # skipped forward into a line: drop it, up to its end
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Follow from now on (a task of the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Stop following, show what is left (a last line without its newline too)."""
        if self._task is not None:
            self._task.cancel()  # (it only sleeps between reads: nothing to wait for)
            self._task = None
        self.read()
        if self._partial:
            self._show(self._partial)
            self._partial = b""

    async def _run(self) -> None:
        while True:
            self.read()
            await asyncio.sleep(FOLLOW_INTERVAL_S)

    def read(self) -> None:
        """Show the complete lines the file gained since the last read."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return
        if size - self.offset > FOLLOW_BEHIND:
            skipped = size - FOLLOW_CHUNK - self.offset
            self.console.line("output", f"… {skipped} bytes not shown (all in {self.path})")
            self.offset = size - FOLLOW_CHUNK
            self._partial = b""
            self._resync = True
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 (closed below, after the reads)
        except OSError:
            return
        with fh:
            while self.offset < size:
                try:
                    fh.seek(self.offset)
                    data = fh.read(min(FOLLOW_CHUNK, size - self.offset))
                except OSError:
                    return
                if not data:
                    return
                self._take(data)

    def _take(self, data: bytes) -> None:
        """Show the complete lines `data` (read at the offset) ends, keep the rest of a line."""
        self.offset += len(data)
        if self._resync:
            cut = data.find(b"\n")
            if cut < 0:
                return
            data, self._resync = data[cut + 1 :], False
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            self._show(raw)
        if len(self._partial) > OUTPUT_LINE_CHARS * 4:  # a line with no end: show it now
            self._show(self._partial)
            self._partial = b""

    def _show(self, raw: bytes) -> None:
        self.console.output(raw.decode("utf-8", "replace").rstrip("\r"))
