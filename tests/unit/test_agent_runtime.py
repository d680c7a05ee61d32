"""The agent runtime's pieces, offline: model specs and their precedence, the scripted model,
the tools as the model sees them (with their bad inputs), limits, transcripts and replay."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from shoal.core.errors import NotFoundError, UsageError
from shoal.core.paths import Layout
from shoal.teams.store import Teams
from shoal.workers.agent.foreground import OUTPUT_KEEP_CHARS, run_foreground
from shoal.workers.agent.loop import AgentLoop, Limits, Outcome
from shoal.workers.agent.models import (
    MissingKeyError,
    ModelSpec,
    build_model,
    check_model,
    choose_model,
)
from shoal.workers.agent.progress import Output
from shoal.workers.agent.replay import replay_model
from shoal.workers.agent.scripted import Script, scripted_model
from shoal.workers.agent.team_tools import TeamCreateArgs, TeamDeleteArgs, TeamTools
from shoal.workers.agent.tool_args import (
    EditArgs,
    GrepArgs,
    ReadArgs,
    ToolFailure,
    WriteArgs,
    parse_args,
)
from shoal.workers.agent.tool_calls import make_tools
from shoal.workers.agent.tools import Workspace
from shoal.workers.agent.transcript import Transcript

# -- models ----------------------------------------------------------------------------------


def test_an_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as info:
        ModelSpec.parse("gemini:pro")
    assert info.value.exit_code == 2
    for known in ("anthropic:", "openai:", "scripted:", "replay:"):
        assert known in str(info.value)


def test_precedence_is_flag_definition_env_config(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('model = "openai:from-config"\n')
    env = {"SHOAL_MODEL": "anthropic:from-env"}
    assert str(choose_model("scripted:x.toml", "openai:d", env, tmp_path)) == "scripted:x.toml"
    assert str(choose_model(None, "openai:d", env, tmp_path)) == "openai:d"
    assert str(choose_model(None, "inherit", env, tmp_path)) == "anthropic:from-env"
    assert str(choose_model(None, None, {}, tmp_path)) == "openai:from-config"
    assert str(choose_model(None, None, {}, tmp_path / "nowhere")) == "scripted:"


def test_a_missing_key_names_its_variable() -> None:
    with pytest.raises(MissingKeyError, match=r"\$ANTHROPIC_API_KEY") as info:
        check_model(ModelSpec.parse("anthropic:claude"), {})
    assert info.value.exit_code == 1
    with pytest.raises(MissingKeyError, match=r"\$OPENAI_API_KEY"):
        check_model(ModelSpec.parse("openai:gpt"), {"OPENAI_BASE_URL": "http://127.0.0.1:1"})
    check_model(ModelSpec.parse("openai:gpt"), {"OPENAI_API_KEY": "k"})


def test_a_missing_script_or_transcript_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=r"script .*nope\.toml not found"):
        check_model(ModelSpec.parse("scripted:nope.toml"), {}, tmp_path)
    with pytest.raises(NotFoundError, match="transcript"):
        check_model(ModelSpec.parse("replay:gone.jsonl"), {}, tmp_path)


def test_network_models_are_built_with_their_base_url() -> None:
    model = build_model(
        ModelSpec.parse("openai:local-llm"),
        {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
    )
    assert model.model_name == "local-llm" and "127.0.0.1:9" in (model.base_url or "")
    model = build_model(
        ModelSpec.parse("anthropic:claude-x"),
        {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
    )
    assert model.model_name == "claude-x" and "127.0.0.1:9" in (model.base_url or "")


# -- scripts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[turn]]\ntext = 'hi {nope}'\n", "unknown template field {nope}"),
        ("[[turn]]\n", "neither text nor call"),
        ("[[turn]]\n[[turn.call]]\nargs = {}\n", 'needs tool = "NAME"'),
        ("tunr = 1\n", "unknown key(s) tunr"),
        ("[[turn]\n", "s.toml"),
    ],
)
def test_a_bad_script_is_refused_naming_the_place(text: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        Script.parse(text, "s.toml")


def test_the_default_script_is_embedded_and_valid() -> None:
    script = Script.default()
    assert script.turns and script.turns[0].calls[0].tool == "Bash"


def _run(loop: AgentLoop, prompt: str | None) -> Outcome:
    return asyncio.run(loop.run(prompt))


NO_LIMITS = Limits()


def _loop(
    script: str, tmp_path: Path, *, limits: Limits = NO_LIMITS, mode: str = "default"
) -> AgentLoop:
    ws = Workspace(tmp_path, mode=mode)
    return AgentLoop(
        scripted_model(Script.parse(script, "test")),
        instructions="test agent",
        tools=make_tools(ws),
        transcript=Transcript(tmp_path / "t.jsonl"),
        output=Output(tmp_path / "out.txt"),
        limits=limits,
    )


def test_a_scripted_run_uses_tools_and_templates_their_results(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    loop = _loop(
        """
        [[turn]]
        text = "reading for {prompt}"
        [[turn.call]]
        tool = "Read"
        args = { file_path = "a.txt" }
        [[turn]]
        [[turn.call]]
        tool = "Edit"
        args = { file_path = "a.txt", old_string = "hello", new_string = "bye" }
        [[turn]]
        text = "turn {turn}: {result_1} / {last}"
        """,
        tmp_path,
    )
    outcome = _run(loop, "the test")
    assert outcome.status == "completed" and outcome.turns == 3 and outcome.tool_uses == 2
    assert (
        outcome.result == f"turn 3:      1\thello / edited {tmp_path / 'a.txt'} (1 replacement(s))"
    )
    assert (tmp_path / "a.txt").read_text() == "bye\n"
    readable = (tmp_path / "out.txt").read_text()
    assert (
        "> the test" in readable
        and "● Read(a.txt)" in readable
        and "reading for the test" in readable
    )
    assert loop.progress.recent_activities[-1] == "Edit(a.txt)"


def test_unknown_tools_and_bad_arguments_are_errors_for_the_model(tmp_path: Path) -> None:
    outcome = _run(
        _loop(
            """
            [[turn]]
            [[turn.call]]
            tool = "Nope"
            [[turn.call]]
            tool = "Read"
            args = { path = "x" }
            [[turn]]
            text = "{result_1} | {result_2}"
            """,
            tmp_path,
        ),
        "go",
    )
    assert outcome.status == "completed"
    assert "Unknown tool name: 'Nope'" in outcome.result
    assert "file_path" in outcome.result and "bad arguments" in outcome.result


def test_max_turns_ends_the_run_failed_naming_the_limit(tmp_path: Path) -> None:
    script = "[[turn]]\n[[turn.call]]\ntool = 'Glob'\nargs = { pattern = '*' }\n" * 5
    outcome = _run(_loop(script, tmp_path, limits=Limits(max_turns=2)), "go")
    assert outcome.status == "failed" and outcome.error is not None
    assert "max turns (2)" in outcome.error


def test_max_tool_uses_ends_the_run_failed(tmp_path: Path) -> None:
    script = "[[turn]]\n[[turn.call]]\ntool = 'Glob'\nargs = { pattern = '*' }\n" * 5
    outcome = _run(_loop(script, tmp_path, limits=Limits(max_tool_uses=2)), "go")
    assert outcome.status == "failed" and "max tool uses (2)" in (outcome.error or "")


def test_wall_time_ends_the_run_failed(tmp_path: Path) -> None:
    script = "[[turn]]\n[[turn.call]]\ntool = 'Bash'\nargs = { command = 'sleep 5' }\n"
    outcome = _run(_loop(script, tmp_path, limits=Limits(timeout=0.3)), "go")
    assert outcome.status == "failed" and "wall time limit reached (0.3s)" in (outcome.error or "")


# -- tools -----------------------------------------------------------------------------------


def test_read_numbers_lines_and_refuses_missing_files_and_directories(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    (tmp_path / "f").write_text("a\nb\nc\n")
    assert ws.read(ReadArgs(file_path="f", offset=2, limit=1)) == (
        "     2\tb\n(1 more line(s); Read with offset=3)"
    )
    with pytest.raises(ToolFailure, match="file not found"):
        ws.read(ReadArgs(file_path="missing"))
    (tmp_path / "d").mkdir()
    with pytest.raises(ToolFailure, match="is a directory"):
        ws.read(ReadArgs(file_path="d"))


def test_write_and_edit_need_a_fresh_read(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    (tmp_path / "f").write_text("x = 1\nx = 1\n")
    with pytest.raises(ToolFailure, match="not Read first"):
        ws.write(WriteArgs(file_path="f", content="new"))
    ws.read(ReadArgs(file_path="f"))
    with pytest.raises(ToolFailure, match="occurs 2 times"):
        ws.edit(EditArgs(file_path="f", old_string="x = 1", new_string="x = 2"))
    with pytest.raises(ToolFailure, match="was not found"):
        ws.edit(EditArgs(file_path="f", old_string="y", new_string="z"))
    ws.edit(EditArgs(file_path="f", old_string="x = 1", new_string="x = 2", replace_all=True))
    assert (tmp_path / "f").read_text() == "x = 2\nx = 2\n"
    os.utime(tmp_path / "f", ns=(1, 1))  # someone else changed it
    with pytest.raises(ToolFailure, match="changed since it was Read"):
        ws.write(WriteArgs(file_path="f", content="new"))
    assert ws.write(WriteArgs(file_path="new.txt", content="n")).startswith("created")


def test_a_symlink_out_of_the_cwd_is_refused_in_default_mode(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "link").symlink_to(outside)
    with pytest.raises(ToolFailure, match="through a symlink outside the working directory"):
        Workspace(cwd).read(ReadArgs(file_path="link/secret"))
    with pytest.raises(ToolFailure, match="outside the working directory"):
        Workspace(cwd).read(ReadArgs(file_path="../outside/secret"))
    bypass = Workspace(cwd, mode="bypassPermissions")
    assert "s" in bypass.read(ReadArgs(file_path="link/secret"))


def test_grep_modes_and_its_dash_arguments(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("Alpha\nbeta\n")
    (tmp_path / "b.txt").write_text("alpha\n")
    ws = Workspace(tmp_path)
    args = parse_args(
        GrepArgs, {"pattern": "alpha", "-i": True, "-n": True, "output_mode": "content"}
    )
    assert isinstance(args, GrepArgs)
    assert ws.grep(args).splitlines() == [f"{tmp_path}/a.py:1:Alpha", f"{tmp_path}/b.txt:1:alpha"]
    only_py = parse_args(GrepArgs, {"pattern": "alpha", "-i": True, "glob": "*.py"})
    assert isinstance(only_py, GrepArgs) and ws.grep(only_py) == f"{tmp_path}/a.py"
    with pytest.raises(ValueError, match="output_mode"):
        parse_args(GrepArgs, {"pattern": "x", "output_mode": "everything"})


def test_a_ten_megabyte_command_output_is_cut_and_noted(tmp_path: Path) -> None:
    text = asyncio.run(
        run_foreground("head -c 10000000 /dev/zero | tr '\\0' a; exit 3", tmp_path, {}, 60)
    )
    assert len(text) < OUTPUT_KEEP_CHARS + 200
    assert "[output truncated:" in text and "not shown]" in text and "[exit code 3]" in text


# -- transcripts and replay --------------------------------------------------------------------


_TWO_TURNS = """
[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "cat f" }
[[turn]]
text = "saw {last}"
"""


def test_a_transcript_replays_with_zero_model_calls(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("one")
    recorded = _run(_loop(_TWO_TURNS, tmp_path), "go")
    assert recorded.result == "saw one"
    path = tmp_path / "t.jsonl"
    replay = AgentLoop(replay_model(path), instructions="x", tools=make_tools(Workspace(tmp_path)))
    assert _run(replay, "go").result == "saw one"
    (tmp_path / "f").write_text("two")  # the world changed: the replay diverges at turn 2
    diverged = _run(
        AgentLoop(replay_model(path), instructions="x", tools=make_tools(Workspace(tmp_path))),
        "go",
    )
    assert diverged.status == "failed" and diverged.error is not None
    assert "diverged at turn 2: Bash returned 'two', the recording has 'one'" in diverged.error


def test_a_truncated_transcript_keeps_its_good_prefix(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("one")
    _run(_loop(_TWO_TURNS, tmp_path), "go")
    path = tmp_path / "t.jsonl"
    lines = path.read_bytes().splitlines()
    assert len(lines) == 4  # request, response (tool call), request (result), response
    path.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:30])  # torn mid-line
    loaded = Transcript.load(path)
    assert loaded.problem is not None and f"{path}:3:" in loaded.problem
    # the second line is a response whose tool call has no result: that round is redone
    assert len(loaded.messages) == 1 and "redone" in loaded.problem
    path.write_bytes(b"not json\n")
    assert Transcript.load(path).messages == [] and ":1:" in (Transcript.load(path).problem or "")


def test_a_resumed_run_continues_the_conversation(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("one")
    script = _TWO_TURNS + '[[turn]]\ntext = "again: {prompt} after {turn} turns"\n'
    first = _loop(script, tmp_path)
    _run(first, "go")
    loaded = Transcript.load(tmp_path / "t.jsonl")
    assert loaded.problem is None
    second = AgentLoop(
        scripted_model(Script.parse(script, "test")),
        instructions="x",
        tools=make_tools(Workspace(tmp_path)),
        transcript=Transcript(tmp_path / "t.jsonl"),
        history=loaded.messages,
    )
    assert _run(second, "more").result == "again: more after 3 turns"
    records = [orjson.loads(line) for line in (tmp_path / "t.jsonl").read_bytes().splitlines()]
    assert len(records) == 6 and all(r["v"] == 1 for r in records)  # appended, not rewritten


class _NoLeader:
    def call(self, op: str, args: dict[str, object]) -> object:
        raise AssertionError(f"{op} is not used here")

    def task_records(self) -> dict[str, dict[str, object]]:
        return {}


def test_team_create_and_delete_tools(tmp_path: Path) -> None:
    """TeamCreate/TeamDelete on real team files; an agent's own team cannot be deleted."""
    teams = Teams(Layout(tmp_path))
    teams.create("home")
    tools = TeamTools(tmp_path, "home", "a00000000", _NoLeader())
    assert "created team side" in tools.teamcreate(TeamCreateArgs(team_name="side"))
    assert teams.exists("side")
    assert "deleted team side" in tools.teamdelete(TeamDeleteArgs(team_name="side"))
    assert not teams.exists("side")
    with pytest.raises(ToolFailure, match="own team"):
        tools.teamdelete(TeamDeleteArgs(team_name="home"))


def test_a_transcript_whose_earlier_messages_changed_records_a_truncate(tmp_path: Path) -> None:
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    path = tmp_path / "t.jsonl"
    first = ModelRequest(parts=[UserPromptPart("hi")])
    answer = ModelResponse(parts=[TextPart("one")])
    transcript = Transcript(path)
    transcript.append([first, answer])
    transcript.append([first, answer])  # nothing new: nothing written
    assert len(path.read_text().splitlines()) == 2
    merged = ModelRequest(parts=[UserPromptPart("hi"), UserPromptPart("and a queued one")])
    transcript.append([merged, ModelResponse(parts=[TextPart("two")])])
    lines = [orjson.loads(line) for line in path.read_text().splitlines()]
    assert lines[2] == {"v": 1, "truncate": 0} and len(lines) == 5
    loaded = Transcript.load(path)
    assert loaded.problem is None and [len(m.parts) for m in loaded.messages] == [2, 1]
    path.write_text(path.read_text() + orjson.dumps({"v": 1, "truncate": 9}).decode() + "\n")
    bad = Transcript.load(path)
    assert bad.problem is not None and "truncate 9 is past the conversation" in bad.problem
    assert len(bad.messages) == 2  # (the good prefix)


def test_queued_texts_joined_into_one_request_count_as_delivered(tmp_path: Path) -> None:
    # Two messages queued into a run can reach the model in one prompt part; neither may be
    # queued again (that showed a coordinator one worker's end twice).
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    loop = _loop('final = "ok"\n', tmp_path)
    loop._into_run = ["first end", "second end", "third end"]
    loop.history = [ModelRequest(parts=[UserPromptPart("first end\n\nsecond end")])]
    assert loop._undelivered(0) == ["third end"]
    loop._into_run = ["same", "same"]
    loop.history = [ModelRequest(parts=[UserPromptPart("same")])]
    assert loop._undelivered(0) == ["same"]  # (sent twice, arrived once: once more to go)


def test_a_queued_text_inside_the_runs_own_prompt_is_not_taken_as_delivered(
    tmp_path: Path,
) -> None:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    loop = _loop('final = "ok"\n', tmp_path)
    loop._run_prompt = "fix the tests"
    loop._into_run = ["test"]
    loop.history = [ModelRequest(parts=[UserPromptPart("fix the tests")])]
    assert loop._undelivered(0) == ["test"]


def test_a_finished_tool_round_is_on_disk_before_the_next_request_goes_out(
    tmp_path: Path,
) -> None:
    """The model's second request finds the first round's tool result already in the
    transcript, and a run resumed from that file (as after a kill -9 while the request was out)
    sends the request again without running the tool a second time."""
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    path = tmp_path / "t.jsonl"
    seen_on_disk: list[list[str]] = []

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            command = "echo R0 >> f"
            return ModelResponse(parts=[ToolCallPart("Bash", {"command": command}, "c1")])
        on_disk = Transcript.load(path).messages
        seen_on_disk.append(
            [p.part_kind for m in on_disk if isinstance(m, ModelRequest) for p in m.parts]
        )
        return ModelResponse(parts=[TextPart("done")])

    def loop(history: list[Any] | None = None) -> AgentLoop:
        return AgentLoop(
            FunctionModel(model),
            instructions="x",
            tools=make_tools(Workspace(tmp_path, mode="bypassPermissions")),
            transcript=Transcript(path),
            history=history or (),
        )

    assert _run(loop(), "go").status == "completed"
    assert seen_on_disk == [["user-prompt", "tool-return"]]
    assert (tmp_path / "f").read_text() == "R0\n"
    # Killed while the second request was out: the file ends with that request.
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join(lines[:-1]) + b"\n")
    loaded = Transcript.load(path)
    assert loaded.problem is None
    assert isinstance(loaded.messages[-1], ModelRequest)
    assert isinstance(loaded.messages[-1].parts[0], ToolReturnPart)
    assert _run(loop(loaded.messages), None).result == "done"
    assert (tmp_path / "f").read_text() == "R0\n"  # the tool ran once
