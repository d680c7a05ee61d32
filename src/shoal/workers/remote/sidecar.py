"""The sidecar file of a remote task, `sessions/{s}/remote/{id}.json`: what a resumed leader
needs to re-attach to its job (the job's id, the cluster, how far its log was read and how
long the output file was then), and how the task ended when that is not in the session's
state yet.

It is written at submit and after each read of the job's log, and deleted once the task's end
was notified (and the session's state, written at most every 0.2 s, surely shows it). A
leader killed in that short while leaves it behind: the next leader of the session sweeps the
sidecars of tasks that had ended (in the session's state, or evicted from it) at its first poll.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from shoal.core.jsonio import atomic_write, dumps
from shoal.core.tasks import AnyTaskState, RemoteAgentTaskState, TaskStatus
from shoal.workers.kinds import TaskStore

SIDECAR_DIR: Final = "remote"
SIDECAR_KEEP_S: Final = 2.0
"""An ended task's sidecar outlives its notification this long (the session's state, written
at most every 0.2 s, shows the end by then)."""
KEEP_ENV: Final = "SHOAL_RAY_SIDECAR_KEEP_S"
"""Overrides SIDECAR_KEEP_S (seconds): a test keeps an ended task's sidecar for a leader to be
killed while it is there."""


class Sidecars:
    """The sidecars of one leader's remote tasks (each kept in memory as last written), and
    the ended tasks whose sidecar is still to go."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[Path, dict[str, Any]]] = {}
        # Ended ids (when they ended): their sidecar goes once they are notified and the
        # session's state has surely been written since (its writes are throttled).
        self._ended: dict[str, float] = {}
        self._swept: set[Path] = set()  # the sidecar directories looked at once

    def write(self, task: RemoteAgentTaskState) -> None:
        """The task's sidecar: what re-attaching needs (the job, the cluster, how far its log
        was read and how long the output file was then), beside the session's state (written
        at submit, then after each read)."""
        meta = task.remote_task_metadata or {}
        path = sidecar_path(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "task_id": task.id,
            "submission_id": task.session_id,
            "address": meta.get("address"),
            "remote_task_type": task.remote_task_type,
            "title": task.title,
            "submitted": False,
            "log_offset": 0,
            "output_size": _size(Path(task.output_file)),
            "written_at": time.time(),
        }
        atomic_write(path, dumps(record))
        self._files[task.id] = (path, record)

    def progress(
        self, task_id: str, submission_id: str, *, submitted: bool, log_offset: int, output: Path
    ) -> None:
        """Record how far the job's log was read and the output file's size (after the lines
        were appended: a resumed leader cuts what a kill left after that size and reads it
        again, so that no line is lost or doubled)."""
        known = self._files.get(task_id)
        if known is None:
            return
        path, record = known
        record = {
            **record,
            "submission_id": submission_id,
            "submitted": submitted,
            "log_offset": log_offset,
            "output_size": _size(output),
            "written_at": time.time(),
        }
        self._files[task_id] = (path, record)
        atomic_write(path, dumps(record))

    def record_end(self, task_id: str, status: TaskStatus, changes: Mapping[str, Any]) -> None:
        """Write how the task ended into its sidecar, before the task moves: a leader killed
        before the session's state shows the end finds it there, and does not re-attach."""
        self.ended(task_id)
        known = self._files.get(task_id)
        if known is None:
            return
        path, record = known
        ended = {"status": status.value, "changes": orjson.loads(dumps(dict(changes)))}
        record = {**record, "ended": ended, "written_at": time.time()}
        self._files[task_id] = (path, record)
        with contextlib.suppress(OSError):
            atomic_write(path, dumps(record))

    def ended(self, task_id: str) -> None:
        """Task `task_id` has ended: its sidecar goes once its end was notified."""
        self._ended[task_id] = time.monotonic()

    def known(self, task: AnyTaskState, record: dict[str, Any]) -> None:
        """Keep `record`, read from the task's sidecar by a resumed leader, as last written."""
        self._files[task.id] = (sidecar_path(task), record)

    def sweep(self, directory: Path, store: TaskStore) -> None:
        """Once per session's sidecar directory: the sidecars this leader did not write or
        re-attach with whose task has ended in the session's state (or was evicted from it,
        which only an ended task is) go once notified, without waiting (that state is on
        disk already). A leader killed between a notification and the deletion left them."""
        if directory in self._swept:
            return
        self._swept.add(directory)
        try:
            paths = sorted(directory.glob("*.json"))
        except OSError:
            return
        for path in paths:
            task_id = path.stem
            if task_id in self._files:
                continue
            task = store.get(task_id)
            if task is None or task.is_terminal:
                self._files[task_id] = (path, {})
                self._ended.setdefault(task_id, -math.inf)

    def drop(self, store: TaskStore) -> None:
        """Delete the sidecars of ended tasks whose end was notified a while ago."""
        now = time.monotonic()
        keep = _keep_s()
        for task_id, ended_at in list(self._ended.items()):
            task = store.get(task_id)
            if (task is not None and not task.notified) or now - ended_at < keep:
                continue
            del self._ended[task_id]
            path = self._files.pop(task_id, (None, None))[0]
            if path is None and task is not None:
                path = sidecar_path(task)
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def sidecar_path(task: AnyTaskState) -> Path:
    """`sessions/{s}/remote/{id}.json` (the output file is in `sessions/{s}/tasks/`)."""
    return Path(task.output_file).parent.parent / SIDECAR_DIR / f"{task.id}.json"


def read_sidecar(task: AnyTaskState) -> dict[str, Any]:
    """The task's sidecar as written last ({} when it is gone, or not readable)."""
    try:
        data = orjson.loads(sidecar_path(task).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def cut_output(path: Path, size: object) -> None:
    """Cut the output file back to `size` bytes (what the sidecar's offset accounts for)."""
    if not isinstance(size, int) or size < 0:
        return
    with contextlib.suppress(OSError):
        if path.stat().st_size > size:
            os.truncate(path, size)


def _keep_s() -> float:
    try:
        return float(os.environ.get(KEEP_ENV) or SIDECAR_KEEP_S)
    except ValueError:
        return SIDECAR_KEEP_S


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
