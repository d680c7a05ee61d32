"""Task model: ids, the transition table, frozen states, updates, the registry and eviction."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from shoal.core.errors import ShoalError, UsageError
from shoal.core.taskrecords import (
    AgentProgress,
    DreamTurn,
    ShellResult,
    TeammateIdentity,
    ToolActivity,
)
from shoal.core.tasks import (
    KILLED_DISPLAY_S,
    PANEL_GRACE_S,
    TASK_ID_PREFIXES,
    TEAMMATE_MESSAGES_UI_CAP,
    TRANSITIONS,
    AnyTaskState,
    DreamTaskState,
    IllegalTransition,
    InProcessTeammateTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    LocalWorkflowTaskState,
    MonitorMcpTaskState,
    RemoteAgentTaskState,
    TaskStatus,
    TaskType,
    in_grace,
    is_background_task,
    is_panel_agent_task,
    is_terminal_task_status,
    new_task_id,
    parse_task_state,
    should_evict,
    task_type_of_id,
)
from shoal.core.taskupdates import transition, update_task
from shoal.orchestrator.registry import TaskRegistry

TERMINAL = {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.KILLED}


def shell(**kw: Any) -> LocalShellTaskState:
    fields: dict[str, Any] = {
        "id": new_task_id(TaskType.LOCAL_BASH),
        "description": "build",
        "output_file": "/tmp/out",
        "command": "make",
        "start_time": 1000.0,
    }
    fields.update(kw)
    return LocalShellTaskState(**fields)


def agent(**kw: Any) -> LocalAgentTaskState:
    fields: dict[str, Any] = {
        "id": new_task_id(TaskType.LOCAL_AGENT),
        "description": "research",
        "output_file": "/tmp/agent",
        "agent_id": "researcher",
        "prompt": "look around",
        "agent_type": "general",
        "start_time": 1000.0,
    }
    fields.update(kw)
    return LocalAgentTaskState(**fields)


def teammate(**kw: Any) -> InProcessTeammateTaskState:
    identity = TeammateIdentity(
        agent_id="researcher@crew",
        agent_name="researcher",
        team_name="crew",
        parent_session_id="s1",
    )
    fields: dict[str, Any] = {
        "id": new_task_id(TaskType.IN_PROCESS_TEAMMATE),
        "description": "teammate",
        "output_file": "/tmp/tm",
        "identity": identity,
        "prompt": "help",
        "start_time": 1000.0,
    }
    fields.update(kw)
    return InProcessTeammateTaskState(**fields)


def one_of_each() -> list[AnyTaskState]:
    return [
        shell(),
        agent(),
        RemoteAgentTaskState(
            id=new_task_id("remote_agent"), description="r", output_file="/o", session_id="x"
        ),
        teammate(),
        DreamTaskState(id=new_task_id("dream"), description="dream", output_file="/o"),
        LocalWorkflowTaskState(
            id=new_task_id("local_workflow"), description="w", output_file="/o", workflow="ci"
        ),
        MonitorMcpTaskState(
            id=new_task_id("monitor_mcp"), description="m", output_file="/o", server_name="gh"
        ),
    ]


# --------------------------------------------------------------------------- ids


@pytest.mark.parametrize("kind", list(TaskType))
def test_new_task_id_has_prefix_and_round_trips(kind: TaskType) -> None:
    task_id = new_task_id(kind)
    assert task_id[0] == TASK_ID_PREFIXES[kind]
    assert len(task_id) == 9
    assert all(c in "0123456789abcdefghijklmnopqrstuvwxyz" for c in task_id[1:])
    assert task_type_of_id(task_id) is kind


def test_new_task_ids_are_random() -> None:
    assert len({new_task_id("local_agent") for _ in range(200)}) == 200


@pytest.mark.parametrize(
    "bad", ["", "a", "a1234567", "a123456789", "x12345678", "aABCDEFGH", "a1234-678"]
)
def test_malformed_task_id_raises_usage_error_naming_it(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        task_type_of_id(bad)
    assert repr(bad) in str(info.value)


def test_state_refuses_id_of_another_type() -> None:
    with pytest.raises(ValidationError, match="prefix of local_agent"):
        shell(id=new_task_id("local_agent"))
    with pytest.raises(ValidationError, match="malformed task id"):
        shell(id="b1")


# --------------------------------------------------------------------------- status table


def test_transition_table_shape() -> None:
    assert set(TRANSITIONS) == set(TaskStatus)
    assert TRANSITIONS[TaskStatus.PENDING] == {
        TaskStatus.RUNNING,
        TaskStatus.FAILED,
        TaskStatus.KILLED,
    }
    assert TRANSITIONS[TaskStatus.RUNNING] == TERMINAL
    for status in TERMINAL:
        assert TRANSITIONS[status] == frozenset()
        assert is_terminal_task_status(status)
        assert is_terminal_task_status(status.value)
    assert not is_terminal_task_status(TaskStatus.PENDING)
    assert not is_terminal_task_status("running")


def test_transition_returns_new_state_and_sets_end_time() -> None:
    task = shell()
    running = transition(task, TaskStatus.RUNNING, pid=42)
    assert running is not task
    assert (task.status, task.pid) == (TaskStatus.PENDING, None)
    assert (running.status, running.pid, running.end_time) == (TaskStatus.RUNNING, 42, None)
    done = transition(running, "completed", result=ShellResult(code=0))
    assert done.status is TaskStatus.COMPLETED
    assert done.end_time is not None and done.end_time >= running.start_time
    assert done.result == ShellResult(code=0, interrupted=False)


def test_transition_keeps_explicit_end_time() -> None:
    done = transition(transition(shell(), "running"), "failed", end_time=5.0)
    assert done.end_time == 5.0


def test_illegal_transition_names_task_and_statuses() -> None:
    done = transition(transition(shell(), "running"), "killed")
    with pytest.raises(IllegalTransition) as info:
        transition(done, TaskStatus.RUNNING)
    err = info.value
    assert isinstance(err, ShoalError)
    assert (err.task_id, err.from_status, err.to_status) == (
        done.id,
        TaskStatus.KILLED,
        TaskStatus.RUNNING,
    )
    assert done.id in str(err) and "killed -> running" in str(err)
    with pytest.raises(IllegalTransition, match="pending -> completed"):
        transition(shell(), "completed")


def test_same_status_transition_on_terminal_is_noop_and_drops_late_outcome() -> None:
    done = transition(transition(shell(), "running"), "completed", result=ShellResult(code=0))
    again = transition(done, "completed", result=ShellResult(code=1))
    assert again is done
    assert again.result == ShellResult(code=0)


def test_same_status_transition_on_live_task_applies_changes() -> None:
    running = transition(shell(), "running")
    assert transition(running, "running") is running
    moved = transition(running, "running", pid=7)
    assert moved.pid == 7 and moved.status is TaskStatus.RUNNING


def test_update_task_status_goes_through_table() -> None:
    task = shell()
    with pytest.raises(IllegalTransition):
        update_task(task, status=TaskStatus.COMPLETED)
    failed = update_task(task, status="failed", error="no such command")
    assert failed.status is TaskStatus.FAILED and failed.end_time is not None
    with pytest.raises(IllegalTransition):
        update_task(failed, status="running")


def test_update_task_same_values_returns_same_object() -> None:
    task = shell(pid=3)
    assert update_task(task) is task
    assert update_task(task, pid=3, command="make", status="pending") is task
    changed = update_task(task, pid=4)
    assert changed is not task and changed.pid == 4 and task.pid == 3


def test_update_task_validates_changes() -> None:
    task = shell()
    with pytest.raises(TypeError, match="no field 'nope'"):
        update_task(task, nope=1)
    with pytest.raises(TypeError, match="cannot change"):
        update_task(task, id=new_task_id("local_bash"))
    with pytest.raises(ValidationError):
        update_task(task, pid="not a pid")
    with pytest.raises(ValidationError):
        update_task(task, output_offset=-1)


def test_states_are_frozen() -> None:
    task = shell()
    with pytest.raises(ValidationError):
        task.status = TaskStatus.RUNNING  # type: ignore[misc]
    with pytest.raises(ValidationError):
        LocalShellTaskState(**{**task.model_dump(), "surprise": 1})


@settings(max_examples=300)
@given(st.lists(st.sampled_from(list(TaskStatus)), max_size=12))
def test_terminal_status_never_changes(moves: list[TaskStatus]) -> None:
    task = shell()
    registry = TaskRegistry([task])
    terminal_seen: TaskStatus | None = None
    for target in moves:
        legal = target == task.status or target in TRANSITIONS[task.status]

        # The registry enforces the table even against an updater that skips `transition`.
        def bypass(t: Any, target: TaskStatus = target) -> Any:
            return t.model_copy(update={"status": target})

        if legal:
            task = transition(task, target)
            registry.update_task_state(task.id, bypass)
        else:
            with pytest.raises(IllegalTransition):
                transition(task, target)
            with pytest.raises(IllegalTransition):
                registry.update_task_state(task.id, bypass)
        stored = registry.get(task.id)
        assert stored is not None
        assert stored.status is task.status
        if terminal_seen is not None:
            assert task.status is terminal_seen
        elif task.status in TERMINAL:
            terminal_seen = task.status


@given(
    st.sampled_from(["pid", "command", "cwd", "kind", "description", "output_offset"]),
    st.sampled_from(list(TaskStatus)),
)
def test_update_with_current_values_is_noop(field: str, status: TaskStatus) -> None:
    task = shell(status=status, pid=9, cwd="/w", output_offset=12)
    assert update_task(task, **{field: getattr(task, field)}) is task
    registry = TaskRegistry([task])
    assert (
        registry.update_task_state(task.id, lambda t: update_task(t, **{field: getattr(t, field)}))
        is False
    )
    assert registry.update_task_state(task.id, lambda t: t) is False
    assert registry.get(task.id) is task


# --------------------------------------------------------------------------- shapes and parsing


def test_every_kind_round_trips_through_parse_task_state() -> None:
    for task in one_of_each():
        data = task.model_dump(mode="json")
        assert data["type"] == task.type.value
        parsed = parse_task_state(data)
        assert type(parsed) is type(task)
        assert parsed == task


def test_parse_task_state_rejects_unknown_type_and_bad_fields() -> None:
    data = shell().model_dump(mode="json")
    with pytest.raises(ValidationError):
        parse_task_state({**data, "type": "mystery"})
    with pytest.raises(ValidationError):
        parse_task_state({**data, "kind": "python"})
    with pytest.raises(ValidationError):
        parse_task_state({**data, "status": "paused"})


def test_caps_keep_the_newest_items() -> None:
    msgs = tuple({"n": i} for i in range(TEAMMATE_MESSAGES_UI_CAP + 20))
    tm = teammate(messages=msgs)
    assert len(tm.messages) == TEAMMATE_MESSAGES_UI_CAP
    assert tm.messages[0] == {"n": 20} and tm.messages[-1] == {"n": TEAMMATE_MESSAGES_UI_CAP + 19}
    grown = update_task(tm, messages=(*tm.messages, {"n": "new"}))
    assert len(grown.messages) == TEAMMATE_MESSAGES_UI_CAP and grown.messages[-1] == {"n": "new"}
    assert tm.agent_id == "researcher@crew"

    acts = tuple(ToolActivity(tool_name=f"t{i}") for i in range(8))
    assert [a.tool_name for a in AgentProgress(recent_activities=acts).recent_activities] == [
        "t3",
        "t4",
        "t5",
        "t6",
        "t7",
    ]
    turns = tuple(DreamTurn(text=str(i)) for i in range(40))
    dream = DreamTaskState(id=new_task_id("dream"), description="d", output_file="/o", turns=turns)
    assert len(dream.turns) == 30 and dream.turns[0].text == "10"


def test_background_and_panel_predicates() -> None:
    assert is_background_task(shell())
    assert is_background_task(transition(shell(), "running"))
    assert not is_background_task(shell(is_backgrounded=False))
    assert not is_background_task(transition(transition(shell(), "running"), "completed"))
    assert is_panel_agent_task(agent())
    assert not is_panel_agent_task(agent(agent_type="main-session"))
    assert not is_panel_agent_task(shell())
    assert not is_panel_agent_task(teammate())


# --------------------------------------------------------------------------- eviction


def finished(task: Any, status: str = "completed", *, notified: bool = True) -> Any:
    return update_task(
        transition(transition(task, "running"), status, end_time=2000.0), notified=notified
    )


def test_should_evict_plain_task_once_terminal_and_notified() -> None:
    assert not should_evict(transition(shell(), "running"), 10**9)
    assert not should_evict(finished(shell(), notified=False), 10**9)
    assert should_evict(finished(shell()), 2000.0)


def test_killed_shell_stays_visible_briefly() -> None:
    killed = finished(shell(), "killed")
    assert not should_evict(killed, 2000.0 + KILLED_DISPLAY_S - 0.01)
    assert should_evict(killed, 2000.0 + KILLED_DISPLAY_S)


@pytest.mark.parametrize("make", [agent, teammate])
def test_agent_tasks_wait_for_panel_grace(make: Any) -> None:
    done = finished(make())
    assert not should_evict(done, 2000.0 + PANEL_GRACE_S - 0.01)
    assert should_evict(done, 2000.0 + PANEL_GRACE_S)
    early = update_task(done, evict_after=2005.0)
    assert not should_evict(early, 2004.9)
    assert should_evict(early, 2005.0)


def test_retained_agent_is_never_evicted() -> None:
    done = update_task(finished(agent()), retain=True)
    assert not should_evict(done, 10**12)


def test_registry_evict_removes_only_evictable() -> None:
    keep_running = transition(shell(), "running")
    keep_unnotified = finished(shell(), notified=False)
    keep_agent = finished(agent())
    gone = finished(shell())
    registry = TaskRegistry([keep_running, keep_unnotified, keep_agent, gone])
    removed = registry.evict(2001.0)
    assert [t.id for t in removed] == [gone.id]
    assert {t.id for t in registry.get_all_tasks()} == {
        keep_running.id,
        keep_unnotified.id,
        keep_agent.id,
    }


# --------------------------------------------------------------------------- registry


def test_registry_basic_operations() -> None:
    tasks = one_of_each()
    registry = TaskRegistry()
    for task in tasks:
        assert registry.register_task(task) is task
    assert len(registry) == len(tasks)
    assert [t.id for t in registry.get_all_tasks()] == [t.id for t in tasks]
    assert registry.get_task_by_type("local_bash") == [tasks[0]]
    assert registry.get_task_by_type(TaskType.DREAM) == [tasks[4]]
    assert tasks[1].id in registry
    assert registry.remove(tasks[1].id) is tasks[1]
    assert tasks[1].id not in registry and registry.get(tasks[1].id) is None
    assert registry.remove(tasks[1].id) is None
    assert registry.update_task_state(tasks[1].id, lambda t: t) is False


def test_update_task_state_replaces_and_reports_change() -> None:
    task = shell()
    registry = TaskRegistry([task])
    assert registry.update_task_state(task.id, lambda t: transition(t, "running", pid=5)) is True
    stored = registry.get(task.id)
    assert isinstance(stored, LocalShellTaskState)
    assert stored.status is TaskStatus.RUNNING and stored.pid == 5
    assert registry.update_task_state(task.id, lambda t: transition(t, "running")) is False


def test_update_task_state_refuses_identity_change() -> None:
    task = shell()
    registry = TaskRegistry([task])
    with pytest.raises(TypeError, match="id or type"):
        registry.update_task_state(task.id, lambda t: shell())
    assert registry.get(task.id) is task


def test_register_task_merges_ui_state_on_resume() -> None:
    original = agent(
        retain=True,
        disk_loaded=True,
        pending_messages=("hi",),
        messages=({"role": "user"},),
        start_time=111.0,
    )
    registry = TaskRegistry([original])
    resumed = agent(id=original.id, prompt="resumed", status="running", start_time=999.0)
    stored = registry.register_task(resumed)
    assert isinstance(stored, LocalAgentTaskState)
    assert stored.prompt == "resumed" and stored.status is TaskStatus.RUNNING
    assert stored.retain is True and stored.disk_loaded is True
    assert stored.pending_messages == ("hi",) and stored.messages == ({"role": "user"},)
    assert stored.start_time == 111.0
    assert registry.get(original.id) is stored


def test_register_task_merge_only_uses_fields_the_model_has() -> None:
    first = shell(start_time=5.0, pid=1)
    registry = TaskRegistry([first])
    stored = registry.register_task(shell(id=first.id, start_time=50.0, pid=2))
    assert isinstance(stored, LocalShellTaskState)
    assert (stored.start_time, stored.pid) == (5.0, 2)


def test_mark_notified_only_for_terminal_and_once() -> None:
    live = transition(shell(), "running")
    done = finished(shell(), notified=False)
    registry = TaskRegistry([live, done])
    assert registry.mark_notified(live.id) is False
    assert registry.mark_notified("bmissing0") is False
    assert registry.mark_notified(done.id) is True
    assert registry.mark_notified(done.id) is False
    stored = registry.get(done.id)
    assert stored is not None and stored.notified is True


@given(
    st.lists(st.sampled_from(list(TaskStatus)), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=60),
)
def test_mark_notified_at_most_once_for_any_interleaving(
    statuses: list[TaskStatus], calls: list[tuple[int, int]]
) -> None:
    tasks = []
    for status in statuses:
        task = transition(shell(), "running") if status is not TaskStatus.PENDING else shell()
        if status is not TaskStatus.PENDING:
            task = transition(task, status)
        tasks.append(task)
    registry = TaskRegistry(tasks)
    wins: Counter[str] = Counter()
    for _caller, index in calls:
        task_id = tasks[index % len(tasks)].id
        if registry.mark_notified(task_id):
            wins[task_id] += 1
    called = {tasks[i % len(tasks)].id for _c, i in calls}
    for task in tasks:
        expected = 1 if task.status in TERMINAL and task.id in called else 0
        assert wins[task.id] == expected


def test_mark_notified_with_real_threads() -> None:
    terminal = [finished(shell(), notified=False) for _ in range(40)]
    live = [transition(shell(), "running") for _ in range(10)]
    registry = TaskRegistry([*terminal, *live])
    ids = [t.id for t in [*terminal, *live]]
    n_threads = 8
    barrier = threading.Barrier(n_threads)
    wins: list[list[str]] = [[] for _ in range(n_threads)]

    def worker(slot: int) -> None:
        order = ids[slot:] + ids[:slot]
        barrier.wait()
        for _ in range(3):
            for task_id in order:
                if registry.mark_notified(task_id):
                    wins[slot].append(task_id)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    counts = Counter(task_id for slot in wins for task_id in slot)
    assert counts == Counter({t.id: 1 for t in terminal})
    notified = {t.id for t in registry.get_all_tasks() if t.notified}
    assert notified == {t.id for t in terminal}


def test_concurrent_updates_apply_to_fresh_state() -> None:
    task = transition(shell(), "running")
    registry = TaskRegistry([task])
    n_threads, per_thread = 8, 200

    def bump() -> None:
        for _ in range(per_thread):
            registry.update_task_state(
                task.id, lambda t: update_task(t, output_offset=t.output_offset + 1)
            )

    threads = [threading.Thread(target=bump) for _ in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    stored = registry.get(task.id)
    assert stored is not None and stored.output_offset == n_threads * per_thread


@pytest.mark.parametrize("make", [agent, teammate])
def test_an_ended_agent_task_carries_its_panel_grace_deadline(make: Any) -> None:
    """`evict_after` is written when the task ends (a resumed leader keeps the deadline)."""
    done = finished(make())
    assert done.evict_after == 2000.0 + PANEL_GRACE_S
    assert in_grace(done, 2000.0 + PANEL_GRACE_S - 0.01)
    assert not in_grace(done, 2000.0 + PANEL_GRACE_S)
    assert not in_grace(finished(shell()), 2000.0)  # (no grace for other kinds)
    assert in_grace(update_task(finished(agent()), retain=True), 10**12)  # (held by a view)
