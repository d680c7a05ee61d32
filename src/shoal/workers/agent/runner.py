"""Runs one `local_agent` job: the same code in a process of its own (`python -m
shoal.workers.agent.entry JOB`, the process and tmux backends) and inside the leader
(the in-process backend, many jobs on one event loop).

The runner builds the model and the tools from the job, continues the transcript when the job
is a resume, drains pending messages into the conversation at tool-round boundaries, attaches
the new output of its background tasks before each model request (attachments.py), and
reports to its status file: progress each round (throttled), then the outcome. It never
touches the leader's registry; the leader reads the status file.
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
from shoal.core.consent import brief
from shoal.core.errors import NoSpaceError, ShoalError
from shoal.core.leasepolicy import agent_policy
from shoal.core.notify import END_NOTIFICATION
from shoal.core.paths import Layout
from shoal.core.sandbox import Policy
from shoal.mailbox.inbox import Inbox
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.schema import PermissionResponseMessage
from shoal.mailbox.store import Maildir
from shoal.teams.models import LEAD_NAME
from shoal.workers.agent.attachments import (
    IDLE_RENEW_S,
    Attacher,
    attached_ends,
    owned_tasks_file,
)
from shoal.workers.agent.filters import filter_tools
from shoal.workers.agent.job import AgentJob, AgentStatus, JobOutcome
from shoal.workers.agent.loop import (
    AgentLoop,
    Limits,
    Output,
    Progress,
    conversation_messages,
    make_tools,
)
from shoal.workers.agent.mcp_tools import McpServer, open_servers
from shoal.workers.agent.models import ModelSpec, build_model
from shoal.workers.agent.permissions import PLAN_TOOL_SPECS, Gate
from shoal.workers.agent.pr_activity import active_subscriptions
from shoal.workers.agent.team_tools import FORK_TAG, TEAM_TOOL_SPECS, LeaderPort, TeamTools
from shoal.workers.agent.tools import TOOL_SPECS, Workspace
from shoal.workers.agent.transcript import IN_FLIGHT_NOTE, Transcript
from shoal.workers.teammate.console import PREVIEW_CHARS

# Progress is written at most this often (the outcome at once).
STATUS_INTERVAL_S: Final = 0.25
KILLED_ERROR: Final = "stopped"
TURN_SIGNAL: Final = signal.SIGUSR1  # stops a runner process's turn in progress
ALL_TOOL_NAMES: Final = tuple(
    name for name, _m, _t in (*TOOL_SPECS, *TEAM_TOOL_SPECS, *PLAN_TOOL_SPECS)
)


class StatusWriter:
    """The runner's side of the status file: progress (throttled), then the outcome."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        self.note: str | None = None
        self.waiting: dict[str, Any] | None = None  # the permission request it waits on
        self.commands: dict[int, float | None] = {}  # running foreground commands: pgid -> start
        self.violations: list[dict[str, Any]] = []  # a worker's changes outside its lease
        self._written = 0.0
        self._progress: dict[str, Any] = {}
        self._tracker: Progress | None = None  # (its messages and drained count go along)

    def progress(self, progress: Progress, *, force: bool = False) -> None:
        self._progress = progress.to_record()
        self._tracker = progress
        now = time.monotonic()
        if force or now - self._written >= STATUS_INTERVAL_S:
            self._written = now
            self._save(AgentStatus(pid=self.pid, progress=self._progress))

    def track(self, pgid: int, running: bool) -> None:
        """A foreground command's process group started (listed at once) or ended."""
        from shoal.core.procs import process_start_time

        if running:
            self.commands[pgid] = process_start_time(pgid)
        else:
            self.commands.pop(pgid, None)
        self.flush()

    def violation(self, command: str, paths: list[str]) -> None:
        """A worker's Bash command changed `paths` outside its lease: recorded at once."""
        self.violations.append({"command": command[:500], "paths": paths[:100], "at": time.time()})
        self.flush()

    def flush(self) -> None:
        """Write the latest progress (and what it waits on) now."""
        self._written = time.monotonic()
        self._save(AgentStatus(pid=self.pid, progress=self._progress))

    def done(self, outcome: JobOutcome, undrained: list[str]) -> None:
        """Write the outcome; on a full disk NoSpaceError (the one write that must not be
        dropped: the caller names the cause)."""
        self._save(
            AgentStatus(
                state="done",
                pid=self.pid,
                progress=self._progress,
                outcome=outcome,
                undrained=tuple(undrained),
            ),
            final=True,
        )

    def _save(self, status: AgentStatus, *, final: bool = False) -> None:
        update: dict[str, Any] = {
            "note": self.note,
            "waiting": self.waiting,
            "commands": tuple((pgid, started) for pgid, started in self.commands.items()),
            "violations": tuple(self.violations),
            "updated_at": time.time(),
        }
        if self._tracker is not None:
            update["drained"] = self._tracker.drained
            update["messages"] = tuple(self._tracker.messages)
            update["from_disk"] = self._tracker.from_disk
        status = status.model_copy(update=update)
        try:
            status.save(self.path)
        except (ShoalError, OSError) as exc:  # (progress on a full disk: the next write retries)
            if final and isinstance(exc, NoSpaceError):
                raise


class Feed:
    """Pending messages for a running agent: `put` from any thread, drained into the loop at
    the next tool-round boundary (or kept for the next run once it is over)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._agent: AgentLoop | None = None
        self.late: list[str] = []
        self.waiting: dict[str, asyncio.Future[tuple[bool, str | None]]] = {}
        self.turn: asyncio.Future[Any] | None = None  # the turn in progress
        self.turn_aborted = False
        self._waiter: asyncio.Future[str] | None = None
        self.waiting_shown: list[str] = []  # a coordinator's outstanding workers, as last said
        self.on_text: Callable[[str], str] | None = None  # sees each message as it is fed

    def attach(self, loop: asyncio.AbstractEventLoop, agent: AgentLoop) -> None:
        self._loop, self._agent = loop, agent

    def put(
        self, text: str, ack: Callable[[], None] | None = None, *, counted: bool = True
    ) -> None:
        """Queue `text`; `ack` (a coordinator's notification) runs once it is recorded in the
        transcript, and at once when a notification of that task is there already. A message
        sent to the task (neither acked nor said by shoal itself, `counted`) is one of its
        pending messages until it reaches the conversation."""
        if self._loop is None or self._agent is None:
            assert ack is None, "acked messages are fed only once the agent runs"
            self.late.append(text)
            return
        self._loop.call_soon_threadsafe(self._deliver, text, ack, counted and ack is None)

    def _deliver(
        self, text: str, ack: Callable[[], None] | None = None, counted: bool = True
    ) -> None:
        if self.on_text is not None and ack is None:
            text = self.on_text(text)
        if ack is None and self._agent is not None:
            task_id = notification_task(text)
            if task_id is not None and task_id in attached_ends(self._agent.user_texts()):
                return  # (its end, and its last output, reached the agent in an attachment)
        if ack is not None and self._agent is not None:
            task_id = notification_task(text)
            if task_id is not None and task_id in recorded_notifications(self._agent):
                ack()  # (delivered again after a crash between the transcript and the ack)
                return
            self._agent.on_recorded(text, ack)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(text)  # (the agent waits for a message after a stopped turn)
            if counted and self._agent is not None:
                self._agent.progress.drained += 1
        elif self._agent is not None:
            self._agent.enqueue(text, counted=counted)

    async def next_message(self, timeout: float | None = None) -> str | None:
        """Wait for the next message (after a stopped turn, or a coordinator's idle turn);
        None when `timeout` passes first."""
        assert self._agent is not None
        queued = self._agent.pending()
        if queued:
            return "\n\n".join(queued)
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiter = None
        # (a message may have come between the timeout and this task's turn on the loop)
        if waiter.done() and not waiter.cancelled():
            return waiter.result()
        waiter.cancel()
        return None

    def abort_turn(self) -> bool:
        """Stop the turn in progress (from any thread); the agent then waits for a message."""
        if self._loop is None:
            return False
        self._loop.call_soon_threadsafe(self.abort_turn_now)
        return True

    def abort_turn_now(self) -> None:
        """`abort_turn` on the agent's own event loop (its SIGUSR1 handler)."""
        if self.turn is not None and not self.turn.done():
            self.turn_aborted = True
            self.turn.cancel()

    def answer(self, request_id: str, approve: bool, reason: str | None) -> bool:
        """The lead's answer to permission request `request_id` (from any thread); False
        when nothing waits on it."""
        future = self.waiting.get(request_id)
        if future is None or self._loop is None:
            return False

        def settle() -> None:
            if not future.done():
                future.set_result((approve, reason))

        self._loop.call_soon_threadsafe(settle)
        return True


class Consent:
    """How a background agent asks the lead: a `permission_request` in the lead's inbox, then
    a wait for the answer (`Feed.answer`); its status says what it waits on meanwhile."""

    def __init__(self, job: AgentJob, feed: Feed, status: StatusWriter) -> None:
        self.job = job
        self.feed = feed
        self.status = status
        self.asked = 0

    async def ask(self, tool: str, shown: dict[str, Any]) -> tuple[bool, str | None]:
        self.asked += 1
        request_id = f"{self.job.task_id}.{self.asked}"
        future: asyncio.Future[tuple[bool, str | None]] = asyncio.get_running_loop().create_future()
        self.feed.waiting[request_id] = future
        layout = Layout(self.job.home)
        # In the readable transcript (and so in a pane): what it waits for, and how to answer.
        output = Output(Path(self.job.output_file), echo=self.job.echo)
        try:
            self.status.waiting = {"request_id": request_id, "tool": tool, "input": shown}
            self.status.flush()
            deliver_to(
                layout.inbox_dir(self.job.team, LEAD_NAME),
                make_message(
                    sender=LEAD_NAME,
                    to=LEAD_NAME,
                    kind="permission_request",
                    summary=f"agent {self.job.task_id} asks to run {tool}",
                    data={
                        "request_id": request_id,
                        "tool": tool,
                        "input": {"agent": self.job.task_id, **shown},
                    },
                ),
            )
            what = brief(shown, request_id, limit=PREVIEW_CHARS)  # (a cut one says so)
            output.write(
                f"[asks the lead to run {tool}{f' ({what})' if what else ''}: "
                f"shoal approve {request_id} | shoal reject {request_id}]\n"
            )
            approved, reason = await future
            verdict = "approved" if approved else f"rejected: {reason or 'no reason given'}"
            output.write(f"[{tool} {verdict}]\n")
            return approved, reason
        finally:
            self.feed.waiting.pop(request_id, None)
            self.status.waiting = None
            self.status.flush()


COORDINATOR_IDLE_CHECK_S: Final = 1.0
# In the scratchpad: what the coordinator said (its synthesis), for its workers to read.
COORDINATOR_JOURNAL: Final = "coordinator.md"


def notification_task(text: str) -> str | None:
    """The task id of a `<task-notification>` of a task's end, else None."""
    found = END_NOTIFICATION.match(text.lstrip())
    return found.group(1) if found else None


def recorded_notifications(agent: AgentLoop) -> set[str]:
    """The task ids whose end notifications are in the agent's conversation."""
    return {m.group(1) for text in agent.user_texts() for m in END_NOTIFICATION.finditer(text)}


def watch_coordinator_inbox(
    path: Path, home: Path, feed: Feed, stop: threading.Event
) -> threading.Thread:
    """Feed a coordinator its workers' notifications; each is acked only once it is in the
    transcript (a coordinator killed in between gets it again, and sees it once)."""

    def run() -> None:
        while not stop.is_set():
            try:
                serve()
            except Exception as exc:  # (the inbox, not the agent, failed: say so, go on)
                feed.put(
                    f"[shoal: the notification inbox {path} failed ({exc}); retrying]",
                    counted=False,
                )
                stop.wait(1.0)

    def serve() -> None:
        maildir = Maildir.create(path, home)
        with Inbox(maildir) as inbox:

            def acker(delivery: Any) -> Callable[[], None]:
                def ack() -> None:
                    with contextlib.suppress(ShoalError, OSError):
                        inbox.ack(delivery)

                return ack

            while not stop.is_set():
                delivery = inbox.receive(timeout=0.2)
                if delivery is None:
                    continue
                if delivery.message.text:
                    feed.put(delivery.message.text, ack=acker(delivery))
                else:
                    inbox.ack(delivery)

    thread = threading.Thread(target=run, name="coordinator-inbox", daemon=True)
    thread.start()
    return thread


def _outstanding(job: AgentJob, leader: LeaderPort, agent: AgentLoop) -> list[str]:
    """A coordinator's workers still running, waiting for a lease, or whose end is not yet in
    its transcript: a query of the leader's records (`worker_of`), which the leader writes
    before it answers the Agent call that started them (the reply follows a state flush)."""
    seen = recorded_notifications(agent)
    records = leader.task_records()
    mine = {task_id for task_id, raw in records.items() if raw.get("worker_of") == job.agent_id}
    return sorted(
        task_id
        for task_id in mine
        if (records.get(task_id) or {}).get("status") not in ("completed", "failed", "killed")
        or task_id not in seen
    )


def own_part(history: list[Any], *, forking: bool) -> list[Any]:
    """The part of a conversation read back that this agent's own requests made: a fork's
    copied history is its parent's (counted there), up to the request that forked it."""
    from shoal.workers.agent.loop import prompt_texts

    for at in range(len(history)):
        if any(FORK_TAG in text for text in prompt_texts(history[at : at + 1])):
            return history[at + 1 :]
    return [] if forking else history


async def _coordinator_wait(
    job: AgentJob, leader: LeaderPort, loop: AgentLoop, feed: Feed, status: StatusWriter
) -> str | None:
    """After a coordinator's turn: the next message to go on with (a worker's notification,
    or the user's), or None when no worker is outstanding and the coordinator is done."""
    replayed = ModelSpec.parse(job.model).provider == "replay"
    while True:
        if loop.attach is not None:
            await loop.attach.idle()  # (an end of its background task may be what wakes it)
        queued = loop.pending()
        if replayed and _replay_left(job, loop) <= 0:
            # The recording asked for nothing more: what arrives now (a worker's end that
            # came in another batching than the recording's, after its last request) asks
            # for no model request. It waits for its workers to end, and is done.
            queued = []
        if queued:
            return "\n\n".join(queued)
        outstanding = await asyncio.to_thread(_outstanding, job, leader, loop)
        watched = await asyncio.to_thread(
            active_subscriptions, Path(job.output_file).parent.parent, job.agent_id
        )
        if not outstanding and not watched:
            if _replay_left(job, loop) > 0:
                # (the recording answered more requests: its notifications came in another
                # batching than this run's, so the replay goes on where the recording did)
                return REPLAY_CONTINUE
            return None
        if outstanding + watched != feed.waiting_shown:
            feed.waiting_shown = outstanding + watched
            what = [f"{len(outstanding)} worker(s): {', '.join(outstanding)}"]
            what = what if outstanding else []
            if watched:  # (a subscription holds it until it unsubscribes or the PR refuses)
                what.append(f"activity on {', '.join(watched)}")
            loop.output.write(f"[waiting for {'; '.join(what)}]\n")
            status.progress(loop.progress, force=True)
        text = await feed.next_message(timeout=COORDINATOR_IDLE_CHECK_S)
        if text is not None and not (replayed and _replay_left(job, loop) <= 0):
            return text


async def _idle_wait(feed: Feed, attacher: Attacher) -> str:
    """After a stopped turn: the next message, the leader told (and told again) meanwhile
    that the agent waits, so its background tasks' ends come as messages that wake it."""
    while True:
        await attacher.idle()
        text = await feed.next_message(timeout=IDLE_RENEW_S)
        if text is not None:
            return text


REPLAY_CONTINUE: Final = "(replay: go on as recorded)"


def _replay_left(job: AgentJob, loop: AgentLoop) -> int:
    """How many recorded responses a replayed coordinator has not given yet (0 otherwise)."""
    from pydantic_ai.messages import ModelResponse

    spec = ModelSpec.parse(job.model)
    if spec.provider != "replay":
        return 0
    recorded = Transcript.load(Path(spec.name)).messages
    given = sum(isinstance(m, ModelResponse) for m in loop.history)
    return sum(isinstance(m, ModelResponse) for m in recorded) - given


def coordinator_tools(job: AgentJob, leader: LeaderPort) -> list[Any]:
    """A coordinator's tools: Agent (background workers), SendMessage, TaskStop and the PR
    activity pair."""
    from pydantic_ai import Tool

    from shoal.workers.agent.loop import _tool_function
    from shoal.workers.agent.team_tools import COORDINATOR_TOOL_SPECS, CoordinatorTools
    from shoal.workers.agent.tools import schema_of

    handler = CoordinatorTools(
        Path(job.home), job.team, job.task_id, leader, cwd=job.cwd, model=job.model
    )
    return [
        Tool.from_schema(_tool_function([handler], name, model), name, text, schema_of(model))
        for name, model, text in COORDINATOR_TOOL_SPECS
    ]


def watch_inbox(path: Path, home: Path, feed: Feed, stop: threading.Event) -> threading.Thread:
    """Drain the agent's maildir inbox into `feed` on a thread (a message is acked once fed)."""

    def run() -> None:
        maildir = Maildir.create(path, home)
        with Inbox(maildir) as inbox:
            while not stop.is_set():
                delivery = inbox.receive(timeout=0.2)
                if delivery is None:
                    continue
                msg = delivery.message
                if isinstance(msg, PermissionResponseMessage):
                    feed.answer(msg.data.request_id, msg.data.approve, msg.data.reason)
                elif msg.text:
                    feed.put(msg.text)
                inbox.ack(delivery)

    thread = threading.Thread(target=run, name="agent-inbox", daemon=True)
    thread.start()
    return thread


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
                    prompt = await _coordinator_wait(job, leader, loop, feed, status)
                    if prompt is not None:
                        continue
                break
            await attacher.flush()  # (what the last request carried: the leader may hold it)
        for shell_id in list(workspace.background_watch):  # (ended or not: what it did)
            await asyncio.to_thread(workspace.background_ended, shell_id, "")
        status.progress(loop.progress, force=True)
        return JobOutcome(
            status="completed" if outcome.status == "completed" else "failed",
            result=outcome.result,
            error=outcome.error,
            total_tokens=outcome.total_tokens,
            tool_uses=outcome.tool_uses,
            turns=outcome.turns,
            duration_ms=outcome.duration_ms,
        )
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
