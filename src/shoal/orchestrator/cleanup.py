"""The cleanup registry: what a process spawned is stopped at exit and on TERM/INT/HUP, in order.

Signals only ask the main loop to stop (no work in a signal handler); the cleanups themselves
run once, from `run_all`, at normal exit or through atexit.
"""

from __future__ import annotations

import atexit
import signal
import threading
from collections.abc import Callable
from types import FrameType

Cleanup = Callable[[], None]


class CleanupRegistry:
    """Callbacks run once, last registered first."""

    def __init__(self) -> None:
        self._items: list[tuple[str, Cleanup]] = []
        self._lock = threading.Lock()
        self._done = False
        atexit.register(self.run_all)

    def register(self, name: str, fn: Cleanup) -> None:
        with self._lock:
            self._items.append((name, fn))

    def run_all(self) -> list[tuple[str, BaseException]]:
        """Run every cleanup (errors are collected, never stop the others)."""
        with self._lock:
            if self._done:
                return []
            self._done = True
            items = list(reversed(self._items))
        errors: list[tuple[str, BaseException]] = []
        for name, fn in items:
            try:
                fn()
            except BaseException as exc:  # a failing cleanup must not skip the rest
                errors.append((name, exc))
        return errors

    def install_signals(self, on_signal: Callable[[int], None]) -> None:
        """Route SIGTERM, SIGINT and SIGHUP to `on_signal(signum)` (main thread only)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            on_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, handler)
