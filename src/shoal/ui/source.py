"""What the views show and do: a snapshot of a team read from its files, and its actions.

`SwarmSource` is the interface the board and the app use; `FileSource` reads the team file,
member status files and the session's `state.json`, `history.jsonl` and `events.jsonl`, and
acts through the leader's control channel (stop) and the mailbox (messages, plan approval).
No new protocol.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from shoal.core.errors import NotFoundError, ShoalError, UsageError
from shoal.core.output import output_size, read_output_delta, tail_lines
from shoal.core.paths import Layout
from shoal.core.tasks import TERMINAL_STATUSES, AnyTaskState, parse_task_state
from shoal.mailbox.store import Maildir
from shoal.teams.models import LEAD_NAME
from shoal.teams.session import HistoryReader, Session
from shoal.teams.store import Teams
from shoal.teams.taskitems import TaskSnapshot, failures_of
from shoal.teams.tasklist import TaskList
from shoal.ui.pill import pill_for
from shoal.ui.status import (
    TeammateFacts,
    member_activity,
    parse_timestamp,
    teammate_facts_from_status,
)

JsonDict = dict[str, Any]

EVENTS_TAIL_BYTES = 256 * 1024
RECENT_EVENTS = 50
FINISHED_STATUSES = frozenset(s.value for s in TERMINAL_STATUSES)


@dataclass(frozen=True)
class ListRow:
    """One item of the team's shared task list, as the views show it."""

    id: int
    subject: str
    status: str
    owner: str | None = None
    open_blockers: tuple[int, ...] = ()
    failures: int = 0


def list_rows(snap: TaskSnapshot) -> tuple[list[ListRow], list[str]]:
    """Rows of a task-list snapshot, and one error line per corrupt item."""
    rows = [
        ListRow(
            id=item.id,
            subject=item.subject,
            status=item.status.value,
            owner=item.owner,
            open_blockers=tuple(snap.open_blockers(item)),
            failures=failures_of(item),
        )
        for item in snap.sorted()
    ]
    return rows, [f"task list item {i}: {err}" for i, err in sorted(snap.errors.items())]


@dataclass(frozen=True)
class TaskRow:
    """One task: its JSON record (for the pure helpers) and its validated state (None if bad)."""

    record: JsonDict
    state: AnyTaskState | None = None
    error: str | None = None

    @property
    def id(self) -> str:
        return str(self.record.get("id", "?"))

    @property
    def type(self) -> str:
        return str(self.record.get("type", "?"))

    @property
    def status(self) -> str:
        return str(self.record.get("status", "?"))

    @property
    def start_time(self) -> float:
        start = self.record.get("start_time")
        return float(start) if isinstance(start, int | float) else 0.0

    @property
    def end_time(self) -> float | None:
        end = self.record.get("end_time")
        return float(end) if isinstance(end, int | float) else None

    @property
    def finished(self) -> bool:
        """True once the task completed, failed or was killed (it will not change again)."""
        return self.status in FINISHED_STATUSES

    @property
    def output_file(self) -> str | None:
        path = self.record.get("output_file")
        return str(path) if path else None

    @property
    def message_target(self) -> str | None:
        """The member a message about this task goes to (a teammate, or the task's agent)."""
        if self.type == "in_process_teammate":
            identity = self.record.get("identity")
            if isinstance(identity, Mapping) and identity.get("agent_name"):
                return str(identity["agent_name"])
        agent = self.record.get("agent_id")
        if isinstance(agent, str) and agent:
            return agent.split("@", 1)[0]
        return None


@dataclass(frozen=True)
class MemberRow:
    """One team member with its derived state and what its status file says."""

    name: str
    state: str
    color: str | None = None
    agent_type: str = "worker"
    started_at: float = 0.0
    pid: int | None = None
    backend: str | None = None
    prompt: str | None = None
    status: JsonDict = field(default_factory=dict)
    pending_plan: JsonDict | None = None
    """{request_id, plan} of the plan this member waits on (see `waiting_plan`)."""

    @property
    def is_lead(self) -> bool:
        return self.name == LEAD_NAME

    @property
    def facts(self) -> TeammateFacts:
        return teammate_facts_from_status(self.status, self.state)

    @property
    def activity(self) -> str:
        """The activity line: stopping, awaiting approval, idle, activity, working ("" if gone)."""
        if self.is_lead and self.state not in ("dead", "left"):
            return "leading"
        return member_activity(self.state, self.facts)


@dataclass(frozen=True)
class Snapshot:
    """Everything the views show at one moment; `errors` says what could not be read."""

    team: str
    taken_at: float
    session_id: str | None = None
    leader_pid: int | None = None
    tasks: tuple[TaskRow, ...] = ()
    members: tuple[MemberRow, ...] = ()
    events: tuple[JsonDict, ...] = ()
    errors: tuple[str, ...] = ()
    items: tuple[ListRow, ...] = ()  # the team's shared task list

    @property
    def pill(self) -> str:
        """The pill label of this snapshot's tasks."""
        return pill_for(t.record for t in self.tasks)

    def task(self, task_id: str) -> TaskRow | None:
        return next((t for t in self.tasks if t.id == task_id), None)

    def member(self, name: str) -> MemberRow | None:
        return next((m for m in self.members if m.name == name), None)


class SwarmSource(Protocol):
    """What the board and the app read and do; `FileSource` is the real one."""

    team: str

    def snapshot(self) -> Snapshot: ...

    def watch_paths(self) -> list[Path]: ...

    def output_tail(self, task_id: str, lines: int = 20) -> list[str]: ...

    def output_size(self, task_id: str) -> int: ...

    def read_output(self, task_id: str, offset: int) -> tuple[bytes, int]: ...

    def stop_task(self, task_id: str) -> JsonDict: ...

    def send_message(self, to: str, text: str) -> str: ...

    def answer_plan(self, member: str, approve: bool, feedback: str | None = None) -> str: ...

    def show(self, task_id: str | None) -> None:
        """The task a view shows now (None: none): held against eviction while it does."""
        ...

    def close(self) -> None:
        """The views are gone: let go of what they held."""
        ...


def read_jsonl(path: Path, max_bytes: int | None = None) -> Iterator[JsonDict]:
    """JSON objects of the last `max_bytes` of a JSON-lines file (all of it when None)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as fh:
        if max_bytes is not None:
            size = os.fstat(fh.fileno()).st_size
            if size > max_bytes:
                fh.seek(size - max_bytes - 1)
                fh.readline()  # drop the line the window cut (or the newline before it)
        for line in fh:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a torn last line from a crash mid-write
            if isinstance(record, dict):
                yield record


def plan_requests(events: Iterable[JsonDict]) -> dict[str, JsonDict]:
    """{request_id, plan} of the latest `plan_approval_request` per sender in lead events."""
    latest: dict[str, JsonDict] = {}
    for event in events:
        msg = event.get("message")
        if event.get("type") != "message" or not isinstance(msg, dict):
            continue
        data = msg.get("data")
        if (
            msg.get("kind") == "plan_approval_request"
            and isinstance(msg.get("from"), str)
            and isinstance(data, dict)
            and data.get("request_id")
        ):
            latest[msg["from"]] = {"request_id": str(data["request_id"]), "plan": data.get("plan")}
    return latest


def status_plan(status: Mapping[str, Any] | None) -> JsonDict | None:
    """{request_id, plan} when a member's status file says what plan it waits on."""
    pending = (status or {}).get("awaiting_approval")
    if isinstance(pending, dict) and pending.get("request_id"):
        return {"request_id": str(pending["request_id"]), "plan": pending.get("plan")}
    return None


def waiting_plan(
    status: Mapping[str, Any] | None,
    requested: JsonDict | None,
    answered: Callable[[str], bool],
) -> JsonDict | None:
    """{request_id, plan} a member waits on, by the rule `shoal approve` follows.

    The member's status file decides: it names the request while the member waits and drops
    it once the answer is read, so a status file that does not say it waits means no plan is
    pending. Only when there is no status file, or it says it waits without naming the
    request, is the latest request from the member in the lead's events (`requested`) taken,
    and then not if `answered(request_id)` says an answer to it was already sent.
    """
    named = status_plan(status)
    if named is not None:
        return named
    if status is not None and not status.get("awaiting_approval"):
        return None
    if requested is None or answered(str(requested["request_id"])):
        return None
    return requested


def answer_waiting(inbox: Path, request_id: str) -> bool:
    """True when a plan_approval_response to `request_id` is in the inbox, not yet handled."""
    try:
        box = Maildir.open(inbox)
    except ShoalError:
        return False
    for sub, names in (("new", box.pending()), ("cur", box.claimed())):
        for name in names:
            try:
                msg = orjson.loads(box.read(sub, name))
            except (OSError, ShoalError, orjson.JSONDecodeError):
                continue  # handled meanwhile, or not a message
            if not isinstance(msg, dict):
                continue
            data = msg.get("data")
            if (
                msg.get("kind") == "plan_approval_response"
                and isinstance(data, dict)
                and str(data.get("request_id")) == request_id
            ):
                return True
    return False


def task_row(raw: JsonDict) -> TaskRow:
    """A task record validated once: its state, or why it is invalid."""
    try:
        return TaskRow(raw, parse_task_state(raw))
    except ValidationError as exc:
        return TaskRow(raw, None, str(exc).splitlines()[0])


def sort_rows(rows: list[TaskRow]) -> None:
    """Sort task rows in place by start time (then id), as every view lists them."""
    rows.sort(key=lambda r: (r.start_time, r.id))


def task_rows(raw_tasks: Any) -> tuple[list[TaskRow], list[str]]:
    """Rows (by start time) of the `tasks` object of a state.json, and what was invalid."""
    rows: list[TaskRow] = []
    errors: list[str] = []
    if not isinstance(raw_tasks, dict):
        return rows, errors
    for key, raw in raw_tasks.items():
        if not isinstance(raw, dict):
            errors.append(f"task {key}: not a JSON object")
            continue
        row = task_row(raw)
        rows.append(row)
        if row.error is not None:
            errors.append(f"task {key}: {row.error}")
    sort_rows(rows)
    return rows, errors


def _read_state(path: Path) -> JsonDict:
    """A state.json as a dict ({} when absent); OSError or JSONDecodeError when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    with os.fdopen(fd, "rb") as fh:
        data = orjson.loads(fh.read())
    return data if isinstance(data, dict) else {}


class FileSource:
    """A team read from the files under a SHOAL_HOME; actions go through leader and mailbox."""

    def __init__(self, layout: Layout, team: str) -> None:
        self.layout = layout
        self.team = team
        self.teams = Teams(layout)
        self._history: HistoryReader | None = None
        self._history_rows: dict[str, TaskRow] = {}
        self._history_lock = threading.Lock()
        self._hold: Any = None  # (a holds.ViewHold, from the first task a view shows)

    # -- reading ---------------------------------------------------------------------------------

    def watch_paths(self) -> list[Path]:
        """Directories whose changes call for a redraw: member status files and the session.

        Not the whole team directory: its inboxes are watched by the leader and by control
        clients, and overlapping recursive watches in one process confuse watchdog. A change
        of the team file alone (a member joining) shows on the next fallback tick.
        """
        paths = [self.layout.status_dir(self.team)]
        if self.layout.tasklist_dir(self.team).is_dir():
            paths.append(self.layout.tasklist_dir(self.team))
        try:
            session_dir = self._session_dir()
        except ShoalError:
            session_dir = None
        if session_dir is not None:
            paths.append(session_dir)
        return paths

    def _session_dir(self) -> Path | None:
        sid = self.teams.read(self.team).lead_session_id
        return self.layout.session_dir(sid) if sid else None

    def finished_rows(self, session_id: str) -> dict[str, TaskRow]:
        """Rows of the tasks evicted into the session's history, by id.

        Final records never change, so each is validated once and its row kept; the reader
        parses only lines appended since the last call. Both start over for a new session.
        """
        with self._history_lock:
            reader = self._history
            if reader is None or reader.session.id != session_id:
                reader = self._history = HistoryReader(Session(self.layout, session_id))
                self._history_rows = {}
            rows = self._history_rows
            for task_id, record in reader.read().items():
                row = rows.get(task_id)
                if row is None or row.record is not record:  # new, or recorded again
                    rows[task_id] = task_row(record)
            return dict(rows)

    def snapshot(self) -> Snapshot:
        """Read everything now; what cannot be read is named in `errors`, never raised.

        Tasks are those of state.json plus the finished ones already evicted into history.
        """
        now = time.time()
        errors: list[str] = []
        try:
            tf = self.teams.read(self.team)
        except ShoalError as exc:
            return Snapshot(team=self.team, taken_at=now, errors=(str(exc),))
        session_id = tf.lead_session_id
        events: tuple[JsonDict, ...] = ()
        rows: list[TaskRow] = []
        if session_id:
            session_dir = self.layout.session_dir(session_id)
            try:
                raw = _read_state(session_dir / "state.json")
            except (OSError, orjson.JSONDecodeError) as exc:
                errors.append(f"cannot read {session_dir / 'state.json'}: {exc}")
                raw = {}
            rows, task_errors = task_rows(raw.get("tasks"))
            errors.extend(task_errors)
            try:
                history = self.finished_rows(session_id)
            except OSError as exc:
                errors.append(f"cannot read {session_dir / 'history.jsonl'}: {exc}")
                history = {}
            live = {r.id for r in rows}
            evicted = [r for r in history.values() if r.id not in live]
            errors.extend(f"task {r.id}: {r.error}" for r in evicted if r.error is not None)
            rows.extend(evicted)
            sort_rows(rows)
            events = tuple(read_jsonl(session_dir / "events.jsonl", EVENTS_TAIL_BYTES))
        plans = plan_requests(events)
        members: list[MemberRow] = []
        leader_pid: int | None = None
        for m in tf.members:
            found: JsonDict | None = None
            try:
                state = self.teams.member_state(self.team, m).value
                found = self.teams.read_status(self.team, m.name)
            except ShoalError as exc:
                errors.append(f"member {m.name}: {exc}")
                state = "dead"
            status = found or {}
            if m.name == LEAD_NAME and state not in ("dead", "left"):
                leader_pid = m.pid
            started = parse_timestamp(status.get("started_at")) or parse_timestamp(m.joined_at)
            prompt = status.get("prompt") or m.prompt
            members.append(
                MemberRow(
                    name=m.name,
                    state=state,
                    color=m.color,
                    agent_type=m.agent_type,
                    started_at=started or 0.0,
                    pid=m.pid,
                    backend=m.backend,
                    prompt=str(prompt) if prompt else None,
                    status=status,
                    pending_plan=self._waiting_plan(m.name, found, plans.get(m.name)),
                )
            )
        members.sort(key=lambda r: (r.started_at, r.name))
        items: list[ListRow] = []
        try:
            items, item_errors = list_rows(TaskList(self.teams, self.team).snapshot())
            errors.extend(item_errors)
        except ShoalError as exc:
            errors.append(f"task list: {exc}")
        return Snapshot(
            team=self.team,
            taken_at=now,
            session_id=session_id,
            leader_pid=leader_pid,
            tasks=tuple(rows),
            members=tuple(members),
            events=events[-RECENT_EVENTS:],
            errors=tuple(errors),
            items=tuple(items),
        )

    def _waiting_plan(
        self, member: str, status: Mapping[str, Any] | None, requested: JsonDict | None
    ) -> JsonDict | None:
        """`waiting_plan` of `member`; an answer counts as sent while it waits in its inbox."""

        def answered(request_id: str) -> bool:
            return answer_waiting(self.layout.inbox_dir(self.team, member), request_id)

        return waiting_plan(status, requested, answered)

    def _output_path(self, task_id: str) -> Path:
        session_dir = self._session_dir()
        if session_dir is None:
            raise NotFoundError(f"team {self.team!r} has no session yet")
        try:
            tasks = _read_state(session_dir / "state.json").get("tasks")
        except (OSError, orjson.JSONDecodeError):
            tasks = None
        record = tasks.get(task_id) if isinstance(tasks, dict) else None
        if record is None:
            with self._history_lock:
                evicted = self._history_rows.get(task_id)
            record = evicted.record if evicted is not None else None
        if isinstance(record, dict) and isinstance(record.get("output_file"), str):
            return Path(record["output_file"])
        return session_dir / "tasks" / f"{task_id}.output"

    def output_tail(self, task_id: str, lines: int = 20) -> list[str]:
        """The last `lines` lines of the task's output ([] before there is any)."""
        return tail_lines(self._output_path(task_id), lines, max_bytes=max(4096, lines * 400))

    def output_size(self, task_id: str) -> int:
        """The size of the task's output so far (0 before there is any)."""
        return output_size(self._output_path(task_id))

    def read_output(self, task_id: str, offset: int) -> tuple[bytes, int]:
        """Output bytes from `offset` (at most 1 MiB); returns (data, new offset)."""
        return read_output_delta(self._output_path(task_id), offset, 1 << 20)

    # -- acting ----------------------------------------------------------------------------------

    def show(self, task_id: str | None) -> None:
        """Hold `task_id` with the leader while a detail or output view shows it (a thread
        renews the hold; no leader running, nothing is evicted and nothing is held)."""
        if self._hold is None:
            if task_id is None:
                return
            from shoal.orchestrator.holds import ViewHold

            self._hold = ViewHold(self.layout, self.team, "ui")
        self._hold.show(task_id)

    def close(self) -> None:
        if self._hold is not None:
            self._hold.close()
            self._hold = None

    def stop_task(self, task_id: str) -> JsonDict:
        """Ask the leader to stop `task_id`; its final record."""
        from shoal.channel.client import call

        result = call(self.layout, self.team, "stop", {"task_id": task_id})
        return result if isinstance(result, dict) else {"id": task_id}

    def send_message(self, to: str, text: str) -> str:
        """Send `text` from the lead to member `to`; the message id."""
        from shoal.mailbox.router import send

        if not text.strip():
            raise UsageError("empty message; nothing was sent")
        directory = self.teams.directory(self.team)
        return send(directory, to=to, sender=LEAD_NAME, kind="text", text=text).id

    def _requested_plan(self, member: str) -> JsonDict | None:
        """The latest plan_approval_request from `member` in the lead's whole event stream."""
        session_dir = self._session_dir()
        if session_dir is None:
            return None
        return plan_requests(read_jsonl(session_dir / "events.jsonl")).get(member)

    def pending_plan(self, member: str) -> JsonDict | None:
        """{request_id, plan} that `member` waits on, by `waiting_plan`: what its status file
        names, else its latest unanswered request in the lead's whole event stream."""
        status = self.teams.read_status(self.team, member)
        named = status_plan(status)
        if named is not None:
            return named
        return self._waiting_plan(member, status, self._requested_plan(member))

    def answer_plan(self, member: str, approve: bool, feedback: str | None = None) -> str:
        """Approve or reject `member`'s pending plan; the request id answered.

        NotFoundError, and nothing sent, when it waits on none (an answered request included).
        """
        from shoal.mailbox.router import send

        pending = self.pending_plan(member)
        if pending is None:
            asked = self._requested_plan(member)
            if asked is None:
                raise NotFoundError(f"{member} has not asked for plan approval; nothing was sent")
            raise NotFoundError(
                f"{member} is not waiting for a plan approval (its request "
                f"{asked['request_id']} was answered); nothing was sent"
            )
        request_id = str(pending["request_id"])
        send(
            self.teams.directory(self.team),
            to=member,
            sender=LEAD_NAME,
            kind="plan_approval_response",
            text=feedback or None,
            data={"request_id": request_id, "approve": approve, "feedback": feedback or None},
        )
        return request_id
