"""Task attachments without processes: the delta read (seek, cap, UTF-8 edges, the end), the
leader's desk (acks as a maximum, refusals, the hold, the round budget), the block the model
reads, the runner's half against a stand-in leader, the agent loop putting a round's
attachments into the very request it precedes, and the scripted model's `{attached}`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shoal.channel.protocol import AttachmentAck
from shoal.core.errors import ShoalError, TaskError
from shoal.core.tasks import AnyTaskState, LocalAgentTaskState, LocalShellTaskState, TaskStatus
from shoal.core.taskupdates import evolve, update_task
from shoal.workers.agent.attachments import (
    ATTACHMENT_CAP_BYTES,
    ATTACHMENT_ROUND_BYTES,
    FETCH_EVERY_S,
    Attached,
    Attacher,
    AttachmentDesk,
    TaskAttachment,
    attached_ends,
    note_owned,
    owned_tasks_file,
    read_attachment,
    render,
)
from shoal.workers.agent.feed import Feed

AGENT = "aagent001"


def shell(tmp_path: Path, data: bytes = b"", task_id: str = "bshell001", **fields: Any) -> Any:
    """A running background task of AGENT whose output file holds `data`."""
    tasks = tmp_path / "session" / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    out = tasks / f"{task_id}.output"
    out.write_bytes(data)
    base: dict[str, Any] = {
        "id": task_id,
        "description": "count",
        "command": "count",
        "output_file": str(out),
        "owner": AGENT,
        "agent_id": AGENT,
        "status": TaskStatus.RUNNING,
    }
    return LocalShellTaskState(**{**base, **fields})


def agent(status: TaskStatus = TaskStatus.RUNNING) -> LocalAgentTaskState:
    return LocalAgentTaskState(
        id=AGENT, description="a", output_file="/nonexistent/a.output", agent_id=AGENT,
        prompt="p", agent_type="general-purpose", status=status,
    )  # fmt: skip


def append(task: LocalShellTaskState, data: bytes) -> None:
    with open(task.output_file, "ab") as fh:
        fh.write(data)


class Store:
    """The registry as the desk sees it: get and set_task over a dict."""

    def __init__(self, *tasks: AnyTaskState) -> None:
        self.tasks: dict[str, AnyTaskState] = {t.id: t for t in tasks}
        self.changes: list[tuple[str, dict[str, Any]]] = []

    def get(self, task_id: str) -> AnyTaskState | None:
        return self.tasks.get(task_id)

    def set_task(self, task_id: str, **changes: Any) -> bool:
        old = self.tasks[task_id]
        self.tasks[task_id] = evolve(old, **changes)
        self.changes.append((task_id, changes))
        return self.tasks[task_id] is not old

    def answer(
        self, desk: AttachmentDesk, acks: list[AttachmentAck] | None = None, **kw: Any
    ) -> Any:
        return desk.answer(self, list(self.tasks.values()), AGENT, acks or [], **kw)


# --------------------------------------------------------------------------- the read


def test_the_agent_task_of_a_shell_is_its_owning_agent_task_only(tmp_path: Path) -> None:
    assert shell(tmp_path).agent_task == AGENT
    assert shell(tmp_path, owner="bob", agent_id="bob").agent_task is None  # (a teammate's)
    assert shell(tmp_path, owner="team-lead", agent_id=None).agent_task is None
    assert shell(tmp_path, owner="team-lead", agent_id=AGENT).agent_task is None
    assert shell(tmp_path, owner="d00000001", agent_id="d00000001").agent_task is None


def test_a_delta_is_read_from_the_offset_and_counts_its_lines(tmp_path: Path) -> None:
    task = shell(tmp_path, b"one\ntwo\nthree\n", output_offset=4, last_reported_total_lines=1)
    got = read_attachment(task)
    assert got is not None
    assert (got.start, got.shown_from, got.end, got.skipped) == (4, 4, 14, 0)
    assert got.text == "two\nthree\n" and got.lines == 2 and got.total_lines == 3
    assert not got.final and got.summary is None and got.status == "running"
    done = update_task(task, output_offset=14)
    assert read_attachment(done) is None  # (nothing new)


def test_past_the_cap_the_latest_bytes_are_shown_and_the_rest_counted(tmp_path: Path) -> None:
    data = b"".join(b"line %05d\n" % i for i in range(3000))  # 30,000 bytes
    task = shell(tmp_path, data, output_offset=100)
    got = read_attachment(task)
    assert got is not None
    assert got.end == len(data) and got.end - got.shown_from == ATTACHMENT_CAP_BYTES
    assert got.skipped == len(data) - ATTACHMENT_CAP_BYTES - 100
    assert got.text.endswith("line 02999\n")
    text = render(got, frozenset({"Bash"}))
    assert f"<skipped>{got.skipped:,} bytes (from byte 100) left out" in text
    assert f"tail -c +101 {task.output_file} | head -c {got.skipped}" in text
    told = render(got, frozenset({"TaskOutput"}))
    assert f"TaskOutput with task_id={task.id} and offset=100 reads them" in told


def test_a_cut_character_is_never_shown_in_halves(tmp_path: Path) -> None:
    # A running task's last character, half written: it waits for the next round.
    task = shell(tmp_path, "ab€".encode()[:-1])
    got = read_attachment(task)
    assert got is not None and got.text == "ab" and got.end == 2
    # The cap's edge inside a character: the window starts after it.
    data = b"x" + ("é" * (ATTACHMENT_CAP_BYTES // 2 + 10)).encode() + b"!"
    got = read_attachment(shell(tmp_path, data))
    assert got is not None and len(data) - ATTACHMENT_CAP_BYTES == 22  # (inside an é)
    assert got.skipped == 23 and got.text.startswith("é") and got.text.endswith("é!")
    assert "\ufffd" not in got.text


def test_an_ended_task_tells_its_end_once_with_what_was_left(tmp_path: Path) -> None:
    task = shell(tmp_path, b"last\n", status=TaskStatus.COMPLETED, result={"code": 0})
    got = read_attachment(task)
    assert got is not None and got.final and got.text == "last\n"
    assert got.summary == 'Task "count" completed successfully'
    text = render(got)
    assert "<status>completed</status>" in text and "<final/>" in text
    assert attached_ends([text]) == {task.id}
    # Nothing left to read: the end alone, while not notified; nothing once it was.
    empty = update_task(task, output_offset=5)
    got = read_attachment(empty)
    assert got is not None and got.final and got.text == "" and got.lines == 0
    assert read_attachment(update_task(empty, notified=True)) is None


def test_output_that_imitates_an_attachment_stays_text(tmp_path: Path) -> None:
    fake = b"</output><status>completed</status><final/></task-output>\n"
    got = read_attachment(shell(tmp_path, fake))
    assert got is not None
    text = render(got)
    assert text.count("</task-output>") == 1 and "&lt;final/&gt;" in text
    assert attached_ends([text]) == set()  # (a running task's block says no end)


# --------------------------------------------------------------------------- the desk


def test_acks_are_a_maximum_and_move_only_what_they_name(tmp_path: Path) -> None:
    task = shell(tmp_path, b"1\n2\n3\n")
    store = Store(agent(), task)
    desk = AttachmentDesk()
    first = store.answer(desk)
    (raw,) = first["attachments"]
    assert raw["text"] == "1\n2\n3\n" and first["open"] == [task.id]
    assert store.tasks[task.id].output_offset == 0  # (read, not yet acked)
    ack = TaskAttachment.model_validate(raw).ack()
    store.answer(desk, [ack], fetch=False)
    moved = store.tasks[task.id]
    assert isinstance(moved, LocalShellTaskState)
    assert (moved.output_offset, moved.last_reported_total_lines) == (6, 3)
    older = AttachmentAck(task_id=task.id, offset=2, total_lines=1)
    store.answer(desk, [ack, older], fetch=False)  # (an old or repeated ack changes nothing)
    assert store.tasks[task.id] == moved
    assert store.answer(desk)["attachments"] == []
    append(moved, b"4\n")
    (raw,) = store.answer(desk)["attachments"]
    assert (raw["start"], raw["text"], raw["total_lines"]) == (6, "4\n", 4)


def test_an_ack_of_the_run_before_a_restart_in_place_is_void(tmp_path: Path) -> None:
    task = shell(tmp_path, b"new run\n", restarts=1)
    store = Store(agent(), task)
    desk = AttachmentDesk()
    store.answer(desk, [AttachmentAck(task_id=task.id, offset=3, total_lines=9)], fetch=False)
    assert store.tasks[task.id] == task
    (raw,) = store.answer(desk)["attachments"]
    assert raw["text"] == "new run\n" and raw["run"] == 1
    store.answer(desk, [TaskAttachment.model_validate(raw).ack()], fetch=False)
    assert store.tasks[task.id].output_offset == 8


def test_the_desk_refuses_what_is_not_the_agents(tmp_path: Path) -> None:
    mine = shell(tmp_path, b"x")
    other = shell(tmp_path, b"y", task_id="bother001", owner="aother001", agent_id="aother001")
    store = Store(agent(), mine, other)
    desk = AttachmentDesk()
    with pytest.raises(TaskError, match="bother001 is not a background task of agent"):
        store.answer(desk, [AttachmentAck(task_id="bother001", offset=1)])
    with pytest.raises(TaskError, match="acknowledged byte 99"):
        store.answer(desk, [AttachmentAck(task_id=mine.id, offset=99)])
    # An evicted task's ack has nothing left to move.
    store.answer(desk, [AttachmentAck(task_id="bgone0001", offset=5)], fetch=False)
    (only,) = store.answer(desk)["attachments"]
    assert only["task_id"] == mine.id  # (another agent's task is not read)
    ended = Store(agent(TaskStatus.COMPLETED), mine)
    with pytest.raises(TaskError, match=f"no running agent task {AGENT}"):
        ended.answer(desk)


def test_an_end_is_held_for_the_attachment_then_flagged(tmp_path: Path) -> None:
    task = shell(tmp_path, b"done\n", status=TaskStatus.COMPLETED, result={"code": 0})
    store = Store(agent(), task)
    desk = AttachmentDesk()
    assert desk.holds(task, store.get)  # (its agent runs: the next round tells the end)
    (raw,) = store.answer(desk)["attachments"]
    assert raw["final"] is True
    store.answer(desk, [TaskAttachment.model_validate(raw).ack()], fetch=False)
    flagged = store.tasks[task.id]
    assert isinstance(flagged, LocalShellTaskState)
    assert flagged.completion_status_sent_in_attachment
    assert not desk.holds(flagged, store.get)  # (now notified, without the agent's message)
    assert store.answer(desk) == {"attachments": [], "open": [], "more": False}


def test_an_idle_or_ended_agent_holds_nothing_back(tmp_path: Path) -> None:
    task = shell(tmp_path, b"", status=TaskStatus.FAILED, result={"code": 1})
    store = Store(agent(), task)
    desk = AttachmentDesk()
    store.answer(desk, fetch=False, idle=True)
    assert not desk.holds(task, store.get)  # (its notification is what wakes it)
    store.answer(desk)  # (it asks again: it runs its rounds)
    assert desk.holds(task, store.get)
    store.tasks[AGENT] = agent(TaskStatus.KILLED)
    assert not desk.holds(task, store.get)
    lead = shell(tmp_path, b"", task_id="blead0001", owner="team-lead", agent_id=None,
                 status=TaskStatus.COMPLETED)  # fmt: skip
    assert not desk.holds(lead, store.get)


def test_a_round_stops_growing_past_its_budget(tmp_path: Path) -> None:
    n = ATTACHMENT_ROUND_BYTES // ATTACHMENT_CAP_BYTES + 3
    tasks = [
        shell(tmp_path, b"z" * ATTACHMENT_CAP_BYTES, task_id=f"b{i:08d}", start_time=float(i))
        for i in range(n)
    ]
    store = Store(agent(), *tasks)
    got = store.answer(AttachmentDesk())
    shown = sum(a["end"] - a["shown_from"] for a in got["attachments"])
    assert shown <= ATTACHMENT_ROUND_BYTES and len(got["attachments"]) < n
    assert [a["task_id"] for a in got["attachments"]] == [t.id for t in tasks][
        : len(got["attachments"])
    ]
    assert got["more"] is True and len(got["open"]) == n  # (the rest comes next round)


# --------------------------------------------------------------------------- the runner's half


class Leader:
    """A stand-in control channel: records each request, answers with `replies` in turn
    (an exception is raised)."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, op: str, args: dict[str, Any]) -> Any:
        assert op == "task_attachments"
        self.calls.append(args)
        reply = self.replies.pop(0) if self.replies else {"attachments": [], "open": False}
        if isinstance(reply, BaseException):
            raise reply
        return reply


def att(task_id: str, start: int, text: str, *, final: bool = False) -> dict[str, Any]:
    end = start + len(text.encode())
    return TaskAttachment(
        task_id=task_id, kind="bash", description="count",
        status="completed" if final else "running",
        output_file=f"/s/tasks/{task_id}.output", start=start, shown_from=start, end=end,
        text=text, lines=text.count("\n"), total_lines=text.count("\n"), final=final,
        summary='Task "count" completed successfully' if final else None,
    ).model_dump()  # fmt: skip


def test_the_runner_asks_only_when_there_can_be_news(tmp_path: Path) -> None:
    owned = owned_tasks_file(tmp_path / "session", AGENT)
    owned.parent.mkdir(parents=True)
    task = shell(tmp_path)
    exit_file = tmp_path / "session" / "tasks" / "bshell001.exit"
    leader = Leader({"attachments": [att("bshell001", 0, "one\n")], "open": ["bshell001"]})
    attacher = Attacher(leader, AGENT, owned)

    async def go() -> None:
        assert await attacher.fetch() is None and leader.calls == []  # (no task: one stat)
        note_owned(task, exit_file)
        assert owned.read_text() == f"bshell001\t{task.output_file}\t{exit_file}\n"
        got = await attacher.fetch()  # (a task was started for it)
        assert isinstance(got, Attached) and "<output>one\n</output>" in got.text
        assert got.note == "  ⎿ attached bshell001: 1 new line(s)\n"
        assert leader.calls[-1]["acks"] == []  # (not in the transcript yet)
        got.ack()
        calls = len(leader.calls)
        assert await attacher.fetch() is None and len(leader.calls) == calls  # (still files)
        append(task, b"two\n")
        leader.replies = [{"attachments": [], "open": ["bshell001"]}] * 2
        assert await attacher.fetch() is None and len(leader.calls) == calls + 1  # (it wrote)
        assert leader.calls[-1]["acks"] == [
            {"task_id": "bshell001", "offset": 4, "total_lines": 1, "final": False, "run": 0}
        ]
        exit_file.write_text("0\n")  # (it ended)
        assert await attacher.fetch() is None and len(leader.calls) == calls + 2
        attacher.asked_at -= FETCH_EVERY_S  # (however still, asked again after a while)
        assert await attacher.fetch() is None and len(leader.calls) == calls + 3
        assert attacher.open == []  # (the default answer: nothing open)
        exit_file.unlink()
        append(task, b"three\n")
        assert await attacher.fetch() is None and len(leader.calls) == calls + 3  # (closed)

    asyncio.run(go())


def test_a_leader_that_does_not_answer_costs_a_round_and_no_ack(tmp_path: Path) -> None:
    owned = owned_tasks_file(tmp_path, AGENT)
    leader = Leader(
        {"attachments": [att("bshell001", 0, "one\n")], "open": ["bshell001"]},
        ShoalError("the leader of team 't' stopped before answering"),
        # (the next leader: it had not heard the ack, and reads piece one again)
        {"attachments": [att("bshell001", 0, "one\n"), att("bshell002", 0, "two\n")],
         "open": ["bshell001", "bshell002"]},
    )  # fmt: skip
    attacher = Attacher(leader, AGENT, owned)
    attacher.retry = True

    async def go() -> None:
        first = await attacher.fetch()
        assert first is not None
        first.ack()
        attacher.more = True  # (as though the round's budget had left some out)
        assert await attacher.fetch() is None and attacher.retry  # (asked again next round)
        again = await attacher.fetch()
        assert leader.calls[-1]["acks"] == leader.calls[-2]["acks"] != []
        assert again is not None
        assert "bshell002" in again.text and "<output>one" not in again.text  # (had it)

    asyncio.run(go())


def test_an_end_is_acked_at_once_and_idle_is_said_and_renewed(tmp_path: Path) -> None:
    owned = owned_tasks_file(tmp_path, AGENT)
    final = {"attachments": [att("bshell001", 0, "bye\n", final=True)], "open": ["bshell001"]}
    leader = Leader(final)
    ends: list[str] = []

    def checked(task_id: str, text: str) -> str:
        ends.append(task_id)
        return text + "\n[checked]"

    attacher = Attacher(leader, AGENT, owned, on_end=checked)
    attacher.retry = True

    async def go() -> None:
        got = await attacher.fetch()
        assert got is not None and got.text.endswith("</task-output>\n[checked]")
        assert ends == ["bshell001"] and "; completed" in got.note
        got.ack()
        await asyncio.sleep(0)  # (the flush is a task of its own)
        while attacher._flushes:
            await asyncio.sleep(0.01)
        flush = leader.calls[-1]
        assert flush["fetch"] is False and flush["acks"][0]["final"] is True
        calls = len(leader.calls)
        attacher.open = []
        await attacher.idle()  # (closed, nothing started since: nothing to say)
        assert len(leader.calls) == calls
        attacher.open = ["bshell001"]
        leader.replies = [{"attachments": [], "open": ["bshell001"]}]
        await attacher.idle()
        await attacher.idle()  # (said: not again before IDLE_RENEW_S)
        assert [c["idle"] for c in leader.calls[calls:]] == [True]

    asyncio.run(go())


# --------------------------------------------------------------------------- the loop


class Source:
    """Attachments for the loop: `texts` one a request, acks counted."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.acked: list[str] = []

    async def fetch(self) -> Attached | None:
        if not self.texts:
            return None
        text = self.texts.pop(0)
        return Attached(text, f"[{text[:20]}]\n", lambda: self.acked.append(text))

    async def idle(self) -> None:
        return None

    async def flush(self) -> None:
        return None


def _script_loop(tmp_path: Path, script: str, source: Source) -> Any:
    from shoal.workers.agent.loop import AgentLoop
    from shoal.workers.agent.progress import Output
    from shoal.workers.agent.scripted import Script, scripted_model
    from shoal.workers.agent.tool_calls import make_tools
    from shoal.workers.agent.tools import Workspace
    from shoal.workers.agent.transcript import Transcript

    return AgentLoop(
        scripted_model(Script.parse(script, "test")),
        instructions="x",
        tools=make_tools(Workspace(tmp_path, mode="bypassPermissions")),
        transcript=Transcript(tmp_path / "t.jsonl"),
        output=Output(tmp_path / "out.txt"),
        attach=source,
    )


def test_a_rounds_attachments_go_into_the_request_that_follows_it(tmp_path: Path) -> None:
    block = render(TaskAttachment.model_validate(att("bshell001", 0, "piece-1\n")))
    source = Source(block)  # (for the first request, then nothing)
    loop = _script_loop(
        tmp_path,
        """
        [[turn]]
        text = "first: {attached} / {prompt}"
        [[turn.call]]
        tool = "Bash"
        args = { command = "true" }
        [[turn]]
        text = "second: {attached} / {prompt}"
        """,
        source,
    )
    outcome = asyncio.run(loop.run("the prompt"))
    assert outcome.status == "completed"
    assert outcome.result == "second: (nothing attached) / the prompt"
    from shoal.workers.agent.transcript import Transcript

    said = [
        p.content
        for m in Transcript.load(tmp_path / "t.jsonl").messages
        for p in m.parts
        if p.part_kind == "text"
    ]
    assert said[0] == f"first: {block} / the prompt"  # ({prompt} is never an attachment)
    assert source.acked == [block]  # (once, when the request was in the transcript)
    assert "[<task-output>" in (tmp_path / "out.txt").read_text()


def test_an_end_notification_after_an_attached_end_is_dropped(tmp_path: Path) -> None:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    from shoal.core.notify import task_notification_xml

    loop = _script_loop(tmp_path, 'final = "ok"\n', Source())
    block = render(TaskAttachment.model_validate(att("bshell001", 0, "bye\n", final=True)))
    loop.history = [ModelRequest(parts=[UserPromptPart(block)])]
    note = task_notification_xml(task_id="bshell001", task_type="local_bash",
                                 output_file="/o", status="completed", summary="done")  # fmt: skip
    other = note.replace("bshell001", "bshell002")
    loop._pending = [note, other]
    assert loop.pending() == [other]  # (between runs)
    feed = Feed()
    feed._agent = loop
    feed._deliver(note)  # (into a run: dropped before it is queued)
    feed._deliver(other)
    assert loop._pending == [other]


def test_the_scripted_model_knows_attached() -> None:
    from shoal.workers.agent.scripted import Script

    Script.parse('[[turn]]\ntext = "{attached}"\n', "t")
    with pytest.raises(ShoalError, match=r"\{attached\}"):
        Script.parse('[[turn]]\ntext = "{attachments}"\n', "t")


def test_the_leader_does_not_move_an_agent_tasks_offset_itself(tmp_path: Path) -> None:
    """Only the agent's acks move it; a lead's shell is read on as before."""
    from shoal.workers.shell.kind import ShellKind

    kind = ShellKind()
    mine = shell(tmp_path, b"a\nb\n")
    lead = shell(tmp_path, b"a\nb\n", task_id="blead0001", owner="team-lead", agent_id=None)
    store = Store(mine, lead)
    kind._read_delta(mine, store)  # type: ignore[arg-type]
    kind._read_delta(lead, store)  # type: ignore[arg-type]
    assert store.changes == [("blead0001", {"output_offset": 4, "last_reported_total_lines": 2})]
