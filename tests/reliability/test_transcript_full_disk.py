"""A transcript on a full disk: an append writes whole lines or none, names the file and the
cause, and what it could not write goes with the next append once there is room, so a resume
reads every message and never a record glued to a torn one.

The transcript lives on a small tmpfs (tests/reliability/conftest.py) filled to the last byte
after a first short record, so the next, longer append gets a short write into the file's last
page and then ENOSPC: the torn-line case. Mounting needs root; elsewhere the test is skipped and
says so.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from shoal.core.errors import NoSpaceError
from shoal.workers.agent.loop import AgentLoop, Limits
from shoal.workers.agent.progress import Output
from shoal.workers.agent.scripted import Script, scripted_model
from shoal.workers.agent.tool_calls import make_tools
from shoal.workers.agent.tools import Workspace
from shoal.workers.agent.transcript import IN_FLIGHT_NOTE, Transcript
from tests.reliability.conftest import Disk


def _conversation(rounds: int) -> list[ModelRequest | ModelResponse]:
    messages: list[ModelRequest | ModelResponse] = []
    for n in range(rounds):
        messages.append(ModelRequest(parts=[UserPromptPart(content=f"round {n}")]))
        # Long enough that its line crosses the page the first record began.
        messages.append(ModelResponse(parts=[TextPart(content=f"answer {n} " + "x" * 9000)]))
    return messages


def test_an_append_on_a_full_disk_leaves_no_torn_line_and_catches_up(disk: Disk) -> None:
    path = disk.root / "transcripts" / "a1.jsonl"
    transcript = Transcript(path)
    first = [ModelRequest(parts=[UserPromptPart(content="hello")])]
    transcript.append(first)
    before = path.read_bytes()
    disk.fill()

    conversation = [*first, *_conversation(2)]
    with pytest.raises(NoSpaceError) as failed:
        transcript.append(conversation)
    assert str(failed.value).startswith(f"no space left on device writing transcript {path}")
    assert path.read_bytes() == before  # what the short write put there was taken back
    assert transcript.written == 1

    disk.free()
    transcript.append(conversation)  # the messages that did not fit go now
    loaded = Transcript.load(path)
    assert loaded.problem is None
    assert loaded.messages == conversation


def test_a_run_whose_transcript_cannot_be_written_ends_failed_naming_it(
    disk: Disk, tmp_path: Path
) -> None:
    """The disk fills while a tool runs (the tool's own step fills it: no timing involved); the
    run ends `failed` with the transcript and "no space left" in its error, not `completed`."""
    work = tmp_path / "work"
    work.mkdir()
    filler = tmp_path / "fill.py"
    filler.write_text(
        f"import sys; sys.path.insert(0, {str(Path.cwd())!r})\n"
        "from pathlib import Path\n"
        "from tests.reliability.conftest import Disk\n"
        f"Disk(Path({str(disk.root)!r})).fill()\n"
        "print('x' * 10000)\n"  # a result longer than the room left in the file's last page
    )
    fill = f"{sys.executable} {filler}"
    script = f"""
        [[turn]]
        [[turn.call]]
        tool = "Bash"
        args = {{ command = "{fill}" }}
        [[turn]]
        text = "done"
        """
    transcript = disk.root / "t.jsonl"
    loop = AgentLoop(
        scripted_model(Script.parse(script, "test")),
        instructions="test agent",
        tools=make_tools(Workspace(work, mode="bypassPermissions")),
        transcript=Transcript(transcript),
        output=Output(tmp_path / "out.txt"),
        limits=Limits(),
    )
    outcome = asyncio.run(loop.run("go"))
    disk.free()
    assert outcome.status == "failed", outcome
    assert outcome.error is not None
    assert f"no space left on device writing transcript {transcript}" in outcome.error
    # Whole lines only: the round whose result did not fit is the round in flight, redone.
    assert Transcript.load(transcript).problem == f"{transcript}: {IN_FLIGHT_NOTE}"
    for line in transcript.read_bytes().splitlines():
        orjson.loads(line)
