"""The live status board: members and tasks of a team, redrawn when its files change.

`render_board` gives a rich renderable (colours, member dots); `board_text` the same content
as plain lines, used when the output is not a terminal or NO_COLOR is set. `run_board` is the
loop behind `shoal ps --watch` (and the lead's pane under `shoal up`). The board lists every
unfinished task but only the latest finished ones, so a long session stays one screen.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from rich.color import Color, ColorParseError
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shoal.core.events import (
    MessageReceived,
    TaskStalled,
    TaskStarted,
    TaskTerminated,
    parse_event,
)
from shoal.ui.source import ListRow, MemberRow, Snapshot, SwarmSource, TaskRow
from shoal.ui.status import (
    agent_notes,
    describe_teammate_activity,
    member_icon,
    one_line,
    rich_color,
    status_icon,
    status_style,
    status_text,
    task_age,
    task_icon,
    teammate_facts_from_task,
    type_label,
)
from shoal.ui.steps import nest_steps, step_prefix, workflow_progress
from shoal.ui.watch import FALLBACK_TICK_S, ChangeSignal

COALESCE_S = 0.1
"""After a wake-up, wait this long so a burst of writes makes one redraw."""

FINISHED_SHOWN = 10
LIST_SHOWN = 12  # items of the shared task list on the board (open ones first)
LIST_ICONS = {"pending": ("·", "dim"), "in_progress": ("▶", "yellow"), "completed": ("✓", "green")}
"""The board lists this many finished tasks, the latest by end time (`shoal ps --all`: all)."""


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class MemberLine:
    """One member as the board shows it."""

    icon: str
    icon_style: str
    name: str
    color: str
    state: str
    activity: str
    detail: str


@dataclass(frozen=True)
class TaskLine:
    """One task as the board shows it."""

    icon: str
    icon_style: str
    id: str
    type: str
    status: str
    age: str
    description: str


def _color(name: str | None) -> str:
    """A rich colour for a member colour, "" when rich does not know it."""
    color = rich_color(name)
    if not color:
        return ""
    try:
        Color.parse(color)
    except ColorParseError:
        return ""
    return color


def _progress(status: Mapping[str, Any]) -> str:
    progress = status.get("progress")
    if not isinstance(progress, Mapping):
        return ""
    parts = []
    tools = progress.get("tool_use_count")
    tokens = progress.get("token_count")
    if isinstance(tools, int) and tools:
        parts.append(f"{tools} tool" if tools == 1 else f"{tools} tools")
    if isinstance(tokens, int) and tokens:
        parts.append(f"{tokens} tokens")
    return ", ".join(parts)


def member_line(member: MemberRow) -> MemberLine:
    """The board's view of a member: icon, name, state, activity, progress/current task."""
    icon, style = member_icon(member.state, member.facts)
    detail = _progress(member.status)
    current = member.status.get("current_task")
    if current not in (None, ""):
        detail = f"task {current}" + (f", {detail}" if detail else "")
    return MemberLine(
        icon=icon,
        icon_style=style,
        name=member.name,
        color=_color(member.color),
        state=member.state,
        activity=member.activity,
        detail=detail,
    )


def task_line(task: TaskRow, now: float, member: MemberRow | None = None) -> TaskLine:
    """The board's view of a task: icon, id, type, status, age, description.

    A running teammate task shows its activity; when its member's status file is known
    (`member`), that live view wins over the leader's copy in the task record.
    """
    icon, style = task_icon(task.record)
    description = str(task.record.get("description") or "")
    if task.type == "in_process_teammate" and task.status == "running":
        facts = teammate_facts_from_task(task.record)
        if member is not None and member.status and member.state not in ("dead", "left"):
            facts = member.facts
            icon, style = status_icon("running", facts.flags), status_style("running", facts.flags)
        activity = describe_teammate_activity(facts)
        description = f"{description} · {activity}" if description else activity
    if task.type == "local_agent":
        description += agent_notes(task.record)  # (a lease waited on, a budget, violations)
    description = step_prefix(task.record) + description + workflow_progress(task.record)
    return TaskLine(
        icon=icon,
        icon_style=style,
        id=task.id,
        type=type_label(task.record),
        status=status_text(task.record),
        age=task_age(task.record, now),
        description=description,
    )


def task_lines(
    snapshot: Snapshot,
    now: float,
    rows: Iterable[TaskRow] | None = None,
    *,
    cache: dict[str, tuple[TaskRow, TaskLine]] | None = None,
) -> list[TaskLine]:
    """`task_line` of every task (or of `rows`), teammates joined with their member's status.

    With `cache`, the lines of finished tasks with an end time, which never change, are kept
    there from one call to the next and reused for the same row object (a source hands out
    the same row for a task evicted into history): thousands of them cost nothing to redraw.
    """
    members = {m.name: m for m in snapshot.members}
    kept: dict[str, tuple[TaskRow, TaskLine]] = {}
    lines = []
    for row in snapshot.tasks if rows is None else rows:
        hit = cache.get(row.id) if cache is not None else None
        if hit is not None and hit[0] is row:
            line = hit[1]
        else:
            target = row.message_target
            line = task_line(row, now, members.get(target) if target else None)
        if row.finished and row.end_time is not None:
            kept[row.id] = (row, line)
        lines.append(line)
    if cache is not None:
        cache.clear()
        cache.update(kept)
    return lines


def board_tasks(snapshot: Snapshot, finished: int = FINISHED_SHOWN) -> tuple[list[TaskRow], int]:
    """The tasks the board lists, in snapshot order (a workflow's steps right under it), and
    how many finished ones it leaves out.

    Every unfinished task is listed, but only the `finished` latest finished ones (by end
    time): evicted tasks stay in the snapshot for the whole session.
    """
    done = [t for t in snapshot.tasks if t.finished]
    if len(done) <= finished:
        return _nested(snapshot.tasks), 0
    done.sort(key=lambda t: (t.end_time or t.start_time, t.start_time, t.id))
    keep = {t.id for t in done[len(done) - finished :]}
    rows = [t for t in snapshot.tasks if not t.finished or t.id in keep]
    return _nested(rows), len(done) - finished


def _nested(rows: Iterable[TaskRow]) -> list[TaskRow]:
    return [row for row, _ in nest_steps(rows, lambda r: r.record)]


def list_item_subject(item: ListRow) -> str:
    """An item's subject, with what holds it back: its open blockers, its failed turns."""
    notes = []
    if item.open_blockers:
        notes.append("blocked by " + ", ".join(map(str, item.open_blockers)))
    if item.failures:
        notes.append(f"failed {item.failures}x")
    return item.subject + (f"  ({'; '.join(notes)})" if notes else "")


def list_item_line(item: ListRow) -> tuple[str, str, str]:
    """An item of the shared task list: its icon, the icon's style and its words."""
    icon, style = LIST_ICONS.get(item.status, ("?", "red"))
    owner = item.owner or "-"
    return icon, style, f"{item.id:>3}  {item.status:<11}  {owner:<10}  {list_item_subject(item)}"


def board_items(snapshot: Snapshot, shown: int = LIST_SHOWN) -> tuple[list[ListRow], int]:
    """The list items the board shows (open ones, then the latest completed) and how many
    it leaves out."""
    open_items = [i for i in snapshot.items if i.status != "completed"]
    done = [i for i in snapshot.items if i.status == "completed"]
    keep = open_items[:shown]
    keep += done[-max(0, shown - len(keep)) :] if len(keep) < shown else []
    keep.sort(key=lambda i: i.id)
    return keep, len(snapshot.items) - len(keep)


def left_out_line(count: int) -> str:
    """The line that says how many earlier finished tasks the board leaves out."""
    noun = "task" if count == 1 else "tasks"
    return f"+ {count} earlier finished {noun} (shoal ps --all)"


def event_line(record: Mapping[str, Any]) -> str | None:
    """One line for an event record worth showing on the board (None for the others)."""
    event = parse_event(dict(record))
    if event is None:
        return None
    ts = event.ts
    stamp = datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts is not None else ""
    if isinstance(event, TaskStarted):
        return f"{stamp} started  {event.task_id}  {event.description}"
    if isinstance(event, TaskTerminated):
        return f"{stamp} {event.status:<8} {event.task_id}  {event.summary}"
    if isinstance(event, TaskStalled):
        return f"{stamp} waiting? {event.task_id}  {event.prompt}"
    if isinstance(event, MessageReceived):
        msg, data = event.message, event.data
        text = msg.get("text") or msg.get("summary") or ""
        if not text:
            text = data.get("plan") or data.get("summary") or ""
        line = f"{stamp} message  {msg.get('from')} [{msg.get('kind')}] {one_line(text, 60)}"
        return line.rstrip()
    return None


def _header(snapshot: Snapshot) -> str:
    parts = [f"team {snapshot.team}"]
    if snapshot.session_id:
        parts.append(f"session {snapshot.session_id}")
    if snapshot.leader_pid is not None:
        parts.append(f"leader pid {snapshot.leader_pid}")
    else:
        parts.append("no leader running (`shoal up`)")
    return "  ".join(parts)


# --------------------------------------------------------------------------- rendering


def render_board(snapshot: Snapshot, *, now: float | None = None, events: int = 0) -> Group:
    """The board as a rich renderable: header and pill, members, tasks, recent events."""
    now = snapshot.taken_at if now is None else now
    header = Text(_header(snapshot), style="bold")
    pill = snapshot.pill
    if pill:
        header.append("   ")
        header.append(f" {pill} ", style="reverse bright_blue")
    parts: list[RenderableType] = [header]

    members = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
    members.add_column("", width=1)
    members.add_column("MEMBER", no_wrap=True)
    members.add_column("STATE", no_wrap=True)
    members.add_column("ACTIVITY", overflow="ellipsis", no_wrap=True, ratio=2)
    members.add_column("", overflow="ellipsis", no_wrap=True, style="dim")
    for m in map(member_line, snapshot.members):
        who = Text("● ", style=m.color) + Text(m.name, style=m.color or "bold")
        members.add_row(Text(m.icon, style=m.icon_style), who, m.state, m.activity, m.detail)
    parts.append(members if snapshot.members else Text("no members", style="dim"))

    tasks = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
    tasks.add_column("", width=1)
    tasks.add_column("ID", no_wrap=True)
    tasks.add_column("TYPE", no_wrap=True)
    tasks.add_column("STATUS", no_wrap=True)
    tasks.add_column("AGE", justify="right", no_wrap=True)
    tasks.add_column("DESCRIPTION", overflow="ellipsis", no_wrap=True)
    shown, left_out = board_tasks(snapshot)
    for t in task_lines(snapshot, now, shown):
        tasks.add_row(
            Text(t.icon, style=t.icon_style),
            t.id,
            t.type,
            Text(t.status, style=t.icon_style),
            t.age,
            one_line(t.description, 200),
        )
    parts.append(tasks if snapshot.tasks else Text("no tasks", style="dim"))
    if left_out:
        parts.append(Text(left_out_line(left_out), style="dim"))
    items, items_left_out = board_items(snapshot)
    if items:
        listing = Text("TASK LIST", style="dim")
        for item in items:
            icon, style, words = list_item_line(item)
            listing.append("\n")
            listing.append(icon, style=style)
            listing.append(" " + words)
        if items_left_out:
            listing.append(f"\n{items_left_out} more: shoal task list", style="dim")
        parts.append(listing)

    if events:
        lines = [ev for e in snapshot.events if (ev := event_line(e))][-events:]
        if lines:
            parts.append(Text("\n".join(lines), style="dim"))
    for error in snapshot.errors:
        parts.append(Text(f"error: {error}", style="red"))
    return Group(*parts)


def board_lines(
    snapshot: Snapshot, *, now: float | None = None, events: int = 0, ages: bool = True
) -> list[str]:
    """The board as plain lines (no colour, no box drawing); `ages=False` leaves ages out."""
    now = snapshot.taken_at if now is None else now
    pill = snapshot.pill
    lines = [_header(snapshot) + (f"  [{pill}]" if pill else "")]
    mlines = [member_line(m) for m in snapshot.members]
    if mlines:
        name_w = max(len(m.name) for m in mlines)
        state_w = max(len(m.state) for m in mlines)
        lines.append("MEMBERS")
        for m in mlines:
            detail = f"  ({m.detail})" if m.detail else ""
            line = f"  {m.icon} {m.name:<{name_w}}  {m.state:<{state_w}}  {m.activity}{detail}"
            lines.append(line.rstrip())
    else:
        lines.append("no members")
    shown, left_out = board_tasks(snapshot)
    tlines = task_lines(snapshot, now, shown)
    if tlines:
        type_w = max(len(t.type) for t in tlines)
        status_w = max(len(t.status) for t in tlines)
        lines.append("TASKS")
        for t in tlines:
            age = f"{t.age:>7}  " if ages else ""
            lines.append(
                f"  {t.icon} {t.id}  {t.type:<{type_w}}  {t.status:<{status_w}}  "
                f"{age}{one_line(t.description, 200)}".rstrip()
            )
        if left_out:
            lines.append(f"  {left_out_line(left_out)}")
    else:
        lines.append("no tasks")
    items, items_left_out = board_items(snapshot)
    if items:
        lines.append("TASK LIST")
        lines.extend(f"  {icon} {words}".rstrip() for icon, _, words in map(list_item_line, items))
        if items_left_out:
            lines.append(f"  {items_left_out} more: shoal task list")
    if events:
        lines.extend([ev for e in snapshot.events if (ev := event_line(e))][-events:])
    lines.extend(f"error: {e}" for e in snapshot.errors)
    return lines


def board_text(snapshot: Snapshot, *, now: float | None = None, events: int = 0) -> str:
    """`board_lines` joined, with a final newline."""
    return "\n".join(board_lines(snapshot, now=now, events=events)) + "\n"


# --------------------------------------------------------------------------- the loop


def wants_plain(console: Console) -> bool:
    """Plain lines when the output is not a terminal or NO_COLOR is set (no-color.org)."""
    return not console.is_terminal or bool(os.environ.get("NO_COLOR"))


class Board:
    """The live board of one source: `run()` shows it until `stop()` (from any thread)."""

    def __init__(
        self,
        source: SwarmSource,
        *,
        out: TextIO | None = None,
        events: int = 0,
        fallback: float = FALLBACK_TICK_S,
        plain: bool | None = None,
    ) -> None:
        self.source = source
        self.out = out or sys.stdout
        self.events = events
        self.fallback = fallback
        self.console = Console(file=self.out)
        self.plain = wants_plain(self.console) if plain is None else plain
        self._stop = threading.Event()
        self._signal: ChangeSignal | None = None
        self.thread: threading.Thread | None = None

    def stop(self) -> None:
        """Make `run` return (at once: the wait is woken too)."""
        self._stop.set()
        if self._signal is not None:
            self._signal.set()

    def run(self, stop: threading.Event | None = None) -> None:
        """Show the board until `stop()` is called or `stop` is set (checked every tick)."""
        with ChangeSignal(self.source.watch_paths, fallback=self.fallback) as signal:
            self._signal = signal

            def done() -> bool:
                return self._stop.is_set() or (stop is not None and stop.is_set())

            if self.plain and not self.console.is_terminal:
                self._run_plain(done, signal)
                return
            with Live(console=self.console, auto_refresh=False, transient=False) as live:
                while not done():
                    live.update(self._view(), refresh=True)
                    self._wait(signal, done)

    def _view(self) -> RenderableType:
        snap = self.source.snapshot()
        if self.plain:
            return Text(board_text(snap, events=self.events).rstrip("\n"))
        return render_board(snap, events=self.events)

    def _run_plain(self, done: Callable[[], bool], signal: ChangeSignal) -> None:
        last: list[str] | None = None
        while not done():
            snap = self.source.snapshot()
            key = board_lines(snap, events=self.events, ages=False)
            if key != last:
                if last is not None:
                    self.out.write("\n")
                self.out.write(board_text(snap, events=self.events))
                self.out.flush()
                last = key
            self._wait(signal, done)

    def _wait(self, signal: ChangeSignal, done: Callable[[], bool]) -> None:
        if signal.wait() and not done():
            self._stop.wait(COALESCE_S)  # let a burst of writes settle into one redraw

    def start(self) -> Board:
        """Run in a daemon thread (e.g. in the lead's pane while the leader runs)."""
        self.thread = threading.Thread(target=self.run, name="shoal-board", daemon=True)
        self.thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


def run_board(
    source: SwarmSource,
    *,
    out: TextIO | None = None,
    stop: threading.Event | None = None,
    events: int = 0,
    fallback: float = FALLBACK_TICK_S,
    plain: bool | None = None,
) -> None:
    """Show the board until `stop` is set (or Ctrl-C), redrawing when the team's files change.

    On a terminal the board is redrawn in place; otherwise (or with NO_COLOR) plain lines are
    printed, a new block only when something other than the ages changed.
    """
    Board(source, out=out, events=events, fallback=fallback, plain=plain).run(stop)


def start_board(source: SwarmSource, *, out: TextIO | None = None, events: int = 5) -> Board:
    """Start the board in a daemon thread; `board.stop(); board.join()` ends it."""
    return Board(source, out=out, events=events).start()
