"""The catalog `shoal --help` is printed from: every command in it, each summary its command's
own (the first paragraph of its help, whole), every command in one job section, and the
aliases naming commands that exist. Also the event line of a teammate's notification, which
says the summary in words rather than the XML."""

from __future__ import annotations

import click

from shoal.cli.catalog import ALIASES, COMMANDS, HINTS, SECTIONS, target_of
from shoal.cli.main import cli
from shoal.ui.event_lines import event_line


def test_each_summary_is_its_commands_own_first_paragraph() -> None:
    ctx = click.Context(cli)
    for name, entry in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None, name
        assert command.get_short_help_str(limit=10_000) == entry.summary, name


def test_every_command_is_in_one_section_and_aliases_name_commands() -> None:
    listed = [name for _, names in SECTIONS for name in names]
    assert sorted(listed) == sorted(COMMANDS) and len(listed) == len(set(listed))
    assert all(alias not in COMMANDS and target in COMMANDS for alias, target in ALIASES.items())
    assert target_of("kill") == COMMANDS["stop"].target and target_of("nope") is None
    assert all(word not in COMMANDS and word not in ALIASES for word in HINTS)


def test_a_notification_event_says_its_summary_not_its_xml() -> None:
    message = {
        "from": "ben",
        "kind": "task_notification",
        "text": "<task-notification><task-id>t1</task-id><status>failed</status>",
        "summary": 'ben: "write notes" failed',
        "data": {"status": "failed", "result": "cannot write /w/notes/1.md: Permission denied"},
    }
    line = event_line({"type": "message", "ts": 0, "message": message})
    assert line is not None and "<task-notification>" not in line
    assert line.endswith(
        'from ben [task_notification] ben: "write notes" failed: cannot write /w/notes/1.md: '
        "Permission denied"
    )
    done = {**message, "summary": 'ben: "x" completed', "data": {"status": "completed"}}
    assert (event_line({"type": "message", "ts": 0, "message": done}) or "").endswith(
        '[task_notification] ben: "x" completed'
    )
