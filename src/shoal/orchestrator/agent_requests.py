"""The leader's agent requests: a part the leader holds, answering what is asked of its
`local_agent` tasks (start, message or resume, a turn's stop, permission answers, write-set
leases, a coordinator run's budget, the background of a main-session query).

Its methods run on the loop's thread: the leader's public methods hop there first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

from shoal.channel.protocol import TaskAttachmentsRequest
from shoal.core.errors import ShoalError, TaskError, UsageError
from shoal.core.paths import Layout
from shoal.core.tasks import (
    MAIN_SESSION_AGENT_TYPE,
    AnyTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    TaskStatus,
)
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.store import Maildir
from shoal.orchestrator.registry import TaskRegistry
from shoal.orchestrator.scheduling import Scheduler
from shoal.orchestrator.store import Policy
from shoal.teams.models import LEAD_NAME
from shoal.workers.agent.attachments import AttachmentDesk
from shoal.workers.agent.coordinator import mode as coordinator
from shoal.workers.agent.coordinator.leases import LeasePolicy, Leases
from shoal.workers.agent.kind import OVER_BUDGET, AgentKind
from shoal.workers.agent.launch import coordinator_inbox
from shoal.workers.agent.permissions import narrowest
from shoal.workers.agent.spec import AgentHost, AgentSpec, new_agent_task
from shoal.workers.agent.team_tools import signed
from shoal.workers.kinds import TaskStore

T = TypeVar("T")


class AgentsHost(TaskStore, AgentHost, Protocol):
    """What the agent requests need of the leader."""

    team: str
    registry: TaskRegistry
    scheduler: Scheduler
    policies: list[Policy]
    agents: AgentKind
    attachments: AttachmentDesk

    @property
    def layout(self) -> Layout: ...

    def history(self) -> dict[str, dict[str, Any]]: ...

    def register(self, task: AnyTaskState) -> AnyTaskState: ...

    def start_pending(self) -> None: ...

    def persist(self, *, force: bool = False) -> None: ...

    def stop(
        self,
        task_id: str,
        on_done: Callable[[AnyTaskState], None] | None = None,
        reason: str = ...,
    ) -> AnyTaskState: ...

    def call(self, fn: Callable[[], T]) -> Future[T]: ...


class AgentRequests:
    """The requests about agent tasks, carried out on `host` (the leader)."""

    def __init__(self, host: AgentsHost) -> None:
        self.host = host

    def start_agent(self, spec: AgentSpec) -> LocalAgentTaskState:
        """Check and register a `local_agent` task and start it (built by workers/agent/spec.py)."""
        task = new_agent_task(self.host, spec)
        self.host.layout.ensure(self.host.session.tasks_dir)
        self.host.register(task)
        self.host.scheduler.enqueue(task.id)
        self.host.start_pending()  # (a worker with a write set starts once it holds its lease)
        self.host.persist(force=True)
        self.host.wake()
        current = self.host.registry.get(task.id)
        assert isinstance(current, LocalAgentTaskState)
        return current

    def send_to_agent(
        self,
        task_id: str,
        text: str,
        sender: str | None = None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A message for agent task `task_id`: queued when it runs, else it resumes it (a new
        task continuing the conversation). Returns {"queued": id} or {"resumed": new id}.

        `sender`: the agent task whose SendMessage sent it (None: the user). Its text then
        carries that agent's id, a resume runs in the lower of the two agents' modes (a
        plan-mode agent cannot wake a bypassPermissions one to act on its words), and one to a
        running agent in a wider mode than the sender's is refused (it would act on it so).
        `env`: the `--env` values of the resumed agent (over those this leader holds of
        `task_id`)."""
        task = self.host.find_agent(task_id)
        if env and not task.is_terminal:
            raise UsageError(
                f"agent {task.id} is {task.status.value}: --env goes with resuming a finished "
                "agent (a running one keeps the environment it started with)"
            )
        mode = None
        if sender is not None:
            mode = self.host.find_agent(sender).permission_mode
            text = signed(sender, text)
        if not task.is_terminal and task.status != TaskStatus.PENDING:
            if mode is not None and narrowest(task.permission_mode, mode) != task.permission_mode:
                raise TaskError(
                    f"agent {task.id} runs in {task.permission_mode}, wider than the sender's "
                    f"{mode}: it would act on the message with more than its sender may. "
                    "Send it once that agent has finished (it then resumes in the narrower "
                    "mode), or ask the lead"
                )
            self.host.agents.send(task, text, self.host, sender=sender)
            return {"queued": task.id, "task_id": task.id}
        if task.status == TaskStatus.PENDING:
            raise TaskError(f"agent {task.id} has not started yet; send again once it runs")
        resumed = self.resume_agent(task, [text], mode, env)
        return {"resumed": resumed.id, "task_id": resumed.id, "resumed_from": task.id}

    def resume_agent(
        self,
        task: LocalAgentTaskState,
        texts: list[str],
        mode: str | None = None,
        env: dict[str, str] | None = None,
    ) -> LocalAgentTaskState:
        """A new task that continues `task`'s conversation with `texts` as the next message,
        in `task`'s mode or the narrower `mode` (its sender's), with `task`'s --env values
        (this leader's memory) under `env`."""
        spec = AgentSpec(
            prompt="\n\n".join(texts),
            model=task.model,
            agent_type=task.agent_type,
            tools=list(task.tools) if task.tools is not None else None,
            permission_mode=narrowest(task.permission_mode, mode),
            cwd=task.cwd,
            env=env or None,  # (over `task`'s own, which new_agent_task takes from it)
            backend=task.backend,
            limits=task.limits,
            description=task.description,
            subagent=task.subagent,
            parent_agent=self._live_coordinator(task.worker_of) if task.worker_of else None,
        )
        return self.start_agent(spec.model_copy(update={"resume": task.id}))

    def _live_coordinator(self, agent_id: str) -> str | None:
        """The running task of coordinator `agent_id`, if any (a continued worker dies with
        it, as it would have with the task that started it)."""
        for task in self.host.registry.get_all_tasks():
            if (
                isinstance(task, LocalAgentTaskState)
                and task.coordinator
                and task.agent_id == agent_id
                and not task.is_terminal
            ):
                return task.id
        return None

    def notify_owner(
        self, task: AnyTaskState, xml: str, summary: str, *, status: str, msg_id: str | None
    ) -> bool:
        """A task owned by a running agent (its background shell, say) tells that agent: the
        notification is queued for its next tool round. False: the owner is no agent (the
        store tells it)."""
        if isinstance(task, LocalAgentTaskState) and task.worker_of is not None:
            # A coordinator's worker: into the coordinator's own maildir, whatever its state
            # (a coordinator resumed later reads what came while it was down).
            inbox = coordinator_inbox(self.host.session.dir, task.worker_of)
            Maildir.create(inbox, self.host.layout.home)
            message = make_message(
                sender=LEAD_NAME,
                to=task.worker_of,
                text=xml,
                summary=summary,
                message_id=msg_id,
            )
            deliver_to(inbox, message, durable=True)
            return True
        owner = self.host.registry.get(task.owner) if task.owner else None
        if isinstance(owner, LocalAgentTaskState):
            if isinstance(task, LocalShellTaskState) and task.completion_status_sent_in_attachment:
                return True  # (its end and last output reached the agent in an attachment)
            if not owner.is_terminal and owner.status != TaskStatus.PENDING:
                self.host.agents.send(owner, xml, self.host)
            return True
        return False

    def task_attachments(self, request: TaskAttachmentsRequest) -> dict[str, Any]:
        """An agent's runner acks what reached its transcript and asks for the new output of
        its background tasks (workers/agent/attachments.py)."""
        return self.host.attachments.answer(
            self.host,
            self.host.registry.get_all_tasks(),
            request.agent,
            request.acks,
            fetch=request.fetch,
            idle=request.idle,
        )

    def stop_turn(self, task_id: str) -> AnyTaskState:
        """Stop only the current turn of agent task `task_id` (it waits for a message)."""
        task = self.host.registry.get(task_id)
        if not isinstance(task, LocalAgentTaskState):
            what = "no running task" if task is None else f"task {task_id} is not an agent;"
            raise TaskError(f"{what} {task_id}: --turn stops an agent's turn (see `shoal ps`)")
        self.host.agents.abort_turn(task)
        return task

    def answer_permission(
        self, request_id: str, approve: bool, reason: str | None = None
    ) -> dict[str, Any]:
        """Approve or reject permission request `request_id` (`{agent task id}.{n}`)."""
        task = self.host.find_agent(request_id.split(".", 1)[0])
        waiting = (task.waiting_for or {}).get("request_id")
        if waiting is not None and waiting != request_id:
            raise TaskError(f"agent {task.id} waits on {waiting}, not on {request_id}")
        self.host.agents.answer(task, request_id, approve, reason, self.host)
        return {"request_id": request_id, "task_id": task.id, "approve": approve}

    def lease_policy(self) -> LeasePolicy:
        """The write-set leases of this session (a policy of the loop from the first use)."""
        for policy in self.host.policies:
            if isinstance(policy, LeasePolicy):
                return policy
        policy = LeasePolicy(Leases(self.host.session.dir))
        policy.holders = {  # (a resumed leader's live holders: released when they end)
            t.id
            for t in self.host.registry.get_all_tasks()
            if isinstance(t, LocalAgentTaskState) and t.lease is not None and not t.is_terminal
        }
        self.host.policies.append(policy)
        return policy

    def admitted(self, task: AnyTaskState) -> bool:
        """Whether `task` may start now: a worker with a write set only once it holds its
        lease (else it waits, pending); one whose lease cannot be taken at all fails."""
        if not isinstance(task, LocalAgentTaskState) or task.write_set is None:
            return True
        if task.lease is not None:
            return True
        try:
            return self.lease_policy().admit(self.host, task)
        except ShoalError as exc:
            self.host.move_task(
                task.id, TaskStatus.FAILED, error=f"could not take its lease: {exc}"
            )
            return False

    def check_run_budget(self, agent: LocalAgentTaskState) -> None:
        """Stop every unfinished worker of `agent`'s coordinator run, `failed` with the limit
        named, once the run's tokens or tool uses are all spent (by the coordinator and its
        workers together: each worker's own limit is only what the run had left at its
        start, so parallel workers could together spend more)."""
        boss_id = agent.id if agent.coordinator else self._live_coordinator(agent.worker_of or "")
        boss = self.host.registry.get(boss_id) if boss_id else None
        if not isinstance(boss, LocalAgentTaskState) or not boss.budget or boss.is_terminal:
            return
        workers = self.host.workers_of(boss.agent_id)
        why = coordinator.overspent(boss, workers)
        if why is None:
            return
        stopped = [  # (one already ending is let be: what it did is done)
            w.id
            for w in workers
            if not w.kill_reason
            and (w.id in self.host.agents.runs or w.status is TaskStatus.PENDING)
            and w.id in self.host.registry
        ]
        for worker_id in stopped:
            self.host.stop(worker_id, reason=f"{OVER_BUDGET}{why}")
        if stopped:
            self.host.note(f"{why}: stopped worker(s) {', '.join(stopped)} of {boss.id}")

    def background(self, task_id: str, background: bool) -> LocalAgentTaskState:
        """Move main-session query `task_id` to the background (`is_backgrounded`: the pill
        and the board count it, its end is told as it comes) or back to the foreground."""
        task = self.host.registry.get(task_id)
        if task is None and task_id in self.host.history():
            raise TaskError(f"task {task_id} has ended and left the registry; it stays put")
        if not isinstance(task, LocalAgentTaskState) or task.agent_type != MAIN_SESSION_AGENT_TYPE:
            what = "no task" if task is None else f"task {task_id} is not a main-session query;"
            raise TaskError(
                f"{what} {task_id} to move (only `shoal chat`'s queries go to the background)"
            )
        self.host.set_task(task_id, is_backgrounded=background)
        current = self.host.registry.get(task_id)
        assert isinstance(current, LocalAgentTaskState)
        return current

    def read_back(self, task_id: str) -> None:
        """A view holds an agent whose record has no messages (it ran before they were kept,
        or its runner died before telling any): they are read back from its transcript, off
        the loop's thread, and the record says so (`disk_loaded`)."""
        task = self.host.registry.get(task_id)
        if (
            not isinstance(task, LocalAgentTaskState)
            or task.messages
            or task.disk_loaded
            or task.id in self.host.agents.runs  # (a running one's runner gathers them)
            or not task.transcript
        ):
            return
        path = Path(task.transcript)

        def load() -> None:
            from shoal.workers.agent.progress import conversation_messages
            from shoal.workers.agent.transcript import Transcript

            try:
                messages = conversation_messages(Transcript.load(path).messages)
            except (ShoalError, OSError, ValueError) as exc:
                why = f"could not read {path} for a view: {exc}"
                self.host.call(lambda: self.host.note(why))
                return
            if messages:
                kept = tuple(messages)
                self.host.call(lambda: self.host.set_task(task_id, messages=kept, disk_loaded=True))

        threading.Thread(target=load, name="transcript-read", daemon=True).start()
