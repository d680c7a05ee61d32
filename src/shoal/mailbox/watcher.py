"""The one place watchdog is used: a per-process observer that wakes inbox readers.

inotify drops events when its queue overflows and watchdog does not tell the handler, so every
registered inbox is also woken by a reconcile tick (every 30 seconds) and right after a queue
overflow (seen through watchdog's own log record). When no inotify instance can be had (Linux
allows 128 per user by default) or `SHOAL_WATCHER=poll` is set (network filesystems), a
polling mode is used instead and `mode`/`reason` say so; watching never fails to start. In
polling mode inboxes and directories are not snapshotted: each inbox's reader sleeps on its
wake socket, which every delivery pokes, and their mtimes are stat'ed every `POLL_INTERVAL_S`
besides; a polling member's latency stays low and its idle cost a few syscalls a second.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.api import BaseObserver, ObservedWatch
from watchdog.observers.polling import PollingObserver

from shoal.mailbox.wake import Listener

# watchdog logs its own hiccups (e.g. an emitter stopping mid-read) as warnings; they are not
# the user's business, and the overflow hook below sees them through a filter anyway.
logging.getLogger("watchdog").addHandler(logging.NullHandler())
logging.getLogger("watchdog").propagate = False

RECONCILE_INTERVAL_S = 30.0
OBSERVER_TIMEOUT_S = 10.0
# Polling (no inotify instance to be had): a delivery wakes the inbox's reader through its
# wake socket (mailbox/wake.py) at once; besides, each inbox's `new/` and each watched
# directory is stat'ed this often, a syscall each (for files other tools drop in and for the
# task list): a directory whose mtime changed, or changed lately (within the kernel
# timestamp's coarse granularity), wakes its readers.
POLL_INTERVAL_S = 0.5
# Trees (views of a whole session) are polled by watchdog's snapshotting observer, less often.
TREE_POLL_INTERVAL_S = 1.0

Wake = Callable[[], None]


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Only arrivals in new/ matter: a created or moved-in file. Claims (new -> cur) and
        # acks are our own doing and need no wake-up.
        if event.event_type not in ("created", "moved", "modified", "deleted"):
            return
        if event.event_type == "deleted" and not self.watcher._dirs:
            return
        path = event.dest_path if event.event_type == "moved" else event.src_path
        path = os.fsdecode(path)
        parent, _, _ = path.rpartition("/")
        inbox, _, sub = parent.rpartition("/")
        if sub == "new":
            self.watcher.wake(inbox)
        elif parent in self.watcher._dirs:
            self.watcher.wake_dir(parent)


class _TreeHandler(FileSystemEventHandler):
    """Wakes on any change below a directory (views redraw on it)."""

    def __init__(self, wake: Wake) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.wake()


# What the kernel is asked for on every watched directory: arrivals (created, moved in) and
# removals; claims (renames out), writes and closes raise no event.
def _event_mask() -> int:
    from watchdog.observers.inotify_c import InotifyConstants as C

    mask: int = C.IN_CREATE | C.IN_MOVED_TO | C.IN_DELETE | C.IN_DELETE_SELF
    return mask


class _NewDirCallback:
    """Wakes one inbox's readers straight from the inotify reader's dispatch thread.

    An inbox's `new/` needs no event objects, move pairing or handler dispatch: an arrival is
    all a reader wants to know. Going through watchdog's emitter and observer threads would
    hand each message's event across two more threads (half the reader's CPU per message).
    """

    def __init__(self, watcher: Watcher, key: str) -> None:
        self.watcher = watcher
        self.key = key

    def on_event(self, event: Any) -> None:
        if event.is_create or event.is_moved_to:
            self.watcher.wake(self.key)

    def on_watch_deleted(self, wd: Any) -> None:
        with self.watcher._lock:
            if self.watcher._direct.get(self.key, (None,))[0] == wd:
                del self.watcher._direct[self.key]
        self.watcher.wake(self.key)  # (new/ is gone: the reader finds out when it looks)

    def on_queue_overflow(self) -> None:
        pass

    def on_events_lost(self) -> None:
        self.watcher.wake(self.key)


def _maildir_observer(timeout: float) -> BaseObserver:
    """An inotify observer that asks the kernel only for arrivals: files created or moved in,
    and removals. Claims (renames out of `new/`), writes and closes raise no event at all, so a
    message costs one event, and watchdog never holds an unpaired rename for 0.5 s."""
    from watchdog.observers.inotify import InotifyEmitter, InotifyObserver
    from watchdog.observers.inotify_c import InotifyFD

    mask = _event_mask()

    class MaildirEmitter(InotifyEmitter):
        def get_event_mask_from_filter(self) -> Any:
            return mask

    class MaildirObserver(InotifyObserver):
        def __init__(self) -> None:
            self._inotify_fd = InotifyFD()
            self._inotify_fd.start()
            BaseObserver.__init__(
                self, MaildirEmitter, timeout=timeout, inotify_fd=self._inotify_fd
            )

    return MaildirObserver()


class _OverflowHook(logging.Filter):
    """Sees watchdog's "queue overflowed" log record and asks for a reconcile."""

    def __init__(self, watcher: Watcher) -> None:
        super().__init__()
        self.watcher = watcher

    def filter(self, record: logging.LogRecord) -> bool:
        if "overflow" in record.getMessage().lower():
            self.watcher.wake_all()
        return True


class Watcher:
    """One observer for all of this process's inboxes; `register` maps an inbox to a wake-up."""

    def __init__(
        self, *, force_polling: bool | None = None, reconcile_interval: float = RECONCILE_INTERVAL_S
    ) -> None:
        self._lock = threading.Lock()
        self._wakers: dict[str, list[Wake]] = {}
        self._watches: dict[str, ObservedWatch] = {}
        self._roots: set[str] = set()
        self._seen: dict[str, int] = {}
        self._dirs: dict[str, list[Wake]] = {}
        # Inboxes whose new/ is watched without watchdog's emitter: key -> (wd, callback id).
        self._direct: dict[str, tuple[Any, Any]] = {}
        self._specs: dict[str, tuple[str, bool]] = {}
        self._polled: dict[str, int] = {}
        self._poller: threading.Thread | None = None
        self._kick: socket.socket | None = None
        self._stop = threading.Event()
        self.reconcile_interval = reconcile_interval
        if force_polling is None:
            force_polling = os.environ.get("SHOAL_WATCHER", "").lower() == "poll"
        self.mode = "inotify"
        self.reason = "inotify available"
        self._observer: BaseObserver
        if force_polling:
            self._use_polling("SHOAL_WATCHER=poll asked for polling")
        else:
            try:
                # The timeout only bounds how soon a stop is noticed (events wake the threads
                # at once); a long one keeps idle watchers from waking every second.
                self._observer = _maildir_observer(OBSERVER_TIMEOUT_S)
            except OSError as exc:
                self._use_polling(self._unavailable(exc))
        self._observer.daemon = True
        self._observer.start()
        self._ticker = threading.Thread(target=self._tick, name="shoal-reconcile", daemon=True)
        self._ticker.start()
        self._hook = _OverflowHook(self)
        logging.getLogger("watchdog.observers.inotify_c").addFilter(self._hook)
        logging.getLogger("watchdog.observers.inotify").addFilter(self._hook)

    @staticmethod
    def _unavailable(exc: OSError) -> str:
        return f"inotify unavailable ({exc.strerror or exc}); polling every {POLL_INTERVAL_S}s"

    def _use_polling(self, reason: str) -> None:
        self.mode = "polling"
        self.reason = reason
        self._observer = PollingObserver(timeout=TREE_POLL_INTERVAL_S)
        if self._poller is None:
            self._poller = threading.Thread(target=self._poll, name="shoal-poll", daemon=True)
            self._poller.start()

    @property
    def polling(self) -> bool:
        return self.mode == "polling"

    def watch_root(self, root: Path) -> None:
        """Watch a whole inbox root (a team's `inboxes/`) with one recursive schedule, so the
        many inboxes of in-process teammates below it cost no schedule (and thread) each."""
        key = os.fspath(root)
        with self._lock:
            if key not in self._watches and not self.polling:  # (polling: inboxes are stat'ed)
                self._watches[key] = self._schedule(key, key, recursive=True)
                self._roots.add(key)

    def watch_dir(self, path: Path, wake: Wake) -> None:
        """Call `wake()` when a file in directory `path` (not below it) is created, changed,
        moved in or out, or removed — e.g. a team's task list."""
        key = os.fspath(path)
        with self._lock:
            self._dirs.setdefault(key, []).append(wake)
            # No watch to be had: the caller's periodic look still finds the changes.
            if key not in self._watches and not self.polling:
                with contextlib.suppress(OSError):
                    self._watches[key] = self._schedule(key, key, recursive=False)

    def watch_tree(self, path: Path, wake: Wake) -> Callable[[], None]:
        """Call `wake()` on files created, moved in or removed anywhere below `path` (e.g. a
        session or status directory a view shows); returns a function that stops it. Appends
        to a file are not reported (the observer's mask is for arrivals)."""
        with self._lock:
            watch = self._observer.schedule(_TreeHandler(wake), os.fspath(path), recursive=True)

        def stop() -> None:
            with self._lock, contextlib.suppress(KeyError, OSError):
                self._observer.unschedule(watch)

        return stop

    def unwatch_dir(self, path: Path, wake: Wake) -> None:
        key = os.fspath(path)
        with self._lock:
            wakers = self._dirs.get(key, [])
            if wake in wakers:
                wakers.remove(wake)

    def wake_dir(self, key: str) -> None:
        for wake in list(self._dirs.get(key, ())):
            wake()

    def _covered(self, key: str) -> bool:
        return any(key.startswith(root + os.sep) for root in self._roots)

    def register(self, inbox: Path, wake: Wake) -> None:
        """Call `wake()` whenever a message may have arrived in `inbox/new`."""
        key = os.fspath(inbox)
        with self._lock:
            self._wakers.setdefault(key, []).append(wake)
            if (
                key not in self._watches
                and key not in self._direct
                and not self._covered(key)
                and not self.polling
            ):
                # Only new/ is watched: that is where messages arrive.
                new = os.path.join(key, "new")
                if not self._watch_new(key, new):
                    self._watches[key] = self._schedule(key, new, recursive=False)
        if self.polling:
            self._kick_poller()  # (its wake socket is bound now, not at the next look)

    def _watch_new(self, key: str, new: str) -> bool:
        """Watch an inbox's `new/` on the observer's own inotify reader with a callback that
        wakes its readers (see _NewDirCallback); False when that cannot be had (the observer
        has no reader of its own, or the kernel refused the watch: a schedule says why)."""
        fd = getattr(self._observer, "_inotify_fd", None)
        if fd is None or not hasattr(fd, "add_callback"):
            return False
        callback_id = id(self)
        try:
            wd = fd.add_callback(os.fsencode(new), _event_mask(), _NewDirCallback(self, key),
                                 callback_id)  # fmt: skip
        except OSError:
            return False
        self._direct[key] = (wd, callback_id)
        return True

    def _schedule(self, key: str, path: str, *, recursive: bool) -> ObservedWatch:
        self._specs[key] = (path, recursive)
        try:
            return self._observer.schedule(_Handler(self), path, recursive=recursive)
        except OSError as exc:
            if self.mode == "polling":
                raise
            # No inotify instance or watch to be had: switch this process to polling, keeping
            # what was registered so far.
            old = self._observer
            old.stop()
            self._use_polling(self._unavailable(exc))
            self._observer.daemon = True
            self._observer.start()
            # Inboxes and directories are stat'ed from now on (they need no schedule); the
            # watches kept are placeholders on the polling observer, so unscheduling works.
            self._watches.clear()
            self._direct.clear()  # (they went with the old observer's inotify reader)
            return self._observer.schedule(_Handler(self), path, recursive=recursive)

    def unregister(self, inbox: Path, wake: Wake) -> None:
        """Stop waking `wake` for `inbox`; the watch goes when nobody wants it."""
        key = os.fspath(inbox)
        with self._lock:
            wakers = self._wakers.get(key, [])
            if wake in wakers:
                wakers.remove(wake)
            if not wakers:
                self._wakers.pop(key, None)
                direct = self._direct.pop(key, None)
                fd = getattr(self._observer, "_inotify_fd", None)
                if direct is not None and fd is not None:
                    with contextlib.suppress(OSError):
                        fd.remove_callbacks([direct])
                watch = None if key in self._roots else self._watches.pop(key, None)
                if watch is not None:
                    with contextlib.suppress(KeyError, OSError):
                        self._observer.unschedule(watch)

    def wake(self, inbox: str) -> None:
        for wake in self._wakers.get(inbox, ()):
            wake()

    def wake_all(self) -> None:
        with self._lock:
            wakers = [w for ws in self._wakers.values() for w in ws]
        for wake in wakers:
            wake()

    def _tick(self) -> None:
        while not self._stop.wait(self.reconcile_interval):
            self.reconcile()

    def reconcile(self) -> None:
        """Wake the readers of inboxes whose `new/` changed (or changed lately) since the
        last look: a missed event is caught, and a thousand idle inboxes cost a stat each."""
        with self._lock:
            items = [(os.path.join(k, "new"), list(w)) for k, w in self._wakers.items()]
        _wake_changed(items, self._seen, int(2 * self.reconcile_interval * 1e9))

    def _poll(self) -> None:
        """Polling mode's thread: sleep on the inboxes' wake sockets (a delivery wakes its
        inbox at once), and look at every mtime each POLL_INTERVAL_S."""
        listeners: dict[str, Listener | None] = {}
        selector = selectors.DefaultSelector()
        kick_r, self._kick = socket.socketpair()
        kick_r.setblocking(False)
        selector.register(kick_r, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                with self._lock:
                    keys = set(self._wakers)
                # (an inbox not there yet, or read by another process, is tried again)
                for key in keys - {k for k, v in listeners.items() if v is not None}:
                    listener: Listener | None = None
                    try:
                        listener = Listener(key)
                    except OSError:  # (not there yet, or read by another process: stat only)
                        pass
                    else:
                        selector.register(listener, selectors.EVENT_READ, key)
                    listeners[key] = listener
                for key in listeners.keys() - keys:
                    gone = listeners.pop(key)
                    if gone is not None:
                        selector.unregister(gone)
                        gone.close()
                deadline = time.monotonic() + POLL_INTERVAL_S
                while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
                    ready = selector.select(left)
                    for sel_key, _ in ready:
                        if sel_key.data is None:  # (registrations changed, or stop)
                            with contextlib.suppress(OSError):
                                kick_r.recv(4096)
                            deadline = 0.0
                            continue
                        sel_key.fileobj.drain()  # type: ignore[union-attr]
                        self.wake(sel_key.data)
                self.poll_once()
        finally:
            for listener in listeners.values():
                if listener is not None:
                    listener.close()
            selector.close()
            kick_r.close()

    def _kick_poller(self) -> None:
        kick = getattr(self, "_kick", None)
        if kick is not None:
            with contextlib.suppress(OSError):
                kick.send(b"k")

    def poll_once(self) -> None:
        """Polling mode's look: wake the readers of inboxes and directories whose mtime
        changed since the last look, or changed lately (a second arrival in the same tick of
        the kernel's coarse clock leaves the mtime as it was)."""
        with self._lock:
            inboxes = [(os.path.join(k, "new"), list(w)) for k, w in self._wakers.items()]
            dirs = [(k, list(w)) for k, w in self._dirs.items() if w]
        _wake_changed([*inboxes, *dirs], self._polled, int(3 * POLL_INTERVAL_S * 1e9) + 20_000_000)

    def stop(self) -> None:
        """Stop the observer and the reconcile tick (tests; processes just exit)."""
        self._stop.set()
        self._kick_poller()
        self._observer.stop()
        logging.getLogger("watchdog.observers.inotify_c").removeFilter(self._hook)
        logging.getLogger("watchdog.observers.inotify").removeFilter(self._hook)


def _wake_changed(
    items: list[tuple[str, list[Wake]]], seen: dict[str, int], recent_ns: int
) -> None:
    """Call the wakers of each directory whose mtime differs from the one `seen` last time,
    or lies within `recent_ns` of now: a change within the timestamp granularity of the last
    look leaves the mtime as it was, so a recently changed directory gets one more look."""
    now_ns = time.time_ns()
    for path, wakers in items:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = -1
        if seen.get(path) != mtime or now_ns - mtime < recent_ns:
            seen[path] = mtime
            for wake in wakers:
                wake()


_shared: Watcher | None = None
_shared_lock = threading.Lock()


def shared_watcher() -> Watcher:
    """The process-wide watcher (one observer, one inotify instance per process)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Watcher()
        return _shared
