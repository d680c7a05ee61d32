"""`shoal run` checks and output without a run: member scripts checked with the spec, script
formats, lines of unknown tables, the backend chosen for members, agent exit codes, one-line
progress and output that nobody reads any more."""

from __future__ import annotations

import asyncio
import io
import os
from pathlib import Path

import pytest

from shoal.cli.run_sinks import Droppable, StreamJson, TextProgress, one_line
from shoal.core.errors import UsageError
from shoal.orchestrator.batch import resolve_backend
from shoal.orchestrator.batch.agents import _exit_code
from shoal.orchestrator.batch.checker import SpecLocator
from shoal.orchestrator.batch.parse import parse_spec
from shoal.orchestrator.batch.spec import SpecError
from shoal.workers.teammate.brains import (
    ExecBrain,
    Script,
    ScriptedBrain,
    TurnContext,
    command_failed,
    exit_code_of,
)

TASK = "[[task]]\nid = 'a'\nprompt = 'p'\nassign = 'm'\n"


def spec_errors(directory: Path, text: str) -> list[str]:
    path = directory / "spec.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        parse_spec(path, display="spec.toml")
    return str(info.value).splitlines()


# --------------------------------------------------------------------------- member scripts


def test_a_member_script_that_does_not_parse_is_a_spec_error_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[[step]\n")
    lines = spec_errors(
        tmp_path,
        "[run]\njobs = 1\n\n[[member]]\nname = 'm'\nprompt = 'x'\nscript = 'bad.toml'\n"
        + TASK
        + "after = 'ghost'\n",
    )
    assert lines[0] == "spec.toml: 2 errors in the spec; nothing was started"
    assert lines[1].startswith(
        f"spec.toml:7: member \"m\": script {tmp_path}/bad.toml is not valid TOML: Expected ']]'"
    )
    assert lines[2].startswith('spec.toml:12: task "a": after names unknown task "ghost"')


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("s.json", '{"step": [{"frob": 1}]}', "step 1 needs exactly one of"),
        ("s.toml", "on_shutdown = 'maybe'\n", "on_shutdown must be approve, reject or ignore"),
        ("s.steps", "[[step]]\nrun = 'x'\nwhen = 'later'\n", "when must be always, task or"),
        ("s.json", "[[step]]\nrun = 'x'\n", "is not valid JSON"),
        ("s.toml", b"\xff\xfe", "is not UTF-8 text"),
    ],
)
def test_a_member_script_is_checked_as_its_teammate_reads_it(
    tmp_path: Path, name: str, text: str | bytes, fragment: str
) -> None:
    script = tmp_path / name
    script.write_bytes(text if isinstance(text, bytes) else text.encode())
    lines = spec_errors(tmp_path, f"[[member]]\nname = 'm'\nscript = '{name}'\n" + TASK)
    assert len(lines) == 2 and lines[1].startswith('spec.toml:3: member "m": '), lines
    assert fragment in lines[1]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("review.steps", '[[step]]\nrun = "echo {name}"\n'),
        ("review.steps", '{"step": [{"run": "echo {name}"}]}'),
        ("review", '[[step]]\nrun = "echo {name}"\n'),
        ("review.TOML", '[[step]]\nrun = "echo {name}"\n'),
        ("review.json", '{"step": [{"run": "echo {name}"}]}'),
    ],
)
def test_a_script_is_toml_or_json_by_extension_else_whichever_parses(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    script = Script.load(path)
    assert [(s.kind, s.args["run"]) for s in script.steps] == [("run", "echo {name}")]


def test_a_script_that_is_neither_names_both_failures(tmp_path: Path) -> None:
    path = tmp_path / "review.steps"
    path.write_text("[[step]\n")
    with pytest.raises(UsageError) as info:
        Script.load(path)
    message = str(info.value)
    assert message.startswith(f"script {path} is neither TOML nor JSON (as TOML: Expected ']]'")
    assert "; as JSON: " in message and message.endswith("name it .toml or .json to choose")
    path.write_text('[[step]]\nrun = "x"\n')
    with pytest.raises(UsageError, match=r"review.json is not valid JSON"):
        Script.load(path.rename(tmp_path / "review.json"))


# --------------------------------------------------------------------------- unknown tables


def test_unknown_top_level_tables_have_their_lines(tmp_path: Path) -> None:
    lines = spec_errors(
        tmp_path,
        "[run]\njobs = 1\n\n[[task]]\nid = 'a'\nrun = 'x'\n[frob]\nx = 1\n[[zap]]\n[a.b]\n",
    )
    assert lines[1:] == [
        'spec.toml:7: spec: unknown key "frob"; allowed: run, member, task',
        'spec.toml:9: spec: unknown key "zap"; allowed: run, member, task',
        'spec.toml:10: spec: unknown key "a"; allowed: run, member, task',
    ]


def test_the_locator_knows_tables_as_top_level_keys() -> None:
    loc = SpecLocator("top = 1\n[run]\njobs = 1\n[[task]]\nid = 'a'\n[task.env]\nA = 1\n")
    assert [loc.line(("", 0), k) for k in ("top", "run", "task")] == [1, 2, 4]
    assert loc.line(("task", 0), "env") == 6


# --------------------------------------------------------------------------- backend


def test_auto_resolves_to_a_named_backend_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TMUX", "TERM_PROGRAM", "ITERM_SESSION_ID"):
        monkeypatch.delenv(name, raising=False)
    backend, why = resolve_backend(None, "auto")
    assert backend == "process" and "not inside tmux or iTerm2" in why
    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,1,0")
    assert resolve_backend(None, "auto") == ("tmux", "running inside tmux ($TMUX is set)")
    assert resolve_backend("auto", "process")[0] == "tmux"
    assert resolve_backend("process", "auto") == ("process", "chosen with --backend")
    assert resolve_backend(None, "in-process") == (
        "in-process",
        "set by [run] backend in the spec",
    )


# --------------------------------------------------------------------------- exit codes


def context(tmp_path: Path) -> TurnContext:
    async def send(to: str, text: str) -> None:
        return None

    async def update_task(task_id: int, status: str) -> None:
        return None

    async def approve_plan(plan: str) -> tuple[bool, str | None]:
        return True, None

    return TurnContext(
        name="m",
        team="t",
        prompt="p",
        cwd=str(tmp_path),
        output_file=tmp_path / "out",
        task=None,
        send=send,
        update_task=update_task,
        approve_plan=approve_plan,
        activity=lambda _: None,
    )


def test_brains_report_the_exit_code_of_the_command_that_failed(tmp_path: Path) -> None:
    brain = ExecBrain("sh -c 'echo line1; echo oops; exit 7'")
    result = asyncio.run(brain.turn(context(tmp_path)))
    assert (result.ok, result.exit_code) == (False, 7)
    assert result.result == "sh exited with code 7: line1\noops"
    assert exit_code_of(result.result) == 7
    scripted = ScriptedBrain(Script.parse({"step": [{"run": "exit 5"}]}))
    result = asyncio.run(scripted.turn(context(tmp_path)))
    assert (result.ok, result.exit_code) == (False, 5)
    assert result.result == "command failed with exit code 5"
    assert exit_code_of(result.result) == 5
    ok = asyncio.run(ExecBrain("true").turn(context(tmp_path)))
    assert (ok.ok, ok.exit_code) == (True, 0)


@pytest.mark.parametrize(
    ("status", "data", "result", "code"),
    [
        ("completed", {}, "", 0),
        ("failed", {"exit_code": 3}, command_failed("sh", 7, ""), 3),
        ("failed", {}, command_failed("/usr/bin/my agent", 7, "x\ny"), 7),
        ("failed", {}, command_failed(None, 130, "tail"), 130),
        ("failed", {"exit_code": True}, "plan rejected: no", None),
        ("failed", {}, "plan rejected: exited with code 3", None),
        ("killed", {}, "aborted: stop", None),
    ],
)
def test_an_agent_attempt_reports_the_real_exit_code(
    status: str, data: dict[str, object], result: str, code: int | None
) -> None:
    assert _exit_code(status, data, result) == code


# --------------------------------------------------------------------------- progress output


def test_progress_lines_stay_one_line_and_reports_keep_the_reason() -> None:
    assert one_line("a\n\n  b  \nc") == "a ⏎ b ⏎ c"
    assert one_line("x" * 300, width=10) == "x" * 9 + "…"
    out, err = io.StringIO(), io.StringIO()
    show = TextProgress(out, err, live=False)
    show({"type": "run", "subtype": "run_started", "spec": "s.toml", "team": "t", "jobs": 1,
          "halt": "never", "total": 2, "resumed": 0})  # fmt: skip
    show({"type": "run", "subtype": "task_retrying", "id": "x", "attempt": 1, "status": "failed",
          "reason": "boom\nbang", "next_attempt": 2, "attempts_max": 2})  # fmt: skip
    show({"type": "run", "subtype": "task_finished", "id": "x", "status": "failed",
          "attempts": 2, "exit_code": 7, "duration_s": 0.5, "output_file": "/o",
          "reason": "sh exited with code 7: line1\noops"})  # fmt: skip
    show({"type": "run", "subtype": "note", "text": "two\nlines"})
    lines = out.getvalue().splitlines()
    assert lines[1] == "retry x: attempt 1 failed (boom ⏎ bang); starting attempt 2 of 2"
    assert lines[2] == (
        "[1/2] FAILED    x  sh exited with code 7: line1 ⏎ oops (0.50s, 2 attempts); output: /o"
    )
    assert err.getvalue() == "note: two ⏎ lines\n"


def test_stream_json_also_shows_notes_on_stderr() -> None:
    out, err = io.BytesIO(), io.StringIO()
    show = StreamJson(out, err)
    show({"type": "run", "subtype": "note", "text": "members run as process: why"})
    show({"type": "system", "subtype": "note", "text": "from the leader"})
    assert out.getvalue().count(b"\n") == 2
    assert err.getvalue() == "note: members run as process: why\n"


def test_output_nobody_reads_is_dropped_and_its_descriptor_silenced() -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    with os.fdopen(write_fd, "w") as stream:
        out = Droppable(stream)
        out.write("first line\n")  # EPIPE: the reader is gone
        assert out.gone and not out.isatty()
        out.write("more\n")
        out.flush()
        # The descriptor now leads to /dev/null: a final flush at exit cannot fail.
        stream.write("at exit\n")
        stream.flush()
