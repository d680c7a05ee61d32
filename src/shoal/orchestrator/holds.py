"""Views' holds on tasks: a view that shows a task (`shoal ui`'s detail and output screens,
`shoal chat` following a query) asks the leader to hold it, and the held task is never
evicted (its record's `retain`) until the view lets go.

A hold is kept by the leader, in memory (`Holds`, a policy of its loop), and names the view's
process (pid and start time) with a lease: it ends on `release`, when that process is gone,
or when the lease runs out unrenewed (a view that hangs, or runs on a machine the pid means
nothing on). A view renews its hold well within the lease (`ViewHold` does it on a thread of
its own). A restarted leader carries the holds of its predecessor's records for one lease,
the time their views take to renew them with it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from shoal.core.errors import ShoalError, TaskError, UnknownTaskError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive, process_start_time

HOLD_LEASE_S: Final = 30.0
"""How long a hold lasts unrenewed."""
RENEW_EVERY: Final = 3
"""A view renews its hold this many times per lease."""
EARLIER_LEADER: Final = "(an earlier leader's view)"


@dataclass(frozen=True)
class Hold:
    """One view's hold on one task."""

    holder: str
    pid: int | None
    pid_started_at: float | None
    expires: float  # on the table's clock


class Holds:
    """The leader's table of holds, by task id then holder (a `Policy` of the loop: each
    step drops the holds that ended and clears `retain` of the tasks no one holds now)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        alive: Callable[[int | None, float | None], bool] = is_alive,
    ) -> None:
        self.clock = clock
        self.alive = alive
        self.held: dict[str, dict[str, Hold]] = {}
        self._carried = False

    def hold(
        self,
        leader: Any,
        task_id: str,
        holder: str,
        *,
        pid: int | None = None,
        pid_started_at: float | None = None,
        lease: float = HOLD_LEASE_S,
    ) -> dict[str, Any]:
        """Hold `task_id` for `holder` (again: its lease begins afresh); TaskError for a
        task that is not in the registry (any more)."""
        task = leader.registry.get(task_id)
        if task is None:
            if task_id in leader.history():
                raise TaskError(
                    f"task {task_id} has ended and left the registry; there is nothing to hold"
                )
            raise UnknownTaskError(task_id, leader.team)
        if not holder.strip():
            raise TaskError("a hold needs the holder's name")
        self._carry(leader)
        lease = min(max(lease, 0.1), 10 * HOLD_LEASE_S)
        self.held.setdefault(task_id, {})[holder] = Hold(
            holder, pid, pid_started_at, self.clock() + lease
        )
        leader.set_task(task_id, retain=True)
        return {"task_id": task_id, "holders": len(self.held[task_id]), "lease_s": lease}

    def release(self, leader: Any, task_id: str, holder: str) -> dict[str, Any]:
        """Let go of `holder`'s hold on `task_id` (none: nothing happens)."""
        holds = self.held.get(task_id, {})
        holds.pop(holder, None)
        if not holds:
            self.held.pop(task_id, None)
            leader.set_task(task_id, retain=False)  # (a task gone meanwhile: a no-op)
        return {"task_id": task_id, "holders": len(holds)}

    def holders(self, task_id: str) -> list[str]:
        """Who holds `task_id` now."""
        return sorted(self.held.get(task_id, {}))

    def _carry(self, leader: Any) -> None:
        """Once, first: the tasks the records say are held (a restarted leader's) are held
        for one lease, until their views renew their holds here."""
        if self._carried:
            return
        self._carried = True
        until = self.clock() + HOLD_LEASE_S
        for task in leader.registry.get_all_tasks():
            if task.retain and task.id not in self.held:
                self.held[task.id] = {EARLIER_LEADER: Hold(EARLIER_LEADER, None, None, until)}

    # -- the policy ----------------------------------------------------------------------------

    def on_event(self, event: Any) -> None:
        """(Events change no hold.)"""

    def step(self, leader: Any, now: float) -> None:
        """Drop holds whose lease ran out or whose view is gone, and holds on tasks that left
        the registry; a task no one holds any more is free to go."""
        self._carry(leader)
        if not self.held:
            return
        at = self.clock()
        for task_id in list(self.held):
            holds = self.held[task_id]
            if task_id not in leader.registry:
                del self.held[task_id]
                continue
            for holder, hold in list(holds.items()):
                if hold.expires <= at or (
                    hold.pid is not None and not self.alive(hold.pid, hold.pid_started_at)
                ):
                    del holds[holder]
            if not holds:
                del self.held[task_id]
                leader.set_task(task_id, retain=False)

    def next_due(self) -> float | None:
        """(Leases are checked at each tick: a second late is no harm.)"""
        return None


class ViewHold:
    """A view's side: hold the task it shows (`show(task_id)`; None: none), renewed on a
    daemon thread every lease / RENEW_EVERY, released when it shows another or `close`s.
    No leader running: nothing to hold (and nothing evicts); a refusal is kept in `error`."""

    def __init__(self, layout: Layout, team: str, holder: str, lease: float = HOLD_LEASE_S):
        self.layout, self.team = layout, team
        pid = os.getpid()
        self.holder = f"{holder}:{pid}"
        self.args = {"holder": self.holder, "pid": pid, "pid_started_at": process_start_time(pid)}
        self.lease = lease
        self.error: str | None = None
        self._want: str | None = None
        self._held: str | None = None
        self._wake = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="view-hold", daemon=True)
        self._thread.start()

    def show(self, task_id: str | None) -> None:
        """Hold `task_id` from now on (and let go of the one held before)."""
        if task_id != self._want:
            self._want = task_id
            self._wake.set()

    def close(self) -> None:
        """Let go of the held task and stop renewing."""
        self._closed = True
        self._want = None
        self._wake.set()
        self._thread.join(timeout=10)

    def _call(self, op: str, args: dict[str, Any]) -> None:
        from shoal.channel.client import NoLeaderError, call

        try:
            call(self.layout, self.team, op, args, timeout=10)
            self.error = None
        except NoLeaderError:
            pass
        except ShoalError as exc:
            self.error = str(exc)

    def _run(self) -> None:
        while True:
            want = self._want
            if self._held is not None and self._held != want:
                self._call("release", {"task_id": self._held, "holder": self.holder})
                self._held = None
            if want is not None:
                self._call("hold", {"task_id": want, "lease_s": self.lease, **self.args})
                self._held = want if self.error is None else None
            if self._closed and self._held is None:
                return
            self._wake.wait(self.lease / RENEW_EVERY)
            self._wake.clear()
