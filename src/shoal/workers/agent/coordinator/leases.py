"""Write-set leases of coordinator mode: one writer per set of files, enforced.

`sessions/{s}/leases.json`, changed only under its lock (`leases.json.lock`):

    {"v": 1, "fence": 7, "leases": {"a1b2c3d4e": {"fence": 7, "write_set": ["src/*.py"],
                                                  "cwd": "/abs/dir", "acquired_at": 1.7e9}},
     "released": [{..., "holder": "a0...", "released_at": 1.7e9}]}   (the last 100)

A worker with a write set takes a lease before it starts; one whose set overlaps a live lease
waits (`pending`) and is started when the holder ends. Every lease carries the next fencing
number, so a late write of a holder that lost its lease can be told from the new holder's. A
lease is released when its holder's task and the shells it started have ended, and only then
(never by a timer alone); a lease whose holder is no longer alive is dropped at the next
acquire.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from shoal.core.errors import CorruptFileError, ShoalError
from shoal.core.faults import pause_point
from shoal.core.jsonio import atomic_write, lock_for
from shoal.core.tasks import LocalAgentTaskState, TaskStatus, TaskType
from shoal.core.writeset import overlaps

LEASES_FILE: Final = "leases.json"
RELEASED_KEPT: Final = 100  # released leases remembered (with when), newest last


def _absolute(cwd: str, write_set: Sequence[str]) -> list[str]:
    root = os.path.realpath(cwd).strip("/")  # (a cwd reached through a link is the same)
    return [f"{root}/{glob}" if root else glob for glob in write_set]


class Leases:
    """The write-set leases of one session."""

    def __init__(self, session_dir: Path) -> None:
        self.path = session_dir / LEASES_FILE
        self._lock = lock_for(self.path)

    def _load(self) -> dict[str, Any]:
        try:
            data = orjson.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {"v": 1, "fence": 0, "leases": {}}
        except orjson.JSONDecodeError as exc:
            raise CorruptFileError(self.path, str(exc)) from None
        if not isinstance(data, dict) or not isinstance(data.get("leases"), dict):
            raise CorruptFileError(self.path, "not a leases file")
        return data

    def _save(self, data: dict[str, Any]) -> None:
        atomic_write(self.path, orjson.dumps(data, option=orjson.OPT_INDENT_2))

    def held(self) -> dict[str, dict[str, Any]]:
        """The live leases by holder task id."""
        with self._lock:
            return dict(self._load()["leases"])

    def acquire(
        self,
        holder: str,
        write_set: Sequence[str],
        cwd: str,
        alive: Callable[[str], bool],
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Take a lease on `write_set` for task `holder`: (the lease, None), or (None, the id
        of the live holder whose write set overlaps). Leases of holders that are not `alive`
        are dropped first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            data = self._load()
            leases: dict[str, Any] = data["leases"]
            for other in [h for h in leases if h != holder and not alive(h)]:
                del leases[other]
            if holder in leases:
                return leases[holder], None
            mine = _absolute(cwd, write_set)
            for other, lease in leases.items():
                if overlaps(mine, _absolute(lease["cwd"], lease["write_set"])):
                    return None, other
            data["fence"] = int(data.get("fence", 0)) + 1
            lease = {
                "fence": data["fence"],
                "write_set": list(write_set),
                "cwd": os.path.realpath(cwd),
                "acquired_at": time.time(),
            }
            leases[holder] = lease
            self._save(data)
            return lease, None

    def release(self, holder: str) -> bool:
        """Drop `holder`'s lease (its task ended); False when it held none."""
        if not self.path.exists():
            return False
        with self._lock:
            data = self._load()
            lease = data["leases"].pop(holder, None)
            if lease is None:
                return False
            # (kept a while, so a change made under it is still told from a violation)
            released = [*data.get("released", []), {**lease, "holder": holder,
                                                    "released_at": time.time()}]  # fmt: skip
            data["released"] = released[-RELEASED_KEPT:]
            self._save(data)
            return True


class LeasePolicy:
    """The leader's side of leases (a policy of its loop): a worker with a write set starts
    only once it holds its lease; one that must wait stays `pending` with what it waits for,
    and is started when the holder ends; a holder's lease is released when its task ends."""

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        self.waiting: list[str] = []  # worker task ids, in the order they asked
        self.holders: set[str] = set()
        self._synced = False

    def admit(self, leader: Any, task: LocalAgentTaskState) -> bool:
        """Take `task`'s lease now (True: start it) or list it as waiting (False)."""
        assert task.write_set is not None
        lease, holder = self.leases.acquire(
            task.id, task.write_set, task.cwd or os.getcwd(), lambda h: _alive(leader, h)
        )
        if lease is None:
            leader.set_task(
                task.id, waiting_for={"lease": holder, "write_set": list(task.write_set)}
            )
            if task.id not in self.waiting:
                self.waiting.append(task.id)
                leader.note(f"worker {task.id} waits for the lease of {holder}")
            return False
        self.holders.add(task.id)
        leader.set_task(task.id, lease=lease, waiting_for=None)
        pause_point("lease-taken")
        return True

    def on_event(self, event: Any) -> None:
        pass

    def step(self, leader: Any, now: float) -> None:
        if not self._synced:  # (a resumed session's leases: released as their holders end)
            self._synced = True
            try:
                self.holders.update(self.leases.held())
            except ShoalError as exc:
                leader.note(f"could not read the session's leases: {exc}")
        ended = [h for h in self.holders if not _alive(leader, h)]
        for holder in ended:
            self.holders.discard(holder)
            self.leases.release(holder)
        for task_id in list(self.waiting):
            task = leader.registry.get(task_id)
            if not isinstance(task, LocalAgentTaskState) or task.status != TaskStatus.PENDING:
                self.waiting.remove(task_id)  # (stopped while it waited)
                continue
            if self.admit(leader, task):
                self.waiting.remove(task_id)
                leader.queue.append(task_id)
                leader.start_pending()

    def next_due(self) -> float | None:
        return None


def _alive(leader: Any, task_id: str) -> bool:
    """A holder is alive while its task runs, and then while any shell it started runs (a
    background command of a finished worker may still be writing its files)."""
    task = leader.registry.get(task_id)
    if task is not None and not task.is_terminal:
        return True
    return any(
        t.type == TaskType.LOCAL_BASH and t.owner == task_id and not t.is_terminal
        for t in leader.registry.get_all_tasks()
    )
