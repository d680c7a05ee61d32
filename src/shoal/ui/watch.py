"""Waiting for file changes: a threading.Event woken by the mailbox watcher, with a slow tick.

Views block on `ChangeSignal.wait()` instead of polling: the process-wide watcher wakes it when
something under the watched directories changes, and the fallback tick (1 s) bounds the wait
when inotify misses an event or cannot be had. A directory that does not exist yet (no
session so far) is picked up on a later wait.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FALLBACK_TICK_S = 1.0


class ChangeSignal:
    """Set by file changes under `paths`; `wait` blocks until one (or the fallback tick).

    `paths` may be a function, asked again on every wait (a new session moves the files).
    """

    def __init__(
        self,
        paths: Sequence[Path] | Callable[[], Sequence[Path]],
        *,
        fallback: float = FALLBACK_TICK_S,
        watcher: Any | None = None,
    ) -> None:
        self.fallback = fallback
        self._paths = paths
        self._event = threading.Event()
        self._closed = False
        self._watcher = watcher
        self._unwatch: dict[Path, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._watch_new()

    def _get_watcher(self) -> Any:
        if self._watcher is None:
            from shoal.mailbox.watcher import shared_watcher

            self._watcher = shared_watcher()
        return self._watcher

    def _wanted(self) -> list[Path]:
        if callable(self._paths):
            try:
                return list(self._paths())
            except Exception:  # e.g. a team file being replaced: keep what is watched
                return list(self._unwatch)
        return list(self._paths)

    def _watch_new(self) -> None:
        """Watch every wanted path that exists; drop watches of paths no longer wanted."""
        wanted = self._wanted()
        with self._lock:
            for path in [p for p in self._unwatch if p not in wanted]:
                with contextlib.suppress(Exception):
                    self._unwatch.pop(path)()
            for path in wanted:
                if self._closed or path in self._unwatch or not path.is_dir():
                    continue
                watcher = self._get_watcher()
                tree = getattr(watcher, "watch_tree", None)
                try:
                    if callable(tree):
                        # Wakes on any change below `path` (the API proposed for watcher.py).
                        stop = tree(path, self.set)
                        self._unwatch[path] = stop if callable(stop) else (lambda: None)
                    else:
                        # Today's watcher only wakes on arrivals in `new/` plus its reconcile
                        # tick; the fallback tick covers the rest.
                        watcher.register(path, self.set)
                        self._unwatch[path] = _unregister(watcher, path, self.set)
                except OSError:
                    continue  # vanished meanwhile: try again on the next wait

    def set(self) -> None:
        """Wake the waiter (called from the watcher's thread)."""
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a change (True) or `timeout`/the fallback tick passes (False)."""
        woke = self._event.wait(self.fallback if timeout is None else timeout)
        self._event.clear()
        self._watch_new()
        return woke

    def close(self) -> None:
        """Stop watching and release a waiter."""
        with self._lock:
            self._closed = True
            unwatch, self._unwatch = list(self._unwatch.values()), {}
        for stop in unwatch:
            with contextlib.suppress(Exception):
                stop()
        self._event.set()

    def __enter__(self) -> ChangeSignal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unregister(watcher: Any, path: Path, wake: Callable[[], None]) -> Callable[[], None]:
    def stop() -> None:
        watcher.unregister(path, wake)

    return stop
