"""The live display of `shoal run` on a terminal: a done/total bar, an ETA and the running tasks.

Only for a terminal: a CI log gets plain lines (no control codes), from `cli/run.py`. The
display is redrawn by rich's own refresh (elapsed time and ETA move between events); lines
printed through `line` appear above it and stay.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import IO, Final

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from shoal.ui.status import COLOR_STYLES

BAR_WIDTH: Final = 30
REFRESH_PER_SECOND: Final = 4
# Names of running tasks shown on the second line; the rest are counted.
NAMES_SHOWN: Final = 8
# Tasks that must have finished before an ETA is shown.
MIN_SAMPLES: Final = 3


def estimate_eta(
    durations: Sequence[float], running_elapsed: Sequence[float], waiting: int, jobs: int
) -> float | None:
    """Seconds left, from the mean duration of the tasks that finished: the waiting tasks'
    and the running tasks' remaining work shared over the job slots. None until
    MIN_SAMPLES tasks finished (one quick task says nothing of the others). A running task
    already past the mean is reckoned to need as long again as it has run (the mean is
    then too short for it; "0s" would be a promise nothing backs)."""
    left = waiting + len(running_elapsed)
    if not durations or len(durations) < min(MIN_SAMPLES, len(durations) + left):
        return None
    mean = sum(durations) / len(durations)
    work = waiting * mean + sum(mean - e if e < mean else e for e in running_elapsed)
    if left == 0:
        return 0.0
    slots = min(jobs, left) if jobs > 0 else left
    return work / max(1, slots)


def format_eta(seconds: float | None) -> str:
    """`ETA 1m20s`, `ETA 45s`, `ETA ?` (no estimate yet)."""
    if seconds is None:
        return "ETA ?"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"ETA {hours}h{minutes:02d}m"
    if minutes:
        return f"ETA {minutes}m{secs:02d}s"
    return f"ETA {secs}s"


class RunBoard:
    """The bar, counts, ETA and running task names, kept live below the printed lines."""

    def __init__(self, file: IO[str], *, no_color: bool) -> None:
        self.console = Console(
            file=file, force_terminal=True, no_color=no_color, highlight=False, soft_wrap=True
        )
        self.total = 0
        self.done = 0
        self.jobs = 0
        self.ok = 0
        self.failed = 0
        self.skipped = 0
        self.running: dict[str, float] = {}  # task id -> when it started (monotonic)
        self.durations: list[float] = []
        self._lock = threading.Lock()
        self._live = Live(
            get_renderable=self._render,
            console=self.console,
            refresh_per_second=REFRESH_PER_SECOND,
            transient=True,  # the summary line replaces it at the end
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._started = False

    def start(self) -> None:
        """Show the display (once the run knows its total)."""
        if not self._started:
            self._started = True
            self._live.start()

    def stop(self) -> None:
        """Take the display away, leaving the printed lines."""
        if self._started:
            self._started = False
            self._live.stop()

    def line(self, text: str, *, style: str | None = None) -> None:
        """Print one line above the display, as it is (no markup)."""
        self.console.print(Text(text, style=style or ""), soft_wrap=True)

    def task_started(self, task_id: str) -> None:
        with self._lock:
            self.running[task_id] = time.monotonic()

    def task_ended(self, task_id: str, verdict: str | None, duration: float | None) -> None:
        """An attempt ended; `verdict` is the task's status when it is final (None when the
        task will be tried again)."""
        with self._lock:
            self.running.pop(task_id, None)
            if verdict is None:
                return
            self.done += 1
            if verdict == "succeeded":
                self.ok += 1
            elif verdict == "skipped":
                self.skipped += 1
            else:
                self.failed += 1
            if duration is not None and verdict != "skipped":
                self.durations.append(duration)

    def _render(self) -> RenderableType:
        with self._lock:
            now = time.monotonic()
            running = list(self.running.items())
            waiting = max(0, self.total - self.done - len(running))
            eta = estimate_eta(self.durations, [now - t for _, t in running], waiting, self.jobs)
            counts = (self.done, self.total, self.ok, self.failed, self.skipped)
        done, total, ok, failed, skipped = counts
        bar = ProgressBar(
            total=max(total, 1),
            completed=done,
            width=BAR_WIDTH,
            complete_style=COLOR_STYLES["error"] if failed else COLOR_STYLES["success"],
            finished_style=COLOR_STYLES["error"] if failed else COLOR_STYLES["success"],
        )
        summary = Text.assemble(
            f" {done}/{total} ",
            (f"{ok} ok", COLOR_STYLES["success"]),
            ", ",
            (f"{failed} failed", COLOR_STYLES["error"] if failed else ""),
            f", {skipped} skipped  {format_eta(eta)}",
        )
        top = Table.grid()
        top.add_row(bar, summary)
        names = [name for name, _ in sorted(running, key=lambda r: r[1])]
        shown = ", ".join(names[:NAMES_SHOWN])
        more = f" (+{len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else ""
        who = Text(f"{len(names)} running: {shown}{more}" if names else "0 running", style="dim")
        return Group(top, who)
