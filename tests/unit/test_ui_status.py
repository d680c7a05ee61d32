"""Status icons and colours, teammate activity lines, formatters and the tmux status hint."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shoal.ui.status import (
    COLOR_STYLES,
    StatusFlags,
    TeammateFacts,
    describe_teammate_activity,
    format_age,
    member_activity,
    member_icon,
    parse_timestamp,
    rich_color,
    status_color,
    status_icon,
    status_text,
    task_icon,
    teammate_facts_from_status,
    teammate_facts_from_task,
    type_label,
)
from shoal.ui.tmux import tmux_status_hint

IDLE = StatusFlags(idle=True)
AWAITING = StatusFlags(awaiting_approval=True)
STOPPING = StatusFlags(shutdown_requested=True)
ERROR = StatusFlags(has_error=True)


@pytest.mark.parametrize(
    ("status", "flags", "icon", "color"),
    [
        ("running", None, "▶", "background"),
        ("pending", None, "•", "background"),
        ("completed", None, "✔", "success"),
        ("failed", None, "✘", "error"),
        ("killed", None, "✘", "warning"),
        ("running", IDLE, "…", "background"),
        ("running", AWAITING, "?", "warning"),
        ("running", STOPPING, "⚠", "warning"),
        ("running", ERROR, "✘", "error"),
        # Approval outranks stopping, which outranks idle; an error outranks everything.
        ("running", StatusFlags(idle=True, awaiting_approval=True), "?", "warning"),
        ("running", StatusFlags(idle=True, shutdown_requested=True), "⚠", "warning"),
        ("completed", StatusFlags(has_error=True, awaiting_approval=True), "✘", "error"),
    ],
)
def test_icon_and_color(status: str, flags: StatusFlags | None, icon: str, color: str) -> None:
    assert status_icon(status, flags) == icon
    assert status_color(status, flags) == color
    assert color in COLOR_STYLES


@pytest.mark.parametrize(
    ("facts", "line"),
    [
        (TeammateFacts(), "working"),
        (TeammateFacts(activity="Reading a.py"), "Reading a.py"),
        (TeammateFacts(recent_activities=("Grep x", "Edit y")), "Edit y"),
        (TeammateFacts(idle=True, activity="Reading a.py"), "idle"),
        (TeammateFacts(idle=True, awaiting_approval=True), "awaiting approval"),
        (TeammateFacts(awaiting_approval=True, shutdown_requested=True), "stopping"),
    ],
)
def test_teammate_activity(facts: TeammateFacts, line: str) -> None:
    assert describe_teammate_activity(facts) == line


def test_facts_from_a_teammate_task_record() -> None:
    record = {
        "type": "in_process_teammate",
        "status": "running",
        "is_idle": False,
        "awaiting_plan_approval": True,
        "shutdown_requested": False,
        "progress": {
            "last_activity": {"tool_name": "Edit", "description": "Editing a.py"},
            "recent_activities": [{"tool_name": "Read", "description": ""}],
        },
    }
    facts = teammate_facts_from_task(record)
    assert facts.activity == "Editing a.py"
    assert facts.recent_activities == ("Read",)
    assert describe_teammate_activity(facts) == "awaiting approval"
    assert task_icon(record) == ("?", "yellow")
    assert task_icon({**record, "status": "completed"}) == ("✔", "green")


@pytest.mark.parametrize(
    ("state", "status", "line", "icon"),
    [
        ("busy", {"activity": "Running tests"}, "Running tests", "▶"),
        ("active", {}, "working", "▶"),
        ("idle", {"activity": "old"}, "idle", "…"),
        ("busy", {"awaiting_approval": True}, "awaiting approval", "?"),
        ("stopping", {}, "stopping", "⚠"),
        ("busy", {"shutdown_requested": True}, "stopping", "⚠"),
        ("dead", {"activity": "Running tests"}, "", "✘"),
        ("left", {}, "", "✔"),
    ],
)
def test_member_activity_and_icon(
    state: str, status: dict[str, object], line: str, icon: str
) -> None:
    facts = teammate_facts_from_status(status, state)
    assert member_activity(state, facts) == line
    assert member_icon(state, facts)[0] == icon


def test_formatters() -> None:
    assert format_age(4.25) == "4.2s"
    assert format_age(90) == "1.5m"
    assert format_age(5400) == "1.5h"
    assert format_age(-3) == "0.0s"
    assert status_text({"status": "failed", "result": {"code": 2}}) == "failed(2)"
    assert status_text({"status": "failed"}) == "failed"
    assert type_label({"type": "local_bash", "kind": "monitor"}) == "monitor"
    assert type_label({"type": "in_process_teammate"}) == "teammate"
    stamp = datetime(2030, 3, 17, 17, 46, 41, tzinfo=UTC).timestamp()
    assert parse_timestamp("2030-03-17T17:46:41.000000Z") == stamp
    assert parse_timestamp(12.5) == 12.5
    assert parse_timestamp("nonsense") is None
    assert rich_color("colour33") == "color(33)"
    assert rich_color("orange") == "dark_orange"
    assert rich_color("red") == "red"
    assert rich_color(None) == ""


def test_tmux_hint_only_inside_tmux() -> None:
    assert tmux_status_hint("/h", "t", env={}) is None
    hint = tmux_status_hint("/my home/#1", "t", env={"TMUX": "/tmp/tmux-0/default,123,0"})
    assert hint is not None
    assert hint.socket == "/tmp/tmux-0/default"
    assert hint.argv[:6] == [
        "tmux",
        "-S",
        "/tmp/tmux-0/default",
        "set-option",
        "-g",
        "status-right",
    ]
    # Quoted for /bin/sh, `#` doubled for tmux's format parser.
    assert hint.status_right.startswith("#(") and hint.status_right.endswith(" pill --team t)")
    assert "--home '/my home/##1'" in hint.status_right
    other = tmux_status_hint("/h", "t", env={}, socket="/tmp/tmux-0/shoal-t")
    assert other is not None and other.argv[2] == "/tmp/tmux-0/shoal-t"
