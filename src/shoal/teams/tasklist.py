"""The shared task list of a team: one JSON file per item, one lock for the whole list.

`teams/{team}/tasklist/{id}.json` holds one item; `.lock` (core.jsonio's backing-off lock,
never deleted) guards every read-modify-write, so claiming is atomic across processes;
`.highwatermark` holds the highest id ever issued, so ids are never reused, even after the
highest one is deleted. Reads need no lock (every write is an atomic replace). A file that
fails validation is reported with its path and never overwritten. An item's status moves only
as TRANSITIONS allows, checked in one place (`move_item`) by every writer.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from shoal.core.clock import iso_now
from shoal.core.errors import (
    ConflictError,
    CorruptFileError,
    NotFoundError,
    UsageError,
)
from shoal.core.jsonio import (
    LockTimeoutError,
    ShoalLock,
    atomic_write,
    dumps,
    lock_at,
    read_bytes_nofollow,
)
from shoal.core.names import validate_name
from shoal.core.paths import check_path, unsafe_reason
from shoal.core.validation import first_error
from shoal.mailbox.router import send
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import MemberState, Teams
from shoal.teams.taskitems import (
    DELETED,
    UNSET,
    UPDATE_STATUSES,
    Notify,
    TaskItem,
    TaskItemStatus,
    TaskSnapshot,
    _Unset,
    check_claim,
    check_id,
    check_metadata,
    check_subject,
    checked_blockers,
    edge_edits,
    first_claimable,
    move_item,
)

log = logging.getLogger(__name__)


LOCK_NAME = ".lock"
HIGHWATERMARK_NAME = ".highwatermark"
_ITEM_FILE = re.compile(r"^([1-9][0-9]*)\.json$")


class TaskList:
    """The shared task list of one team."""

    def __init__(
        self,
        teams: Teams,
        team: str,
        *,
        notify: Notify | None = None,
        durable: bool = False,
    ) -> None:
        self.teams = teams
        self.team = validate_name(team, "team name")
        self.layout = teams.layout
        self.notify: Notify = notify or self._send_assignment
        self.durable = durable
        # The last failure to tell a new owner about its task (None when the last add or update
        # notified fine or had nobody to notify). The update itself is never undone by it.
        self.last_notify_error: Exception | None = None
        self._lock: ShoalLock | None = None

    # -- paths and locking -------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """`teams/{team}/tasklist` (pure path arithmetic)."""
        return self.layout.tasklist_dir(self.team)

    def path(self, task_id: int) -> Path:
        """The file of task `task_id`."""
        return self.directory / f"{check_id(task_id)}.json"

    def _dir(self) -> Path:
        """The list's directory, created safely for an existing team (no symlinks anywhere)."""
        if not self.teams.exists(self.team):
            self.teams.read(self.team)  # raises the friendly NotFoundError
        return self.layout.ensure(self.directory)

    @contextmanager
    def _locked(self) -> Iterator[Path]:
        """Hold the list's lock (a flock, see core.jsonio); yields the directory."""
        directory = self._dir()
        lock_path = directory / LOCK_NAME
        check_path(lock_path, "file")
        if self._lock is None:
            self._lock = lock_at(lock_path)
        try:
            self._lock.acquire()
        except LockTimeoutError as exc:
            raise LockTimeoutError(f"the task list of team {self.team!r}: {exc}") from None
        try:
            yield directory
        finally:
            self._lock.release()

    # -- reading -----------------------------------------------------------------------------

    def _ids_on_disk(self, directory: Path) -> builtins.list[int]:
        """Ids of every item file (valid or not) in the directory, sorted."""
        ids: builtins.list[int] = []
        with os.scandir(directory) as entries:
            for entry in entries:
                m = _ITEM_FILE.fullmatch(entry.name)
                if m:
                    ids.append(int(m.group(1)))
        return sorted(ids)

    def _read(self, directory: Path, task_id: int) -> TaskItem:
        path = directory / f"{task_id}.json"
        try:
            raw = _read_regular(path)
        except FileNotFoundError:
            raise NotFoundError(
                f"no task {task_id} in team {self.team!r} (see `shoal task list`)"
            ) from None
        try:
            item = TaskItem.model_validate(orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            raise CorruptFileError(path, f"not valid JSON ({exc})") from None
        except ValidationError as exc:
            raise CorruptFileError(
                path, f"invalid task item: {first_error(exc, count=True)}"
            ) from None
        if item.id != task_id:
            raise CorruptFileError(path, f"holds id {item.id}, not the {task_id} of its name")
        return item

    def _snapshot(self, directory: Path) -> TaskSnapshot:
        snap = TaskSnapshot()
        for task_id in self._ids_on_disk(directory):
            try:
                snap.items[task_id] = self._read(directory, task_id)
            except CorruptFileError as exc:
                snap.errors[task_id] = exc
            except NotFoundError:
                continue  # deleted while we looked (only possible outside the lock)
        return snap

    def _partial(self, directory: Path, task_ids: Iterable[int]) -> TaskSnapshot:
        """A snapshot of just the named items (missing ones left out)."""
        snap = TaskSnapshot()
        for task_id in task_ids:
            try:
                snap.items[task_id] = self._read(directory, check_id(task_id))
            except CorruptFileError as exc:
                snap.errors[task_id] = exc
            except NotFoundError:
                continue
        return snap

    def _existing(self, snap: TaskSnapshot, task_id: int) -> TaskItem:
        """Task `task_id` of `snap`; its file's error if corrupt, NotFoundError if absent."""
        if task_id in snap.errors:
            raise snap.errors[task_id]
        item = snap.items.get(task_id)
        if item is None:
            raise NotFoundError(f"no task {task_id} in team {self.team!r} (see `shoal task list`)")
        return item

    def get(self, task_id: int) -> TaskItem:
        """Task `task_id`; NotFoundError naming id and team, CorruptFileError naming the file."""
        check_id(task_id)
        return self._read(self._dir(), task_id)

    def snapshot(self) -> TaskSnapshot:
        """Every item file, read now (valid items and corrupt files by id), without the lock."""
        return self._snapshot(self._dir())

    def list_with_errors(self) -> tuple[builtins.list[TaskItem], builtins.list[CorruptFileError]]:
        """All valid items sorted by id, and one error per file that failed validation."""
        snap = self.snapshot()
        return snap.sorted(), [snap.errors[i] for i in sorted(snap.errors)]

    def list(self) -> builtins.list[TaskItem]:
        """All valid items sorted by id; corrupt files are logged and left out (see
        `list_with_errors` to report them)."""
        items, errors = self.list_with_errors()
        for exc in errors:
            log.warning("skipping corrupt task file: %s", exc)
        return items

    def open_blockers(self, task: TaskItem) -> builtins.list[int]:
        """Ids of `task`'s blockers that are not completed (unreadable ones count as open)."""
        return self._partial(self._dir(), task.blocked_by).open_blockers(task)

    def is_blocked(self, task: TaskItem) -> bool:
        """True while any task in `task.blocked_by` is not completed."""
        return bool(self.open_blockers(task))

    def next_claimable(self, name: str, max_failures: int | None = None) -> TaskItem | None:
        """The lowest-id pending, unblocked task that is unowned or owned by `name` (and has
        failed fewer than `max_failures` times, when given)."""
        validate_name(name, "member name")
        return first_claimable(self._snapshot(self._dir()), name, max_failures)

    # -- writing -----------------------------------------------------------------------------

    def _write(self, directory: Path, item: TaskItem) -> None:
        atomic_write(directory / f"{item.id}.json", dumps(item, pretty=True), durable=self.durable)

    def _read_highwatermark(self, directory: Path) -> int:
        path = directory / HIGHWATERMARK_NAME
        try:
            raw = _read_regular(path)
        except FileNotFoundError:
            return 0
        text = raw.decode("ascii", "replace").strip()
        if not text.isdigit() or not text.isascii():
            raise CorruptFileError(
                path, f"holds {text[:40]!r}, not the highest task id issued (a whole number)"
            )
        return int(text)

    def _raise_highwatermark(self, directory: Path, task_id: int) -> None:
        if self._read_highwatermark(directory) < task_id:
            atomic_write(
                directory / HIGHWATERMARK_NAME, f"{task_id}\n".encode(), durable=self.durable
            )

    def _check_member(self, name: str) -> str:
        """`name` if it is a current member of the team; else a clear error."""
        validate_name(name, "member name")
        tf = self.teams.read(self.team)
        member = tf.member(name)
        if member is None:
            known = ", ".join(m.name for m in tf.members)
            raise NotFoundError(
                f"no member {name!r} in team {self.team!r} (members: {known}); "
                f"add it with `shoal team join {self.team} {name}`"
            )
        if not member.is_active:
            raise ConflictError(
                f"member {name!r} has left team {self.team!r}; it cannot own tasks until it "
                "joins again"
            )
        return name

    def add(
        self,
        subject: str,
        *,
        description: str = "",
        active_form: str | None = None,
        blocked_by: Iterable[int] = (),
        metadata: Mapping[str, Any] | None = None,
        owner: str | None = None,
        assigned_by: str | None = None,
    ) -> TaskItem:
        """Add a pending task with the next id; it is added to each blocker's `blocks`.

        With `owner`, the owner is told through `notify` once the task is written.
        """
        self.last_notify_error = None
        subject = check_subject(subject)
        meta = check_metadata(metadata)
        if owner is not None:
            self._check_member(owner)
        if assigned_by is not None:
            validate_name(assigned_by, "assigned-by name")
        wanted = list(blocked_by)
        with self._locked() as directory:
            # Only the blockers are read: adding stays cheap however long the list grows.
            snap = self._partial(directory, wanted)
            blockers = checked_blockers(snap, wanted, "--blocked-by", self.team)
            new_id = max([*self._ids_on_disk(directory), self._read_highwatermark(directory)]) + 1
            now = iso_now()
            item = TaskItem(
                id=new_id,
                subject=subject,
                description=description,
                active_form=active_form,
                owner=owner,
                blocked_by=tuple(blockers),
                metadata=meta,
                created_at=now,
                updated_at=now,
            )
            # The high-water mark first: a crash after it only skips an id, never reuses one.
            self._raise_highwatermark(directory, new_id)
            self._write(directory, item)
            for bid in blockers:
                blocker = snap.items[bid]
                self._write(
                    directory,
                    blocker.model_copy(
                        update={"blocks": (*blocker.blocks, new_id), "updated_at": now}
                    ),
                )
        if owner is not None:
            self._notify(item, assigned_by)
        return item

    def update(
        self,
        task_id: int,
        *,
        status: str | None = None,
        owner: str | _Unset | None = UNSET,
        subject: str | None = None,
        description: str | None = None,
        active_form: str | _Unset | None = UNSET,
        metadata: Mapping[str, Any] | None = None,
        add_blocked_by: Iterable[int] = (),
        add_blocks: Iterable[int] = (),
        assigned_by: str | None = None,
    ) -> TaskItem:
        """Change a task under the lock and return it as written.

        A status move must be allowed by TRANSITIONS (else IllegalStatusMove: nothing is
        written, and the CLI exits 1). `status="deleted"` deletes it (see `delete`) and returns
        its last state. `owner` must be a current member (None clears it); a new owner is told
        through `notify` after the write (a failed notice never undoes the update: see
        `last_notify_error`). `metadata` is merged into the task's (a key set to None is
        removed). `add_blocked_by` / `add_blocks` add dependency edges on both sides; an unknown
        id, the task itself or a cycle is refused.
        """
        self.last_notify_error = None
        check_id(task_id)
        if status is not None and status not in UPDATE_STATUSES:
            raise UsageError(
                f"invalid status {status!r} for task {task_id}; use one of "
                + ", ".join(UPDATE_STATUSES)
            )
        if status == DELETED:
            return self._delete(task_id)
        if subject is not None:
            subject = check_subject(subject)
        meta = check_metadata(metadata) if metadata is not None else None
        if isinstance(owner, str):
            self._check_member(owner)
        if assigned_by is not None:
            validate_name(assigned_by, "assigned-by name")
        wanted_by = list(add_blocked_by)
        wanted_blocks = list(add_blocks)
        with self._locked() as directory:
            snap = self._snapshot(directory)
            old = self._existing(snap, task_id)
            changes: dict[str, Any] = {}
            if not isinstance(owner, _Unset):
                changes["owner"] = owner
            if subject is not None:
                changes["subject"] = subject
            if description is not None:
                changes["description"] = description
            if not isinstance(active_form, _Unset):
                changes["active_form"] = active_form
            if meta is not None:
                merged = {**old.metadata, **meta}
                changes["metadata"] = {k: v for k, v in merged.items() if v is not None}
            edits = edge_edits(snap, task_id, wanted_by, wanted_blocks, self.team)
            if edits:
                old = edits.pop(task_id, old)
            # An illegal move raises here, before anything is written.
            new = move_item(old, status if status is not None else old.status, **changes)
            if new != snap.items[task_id]:
                new = new.model_copy(update={"updated_at": iso_now()})
                self._write(directory, new)
            for other in edits.values():
                self._write(directory, other.model_copy(update={"updated_at": iso_now()}))
        if isinstance(owner, str) and owner != snap.items[task_id].owner:
            self._notify(new, assigned_by)
        return new

    def reset(self) -> int:
        """Empty the list, as the seed's resetTaskList when a team is created (Team = Project
        = TaskList: a new team never inherits the items an earlier team of its name left).
        Every item file goes, under the lock; the high-water mark is raised to the highest id
        first, so none of their ids is issued again. Returns how many items were removed."""
        with self._locked() as directory:
            ids = self._ids_on_disk(directory)
            if ids:
                self._raise_highwatermark(directory, ids[-1])
            for task_id in ids:
                os.unlink(directory / f"{task_id}.json")
        return len(ids)

    def delete(self, task_id: int) -> None:
        """Remove the task's file and its id from every other task's blocks/blocked_by.

        The id stays issued (the high-water mark is raised to it if needed), so it is never
        given to a new task.
        """
        self._delete(task_id)

    def _delete(self, task_id: int) -> TaskItem:
        check_id(task_id)
        with self._locked() as directory:
            snap = self._snapshot(directory)
            item = self._existing(snap, task_id)
            self._raise_highwatermark(directory, task_id)
            os.unlink(directory / f"{task_id}.json")
            for other in snap.sorted():
                if other.id == task_id:
                    continue
                if task_id in other.blocks or task_id in other.blocked_by:
                    self._write(
                        directory,
                        other.model_copy(
                            update={
                                "blocks": tuple(i for i in other.blocks if i != task_id),
                                "blocked_by": tuple(i for i in other.blocked_by if i != task_id),
                                "updated_at": iso_now(),
                            }
                        ),
                    )
        return item

    # -- claiming ----------------------------------------------------------------------------

    def claim(self, task_id: int, name: str, *, check_busy: bool = True) -> TaskItem:
        """Make `name` the owner of task `task_id` and set it in progress, atomically.

        Refused with ClaimRefused: `already_resolved` (completed), `already_claimed` (another
        owner), `blocked` (an open blocker), `agent_busy` (`name` has another task in progress,
        when `check_busy`). Claiming one's own in-progress task again returns it unchanged.
        No task_assignment is sent: the claimant is the one who asked.
        """
        check_id(task_id)
        self._check_member(name)
        with self._locked() as directory:
            snap = self._snapshot(directory)
            item = self._existing(snap, task_id)
            check_claim(snap, item, name, check_busy)
            if item.owner == name and item.status == TaskItemStatus.IN_PROGRESS:
                return item
            claimed = move_item(item, TaskItemStatus.IN_PROGRESS, owner=name, updated_at=iso_now())
            self._write(directory, claimed)
            return claimed

    def claim_next(self, name: str, max_failures: int | None = None) -> TaskItem | None:
        """Find and claim the next claimable task for `name` in one locked step, passing over
        unowned tasks whose turns failed `max_failures` times or more (they wait for an
        assignment, and do not hold up the tasks behind them).

        None when nothing is claimable or `name` already has a task in progress.
        """
        self._check_member(name)
        with self._locked() as directory:
            snap = self._snapshot(directory)
            if snap.in_progress_of(name):
                return None
            item = first_claimable(snap, name, max_failures)
            if item is None:
                return None
            claimed = move_item(item, TaskItemStatus.IN_PROGRESS, owner=name, updated_at=iso_now())
            self._write(directory, claimed)
            return claimed

    def settle_claim(
        self, task_id: int, name: str, *, completed: bool, error: str | None = None
    ) -> TaskItem | None:
        """End `name`'s claim on task `task_id` in one locked step, if it still holds it (in
        progress, owned by `name`): completed, or back to pending with no owner, a failure
        counted (`metadata.failures` + 1, `last_error`) when `error` is given. None when the
        claim is no longer `name`'s (settled or released by someone else first): nothing is
        written, so a task is never completed or charged a failure twice."""
        check_id(task_id)
        validate_name(name, "member name")
        with self._locked() as directory:
            item = self._existing(self._partial(directory, [task_id]), task_id)
            if item.owner != name or item.status != TaskItemStatus.IN_PROGRESS:
                return None
            if completed:
                new = move_item(item, TaskItemStatus.COMPLETED, updated_at=iso_now())
            else:
                changes: dict[str, Any] = {"owner": None, "updated_at": iso_now()}
                if error is not None:
                    failures = int(item.metadata.get("failures", 0) or 0) + 1
                    changes["metadata"] = {
                        **item.metadata,
                        "failures": failures,
                        "last_error": error,
                    }
                new = move_item(item, TaskItemStatus.PENDING, **changes)
            self._write(directory, new)
            return new

    def release_member(self, name: str) -> builtins.list[TaskItem]:
        """Return every unfinished task owned by `name` to pending with no owner."""
        validate_name(name, "member name")
        released: builtins.list[TaskItem] = []
        with self._locked() as directory:
            for item in self._snapshot(directory).sorted():
                if item.owner == name and not item.resolved:
                    new = move_item(item, TaskItemStatus.PENDING, owner=None, updated_at=iso_now())
                    self._write(directory, new)
                    released.append(new)
        return released

    def orphaned_owners(self, skip: Collection[str] = ()) -> builtins.list[str]:
        """The owners of unfinished tasks that are gone: not in the team file, departed, or
        dead (a recorded process that no longer runs), leaving out those in `skip`."""
        owners = {i.owner for i in self.list() if i.owner is not None and not i.resolved} - set(
            skip
        )
        if not owners:  # (an idle team: no member's liveness to look up)
            return []
        views = {v.member.name: v for v in self.teams.members(self.team)}
        gone: set[str] = set()
        for owner in owners:
            view = views.get(owner)
            if (
                view is None
                or view.state is MemberState.LEFT
                or (view.state is MemberState.DEAD and view.member.pid is not None)
            ):
                gone.add(owner)
        return sorted(gone)

    # -- notifying ---------------------------------------------------------------------------

    def _notify(self, item: TaskItem, assigned_by: str | None) -> None:
        """Tell the new owner; a failure is logged and kept, never raised (the write stands)."""
        try:
            self.notify(item, assigned_by)
        except Exception as exc:
            self.last_notify_error = exc
            log.warning(
                "task %s was assigned to %s, but the task_assignment was not delivered: %s",
                item.id,
                item.owner,
                exc,
            )

    def _send_assignment(self, item: TaskItem, assigned_by: str | None) -> None:
        """Default `notify`: a `task_assignment` message into the new owner's inbox."""
        if item.owner is None:
            return
        sender = assigned_by or LEAD_NAME
        if sender == item.owner:
            return  # assigning a task to oneself needs no message
        send(
            self.teams.directory(self.team),
            to=item.owner,
            sender=sender,
            kind="task_assignment",
            text=f"{sender} assigned you task {item.id}: {item.subject}",
            summary=f"task {item.id}: {item.subject}"[:200],
            data={
                "task_id": item.id,
                "subject": item.subject,
                "description": item.description,
                "assigned_by": sender,
            },
        )


# -- helpers -------------------------------------------------------------------------------


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file; a symlink, FIFO, directory or unreadable file is a
    CorruptFileError naming it (FileNotFoundError passes through)."""
    reason = unsafe_reason(os.lstat(path), "file")
    if reason is not None:
        raise CorruptFileError(path, reason)
    try:
        return read_bytes_nofollow(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptFileError(path, "is a symlink; refusing to follow it") from None
        raise CorruptFileError(path, f"cannot read: {exc.strerror}") from None
