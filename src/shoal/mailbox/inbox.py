"""Reading an inbox: priority order, claim, exactly-once handling, iteration and subscriptions.

Order: `shutdown_request` first, then messages from the lead, then FIFO by delivery. Handling is
claim (new -> cur), the handler's effect, the id appended to the handled log, then ack (unlink).
After a crash, `cur/` is handled again and ids already in the log are only acked, so an effect
is applied once. A handler that keeps raising does not stop the reader: the message is retried,
then moved to `bad/` with the error.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shoal.core.errors import UnsafePathError
from shoal.mailbox.schema import AnyMessage, DecodeError, decode
from shoal.mailbox.store import Maildir
from shoal.mailbox.watcher import Watcher, shared_watcher

Handler = Callable[[AnyMessage], Any]

MAX_ATTEMPTS = 3
RETRY_BACKOFF_S = 0.05
# Compact the handled log once it holds this many ids (only ids still in cur/ are kept).
COMPACT_AFTER = 10_000
SUBSCRIPTION_WAIT_S = 60.0
"""The longest a Subscription's reader sleeps before looking again (interrupt ends it)."""
JANITOR_INTERVAL_S = 60.0
# While claimed messages are still cached, a wake-up lists new/ again only once this many times
# the last listing's duration has passed: each arrival wakes the reader, and listing a backlog
# of thousands for every message would cost more than handling them (see Inbox.receive).
RELIST_AFTER_X = 8.0
# With nothing cached and no wake-up since the last look, a receive that may wait lists new/
# again only once this long has passed since that look (a reader keeping up with its sender
# would otherwise list an empty new/ after every message; an arrival wakes it, and the
# reconcile tick covers the rest).
IDLE_RELOOK_S = 0.005


@dataclass(frozen=True)
class Delivery:
    """A claimed message: `name` is its file in `cur/`; `redelivered` after a crash."""

    name: str
    message: AnyMessage
    redelivered: bool = False


def priority(message: AnyMessage, lead: str | None) -> int:
    """0 for shutdown requests, 1 for messages from the lead, 2 for the rest."""
    if message.kind == "shutdown_request":
        return 0
    if lead is not None and message.from_ == lead:
        return 1
    return 2


class Inbox:
    """The reading side of one maildir; thread-safe, one instance per reader per process."""

    def __init__(
        self,
        maildir: Maildir,
        *,
        lead: str | None = None,
        watcher: Watcher | None = None,
        durable: bool = False,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.maildir = maildir
        self.lead = lead
        self.durable = durable
        self.max_attempts = max_attempts
        self._watcher = watcher
        self._event = threading.Event()
        self._lock = threading.RLock()
        self._cache: dict[str, tuple[int, AnyMessage]] = {}
        self._heap: list[tuple[int, str]] = []
        self._scanned = False
        self._owed = False  # woken since the last look into new/
        self._relist_at = 0.0  # (monotonic) a look owed is due from then on
        self._looked_at = 0.0  # (monotonic) the end of the last look
        self._handled: set[str] | None = None
        self._handled_count = 0
        self._recovered: list[Delivery] | None = None
        self._registered = False
        self._extra_wakers: list[Callable[[], None]] = []
        self._interrupted = False
        self._last_janitor = 0.0
        self.quarantined = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Inbox:
        """Begin watching (idempotent). Receiving starts it on demand too."""
        with self._lock:
            if not self._registered:
                watcher = self._watcher or shared_watcher()
                self._watcher = watcher
                watcher.register(self.maildir.path, self._event.set)
                self._registered = True
        return self

    def interrupt(self) -> None:
        """Make a `receive` waiting in another thread return None now."""
        self._interrupted = True
        self._event.set()

    def add_waker(self, wake: Callable[[], None]) -> None:
        """Also call `wake()` whenever a message may have arrived (e.g. to wake an event loop:
        `lambda: loop.call_soon_threadsafe(event.set)`)."""
        self.start()
        assert self._watcher is not None
        self._watcher.register(self.maildir.path, wake)
        self._extra_wakers.append(wake)

    def close(self) -> None:
        """Stop watching."""
        with self._lock:
            if self._registered and self._watcher is not None:
                self._watcher.unregister(self.maildir.path, self._event.set)
                for wake in self._extra_wakers:
                    self._watcher.unregister(self.maildir.path, wake)
                self._extra_wakers.clear()
                self._registered = False
            self.maildir.close()

    def __enter__(self) -> Inbox:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def watcher_mode(self) -> str:
        return self._watcher.mode if self._watcher else "none"

    # -- scanning ----------------------------------------------------------------------------

    def _load_handled(self) -> set[str]:
        if self._handled is None:
            self._handled = self.maildir.handled_ids()
            self._handled_count = len(self._handled)
        return self._handled

    def _scan(self) -> None:
        """Decode what is new in new/ (decoded messages are cached), quarantining what cannot
        be decoded. Names that left new/ leave the cache; heap entries of them are skipped."""
        started = time.monotonic()
        names = self.maildir.pending()
        if self._cache:
            live = set(names)
            for gone in [n for n in self._cache if n not in live]:
                del self._cache[gone]
        now = time.monotonic()
        self._relist_at = now + RELIST_AFTER_X * (now - started)
        self._looked_at = now
        self._scanned = True
        self._owed = False
        for name in names:
            if name in self._cache or name.startswith("."):
                continue
            try:
                msg = decode(self.maildir.read("new", name))
            except FileNotFoundError:
                continue  # claimed by another reader
            except (DecodeError, UnsafePathError) as exc:
                reason = exc.reason if isinstance(exc, DecodeError) else str(exc)
                self.maildir.quarantine("new", name, reason)
                self.quarantined += 1
                continue
            except OSError:
                continue  # a passing failure (EMFILE, EIO): the message stays for the next look
            prio = priority(msg, self.lead)
            self._cache[name] = (prio, msg)
            heapq.heappush(self._heap, (prio, name))
        if len(self._heap) > 2 * len(self._cache) + 64:
            self._heap = [(p, n) for n, (p, _) in self._cache.items()]
            heapq.heapify(self._heap)

    def _ordered(self) -> list[tuple[int, str, AnyMessage]]:
        return sorted((p, n, m) for n, (p, m) in self._cache.items())

    def _recover(self) -> list[Delivery]:
        """Messages left in cur/ by a crashed reader: acked if handled, else handled again."""
        if self._recovered is None:
            handled = self._load_handled()
            out = []
            for name in self.maildir.claimed():
                try:
                    msg = decode(self.maildir.read("cur", name))
                except OSError:
                    continue  # gone, or a passing failure: the next reader recovers it
                except (DecodeError, UnsafePathError) as exc:
                    reason = exc.reason if isinstance(exc, DecodeError) else str(exc)
                    self.maildir.quarantine("cur", name, reason)
                    self.quarantined += 1
                    continue
                if msg.id in handled:
                    self.maildir.ack(name)
                else:
                    out.append(Delivery(name, msg, redelivered=True))
            out.sort(key=lambda d: (priority(d.message, self.lead), d.name))
            self._recovered = out
            self.maildir.janitor()
        return self._recovered

    def peek(self) -> list[AnyMessage]:
        """Messages waiting in priority order, without claiming them (recovered ones first)."""
        with self._lock:
            recovered = [d.message for d in self._recover()]
            self._scan()
            return recovered + [m for _, _, m in self._ordered()]

    # -- receiving ---------------------------------------------------------------------------

    def receive(
        self, timeout: float | None = None, where: Callable[[AnyMessage], bool] | None = None
    ) -> Delivery | None:
        """Claim the next message by priority, waiting up to `timeout` s (None: forever).

        With `where`, only messages it accepts are claimed (others stay waiting). The caller
        must call `ack(delivery)` once the message's effect is done (or use `process`, which
        does that and keeps the handled log).
        """
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            woke = self._event.is_set()
            self._event.clear()
            with self._lock:
                recovered = self._recover()
                for i, delivery in enumerate(recovered):
                    if where is None or where(delivery.message):
                        return recovered.pop(i)
                # Look at new/ when woken (or on first use, or with nothing cached for a
                # while). With a backlog cached, a wake-up's look waits until RELIST_AFTER_X
                # times the last listing has passed: a backlog drains without listing the
                # directory for every message, and a message that came meanwhile (a
                # shutdown_request, say) is seen in its priority place after a bounded delay.
                self._owed = self._owed or woke
                if not self._scanned:
                    self._scan()
                elif not self._cache:
                    now = time.monotonic()
                    if (
                        self._owed
                        or (deadline is not None and now >= deadline)  # (it will not wait)
                        or now - self._looked_at >= IDLE_RELOOK_S
                    ):
                        self._scan()
                elif self._owed and time.monotonic() >= self._relist_at:
                    self._scan()
                got = self._claim_next(where)
                if got is None and self._owed:  # (what `where` wants may be in the look owed)
                    self._scan()
                    got = self._claim_next(where)
                if got is not None:
                    return got
                self._maybe_janitor()
            if deadline is None:
                self._event.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._event.wait(remaining)
            if self._interrupted:
                self._interrupted = False
                return None

    def _claim_next(self, where: Callable[[AnyMessage], bool] | None) -> Delivery | None:
        """Claim the best cached message (accepted by `where`); None when there is none."""
        if where is None:
            candidates: Iterator[tuple[str, AnyMessage]] = self._pop_heap()
        else:
            candidates = ((n, m) for _, n, m in self._ordered() if where(m))
        for name, msg in candidates:
            self._cache.pop(name, None)
            if not self.maildir.claim(name):
                continue
            if msg.id in self._load_handled():
                self.maildir.ack(name)  # effect already applied before a crash
                continue
            return Delivery(name, msg)
        return None

    def _pop_heap(self) -> Iterator[tuple[str, AnyMessage]]:
        while self._heap:
            _, name = heapq.heappop(self._heap)
            entry = self._cache.get(name)
            if entry is not None:
                yield name, entry[1]

    def ack(self, delivery: Delivery) -> None:
        """Record the message as handled, then remove it from cur/."""
        with self._lock:
            self.maildir.mark_handled(delivery.message.id, durable=self.durable)
            handled = self._load_handled()
            handled.add(delivery.message.id)
            self._handled_count += 1
            self.maildir.ack(delivery.name)
            if self._handled_count >= COMPACT_AFTER:
                self._compact()

    def _compact(self) -> None:
        in_cur = set()
        for name in self.maildir.claimed():
            with contextlib.suppress(FileNotFoundError, DecodeError, UnsafePathError, OSError):
                in_cur.add(decode(self.maildir.read("cur", name)).id)
        keep = self._load_handled() & in_cur
        self.maildir.compact_handled(keep)
        self._handled = keep
        self._handled_count = len(keep)

    def _maybe_janitor(self) -> None:
        now = time.monotonic()
        if now - self._last_janitor > JANITOR_INTERVAL_S:
            self._last_janitor = now
            self.maildir.janitor()

    def process(self, handler: Handler, timeout: float | None = None) -> Delivery | None:
        """Receive one message and run `handler` on it exactly once in effect.

        A raising handler is retried `max_attempts` times, then the message goes to `bad/`
        with the error. Returns the delivery (handled or quarantined), or None on timeout.
        """
        delivery = self.receive(timeout)
        if delivery is None:
            return None
        self.run_handler(handler, delivery)
        return delivery

    def run_handler(self, handler: Handler, delivery: Delivery) -> bool:
        """Run `handler` on a claimed delivery with retries; True if handled, False if bad."""
        error = ""
        for attempt in range(self.max_attempts):
            try:
                handler(delivery.message)
            except Exception as exc:
                error = "".join(traceback.format_exception_only(exc)).strip()
                time.sleep(RETRY_BACKOFF_S * (attempt + 1))
                continue
            self.ack(delivery)
            return True
        self.maildir.quarantine(
            "cur", delivery.name, f"handler failed {self.max_attempts} times: {error}"
        )
        self.quarantined += 1
        return False

    def iterate(self, timeout: float | None = None) -> Iterator[AnyMessage]:
        """Yield messages until none arrives within `timeout`; each is acked when the loop
        body moves on to the next one (so a crash inside the body redelivers it)."""
        while True:
            delivery = self.receive(timeout)
            if delivery is None:
                return
            yield delivery.message
            self.ack(delivery)

    def subscribe(self, callback: Handler) -> Subscription:
        """Run `callback` for every message on a background thread until the subscription stops."""
        sub = Subscription(self, callback)
        sub.start()
        return sub


class Subscription:
    """A background reader thread calling one callback per message."""

    def __init__(self, inbox: Inbox, callback: Handler) -> None:
        self.inbox = inbox
        self.callback = callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shoal-inbox", daemon=True)
        self.last_error: str | None = None

    def start(self) -> None:
        self.inbox.start()
        self._thread.start()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                # (`stop` interrupts the wait: no wake-up every so often to look at `_stop`,
                # which in an idle leader cost more than all else it does)
                delivery = self.inbox.receive(timeout=SUBSCRIPTION_WAIT_S)
                if delivery is not None:
                    self.inbox.run_handler(self.callback, delivery)
                failures = 0
            except Exception as exc:  # the reader must outlive a full disk or a vanished dir
                failures += 1
                self.last_error = repr(exc)
                self._stop.wait(min(5.0, 0.05 * 2**failures))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the message being handled (if any) is done."""
        self._stop.set()
        self.inbox.interrupt()
        self._thread.join(timeout)
