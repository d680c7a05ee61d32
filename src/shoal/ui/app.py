"""`shoal ui`: a full-screen browser of a team's tasks and members (textual).

The overview lists every task (finished ones too) and member; enter opens a detail view for
the task's kind (or the member). Keys act on what is selected: s stops a task, m sends a
message, a/r approve or reject a plan, f follows output. Data comes from a `SwarmSource` (files
by default) and is reread when the files change; actions run in worker threads so the screen
never blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from rich.cells import cell_len
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.coordinate import Coordinate
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Header, Input, Label, Log, Static
from textual.widgets.data_table import CellDoesNotExist, RowDoesNotExist
from textual.worker import get_current_worker

from shoal.core.errors import ShoalError
from shoal.ui.board import (
    MemberLine,
    TaskLine,
    list_item_line,
    list_item_subject,
    member_line,
    task_lines,
)
from shoal.ui.details import member_detail, task_detail
from shoal.ui.source import ListRow, Snapshot, SwarmSource, TaskRow
from shoal.ui.steps import nest_steps
from shoal.ui.watch import FALLBACK_TICK_S, ChangeSignal

OUTPUT_TAIL_LINES = 15
FOLLOW_START_BYTES = 64 * 1024
FOLLOW_MAX_LINES = 10_000

L = TypeVar("L")


@dataclass(frozen=True)
class Selection:
    """What the keys act on: a task (by id) or a member (by name)."""

    kind: Literal["task", "member"]
    key: str


def _swarm(screen: Screen[Any]) -> SwarmApp:
    return cast("SwarmApp", screen.app)


class SwarmScreen(Screen[None]):
    """A screen that shows part of a snapshot and knows what is selected."""

    shown_task: str | None = None
    """The task this screen shows, held against eviction while it is on top."""

    def on_screen_resume(self) -> None:
        _swarm(self).source.show(self.shown_task)

    def update_snapshot(self, snapshot: Snapshot) -> None:
        """Show `snapshot` (called on every reread)."""

    def selection(self) -> Selection | None:
        return None

    def action_stop(self) -> None:
        _swarm(self).stop_selected(self.selection())

    def action_message(self) -> None:
        _swarm(self).message_selected(self.selection())

    def action_approve(self) -> None:
        _swarm(self).answer_selected(self.selection(), approve=True)

    def action_reject(self) -> None:
        _swarm(self).answer_selected(self.selection(), approve=False)

    def action_follow(self) -> None:
        _swarm(self).follow_selected(self.selection())


class Overview(SwarmScreen):
    """All tasks and members of the team."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Open", show=True),
        Binding("s", "stop", "Stop"),
        Binding("m", "message", "Message"),
        Binding("a", "approve", "Approve"),
        Binding("r", "reject", "Reject"),
        Binding("f", "follow", "Follow"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._tasks: TableRows[TaskLine] | None = None
        self._members: TableRows[MemberLine] | None = None
        self._items: TableRows[ListRow] | None = None
        self._task_cache: dict[str, tuple[TaskRow, TaskLine]] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="summary")
        yield Label("Tasks", classes="section")
        yield DataTable(id="tasks", cursor_type="row", zebra_stripes=True)
        yield Label("Members", classes="section")
        yield DataTable(id="members", cursor_type="row", zebra_stripes=True)
        yield Label("Task list", classes="section")
        yield DataTable(id="items", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        tasks = self.query_one("#tasks", DataTable)
        tasks.add_columns("", "ID", "TYPE", "STATUS", "AGE", "DESCRIPTION")
        members = self.query_one("#members", DataTable)
        members.add_columns("", "MEMBER", "STATE", "ACTIVITY", "")
        self._tasks = TableRows(tasks, _task_cells)
        self._members = TableRows(members, _member_cells)
        items = self.query_one("#items", DataTable)
        items.add_columns("", "ID", "STATUS", "OWNER", "SUBJECT")
        self._items = TableRows(items, _item_cells)
        tasks.focus()
        self.update_snapshot(_swarm(self).snapshot)

    def update_snapshot(self, snapshot: Snapshot) -> None:
        summary = Text(f"team {snapshot.team}", style="bold")
        if snapshot.session_id:
            summary.append(f"  session {snapshot.session_id}")
        if snapshot.leader_pid is not None:
            summary.append(f"  leader pid {snapshot.leader_pid}")
        else:
            summary.append("  no leader running", style="yellow")
        if snapshot.pill:
            summary.append(f"  [{snapshot.pill}]", style="bright_blue")
        for error in snapshot.errors:
            summary.append(f"\nerror: {error}", style="red")
        self.query_one("#summary", Static).update(summary)
        if self._tasks is None or self._members is None:
            return  # not mounted yet
        rows = [r for r, _ in nest_steps(snapshot.tasks, lambda r: r.record)]  # (steps under)
        lines = task_lines(snapshot, time.time(), rows, cache=self._task_cache)
        self._tasks.show([(t.id, t) for t in lines])
        self._members.show([(m.name, m) for m in map(member_line, snapshot.members)])
        if self._items is not None:
            self._items.show([(str(i.id), i) for i in snapshot.items])

    def selection(self) -> Selection | None:
        focused = self.focused
        if isinstance(focused, DataTable) and focused.id in ("tasks", "members"):
            key = _cursor_key(focused)
            if key is not None:
                return Selection("task" if focused.id == "tasks" else "member", key)
        return None

    def action_open(self) -> None:
        _swarm(self).open_selected(self.selection())

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value
        if key is not None:
            kind: Literal["task", "member"] = "task" if event.data_table.id == "tasks" else "member"
            _swarm(self).open_selected(Selection(kind, key))


def _cursor_key(table: DataTable[Any]) -> str | None:
    if table.row_count == 0:
        return None
    try:
        row_key = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key
    except CellDoesNotExist:
        return None
    return row_key.value


def _task_cells(t: TaskLine) -> tuple[Any, ...]:
    return (
        Text(t.icon, style=t.icon_style),
        t.id,
        t.type,
        Text(t.status, style=t.icon_style),
        t.age,
        t.description,
    )


def _member_cells(m: MemberLine) -> tuple[Any, ...]:
    return (
        Text(m.icon, style=m.icon_style),
        Text(m.name, style=m.color or "bold"),
        m.state,
        m.activity,
        m.detail,
    )


def _item_cells(item: ListRow) -> tuple[Any, ...]:
    icon, style, _ = list_item_line(item)
    status, owner = item.status, item.owner or "-"
    return (Text(icon, style=style), str(item.id), status, owner, list_item_subject(item))


def _cell_width(cell: Any) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(str(cell))


class TableRows(Generic[L]):
    """The rows of a DataTable by key, each drawn from a line (a TaskLine, a MemberLine).

    The overview lists every task of a session, thousands in a long one. Clearing and
    re-adding them all would have the table measure every cell again on each refresh; here
    only rows whose line changed are rewritten and new rows appended. The table is rebuilt
    only when rows went away or moved (a new session), keeping the cursor on the same key.
    """

    def __init__(self, table: DataTable[Any], cells: Callable[[L], tuple[Any, ...]]) -> None:
        self.table = table
        self.cells = cells
        self.shown: dict[str, L] = {}

    def show(self, rows: list[tuple[str, L]]) -> None:
        """Make the table list `rows` ((key, line) in order)."""
        table = self.table
        keep: str | None = None
        if [key for key, _ in rows[: len(self.shown)]] != list(self.shown):
            keep = _cursor_key(table)
            table.clear()
            self.shown = {}
        columns = table.ordered_columns
        for key, line in rows:
            old = self.shown.get(key)
            if old is None:
                table.add_row(*self.cells(line), key=key)
            elif old != line:
                for column, cell in zip(columns, self.cells(line), strict=False):
                    # Only a wider cell remeasures its column: a narrower one would have the
                    # table measure the whole column again, for each such cell.
                    wider = _cell_width(cell) > column.content_width
                    table.update_cell(key, column.key, cell, update_width=wider)
            self.shown[key] = line
        if keep is not None:
            with contextlib.suppress(RowDoesNotExist):
                table.move_cursor(row=table.get_row_index(keep))


class _DetailScreen(SwarmScreen):
    """A screen of one thing's details in a scrolling #detail area, redrawn on each snapshot."""

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.update_snapshot(_swarm(self).snapshot)


class TaskDetail(_DetailScreen):
    """One task, shown by kind, with its live output tail when it has output."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "stop", "Stop"),
        Binding("m", "message", "Message"),
        Binding("a", "approve", "Approve"),
        Binding("r", "reject", "Reject"),
        Binding("f", "follow", "Follow output"),
    ]

    def __init__(self, task_id: str) -> None:
        super().__init__()
        self.task_id = self.shown_task = task_id

    def update_snapshot(self, snapshot: Snapshot) -> None:
        row = snapshot.task(self.task_id)
        detail = self.query_one("#detail", Static)
        if row is None:
            detail.update(Text(f"task {self.task_id} is gone (see `shoal ps --all`)", "yellow"))
            return
        output: list[str] = []
        if row.type == "local_bash":
            try:
                output = _swarm(self).source.output_tail(self.task_id, OUTPUT_TAIL_LINES)
            except (ShoalError, OSError):
                output = []
        detail.update(task_detail(row, time.time(), output))

    def selection(self) -> Selection:
        return Selection("task", self.task_id)


class MemberDetail(_DetailScreen):
    """One team member: its status, recent activities, messages and a pending plan."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("m", "message", "Message"),
        Binding("a", "approve", "Approve"),
        Binding("r", "reject", "Reject"),
    ]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.member_name = name

    def update_snapshot(self, snapshot: Snapshot) -> None:
        member = snapshot.member(self.member_name)
        detail = self.query_one("#detail", Static)
        if member is None:
            detail.update(Text(f"{self.member_name} is no longer in the team", "yellow"))
        else:
            detail.update(member_detail(member))

    def selection(self) -> Selection:
        return Selection("member", self.member_name)


class OutputScreen(SwarmScreen):
    """A task's output, followed as it grows (the last 64 KiB first)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "stop", "Stop"),
    ]

    def __init__(self, task_id: str) -> None:
        super().__init__()
        self.task_id = self.shown_task = task_id
        self.read_offset: int | None = None
        self._pending = b""
        self._error: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label(f"output of {self.task_id} (following)", id="title")
        yield Log(id="output", auto_scroll=True, max_lines=FOLLOW_MAX_LINES)
        yield Footer()

    def on_mount(self) -> None:
        self.update_snapshot(_swarm(self).snapshot)

    def update_snapshot(self, snapshot: Snapshot) -> None:
        source = _swarm(self).source
        log = self.query_one("#output", Log)
        try:
            if self.read_offset is None:
                start = max(0, source.output_size(self.task_id) - FOLLOW_START_BYTES)
                data, self.read_offset = source.read_output(self.task_id, start)
                if start > 0:  # begin on a whole line
                    data = data[data.find(b"\n") + 1 :]
            else:
                data, self.read_offset = source.read_output(self.task_id, self.read_offset)
        except (ShoalError, OSError) as exc:
            if str(exc) != self._error:
                self._error = str(exc)
                log.write_line(f"[cannot read output: {exc}]")
            return
        if data:
            # Split bytes, not text: a chunk may end inside a multi-byte character.
            *lines, self._pending = (self._pending + data).split(b"\n")
            log.write_lines([ln.decode("utf-8", errors="replace") for ln in lines])
        row = snapshot.task(self.task_id)
        if row is not None and row.status in ("completed", "failed", "killed"):
            if self._pending:
                log.write_line(self._pending.decode("utf-8", errors="replace"))
                self._pending = b""
            self.query_one("#title", Label).update(f"output of {self.task_id} ({row.status})")

    def selection(self) -> Selection:
        return Selection("task", self.task_id)


class PromptScreen(ModalScreen[str | None]):
    """Ask for one line of text; enter submits it, escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    DEFAULT_CSS = """
    PromptScreen { align: center middle; }
    PromptScreen > Vertical {
        width: 70%; height: auto; border: round $accent; padding: 1 2; background: $surface;
    }
    """

    def __init__(self, title: str, placeholder: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            yield Input(placeholder=self.placeholder, id="prompt")

    def on_mount(self) -> None:
        self.query_one("#prompt", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SwarmApp(App[None]):
    """The task browser; `source` gives the data (FileSource in production and tests)."""

    TITLE = "shoal"
    CSS = """
    #summary { padding: 0 1; }
    .section { padding: 0 1; text-style: bold; margin-top: 1; }
    #tasks { height: 1fr; }
    #members { height: 1fr; }
    #detail { padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "Quit")]

    def __init__(
        self, source: SwarmSource, *, watch: bool = True, fallback: float = FALLBACK_TICK_S
    ) -> None:
        super().__init__()
        self.source = source
        self.watch_files = watch
        self.fallback = fallback
        self.snapshot = source.snapshot()
        self._signal: ChangeSignal | None = None

    def on_mount(self) -> None:
        self.sub_title = f"team {self.source.team}"
        self.push_screen(Overview())
        if self.watch_files:
            self._signal = ChangeSignal(self.source.watch_paths, fallback=self.fallback)
            self.run_worker(self._watch_loop, thread=True, group="watch", exit_on_error=False)

    def on_unmount(self) -> None:
        if self._signal is not None:
            self._signal.close()
        self.source.close()

    def _watch_loop(self) -> None:
        worker = get_current_worker()
        signal = self._signal
        assert signal is not None
        while not worker.is_cancelled:
            signal.wait()
            if worker.is_cancelled:
                return
            try:
                self.call_from_thread(self.refresh_data)
            except RuntimeError:
                return  # the app has stopped

    def refresh_data(self) -> None:
        """Reread the files and update every screen."""
        self.snapshot = self.source.snapshot()
        for screen in self.screen_stack:
            if isinstance(screen, SwarmScreen) and screen.is_mounted:
                screen.update_snapshot(self.snapshot)

    # -- actions on a selection ------------------------------------------------------------------

    def open_selected(self, sel: Selection | None) -> None:
        """Open the detail view of a task or member."""
        if sel is None:
            return
        self.push_screen(TaskDetail(sel.key) if sel.kind == "task" else MemberDetail(sel.key))

    def _in_thread(self, what: str, fn: Callable[[], str]) -> None:
        """Run an action off the UI thread; report its outcome as a notification."""

        def run() -> None:
            try:
                message, severity = fn(), "information"
            except ShoalError as exc:
                message, severity = f"{what} failed: {exc}", "error"
            except Exception as exc:  # a bug or an I/O error: say so, keep the app running
                message, severity = f"{what} failed: {exc!r}", "error"
            self.call_from_thread(self._done, message, severity)

        self.run_worker(run, thread=True, group="actions", exit_on_error=False)

    def _done(self, message: str, severity: Literal["information", "error"]) -> None:
        self.notify(message, severity=severity, timeout=6)
        self.refresh_data()

    def _member_for(self, sel: Selection | None) -> str | None:
        if sel is None:
            return None
        if sel.kind == "member":
            return sel.key
        row = self.snapshot.task(sel.key)
        return row.message_target if row is not None else None

    def stop_selected(self, sel: Selection | None) -> None:
        """Stop the selected task through the leader."""
        if sel is None or sel.kind != "task":
            self.notify("select a task to stop", severity="warning")
            return
        task_id = sel.key

        def stop() -> str:
            final = self.source.stop_task(task_id)
            return f"stopped {task_id} ({final.get('status', 'killed')})"

        self.notify(f"stopping {task_id}…")
        self._in_thread("stop", stop)

    def message_selected(self, sel: Selection | None) -> None:
        """Ask for a message and send it to the selected member (or task's teammate)."""
        member = self._member_for(sel)
        if member is None:
            self.notify("select a member (or a teammate's task) to message", severity="warning")
            return

        def send(text: str | None) -> None:
            if text:
                self._in_thread(
                    "message",
                    lambda: f"sent to {member} ({self.source.send_message(member, text)})",
                )

        self.push_screen(PromptScreen(f"Message to {member}"), send)

    def answer_selected(self, sel: Selection | None, *, approve: bool) -> None:
        """Approve, or ask for feedback and reject, the selected member's pending plan."""
        member = self._member_for(sel)
        if member is None:
            self.notify("select a member to answer its plan", severity="warning")
            return
        if approve:
            self._in_thread(
                "approve",
                lambda: f"approved {member}'s plan ({self.source.answer_plan(member, True)})",
            )
            return

        def reject(feedback: str | None) -> None:
            if feedback is None:
                return  # cancelled

            def run() -> str:
                request = self.source.answer_plan(member, False, feedback or None)
                return f"rejected {member}'s plan ({request})"

            self._in_thread("reject", run)

        self.push_screen(PromptScreen(f"Reject {member}'s plan: feedback (optional)"), reject)

    def follow_selected(self, sel: Selection | None) -> None:
        """Follow the selected task's output."""
        if sel is None or sel.kind != "task":
            self.notify("select a task to follow its output", severity="warning")
            return
        self.push_screen(OutputScreen(sel.key))


def run_app(source: SwarmSource) -> None:
    """Run the browser in this terminal until the user quits."""
    SwarmApp(source).run()
