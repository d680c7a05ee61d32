"""Notification XML, outcome summaries and SDK event records."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.core.events import task_started, task_terminated
from shoal.core.notify import (
    is_task_notification,
    stall_notification_xml,
    stall_summary,
    summary_for,
    task_notification_for,
    task_notification_xml,
    xml_escape,
)
from shoal.core.taskrecords import ShellResult, TaskUsage, TeammateIdentity
from shoal.core.tasks import (
    InProcessTeammateTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    RemoteAgentTaskState,
    TaskStatus,
    TaskType,
    new_task_id,
)
from shoal.core.taskupdates import transition


def shell(**kw: Any) -> LocalShellTaskState:
    fields: dict[str, Any] = {
        "id": "b12345678",
        "description": "build",
        "output_file": "/s/tasks/b12345678.output",
        "command": "make",
    }
    fields.update(kw)
    return LocalShellTaskState(**fields)


def agent(**kw: Any) -> LocalAgentTaskState:
    fields: dict[str, Any] = {
        "id": "a7k2m9x3f",
        "description": "research",
        "output_file": "/s/tasks/a7k2m9x3f.output",
        "agent_id": "researcher",
        "prompt": "p",
        "agent_type": "general",
    }
    fields.update(kw)
    return LocalAgentTaskState(**fields)


def ended(task: Any, status: str, **changes: Any) -> Any:
    return transition(transition(task, "running"), status, **changes)


def test_xml_matches_seed_layout_exactly() -> None:
    xml = task_notification_xml(
        task_id="b12345678",
        tool_use_id="toolu_1",
        task_type=TaskType.LOCAL_BASH,
        output_file="/s/tasks/b12345678.output",
        status=TaskStatus.COMPLETED,
        summary="Task build completed successfully",
    )
    assert xml == (
        "<task-notification>\n"
        "<task-id>b12345678</task-id>\n"
        "<tool-use-id>toolu_1</tool-use-id>\n"
        "<task-type>local_bash</task-type>\n"
        "<output-file>/s/tasks/b12345678.output</output-file>\n"
        "<status>completed</status>\n"
        "<summary>Task build completed successfully</summary>\n"
        "</task-notification>"
    )


def test_xml_omits_tool_use_id_and_adds_agent_elements() -> None:
    xml = task_notification_xml(
        task_id="a7k2m9x3f",
        task_type="local_agent",
        output_file="/o",
        status="failed",
        summary="s",
        result="done",
        usage=TaskUsage(total_tokens=12, tool_uses=3, duration_ms=450),
    )
    lines = xml.split("\n")
    assert not any("tool-use-id" in line for line in lines)
    assert lines[-3] == "<result>done</result>"
    assert lines[-2] == (
        "<usage><total_tokens>12</total_tokens><tool_uses>3</tool_uses>"
        "<duration_ms>450</duration_ms></usage>"
    )
    assert lines[-1] == "</task-notification>"


def test_values_are_escaped() -> None:
    xml = task_notification_xml(
        task_id="b12345678",
        task_type="local_bash",
        output_file="/tmp/a&b<c>.out",
        status="completed",
        summary='Task "x</summary><status>completed" it\'s',
        result="</result></task-notification>",
    )
    assert "<output-file>/tmp/a&amp;b&lt;c&gt;.out</output-file>" in xml
    assert xml.count("</task-notification>") == 1
    assert xml.count("<status>") == 1
    assert "&quot;" in xml and "&apos;" in xml
    root = ET.fromstring(xml)
    assert root.findtext("summary") == 'Task "x</summary><status>completed" it\'s'
    assert root.findtext("result") == "</result></task-notification>"


@given(
    st.text(st.characters(blacklist_categories=("Cs", "Cc"))),
    st.text(st.characters(blacklist_categories=("Cs", "Cc"))),
)
def test_any_text_round_trips_through_an_xml_parser(summary: str, result: str) -> None:
    xml = task_notification_xml(
        task_id="a7k2m9x3f",
        task_type="local_agent",
        output_file="/o",
        status="completed",
        summary=summary,
        result=result,
    )
    root = ET.fromstring(xml)
    assert [child.tag for child in root] == [
        "task-id",
        "task-type",
        "output-file",
        "status",
        "summary",
        "result",
    ]
    assert (root.findtext("summary") or "") == summary
    assert (root.findtext("result") or "") == result
    assert xml_escape(summary).count("<") == 0


def test_summaries_per_status() -> None:
    assert summary_for(ended(shell(), "completed")) == 'Task "build" completed successfully'
    assert (
        summary_for(ended(shell(), "failed", result=ShellResult(code=2)))
        == 'Task "build" failed with exit code 2'
    )
    assert (
        summary_for(ended(agent(), "failed", error="rate limited"))
        == 'Task "research" failed: rate limited'
    )
    assert summary_for(ended(agent(), "failed")) == 'Task "research" failed'
    assert summary_for(ended(shell(), "killed")) == 'Task "build" was stopped'
    assert (
        summary_for(ended(shell(), "killed", kill_reason="output exceeded 5 GiB"))
        == 'Task "build" was stopped: output exceeded 5 GiB'
    )
    with pytest.raises(ValueError, match="not terminal"):
        summary_for(transition(shell(), "running"))


def test_stall_summary() -> None:
    assert stall_summary("npm init") == (
        'Task "npm init" appears to be waiting for interactive input'
    )
    xml = stall_notification_xml(transition(shell(description="npm init"), "running"), "ok? (y/n)")
    root = ET.fromstring(xml)
    assert root.findtext("status") == "running"
    assert root.findtext("summary") == stall_summary("npm init")
    assert root.findtext("output-tail") == "ok? (y/n)"


def test_notification_for_shell_and_agent() -> None:
    done_shell = ended(shell(tool_use_id="toolu_9"), "completed")
    root = ET.fromstring(task_notification_for(done_shell))
    assert root.findtext("tool-use-id") == "toolu_9"
    assert root.findtext("task-type") == "local_bash"
    assert root.findtext("output-file") == done_shell.output_file
    assert root.findtext("summary") == 'Task "build" completed successfully'
    assert root.find("result") is None and root.find("usage") is None

    usage = TaskUsage(total_tokens=100, tool_uses=4, duration_ms=2500)
    done_agent = ended(agent(), "completed", result="found it", usage=usage)
    root = ET.fromstring(task_notification_for(done_agent))
    assert root.find("tool-use-id") is None
    assert root.findtext("result") == "found it"
    assert root.findtext("usage/total_tokens") == "100"
    assert root.findtext("usage/tool_uses") == "4"
    assert root.findtext("usage/duration_ms") == "2500"

    custom = ET.fromstring(task_notification_for(done_agent, summary="custom words"))
    assert custom.findtext("summary") == "custom words"


def test_notification_for_teammate_carries_result() -> None:
    identity = TeammateIdentity(
        agent_id="r@crew", agent_name="r", team_name="crew", parent_session_id="s"
    )
    task = InProcessTeammateTaskState(
        id=new_task_id("in_process_teammate"),
        description="tm",
        output_file="/o",
        identity=identity,
        prompt="p",
    )
    root = ET.fromstring(task_notification_for(ended(task, "completed", result="bye")))
    assert root.findtext("result") == "bye"
    assert root.findtext("task-type") == "in_process_teammate"


def test_is_task_notification() -> None:
    xml = task_notification_for(ended(shell(), "completed"))
    assert is_task_notification(xml)
    assert is_task_notification("\n  " + xml)
    assert not is_task_notification("please read <task-notification> docs")
    assert not is_task_notification("hello")


def test_event_records() -> None:
    task = shell(tool_use_id="toolu_2")
    assert task_started(task).to_record() == {
        "type": "system",
        "subtype": "task_started",
        "task_id": "b12345678",
        "tool_use_id": "toolu_2",
        "description": "build",
        "task_type": "local_bash",
    }
    done = ended(task, "failed", result=ShellResult(code=1))
    assert task_terminated(done).to_record() == {
        "type": "system",
        "subtype": "task_terminated",
        "task_id": "b12345678",
        "status": "failed",
        "summary": 'Task "build" failed with exit code 1',
    }
    remote = RemoteAgentTaskState(id="r00000000", description="cloud", output_file="/o")
    assert task_started(remote).to_record()["tool_use_id"] is None
    assert task_terminated(ended(remote, "killed"), summary="x").to_record()["summary"] == "x"


@given(st.text())
def test_xml_escape_is_saxutils_escape_with_both_quotes(text: str) -> None:
    from xml.sax.saxutils import escape

    assert xml_escape(text) == escape(text, {'"': "&quot;", "'": "&apos;"})
    assert xml_escape(42) == "42"
