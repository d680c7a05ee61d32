"""The leader's one loop: kills that never block it, one in-process backend per swarm, steps
whose errors are seen, and notifications whose summary is plain text."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from shoal.channel.client import call
from shoal.core.config import Limits
from shoal.core.events import TaskNotified, TeammateReady
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.tasks import LocalShellTaskState, TaskStatus
from shoal.mailbox.router import send
from shoal.orchestrator.leader import Leader
from shoal.teams.models import LEAD_NAME
from shoal.teams.store import Teams
from tests.polling import wait_until

# A task that ignores SIGTERM (and so does its shell): only the KILL after the grace ends it.
STUBBORN = "trap '' TERM; echo up; while :; do sleep 0.05; done"


@contextmanager
def running(leader: Leader) -> Iterator[Leader]:
    """`leader` started, its loop on a thread of its own; shut down at the end."""
    leader.start()
    stop = threading.Event()
    loop = threading.Thread(target=leader.run, args=(stop,), name=f"loop-{leader.team}")
    loop.start()
    try:
        yield leader
    finally:
        stop.set()
        leader.wake()
        loop.join(30)
        leader.shutdown()


def _printed(path: Path, text: str) -> bool:
    return path.read_text().startswith(text)


def test_a_control_request_is_answered_while_ten_stubborn_tasks_are_being_killed(
    home: Path,
) -> None:
    limits = replace(Limits(), kill_grace=5.0, poll_interval=0.1)
    layout = Layout(home)
    with running(Leader(layout, "k", limits=limits)) as leader:
        tasks = [leader.submit_shell([STUBBORN]) for _ in range(10)]
        for task in tasks:  # each has trapped TERM (it printed "up")
            wait_until(partial(_printed, Path(task.output_file), "up"))
        for task in tasks:  # begins each kill: TERM sent, deadline recorded, nothing waits
            leader.call(partial(leader.stop, task.id)).result(5)
        replies = []
        for _ in range(3):  # (the quickest of three: the machine is shared)
            started = time.monotonic()
            assert call(layout, "k", "ping")["pid"] == os.getpid()
            replies.append(time.monotonic() - started)
        still = [leader.registry.get(t.id) for t in tasks]
        assert all(s is not None and s.status is TaskStatus.RUNNING for s in still)
        assert min(replies) < 0.1, replies
        # The later reap sends KILL once the grace is over; then every task ends killed.
        wait_until(
            lambda: all(
                (s := leader.registry.get(t.id)) is None or s.status is TaskStatus.KILLED
                for t in tasks
            ),
            timeout=30,
        )
        for task in tasks:
            final = leader.registry.get(task.id)
            if final is not None:
                assert isinstance(final, LocalShellTaskState)
                assert not is_alive(final.pid, final.pid_started_at)


def test_two_leaders_in_one_process_each_start_an_in_process_teammate(home: Path) -> None:
    layout = Layout(home)
    ready: dict[str, list[str]] = {"a": [], "b": []}

    def leader_for(team: str) -> Leader:
        def on_event(event: Any) -> None:
            if isinstance(event, TeammateReady):
                ready[team].append(event.name)

        return Leader(layout, team, on_event=on_event)

    with running(leader_for("a")) as first, running(leader_for("b")) as second:
        answers: dict[str, Any] = {}
        for leader, name in ((first, "ana"), (second, "ben")):

            def done(result: Any, error: Any, name: str = name) -> None:
                answers[name] = error if error is not None else result

            spec = {"name": name, "backend": "in-process", "cwd": str(home)}
            leader.call(partial(leader.spawn, [spec], done))
        wait_until(lambda: len(answers) == 2, timeout=60)
        assert not any(isinstance(a, Exception) for a in answers.values()), answers
        assert ready == {"a": ["ana"], "b": ["ben"]}
        assert first.swarm.members["ana"].backend is not second.swarm.members["ben"].backend


def test_a_notification_summary_is_plain_text(home: Path) -> None:
    layout = Layout(home)
    teams = Teams(layout)
    teams.create("n")
    teams.join("n", "ana", pid=os.getpid())  # a live member to own the task
    leader = Leader(layout, "n").start()
    try:
        command = 'echo "a" && echo b'
        task = leader.submit_shell([command], agent="ana")
        wait_until(lambda: not leader.procs[task.id].poll())
        leader.tick()
        events = [e for e in leader.session.typed_events() if isinstance(e, TaskNotified)]
        assert [e.summary for e in events] == [f'Task "{command}" completed successfully']
        assert "&quot;" in events[0].notification  # (the XML itself is escaped)
        inbox = layout.inbox_dir("n", "ana") / "new"
        messages = [orjson.loads(p.read_bytes()) for p in inbox.iterdir()]
        notes = [m for m in messages if m["kind"] == "task_notification"]
        assert [m["summary"] for m in notes] == [f'Task "{command}" completed successfully']
        assert notes[0]["data"]["status"] == "completed"
    finally:
        leader.shutdown()


def test_a_step_that_raises_fails_in_strict_mode_and_is_a_note_otherwise(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(home)

    def broken() -> None:
        raise RuntimeError("disk on fire")

    strict = Leader(layout, "s1", strict=True).start()
    try:
        monkeypatch.setattr(strict, "cleanup_orphans", broken)
        with pytest.raises(RuntimeError, match="disk on fire"):
            strict.tick()
    finally:
        monkeypatch.undo()
        strict.shutdown()
    lenient = Leader(layout, "s2", strict=False).start()
    try:
        monkeypatch.setattr(lenient, "cleanup_orphans", broken)
        lenient.tick()
        lenient.tick()  # (the same error again is not noted twice)
        assert lenient.notes.count("orphans failed: RuntimeError('disk on fire')") == 1
    finally:
        lenient.shutdown()


def test_stop_of_a_pending_task_ends_it_at_once(home: Path) -> None:
    leader = Leader(Layout(home), "p", jobs=1).start()
    try:
        first = leader.submit_shell(["sleep 30"])
        second = leader.submit_shell(["echo never"])
        assert leader.registry.get(second.id).status is TaskStatus.PENDING  # type: ignore[union-attr]
        final = leader.stop_task(second.id)
        assert final.status is TaskStatus.KILLED and final.notified
        assert not Path(second.output_file).exists()  # it never ran
        leader.stop_task(first.id)
    finally:
        leader.shutdown()


def test_what_a_control_request_did_is_on_disk_when_its_client_hears_the_answer(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`shoal ps` right after `shoal spawn` (or `sh`) lists what it started: the leader
    writes state.json before it answers, not at its next throttled write (here never)."""
    monkeypatch.setattr("shoal.orchestrator.leader.PERSIST_INTERVAL_S", 1e9)
    layout = Layout(home)
    with running(Leader(layout, "w")) as leader:
        wait_until(lambda: not leader.snapshot.dirty)  # (the start's own writes are done)
        spec = {"name": "ana", "backend": "in-process", "cwd": str(home)}
        member = call(layout, "w", "spawn", spec, timeout=60)
        listed = leader.session.read_tasks_raw()
        assert member["task_id"] in listed, (member, sorted(listed))
        started = call(layout, "w", "sh", {"command": ["sleep 30"]})
        assert started["id"] in leader.session.read_tasks_raw()


def test_mail_that_reaches_the_lead_after_its_loop_ends_is_recorded_at_shutdown(
    home: Path,
) -> None:
    """A teammate's last message (its shutdown answer, its result) can reach the lead's inbox
    after the loop's last pass. The inbox has taken it by then (handled and acknowledged), so
    the shutdown records it: an event, like any other, not a message lost with the queue."""
    layout = Layout(home)
    leader = Leader(layout, "m")
    leader.start()
    stop = threading.Event()
    loop = threading.Thread(target=leader.run, args=(stop,), name="loop-m")
    loop.start()
    try:
        Teams(layout).join("m", "ana", pid=os.getpid())
        stop.set()
        leader.wake()
        loop.join(30)
        assert not loop.is_alive()
        sent = send(Teams(layout).directory("m"), to=LEAD_NAME, sender="ana", text="last words")
        handled = layout.home / "teams" / "m" / "inboxes" / LEAD_NAME / "handled.log"
        wait_until(
            lambda: handled.exists() and sent.message.id in handled.read_text(),
            what="the lead's inbox to take the message",
        )
    finally:
        leader.shutdown()
    session = leader.session
    texts = [e["message"].get("text") for e in session.events() if e.get("type") == "message"]
    assert texts == ["last words"], texts


def test_a_notified_task_leaves_the_registry_on_the_next_round(home: Path) -> None:
    """As the seed's generateTaskAttachments: terminal + notified tasks are marked at one
    round and evicted at the next, so a view that saw the end still finds the task once."""
    from tests.unit.test_task_model import finished, shell

    leader = Leader(Layout(home), "ev").start()
    try:
        task = leader.register(finished(shell(output_file=str(home / "out"))))
        now = time.time()
        leader.evict(now)
        assert leader.registry.get(task.id) is not None  # found evictable: marked, still listed
        leader.evict(now, new_round=False)  # (a quick pass drops what a round marked)
        assert leader.registry.get(task.id) is None
        assert task.id in leader.history()
    finally:
        leader.shutdown()
