"""The teammate console's lines: plain off a terminal, coloured on one unless NO_COLOR, one
line per event whatever the text holds; and a command's output followed as it is written."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shoal.workers.teammate import console as console_mod
from shoal.workers.teammate.console import Console, OutputFollower, preview, wants_colour
from tests.polling import wait_until, wait_until_async

NOON = time.mktime((2026, 1, 2, 12, 0, 5, 0, 0, -1))


def plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(out, clock=lambda: NOON), out


def test_a_line_is_a_time_a_padded_tag_and_the_text() -> None:
    con, out = plain()
    con.received("text", "team-lead", "hello\n  there")
    con.idle()
    con.exited(0)
    con.exited(2)
    assert out.getvalue().splitlines() == [
        "12:00:05 received text from team-lead: hello there",
        "12:00:05 idle",
        "12:00:05 exit     exit code 0",
        "12:00:05 failed   exit code 2",
    ]


def test_colour_wraps_the_tag_and_stamp_and_keeps_the_text() -> None:
    out = io.StringIO()
    Console(out, colour=True, clock=lambda: NOON).sent("task_notification", "team-lead", "ok")
    line = out.getvalue()
    assert line.startswith("\x1b[2m12:00:05\x1b[0m \x1b[32msent    \x1b[0m ")
    assert line.endswith("task_notification to team-lead: ok\n")


def test_escape_sequences_and_control_characters_never_reach_the_pane() -> None:
    con, out = plain()
    con.output("\x1b[31mred\x1b[0m 50%\r100%\x07 done\tok")
    con.received("text", "ana", "a\x1b]0;title\x07b")
    assert out.getvalue().splitlines() == [
        "12:00:05 output   red 50%100% done\tok",
        "12:00:05 received text from ana: ab",
    ]


def test_previews_are_one_line_and_cut() -> None:
    assert preview("a\n\n b  c") == "a b c"
    assert preview(None) == ""
    cut = preview("x" * 500)
    assert len(cut) == console_mod.PREVIEW_CHARS and cut.endswith("…")
    con, out = plain()
    con.output("y" * 2000)
    assert len(out.getvalue().split(None, 2)[2].rstrip("\n")) == console_mod.OUTPUT_LINE_CHARS


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    leader, follower = os.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            assert wants_colour(tty, {})
            assert not wants_colour(tty, {"NO_COLOR": "1"})
            assert wants_colour(tty, {"NO_COLOR": ""})  # (set but empty: no-color.org says colour)
        assert not wants_colour(io.StringIO(), {})
    finally:
        os.close(leader)
        os.close(follower)


def test_a_console_that_is_off_writes_nothing() -> None:
    con = Console.off()
    assert not con.enabled
    con.received("text", "a", "b")
    con.transcript("● Bash(ls)\n")  # (nothing to write to, nothing raised)


def test_stdout_is_line_buffered_so_a_log_file_has_each_line_at_once(tmp_path: Path) -> None:
    log = tmp_path / "member.log"
    code = (
        "import time\n"
        "from shoal.workers.teammate.console import Console\n"
        "c = Console.for_stdout()\n"
        "c.received('text', 'team-lead', 'hi')\n"
        "c.idle()\n"
        "time.sleep(600)\n"
    )
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=fh, env=dict(os.environ))
    try:
        wait_until(
            lambda: len(log.read_text().splitlines()) == 2,
            what=lambda: f"two lines in the log while the writer still runs: {log.read_text()!r}",
        )
        lines = log.read_text().splitlines()
        assert proc.poll() is None
        assert lines[0].endswith("received text from team-lead: hi") and "\x1b" not in lines[0]
    finally:
        proc.kill()
        proc.wait()


def test_the_follower_shows_complete_lines_as_they_are_written(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"before the command\n")
    con, out = plain()

    async def main() -> None:
        follower = con.follow(path, path.stat().st_size)
        follower.start()
        with open(path, "ab", buffering=0) as fh:
            fh.write(b"one\ntw")
            await wait_until_async(lambda: "output   one" in out.getvalue())
            assert "tw" not in out.getvalue()  # (half a line waits for its end)
            fh.write(b"o\nthree")
            await wait_until_async(lambda: "output   two" in out.getvalue())
        follower.stop()  # the last line, without its newline, is shown at the end

    asyncio.run(main())
    assert [line.split(None, 2)[2] for line in out.getvalue().splitlines()] == [
        "one",
        "two",
        "three",
    ]


def test_the_follower_skips_what_it_cannot_keep_up_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console_mod, "FOLLOW_BEHIND", 100)
    monkeypatch.setattr(console_mod, "FOLLOW_CHUNK", 20)
    path = tmp_path / "out"
    path.write_bytes(b"".join(b"line %03d\n" % i for i in range(50)))  # 450 bytes
    con, out = plain()
    follower = OutputFollower(con, path, 0)
    follower.read()
    shown = [line.split(None, 2)[2] for line in out.getvalue().splitlines()]
    assert shown[0] == f"… 430 bytes not shown (all in {path})"
    # From 20 bytes before the end, less the rest of the line that cut into.
    assert shown[1:] == ["line 048", "line 049"]
