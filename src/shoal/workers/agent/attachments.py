"""Task attachments: what an agent's running background tasks wrote, given to the agent at
each tool-round boundary (the seed's generateTaskAttachments).

Before each model request the runner asks its leader (control operation `task_attachments`)
for the new output of the background tasks it owns: its Bash run_in_background commands and
the monitors started for it (`shoal sh --monitor --agent ID`). Each is a delta read from the
task's `output_offset` by seeking, at most ATTACHMENT_CAP_BYTES a task a round (the latest
bytes; what is left out is counted and named with the call that reads it), and at most
ATTACHMENT_ROUND_BYTES in all (the rest waits for the next round). Of a task that ended it
carries the end as well. The runner puts them in the request as `<task-output>` blocks.

Exactly once: the leader reads, but moves `output_offset` and `last_reported_total_lines`
(and sets `completion_status_sent_in_attachment`) only on the runner's ack, which the runner
makes once the block is in the agent's transcript. Acks are absolute (offset, lines so far),
sent with every request of the runner and applied as a maximum, and the leader writes
state.json before it answers: a leader killed -9 between its read and the ack loses nothing
(its successor reads the same bytes again) and repeats nothing (the runner's acks, sent
again, move the successor past what the transcript holds).

While its agent runs, the end of a task is held back from the agent for the attachment of
its next round: once that is acked, the task is notified (its events, `notified`) without the
message to the agent, which would say the same again. An agent that waits for a message says
so (`idle`, renewed every IDLE_RENEW_S while it waits, so a leader that started meanwhile
hears it too), and its tasks' ends then reach it as notifications, as before (one wakes it).
The runner, too, drops an end notification of a task whose end its transcript already has
from an attachment.

The runner asks only when there can be news: the list of tasks started for it
(`sessions/{s}/agents/{agent}.tasks`, a line each, appended when one starts) has grown, or of
the tasks the leader said are open one's output file has grown or its exit file appeared
since it last asked, or FETCH_EVERY_S has passed (an end without an exit file: a SIGKILL). An
agent with no background task pays one stat a round; one with a quiet task, two stats a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import BaseModel, ConfigDict

from shoal.channel.protocol import AttachmentAck
from shoal.core.errors import ShoalError, TaskError
from shoal.core.faults import pause_point
from shoal.core.notify import summary_for, xml_escape
from shoal.core.output import output_size, partial_char_at_end, read_output_delta
from shoal.core.paths import FILE_MODE
from shoal.core.tasks import (
    AnyTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    TaskStatus,
)
from shoal.workers.agent.job import AGENTS_DIR

# At most this much of one task's new output goes to its agent in a round: the latest bytes,
# the rest named (how many, from where) with the TaskOutput call that reads them.
ATTACHMENT_CAP_BYTES: Final = 8 * 1024
# A round's attachments stop growing past this (the tasks left over come next round): an
# agent with many chatty tasks gets a bounded request, and the answer stays far below the
# control channel's 1 MiB message cap.
ATTACHMENT_ROUND_BYTES: Final = 64 * 1024
# How long a runner waits for its leader's answer before it sends the request without
# attachments (they come next round: nothing was acked).
ATTACH_WAIT_S: Final = 10.0
# How often an agent that waits for a message tells its leader so again (a leader started
# since holds its tasks' ends back until it hears it).
IDLE_RENEW_S: Final = 2.0
# However still its open tasks' files look, a runner asks again once this long has passed.
FETCH_EVERY_S: Final = 1.0
OPEN_TAG: Final = "<task-output>"
CLOSE_TAG: Final = "</task-output>"
# An attachment that told a task's end; group 1 is the task id.
ATTACHED_END: Final = re.compile(
    r"<task-output>\s*<task-id>([^<]+)</task-id>(?:(?!</task-output>).)*?"
    r"<status>(?:completed|failed|killed)</status>(?:(?!</task-output>).)*?<final/>",
    re.DOTALL,
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TaskAttachment(_Frozen):
    """One task's new output for its agent: bytes [shown_from, end) of its output file, the
    bytes [start, shown_from) before them left out (the cap)."""

    task_id: str
    kind: str
    description: str
    status: str
    output_file: str
    start: int
    shown_from: int
    end: int
    text: str
    lines: int
    total_lines: int
    final: bool = False
    summary: str | None = None
    run: int = 0  # (the task's `restarts`)

    @property
    def skipped(self) -> int:
        return self.shown_from - self.start

    def ack(self) -> AttachmentAck:
        return AttachmentAck(
            task_id=self.task_id,
            offset=self.end,
            total_lines=self.total_lines,
            final=self.final,
            run=self.run,
        )


# --------------------------------------------------------------------------- on disk


def owned_tasks_file(session_dir: Path, agent_task: str) -> Path:
    """Where the background tasks started for agent task `agent_task` are listed: a line
    each, `{task id}\t{output file}\t{exit file}`."""
    return session_dir / AGENTS_DIR / f"{agent_task}.tasks"


def note_owned(task: LocalShellTaskState, exit_file: Path) -> None:
    """Add a starting background task to its agent's list (the runner then asks for its
    output, and looks at its files to know when to ask again). A hint only: a list that
    cannot be written costs the agent the attachments of a task it did not start itself,
    never a notification."""
    agent = task.agent_task
    if agent is None:
        return
    path = owned_tasks_file(Path(task.output_file).parent.parent, agent)
    with contextlib.suppress(OSError):
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path, flags, FILE_MODE)
        try:
            os.write(fd, f"{task.id}\t{task.output_file}\t{exit_file}\n".encode())
        finally:
            os.close(fd)


def _size(path: Path | str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _listed(path: Path) -> dict[str, tuple[str, str]]:
    """The tasks an agent's list names: id -> (output file, exit file)."""
    found: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                found[parts[0]] = (parts[1], parts[2])
    return found


# --------------------------------------------------------------------------- the leader's half


def read_attachment(
    task: LocalShellTaskState, cap: int = ATTACHMENT_CAP_BYTES
) -> TaskAttachment | None:
    """What `task` wrote since its agent was last shown its output (None: nothing to say).
    Seeks to `output_offset` (or, past the cap, to the latest `cap` bytes): a file of any size
    costs at most `cap` bytes of reading. A running task's last character, if it is cut,
    waits for the next round; an ended task's attachment reaches the end (`final`)."""
    start = task.output_offset
    size = max(output_size(task.output_file), start)
    ended = task.is_terminal
    if size <= start and (not ended or task.notified):
        return None
    shown_from = max(start, size - cap)
    data = b""
    if size > shown_from:
        data, _ = read_output_delta(task.output_file, shown_from, size - shown_from)
    if shown_from > start:  # (a window that starts inside a character skips its rest)
        skip = 0
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data, shown_from = data[skip:], shown_from + skip
    if not ended:
        data = data[: len(data) - partial_char_at_end(data)]
        if not data:
            return None
    end = shown_from + len(data)
    lines = data.count(b"\n")
    final = ended and end >= size
    return TaskAttachment(
        task_id=task.id,
        kind=task.kind,
        description=task.description,
        status=task.status.value,
        output_file=task.output_file,
        start=start,
        shown_from=shown_from,
        end=end,
        text=data.decode("utf-8", errors="replace"),
        lines=lines,
        total_lines=task.last_reported_total_lines + lines,
        final=final,
        summary=summary_for(task) if final else None,
        run=task.restarts,
    )


class DeskStore(Protocol):
    """What the desk needs of the leader's registry (a TaskStore has it)."""

    def get(self, task_id: str) -> AnyTaskState | None: ...

    def set_task(self, task_id: str, **changes: Any) -> bool: ...


def _still_open(task: AnyTaskState | None) -> bool:
    """True while `task` has something left to tell its agent."""
    if not isinstance(task, LocalShellTaskState) or task.completion_status_sent_in_attachment:
        return False
    if not task.is_terminal:
        return True
    return not task.notified or output_size(task.output_file) > task.output_offset


class AttachmentDesk:
    """The leader's half: answers `task_attachments` and holds back the ends it will tell."""

    def __init__(self) -> None:
        self.idle: set[str] = set()  # agents that wait for a message (said since they asked)

    def answer(
        self,
        store: DeskStore,
        tasks: Iterable[AnyTaskState],
        agent_id: str,
        acks: Iterable[AttachmentAck] = (),
        *,
        fetch: bool = True,
        idle: bool = False,
    ) -> dict[str, Any]:
        """Record `acks`, then (`fetch`) read what agent `agent_id`'s tasks wrote since:
        {"attachments": [...], "open": [the ids of its tasks with something left to tell],
        "more": whether the round's budget left some out}."""
        agent = store.get(agent_id)
        if not isinstance(agent, LocalAgentTaskState) or agent.is_terminal:
            raise TaskError(
                f"no running agent task {agent_id} in this session: only a running agent "
                "asks for the output of its background tasks"
            )
        owned = sorted(
            (t for t in tasks if isinstance(t, LocalShellTaskState) and t.agent_task == agent_id),
            key=lambda t: (t.start_time, t.id),
        )
        mine = [t.id for t in owned]
        for ack in acks:
            self._apply(store, agent_id, set(mine), ack)
        if idle:
            self.idle.add(agent_id)
        elif fetch:
            self.idle.discard(agent_id)
        found: list[TaskAttachment] = []
        more = False
        if fetch:
            budget = ATTACHMENT_ROUND_BYTES
            for task_id in mine:
                task = store.get(task_id)
                if not isinstance(task, LocalShellTaskState):
                    continue
                if budget <= 0:
                    more = True
                    break
                if task.completion_status_sent_in_attachment or task.status is TaskStatus.PENDING:
                    continue
                attachment = read_attachment(task)
                if attachment is not None:
                    found.append(attachment)
                    budget -= attachment.end - attachment.shown_from
        pause_point("attachments-read")
        told = {a.task_id for a in found}
        still_open = [i for i in mine if i in told or _still_open(store.get(i))]
        return {"attachments": [a.model_dump() for a in found], "open": still_open, "more": more}

    def _apply(self, store: DeskStore, agent_id: str, mine: set[str], ack: AttachmentAck) -> None:
        task = store.get(ack.task_id)
        if task is None:
            return  # (evicted since: nothing of it is kept any more)
        if ack.task_id not in mine or not isinstance(task, LocalShellTaskState):
            raise TaskError(
                f"task {ack.task_id} is not a background task of agent {agent_id}: "
                "it cannot acknowledge its output"
            )
        if ack.run != task.restarts:
            return  # (of its run before it was run again in place)
        size = max(output_size(task.output_file), task.output_offset)
        if ack.offset > size:
            raise TaskError(
                f"agent {agent_id} acknowledged byte {ack.offset:,} of {task.id}, whose output "
                f"has {size:,} bytes"
            )
        changes: dict[str, Any] = {}
        if ack.offset > task.output_offset:
            changes["output_offset"] = ack.offset
        if ack.total_lines > task.last_reported_total_lines:
            changes["last_reported_total_lines"] = ack.total_lines
        if ack.final and task.is_terminal and ack.offset >= size:
            changes["completion_status_sent_in_attachment"] = True
        if changes:
            store.set_task(task.id, **changes)

    def holds(self, task: AnyTaskState, get: Callable[[str], AnyTaskState | None]) -> bool:
        """True while the end of `task` waits for its agent's next attachment (not yet to be
        notified): an ended background task of an agent that runs and does not wait idle."""
        if not isinstance(task, LocalShellTaskState) or task.completion_status_sent_in_attachment:
            return False
        agent_id = task.agent_task
        if agent_id is None or agent_id in self.idle:
            return False
        agent = get(agent_id)
        if agent is None or agent.is_terminal or agent.status is not TaskStatus.RUNNING:
            self.idle.discard(agent_id)
            return False
        return True


# --------------------------------------------------------------------------- the runner's half


def _how_to_read(attachment: TaskAttachment, tools: frozenset[str]) -> str:
    """The call that reads the bytes an attachment left out, with a tool the agent has."""
    if "TaskOutput" in tools:
        return f"TaskOutput with task_id={attachment.task_id} and offset={attachment.start}"
    command = (
        f"tail -c +{attachment.start + 1} {shlex.quote(attachment.output_file)} "
        f"| head -c {attachment.skipped}"
    )
    return f"Bash `{command}`" if "Bash" in tools else f"`{command}`"


def render(attachment: TaskAttachment, tools: frozenset[str] = frozenset()) -> str:
    """The `<task-output>` block the model is given (every value XML-escaped)."""
    a = attachment
    lines = [
        OPEN_TAG,
        f"<task-id>{xml_escape(a.task_id)}</task-id>",
        f"<kind>{xml_escape(a.kind)}</kind>",
        f"<description>{xml_escape(a.description)}</description>",
        f"<status>{xml_escape(a.status)}</status>",
        f"<bytes>{a.shown_from}-{a.end}</bytes>",
        f"<lines>{a.lines} new, {a.total_lines} shown so far</lines>",
    ]
    if a.skipped > 0:
        lines.append(
            f"<skipped>{a.skipped:,} bytes (from byte {a.start:,}) left out, over the "
            f"{ATTACHMENT_CAP_BYTES:,}-byte cap of a round: {xml_escape(_how_to_read(a, tools))} "
            "reads them</skipped>"
        )
    lines.append(f"<output>{xml_escape(a.text)}</output>")
    if a.final:
        lines += [f"<summary>{xml_escape(a.summary or '')}</summary>", "<final/>"]
    lines.append(CLOSE_TAG)
    return "\n".join(lines)


def is_attachment(text: str) -> bool:
    """True for the text of a round's attachments (it opens with a `<task-output>` block)."""
    return text.lstrip().startswith(OPEN_TAG)


def attached_ends(texts: Iterable[str]) -> set[str]:
    """The task ids whose ends attachments among `texts` told."""
    return {m.group(1) for text in texts if OPEN_TAG in text for m in ATTACHED_END.finditer(text)}


@dataclass(frozen=True)
class Attached:
    """A round's attachments: the text for the request, what the readable output says of
    them, and the ack to run once the text is in the transcript."""

    text: str
    note: str
    ack: Callable[[], None]


class AttachSource(Protocol):
    """Where an agent loop gets its attachments (an Attacher)."""

    async def fetch(self) -> Attached | None:
        """The attachments of the request about to go, if any."""
        ...

    async def idle(self) -> None:
        """The agent now waits for a message."""
        ...

    async def flush(self) -> None:
        """Send what reached the transcript and was not confirmed yet."""
        ...


class Attacher:
    """The runner's half: asks its leader before each model request, acks what reached the
    transcript (with every later request, and at once for an end, which the leader holds
    back until then)."""

    def __init__(
        self,
        call: Callable[[str, dict[str, Any]], Any],
        agent: str,
        owned_file: Path,
        *,
        tools: frozenset[str] = frozenset(),
        on_end: Callable[[str, str], str] | None = None,
        wait_s: float = ATTACH_WAIT_S,
    ) -> None:
        self.call = call  # the leader's control channel (blocking)
        self.agent = agent
        self.owned_file = owned_file
        self.tools = tools
        # (task id, text) -> text: a worker's lease check of a command that ended
        self.on_end = on_end
        self.wait_s = wait_s
        self.open: list[str] = []  # the leader's last answer: our tasks left to tell of
        self.more = False  # it left some out (its round's budget): ask again
        self.retry = False  # it did not answer: ask again
        self.seen = -1  # the size of `owned_file` when the leader was last asked
        self.files: dict[str, tuple[str, str]] = {}  # our tasks' output and exit files
        self.looked: dict[str, tuple[int, bool]] = {}  # how they looked when we last asked
        self.asked_at = -FETCH_EVERY_S
        self.acks: dict[str, AttachmentAck] = {}  # what the transcript holds, by task
        self._version = 0  # bumped by each ack; the leader confirmed those up to _confirmed
        self._confirmed = 0
        self._idle_said: float | None = None  # when the leader was last told we wait idle
        self._flushes: set[asyncio.Task[None]] = set()

    def _look(self, task_id: str) -> tuple[int, bool] | None:
        files = self.files.get(task_id)
        if files is None:
            return None
        return _size(files[0]), os.path.exists(files[1])

    def due(self) -> bool:
        """Whether the leader may have news for us (stats only): a task was started for us
        since we asked, or one it said is open wrote or ended since, or FETCH_EVERY_S passed."""
        if _size(self.owned_file) != self.seen or self.retry or self.more:
            return True
        if not self.open:
            return False
        if time.monotonic() - self.asked_at >= FETCH_EVERY_S:
            return True
        return any((now := self._look(i)) is None or now != self.looked.get(i) for i in self.open)

    async def fetch(self) -> Attached | None:
        """The attachments of the request about to go (None: nothing new, or the leader did
        not answer: what it would have said comes next round)."""
        if not self.due():
            return None  # (no background task: one stat; quiet ones: two stats each)
        size = _size(self.owned_file)
        if size != self.seen:
            self.files = _listed(self.owned_file)
        looked = {i: look for i in self.files if (look := self._look(i)) is not None}
        asked_at = time.monotonic()
        reply = await self._ask(fetch=True)
        if reply is None:
            return None
        self.seen, self.looked, self.asked_at = size, looked, asked_at
        self.retry = False
        self._idle_said = None
        self._answered(reply)
        found = [TaskAttachment.model_validate(a) for a in reply.get("attachments") or ()]
        found = [a for a in found if self._new(a)]
        if not found:
            return None
        blocks: list[str] = []
        notes: list[str] = []
        for a in found:
            block = render(a, self.tools)
            if a.final and self.on_end is not None:
                block += self.on_end(a.task_id, "")
            blocks.append(block)
            ended = f"; {a.status}" if a.final else ""
            notes.append(f"  ⎿ attached {a.task_id}: {a.lines} new line(s){ended}\n")
        acks = [a.ack() for a in found]
        return Attached("\n".join(blocks), "".join(notes), lambda: self._delivered(acks))

    def _new(self, attachment: TaskAttachment) -> bool:
        """False for what the transcript has already (a leader behind the acks)."""
        seen = self.acks.get(attachment.task_id)
        if seen is None or seen.run != attachment.run:
            return True
        return attachment.end > seen.offset or (attachment.final and not seen.final)

    def _delivered(self, acks: list[AttachmentAck]) -> None:
        """The attachments are in the transcript: remember, and tell the leader (at once
        when one told an end, which it holds back until then)."""
        for ack in acks:
            old = self.acks.get(ack.task_id)
            if old is not None and old.run == ack.run:
                ack = AttachmentAck(
                    task_id=ack.task_id,
                    offset=max(ack.offset, old.offset),
                    total_lines=max(ack.total_lines, old.total_lines),
                    final=ack.final or old.final,
                    run=ack.run,
                )
            self.acks[ack.task_id] = ack
        self._version += 1
        if any(a.final for a in acks):
            with contextlib.suppress(RuntimeError):  # (no loop: the next request carries it)
                flush = asyncio.get_running_loop().create_task(self.flush())
                self._flushes.add(flush)
                flush.add_done_callback(self._flushes.discard)

    async def flush(self) -> None:
        """Send the acks the leader has not confirmed yet."""
        if self._version > self._confirmed:
            await self._ask(fetch=False)

    async def idle(self) -> None:
        """The agent waits for a message: the leader holds back none of its tasks' ends (a
        notification may be what wakes it). Called again while it waits: said again every
        IDLE_RENEW_S, while it has background tasks (for a leader started meanwhile)."""
        now = time.monotonic()
        if self._idle_said is not None and now - self._idle_said < IDLE_RENEW_S:
            return
        size = _size(self.owned_file)
        if not self.open and not self.retry and size == self.seen:
            return
        reply = await self._ask(fetch=False, idle=True)
        if reply is not None:
            self._idle_said = now
            self.seen = size
            self.files = _listed(self.owned_file)
            self._answered(reply)

    def _answered(self, reply: dict[str, Any]) -> None:
        listed = reply.get("open")
        self.open = [str(i) for i in listed] if isinstance(listed, list) else []
        self.more = bool(reply.get("more"))

    async def _ask(self, *, fetch: bool, idle: bool = False) -> dict[str, Any] | None:
        version = self._version
        args = {
            "agent": self.agent,
            "acks": [a.model_dump() for a in self.acks.values()],
            "fetch": fetch,
            "idle": idle,
        }
        try:
            reply = await asyncio.wait_for(
                asyncio.to_thread(self.call, "task_attachments", args), self.wait_s
            )
        except (ShoalError, OSError, TimeoutError):
            # (no leader, or one that stopped: asked again next round, the acks with it)
            self.retry = True
            return None
        self._confirmed = max(self._confirmed, version)
        return reply if isinstance(reply, dict) else {}
