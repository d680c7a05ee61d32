"""A dream's runner: `python -m shoal.workers.dream.runner JOB_FILE`, a process of its own.

It runs the agent loop (workers/agent/loop.py) on the dream's model with only the tools of
a `DreamWorkspace` (Read, Write, Edit, Glob, Grep; writes confined to the memory directory),
and reports to its status file what the leader maps onto the dream's record: the agent's
progress plus `phase`, `files_touched` and the last turns (text and tool-use count). SIGTERM,
SIGINT and SIGHUP end the run `killed`, its status written. It never touches the lock or the
registry: the leader settles both from the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Final

from shoal.core.config import model_idle_s, tool_retries
from shoal.core.errors import ShoalError
from shoal.core.tasks import DREAM_TURNS_CAP, DreamPhase
from shoal.workers.agent.job import AgentStatus, JobOutcome, RunnerJob
from shoal.workers.agent.job_process import (
    KILLED_ERROR,
    exit_code,
    job_outcome,
    main_of,
    until_signalled,
)
from shoal.workers.agent.loop import AgentLoop, Limits
from shoal.workers.agent.models import ModelSpec, build_model
from shoal.workers.agent.progress import Output, Progress
from shoal.workers.agent.tool_calls import make_tools
from shoal.workers.agent.transcript import Transcript
from shoal.workers.dream.workspace import DREAM_TOOLS, DreamWorkspace

STATUS_INTERVAL_S: Final = 0.25
TURN_TEXT_CHARS: Final = 500


class DreamJob(RunnerJob):
    """Everything a dream's runner needs (written by the leader before it starts); its `cwd`
    is where a relative `scripted:FILE` is found (the requester's directory)."""

    what: ClassVar[str] = "dream job"

    instructions: str
    memory_dir: str
    sessions: tuple[str, ...] = ()
    """The session directories under review (read-only)."""


def turns_of(history: list[Any]) -> list[dict[str, Any]]:
    """The last DREAM_TURNS_CAP model responses: their text and how many tools they called."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

    turns: list[dict[str, Any]] = []
    for message in history:
        if not isinstance(message, ModelResponse):
            continue
        text = "\n".join(p.content.strip() for p in message.parts if isinstance(p, TextPart))
        calls = sum(isinstance(p, ToolCallPart) for p in message.parts)
        turns.append({"text": text.strip()[:TURN_TEXT_CHARS], "tool_use_count": calls})
    return turns[-DREAM_TURNS_CAP:]


class DreamStatus:
    """The runner's side of the status file: progress with the dream's fields (throttled),
    then the outcome."""

    def __init__(self, path: Path, workspace: DreamWorkspace) -> None:
        self.path = path
        self.workspace = workspace
        self.loop: AgentLoop | None = None
        self._record: dict[str, Any] = {}
        self._written = 0.0
        self._lock = threading.Lock()  # (a write is told from the thread its tool runs on)

    def progress(self, progress: Progress | None = None, *, force: bool = False) -> None:
        with self._lock:
            self._progress(progress, force)

    def _progress(self, progress: Progress | None, force: bool) -> None:
        record = progress.to_record() if progress is not None else dict(self._record)
        touched = list(self.workspace.touched)
        record["phase"] = (DreamPhase.UPDATING if touched else DreamPhase.STARTING).value
        record["files_touched"] = touched
        record["turns"] = turns_of(self.loop.history) if self.loop is not None else []
        # (a new turn is written at once: the runner may block in its tools next)
        news = record["turns"] != self._record.get("turns")
        self._record = record
        now = time.monotonic()
        if force or news or now - self._written >= STATUS_INTERVAL_S:
            self._written = now
            self._save(AgentStatus(pid=os.getpid(), progress=record))

    def done(self, outcome: JobOutcome) -> None:
        self.progress(force=True)
        with self._lock:
            self._save(
                AgentStatus(state="done", pid=os.getpid(), progress=self._record, outcome=outcome)
            )

    def _save(self, status: AgentStatus) -> None:
        status = status.model_copy(update={"updated_at": time.time()})
        with contextlib.suppress(ShoalError, OSError):  # (a full disk: the next write retries)
            status.save(self.path)


async def run_dream(job: DreamJob, env: Mapping[str, str], status: DreamStatus) -> JobOutcome:
    """Run the dream to its outcome (a cancel ends it `killed`)."""
    started = time.monotonic()
    loop: AgentLoop | None = None
    output = Output(Path(job.output_file))
    try:
        home = Path(job.home)
        idle_s = model_idle_s(home, job.limits.model_idle_s)
        model = build_model(ModelSpec.parse(job.model), env, Path(job.cwd), idle_s=idle_s)
        tools = make_tools(status.workspace, DREAM_TOOLS)
        loop = AgentLoop(
            model,
            instructions=job.instructions,
            tools=tools,
            transcript=Transcript(Path(job.transcript)),
            output=output,
            limits=Limits(**job.limits.model_dump(exclude={"model_idle_s"})),
            on_progress=status.progress,
            tool_retries=tool_retries(home),
        )
        status.loop = loop
        # (a write is told at once: the record says `updating` from the first one)
        status.workspace.on_write = lambda _rel: status.progress(force=True)
        status.progress(force=True)
        return job_outcome(await loop.run(job.prompt))
    except asyncio.CancelledError:
        output.write(f"\n[{KILLED_ERROR}]\n")
        return JobOutcome(
            status="killed",
            error=KILLED_ERROR,
            tool_uses=loop.progress.tool_use_count if loop else 0,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    except (ShoalError, OSError, ValueError) as exc:  # a model that cannot be built, a bad file
        output.write(f"\n[failed: {exc}]\n")
        return JobOutcome(
            status="failed", error=str(exc), duration_ms=int((time.monotonic() - started) * 1000)
        )


async def _main_async(job: DreamJob) -> int:
    workspace = DreamWorkspace(
        cwd=Path(job.memory_dir),
        mode="acceptEdits",
        readable=tuple(Path(p) for p in job.sessions),
    )
    status = DreamStatus(Path(job.status_file), workspace)
    outcome = await until_signalled(lambda: run_dream(job, os.environ, status))
    status.done(outcome)
    return exit_code(outcome)


def main(argv: list[str] | None = None) -> int:
    """Run the dream job file given as the one argument."""
    return main_of("shoal.workers.dream.runner", DreamJob.load, _main_async, argv)


if __name__ == "__main__":
    sys.exit(main())
