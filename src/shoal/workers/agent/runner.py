"""Runs one `local_agent` job: the same code in a process of its own (`python -m
shoal.workers.agent.entry JOB`, the process and tmux backends) and inside the leader
(the in-process backend, many jobs on one event loop).

The runner builds the model, the tools and its commands' sandbox from the job, continues the
transcript when the job is a resume, drains pending messages into the conversation at
tool-round boundaries (feed.py), attaches the new output of its background tasks before each
model request (attachments.py), and reports to its status file: progress each round
(throttled), then the outcome (status_writer.py). A coordinator waits for its workers between
turns (coordinator/turns.py). It never touches the leader's registry; the leader reads the
status file.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from shoal.core.config import model_idle_s, tool_retries
from shoal.core.errors import ShoalError
from shoal.core.leasepolicy import agent_policy
from shoal.core.paths import Layout
from shoal.core.sandbox import Policy
from shoal.workers.agent.ask_lead import Consent
from shoal.workers.agent.attachments import IDLE_RENEW_S, Attacher, owned_tasks_file
from shoal.workers.agent.coordinator.turns import (
    COORDINATOR_JOURNAL,
    coordinator_tools,
    coordinator_wait,
    watch_coordinator_inbox,
)
from shoal.workers.agent.feed import Feed, notification_task
from shoal.workers.agent.filters import filter_tools
from shoal.workers.agent.job import AgentJob, JobOutcome
from shoal.workers.agent.job_process import KILLED_ERROR, job_outcome
from shoal.workers.agent.loop import AgentLoop, Limits
from shoal.workers.agent.mcp_tools import McpServer, open_servers
from shoal.workers.agent.models import ModelSpec, build_model
from shoal.workers.agent.permissions import PLAN_TOOL_SPECS, Gate
from shoal.workers.agent.progress import Output, conversation_messages, prompt_texts
from shoal.workers.agent.status_writer import StatusWriter
from shoal.workers.agent.team_tools import FORK_TAG, TEAM_TOOL_SPECS, LeaderPort, TeamTools
from shoal.workers.agent.tool_args import TOOL_SPECS
from shoal.workers.agent.tool_calls import make_tools
from shoal.workers.agent.tools import Workspace
from shoal.workers.agent.transcript import IN_FLIGHT_NOTE, Transcript

TURN_SIGNAL: Final = signal.SIGUSR1  # stops a runner process's turn in progress
ALL_TOOL_NAMES: Final = tuple(
    name for name, _m, _t in (*TOOL_SPECS, *TEAM_TOOL_SPECS, *PLAN_TOOL_SPECS)
)


def own_part(history: list[Any], *, forking: bool) -> list[Any]:
    """The part of a conversation read back that this agent's own requests made: a fork's
    copied history is its parent's (counted there), up to the request that forked it."""
    for at in range(len(history)):
        if any(FORK_TAG in text for text in prompt_texts(history[at : at + 1])):
            return history[at + 1 :]
    return [] if forking else history


async def _idle_wait(feed: Feed, attacher: Attacher) -> str:
    """After a stopped turn: the next message, the leader told (and told again) meanwhile
    that the agent waits, so its background tasks' ends come as messages that wake it."""
    while True:
        await attacher.idle()
        text = await feed.next_message(timeout=IDLE_RENEW_S)
        if text is not None:
            return text


def _background_starter(
    job: AgentJob, leader: LeaderPort, env: Mapping[str, str]
) -> Callable[[str, str | None, Policy | None], Any]:
    """Bash(run_in_background): a `local_bash` task of the team's leader, owned by this agent."""

    async def start(
        command: str, description: str | None, sandbox: Policy | None
    ) -> tuple[str, str]:
        args: dict[str, Any] = {
            "command": ["sh", "-c", command],
            "description": description or command[:80],
            "agent": job.task_id,
            "cwd": job.cwd,
        }
        if sandbox is not None:
            args["sandbox"] = sandbox.to_json()
            if "TMPDIR" in env:
                args["env"] = {"TMPDIR": env["TMPDIR"]}
        record = await asyncio.to_thread(leader.call, "sh", args)
        return str(record["id"]), str(record["output_file"])

    return start


def command_sandbox(
    job: AgentJob, env: dict[str, str], notes: list[str]
) -> Callable[[str], Policy] | None:
    """The sandbox of the agent's commands, as a function of its permission mode (a plan, once
    approved, moves the agent to another mode), with its private tmp made and named in `env`
    (TMPDIR); None, said in `notes`, when sandboxes are off or the kernel has none (its
    commands are then checked after the fact only, as a worker's always are as well)."""
    from shoal.core import sandbox
    from shoal.core.config import sandbox_settings, sandbox_unix_sockets

    enabled, writable = sandbox_settings(Path(job.home))
    unix = sandbox_unix_sockets(Path(job.home))
    if not enabled:
        notes.append(
            "sandbox: off (enabled = false in SHOAL_HOME/config.toml); commands run unconfined"
        )
        return None
    if sandbox.abi() < 1:
        notes.append(
            "sandbox: this kernel offers no Landlock; commands run unconfined"
            + (", checked against the lease after they end" if job.worker else "")
        )
        return None
    # (made in plan mode too, where it is not writable, for the mode an approved plan gives)
    tmp = Path(tempfile.mkdtemp(prefix=f"shoal-{job.task_id}-"))
    env["TMPDIR"] = str(tmp)

    def for_mode(mode: str) -> Policy:
        return agent_policy(
            Path(job.cwd),
            mode,
            (job.write_set or ()) if job.worker else None,
            scratchpad=Path(job.scratchpad) if job.scratchpad else None,
            tmp=tmp,
            network=job.allow_network if job.worker else None,
            extra=writable,
            unix=unix,
            home=Path(job.home),
        )

    policy = for_mode(job.permission_mode)
    if policy.notes:
        notes.append("sandbox: " + "; ".join(policy.notes))
    return for_mode


async def run_job(
    job: AgentJob,
    env: Mapping[str, str],
    feed: Feed,
    status: StatusWriter,
    leader: LeaderPort,
) -> JobOutcome:
    """Run `job` to its outcome (a cancel ends it `killed`; the transcript keeps what was said)."""
    started = time.monotonic()
    loop: AgentLoop | None = None
    tmp_env: dict[str, str] = {}  # (TMPDIR: the private tmp of its commands, removed at the end)
    try:
        cwd = Path(job.cwd)
        home = Path(job.home)
        idle_s = model_idle_s(home, job.limits.model_idle_s)
        model = build_model(ModelSpec.parse(job.model), env, cwd, idle_s=idle_s)
        if job.scratchpad:
            Path(job.scratchpad).mkdir(mode=0o700, parents=True, exist_ok=True)
        notes: list[str] = list(job.notes)
        sandbox_for = command_sandbox(job, tmp_env, notes)
        policy = sandbox_for(job.permission_mode) if sandbox_for is not None else None
        workspace = Workspace(
            cwd=cwd,
            mode=job.permission_mode,
            env={**job.env, **job.env_values, **tmp_env},
            start_background=_background_starter(job, leader, tmp_env),
            track_command=status.track,
            write_set=(job.write_set or ()) if job.worker else None,
            scratchpad=Path(job.scratchpad) if job.scratchpad else None,
            on_violation=status.violation,
            lease_skip=(Path(job.home),),
            home=Path(job.home),
            lease_peers=(Layout(Path(job.home)).session_dir(job.session_id), job.task_id),
            sandbox=policy,
        )
        transcript = Transcript(Path(job.transcript))
        history: list[Any] = []
        if job.resume:
            loaded = Transcript.load(transcript.path)
            transcript.adopt(loaded)  # (what it could not use is not left to confuse the next)
            history = loaded.messages
            status.note = loaded.problem
            if FORK_TAG in job.prompt and (loaded.problem or "").endswith(IN_FLIGHT_NOTE):
                status.note = None  # (a fork is copied mid-round: the round in flight is its own)

        def approved(mode: str) -> None:  # (a plan approved: its commands get the new mode's box)
            if sandbox_for is not None:
                workspace.sandbox = sandbox_for(mode)

        gate = Gate(job.permission_mode, Consent(job, feed, status).ask, on_approved=approved)
        async with contextlib.AsyncExitStack() as stack:
            mcp = await open_servers(
                {k: McpServer.model_validate(v) for k, v in job.mcp_servers.items()},
                stack,
                {**env, **tmp_env},
                cwd,
                notes.append,
                workspace.lease_guard if workspace.write_set is not None else None,
                policy,
                gate.check,  # (an MCP tool is a command: it asks, or is refused, as Bash is)
            )
            names: tuple[str, ...] | list[str] = ()
            if job.coordinator:
                tools = coordinator_tools(job, leader)
            else:
                names = filter_tools(
                    ALL_TOOL_NAMES,
                    custom=job.custom,
                    plan_mode=job.permission_mode == "plan",
                    only=job.tools,
                    without=("Agent",) if job.subagent else (),
                )
                workspace.tool_names = frozenset(names)
                tools = [
                    *make_tools(
                        workspace,
                        names,
                        TeamTools(
                            Path(job.home),
                            job.team,
                            job.task_id,
                            leader,
                            cwd=job.cwd,
                            model=job.model,
                            fork=job.fork,
                            in_fork=FORK_TAG in job.prompt
                            or any(FORK_TAG in str(m) for m in history),
                        ),
                        gate,
                    ),
                    *mcp,  # (offered in every mode; each call passes the gate)
                ]
            attacher = Attacher(
                leader.call,
                job.task_id,
                owned_tasks_file(Path(job.output_file).parent.parent, job.task_id),
                tools=frozenset(names),
                # (a worker's background command is lease-checked when its end is told)
                on_end=workspace.background_ended if job.worker else None,
            )
            loop = AgentLoop(
                model,
                instructions=job.instructions,
                tools=tools,
                attach=attacher,
                transcript=transcript,
                output=Output(Path(job.output_file), echo=job.echo),
                history=history,
                limits=Limits(**job.limits.model_dump(exclude={"model_idle_s"})),
                on_progress=status.progress,
                tool_retries=tool_retries(home),
                journal=Path(job.scratchpad) / COORDINATOR_JOURNAL
                if job.coordinator and job.scratchpad
                else None,
            )
            loop.progress.count_history(own_part(history, forking=FORK_TAG in job.prompt))
            if history:  # (a resume: its views see the conversation so far, read from disk)
                conversation_messages(history, loop.progress)
                loop.progress.from_disk = True
            if status.note:
                loop.output.write(f"[resumed: {status.note}]\n")
            for line in notes:
                loop.output.write(f"[{line}]\n")
            for text in feed.late:
                loop.enqueue(text)
            feed.late.clear()
            if job.worker:  # (its background commands' ends are lease-checked)
                feed.on_text = lambda text: workspace.background_ended(
                    notification_task(text), text
                )
            feed.attach(asyncio.get_running_loop(), loop)
            if job.coordinator and job.coordinator_inbox:
                stop_inbox = threading.Event()
                stack.callback(stop_inbox.set)
                watch_coordinator_inbox(
                    Path(job.coordinator_inbox), Path(job.home), feed, stop_inbox
                )
            prompt: str | None = job.prompt
            while True:
                feed.turn = asyncio.ensure_future(loop.run(prompt))
                try:
                    outcome = await feed.turn
                except asyncio.CancelledError:
                    if not feed.turn_aborted:
                        raise  # the whole agent is stopped
                    feed.turn_aborted = False
                    loop.drop_in_flight()
                    loop.output.write("\n[turn stopped; waiting for the next message]\n")
                    status.progress(loop.progress, force=True)
                    prompt = await _idle_wait(feed, attacher)
                    continue
                if job.coordinator and outcome.status == "completed":
                    prompt = await coordinator_wait(job, leader, loop, feed, status)
                    if prompt is not None:
                        continue
                break
            await attacher.flush()  # (what the last request carried: the leader may hold it)
        for shell_id in list(workspace.background_watch):  # (ended or not: what it did)
            await asyncio.to_thread(workspace.background_ended, shell_id, "")
        status.progress(loop.progress, force=True)
        return job_outcome(outcome)
    except asyncio.CancelledError:
        if loop is not None:
            loop.output.write(f"\n[{KILLED_ERROR}]\n")
        return JobOutcome(
            status="killed",
            error=KILLED_ERROR,
            total_tokens=loop.progress.token_count if loop else 0,
            tool_uses=loop.progress.tool_use_count if loop else 0,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    except (ShoalError, OSError, ValueError) as exc:  # a model that cannot be built, a bad file
        if loop is not None:
            loop.output.write(f"\n[failed: {exc}]\n")
        else:
            Output(Path(job.output_file), echo=job.echo).write(f"[failed: {exc}]\n")
        return JobOutcome(
            status="failed",
            error=str(exc),
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    finally:
        if "TMPDIR" in tmp_env:
            shutil.rmtree(tmp_env["TMPDIR"], ignore_errors=True)
        if loop is not None:  # messages queued after the run ended: the leader resumes with them
            feed.late.extend(loop.pending(drained=False))
