"""Requests to the leader: start shell tasks, stop a task, spawn teammates, shut down.

They come from the control server, a policy, or another thread of this process: `call` runs
a function on the loop's thread, and the public methods here hop there when called from
elsewhere, so one thread owns the registry whoever asks.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from queue import SimpleQueue
from typing import Any, TypeVar

from shoal.channel.protocol import (
    HoldRequest,
    MonitorRequest,
    QueueRequest,
    ReleaseRequest,
    ShellSpec,
    TaskAttachmentsRequest,
    ViewRequest,
)
from shoal.core.errors import ShoalError, TaskError, UsageError
from shoal.core.tasks import (
    MAIN_SESSION_AGENT_TYPE,
    STOPPED_ON_REQUEST,
    AnyTaskState,
    DreamTaskState,
    LocalAgentTaskState,
    LocalShellTaskState,
    MonitorMcpTaskState,
    RemoteAgentTaskState,
    TaskStatus,
    TaskType,
    new_task_id,
    parse_task_state,
)
from shoal.mailbox.router import deliver_to, make_message
from shoal.mailbox.store import Maildir
from shoal.orchestrator import task_ops
from shoal.orchestrator.holds import Holds
from shoal.orchestrator.scheduling import Scheduler
from shoal.orchestrator.store import LeaderStore
from shoal.teams.models import LEAD_NAME
from shoal.workers.agent.attachments import AttachmentDesk
from shoal.workers.agent.coordinator import mode as coordinator
from shoal.workers.agent.coordinator.leases import LeasePolicy, Leases
from shoal.workers.agent.kind import OVER_BUDGET, AgentKind
from shoal.workers.agent.launch import coordinator_inbox
from shoal.workers.agent.permissions import narrowest
from shoal.workers.agent.spec import AgentSpec, new_agent_task
from shoal.workers.agent.team_tools import signed
from shoal.workers.dream.kind import DreamHost, DreamKind, DreamSpec, new_dream_task, release_lock
from shoal.workers.kinds import TaskKind
from shoal.workers.monitor.kind import MonitorKind, new_monitor_task
from shoal.workers.remote.kind import RemoteKind
from shoal.workers.remote.packing import check_model_key
from shoal.workers.remote.spec import RemoteSpec, new_remote_task
from shoal.workers.shell.kind import ShellKind
from shoal.workers.shell.spec import new_task as new_shell_task
from shoal.workers.teammate.swarm import Swarm

T = TypeVar("T")


class LeaderRequests(LeaderStore, ABC):
    """The requests a leader answers; the loop that carries them out is the subclass's."""

    jobs: int
    shell: ShellKind
    swarm: Swarm
    scheduler: Scheduler
    agents: AgentKind
    attachments: AttachmentDesk
    remote: RemoteKind
    dreams: DreamKind
    monitors: MonitorKind
    kinds: dict[TaskType, TaskKind]
    holds: Holds
    queue: deque[str]
    _calls: SimpleQueue[tuple[Callable[[], Any], Future[Any]]]
    _loop_thread: threading.Thread | None
    _stop_requested: bool
    _closed: bool

    @abstractmethod
    def start_pending(self) -> None:
        """The loop's `start` step."""

    @abstractmethod
    def slots_used(self) -> int:
        """Job slots taken: running shell tasks and remote jobs in flight."""

    @abstractmethod
    def persist(self, *, force: bool = False) -> None:
        """The loop's `persist` step."""

    @abstractmethod
    def write_ahead(self, task_id: str) -> bool:
        """Record a task's start on disk before anything is spawned for it."""

    @abstractmethod
    def notify(self) -> None:
        """The loop's `notify` step."""

    @property
    @abstractmethod
    def stopping(self) -> bool:
        """Shutting down: nothing new starts."""

    @abstractmethod
    def run_until(self, until: Callable[[], bool], timeout: float) -> None:
        """Run the loop on this thread until `until()` holds."""

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the loop's thread (at once when called there); its Future has the result."""
        future: Future[T] = Future()
        if self._owns():
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)
            return future
        if self._closed:
            future.set_exception(TaskError(f"the leader of team {self.team!r} has stopped"))
            return future
        self._calls.put((fn, future))
        self.wake()
        return future

    def _owns(self) -> bool:
        """True on the thread that owns the registry (the loop's, or anyone's when none runs)."""
        return self._loop_thread is None or threading.current_thread() is self._loop_thread

    def make_shell_task(self, command: list[str], **options: Any) -> LocalShellTaskState:
        """Build (and check) a new pending shell task; nothing is registered yet (`task_id`:
        an id to reuse; `stdin`: a FIFO as its stdin; the rest: new_shell_task's)."""
        reuse: str | None = options.pop("task_id", None)
        stdin: bool = options.pop("stdin", False)
        owner, agent_id = LEAD_NAME, None
        agent = options.pop("agent", None)
        own = self.registry.get(agent) if agent else None
        if own is not None and own.type == TaskType.LOCAL_AGENT:  # a shell of an agent task
            if own.is_terminal:
                raise TaskError(f"agent {agent} has ended; it cannot start shells")
            owner = agent_id = agent
            inherited = getattr(own, "env_values", None) or {}  # (its background Bash)
            if inherited:
                options["env_values"] = {**inherited, **(options.get("env_values") or {})}
        elif agent:
            name = agent.split("@", 1)[0]
            if self.teams.read(self.team).member(name) is None:
                raise TaskError(f"no member {name!r} in team {self.team!r} to own the task")
            owner = agent_id = name
        task_id = reuse or new_task_id(TaskType.LOCAL_BASH)
        fifo = str(self.session.tasks_dir / f"{task_id}.stdin") if stdin else None
        return new_shell_task(
            command,
            task_id=task_id,
            output_file=str(self.session.output_file(task_id)),
            owner=owner,
            agent_id=agent_id,
            stdin_fifo=fifo,
            **options,
        )

    # -- remote tasks ----------------------------------------------------------------------

    def start_remote(self, spec: RemoteSpec) -> RemoteAgentTaskState:
        """Check and register a `remote_agent` task and start it (a Ray job; remote.py). An
        agent type needs its model's key in the job's environment: named with --env (the
        values stay in the remote kind's memory; the task's record has their names)."""
        if not self._owns():
            return self.call(lambda: self.start_remote(spec)).result()
        env = {**self.remote.inherited_env(spec.remote_type), **spec.env}
        check_model_key(spec.remote_type, spec.model, env, self.layout.home, Path.cwd())
        task = new_remote_task(spec, self.session.output_file)
        self.remote.remember_env(task.id, spec.env)
        self.layout.ensure(self.session.tasks_dir)
        self.register(task)
        self.queue.append(task.id)
        self.start_pending()
        self.persist(force=True)
        self.wake()
        current = self.registry.get(task.id)
        assert isinstance(current, RemoteAgentTaskState)
        return current

    def answer_remote(self, task_id: str, approve: bool, text: str | None) -> AnyTaskState:
        """`shoal approve`/`reject` of a remote ultraplan (remote.py: RemoteKind.answer)."""
        if not self._owns():
            return self.call(lambda: self.answer_remote(task_id, approve, text)).result()
        task = self.registry.get(task_id)
        if not isinstance(task, RemoteAgentTaskState):
            raise TaskError(f"no remote task {task_id!r} in this session (see `shoal ps`)")
        done = self.remote.answer(task, self, approve=approve, text=text)
        self.persist(force=True)
        self.wake()
        return done

    # -- MCP monitors ----------------------------------------------------------------------

    def start_monitor(self, request: MonitorRequest) -> MonitorMcpTaskState:
        """Check and register a `monitor_mcp` task and start it (workers/monitor.py); it holds
        no job slot, so it starts at once."""
        if not self._owns():
            return self.call(lambda: self.start_monitor(request)).result()
        task = new_monitor_task(
            self.session.output_file, server=request.server, config=request.config,
            tool=request.tool, every=request.every, args=request.args, cwd=request.cwd,
        )  # fmt: skip
        self.layout.ensure(self.session.tasks_dir)
        self.register(task)
        self.monitors.start(task, self)
        self.persist(force=True)
        self.wake()
        current = self.registry.get(task.id)
        assert isinstance(current, MonitorMcpTaskState)
        return current

    # -- dreams ----------------------------------------------------------------------------

    def start_dream(self, spec: DreamSpec) -> DreamTaskState:
        """Check a `dream` task, take the consolidation lock (a second dream is refused,
        naming the first), register it and start it (workers/dream/kind.py)."""
        if not self._owns():
            return self.call(lambda: self.start_dream(spec)).result()
        self.layout.ensure(self.session.tasks_dir)
        host = DreamHost(
            home=self.layout.home,
            team=self.team,
            output_file=self.session.output_file,
            environ={os.fsdecode(k): os.fsdecode(v) for k, v in self.environ.items()},
            live=self._dream_live,
        )
        task = new_dream_task(host, spec)
        try:
            self.register(task)
        except BaseException:
            release_lock(task, None)
            raise
        self.queue.append(task.id)
        self.start_pending()
        self.persist(force=True)
        self.wake()
        current = self.registry.get(task.id)
        assert isinstance(current, DreamTaskState)
        return current

    def _dream_live(self, task_id: str) -> bool:
        """True while dream `task_id` is a live task of this leader (else its lock is stale)."""
        task = self.registry.get(task_id)
        return task is not None and not task.is_terminal

    # -- workflows -------------------------------------------------------------------------

    def start_workflow(self, spec_path: str) -> AnyTaskState:
        """Check a workflow's spec (SpecError, exit 2: nothing is registered), register its
        `local_workflow` task and start it (its kind: orchestrator/workflow_kind.py). It holds
        no job slot, so it starts at once; its steps queue like any shell task."""
        if not self._owns():
            return self.call(lambda: self.start_workflow(spec_path)).result()
        from shoal.orchestrator.batch.workflow import load_spec, new_id, new_workflow_task

        kind = self.kinds.get(TaskType.LOCAL_WORKFLOW)
        if kind is None:
            raise TaskError(f"this leader of team {self.team!r} runs no workflows")
        spec = load_spec(spec_path)
        task_id = new_id()
        task = new_workflow_task(spec, self.session.output_file(task_id), task_id)
        self.layout.ensure(self.session.tasks_dir)
        Path(task.output_file).touch(exist_ok=True)
        self.register(task)
        kind.start(task, self)
        self.persist(force=True)
        self.wake()
        return self.registry.get(task.id) or task

    # -- agents ----------------------------------------------------------------------------

    def start_agent(self, spec: AgentSpec) -> LocalAgentTaskState:
        """Check and register a `local_agent` task and start it (see agent_tasks.py)."""
        if not self._owns():
            return self.call(lambda: self.start_agent(spec)).result()
        task = new_agent_task(self, spec)
        self.layout.ensure(self.session.tasks_dir)
        self.register(task)
        self.queue.append(task.id)
        self.start_pending()  # (a worker with a write set starts once it holds its lease)
        self.persist(force=True)
        self.wake()
        current = self.registry.get(task.id)
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
        if not self._owns():
            return self.call(lambda: self.send_to_agent(task_id, text, sender, env)).result()
        task = self.find_agent(task_id)
        if env and not task.is_terminal:
            raise UsageError(
                f"agent {task.id} is {task.status.value}: --env goes with resuming a finished "
                "agent (a running one keeps the environment it started with)"
            )
        mode = None
        if sender is not None:
            mode = self.find_agent(sender).permission_mode
            text = signed(sender, text)
        if not task.is_terminal and task.status != TaskStatus.PENDING:
            if mode is not None and narrowest(task.permission_mode, mode) != task.permission_mode:
                raise TaskError(
                    f"agent {task.id} runs in {task.permission_mode}, wider than the sender's "
                    f"{mode}: it would act on the message with more than its sender may. "
                    "Send it once that agent has finished (it then resumes in the narrower "
                    "mode), or ask the lead"
                )
            self.agents.send(task, text, self, sender=sender)
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
        for task in self.registry.get_all_tasks():
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
    ) -> None:
        """A task owned by a running agent (its background shell, say) tells that agent: the
        notification is queued for its next tool round. Other owners as LeaderStore does."""
        if isinstance(task, LocalAgentTaskState) and task.worker_of is not None:
            # A coordinator's worker: into the coordinator's own maildir, whatever its state
            # (a coordinator resumed later reads what came while it was down).
            inbox = coordinator_inbox(self.session.dir, task.worker_of)
            Maildir.create(inbox, self.layout.home)
            message = make_message(
                sender=LEAD_NAME,
                to=task.worker_of,
                text=xml,
                summary=summary,
                message_id=msg_id,
            )
            deliver_to(inbox, message, durable=True)
            return
        owner = self.registry.get(task.owner) if task.owner else None
        if isinstance(owner, LocalAgentTaskState):
            if isinstance(task, LocalShellTaskState) and task.completion_status_sent_in_attachment:
                return  # (its end and last output reached the agent in an attachment)
            if not owner.is_terminal and owner.status != TaskStatus.PENDING:
                self.agents.send(owner, xml, self)
            return
        super().notify_owner(task, xml, summary, status=status, msg_id=msg_id)

    def task_attachments(self, request: TaskAttachmentsRequest) -> dict[str, Any]:
        """An agent's runner acks what reached its transcript and asks for the new output of
        its background tasks (workers/agent/attachments.py)."""
        if not self._owns():
            return self.call(lambda: self.task_attachments(request)).result()
        return self.attachments.answer(
            self,
            self.registry.get_all_tasks(),
            request.agent,
            request.acks,
            fetch=request.fetch,
            idle=request.idle,
        )

    def stop_turn(self, task_id: str) -> AnyTaskState:
        """Stop only the current turn of agent task `task_id` (it waits for a message)."""
        if not self._owns():
            return self.call(lambda: self.stop_turn(task_id)).result()
        task = self.registry.get(task_id)
        if not isinstance(task, LocalAgentTaskState):
            what = "no running task" if task is None else f"task {task_id} is not an agent;"
            raise TaskError(f"{what} {task_id}: --turn stops an agent's turn (see `shoal ps`)")
        self.agents.abort_turn(task)
        return task

    def answer_permission(
        self, request_id: str, approve: bool, reason: str | None = None
    ) -> dict[str, Any]:
        """Approve or reject permission request `request_id` (`{agent task id}.{n}`)."""
        if not self._owns():
            return self.call(lambda: self.answer_permission(request_id, approve, reason)).result()
        task = self.find_agent(request_id.split(".", 1)[0])
        waiting = (task.waiting_for or {}).get("request_id")
        if waiting is not None and waiting != request_id:
            raise TaskError(f"agent {task.id} waits on {waiting}, not on {request_id}")
        self.agents.answer(task, request_id, approve, reason, self)
        return {"request_id": request_id, "task_id": task.id, "approve": approve}

    def lease_policy(self) -> LeasePolicy:
        """The write-set leases of this session (a policy of the loop from the first use)."""
        for policy in self.policies:
            if isinstance(policy, LeasePolicy):
                return policy
        policy = LeasePolicy(Leases(self.session.dir))
        policy.holders = {  # (a resumed leader's live holders: released when they end)
            t.id
            for t in self.registry.get_all_tasks()
            if isinstance(t, LocalAgentTaskState) and t.lease is not None and not t.is_terminal
        }
        self.policies.append(policy)
        return policy

    def admitted(self, task: AnyTaskState) -> bool:
        """Whether `task` may start now: a worker with a write set only once it holds its
        lease (else it waits, pending); one whose lease cannot be taken at all fails."""
        if not isinstance(task, LocalAgentTaskState) or task.write_set is None:
            return True
        if task.lease is not None:
            return True
        try:
            return self.lease_policy().admit(self, task)
        except ShoalError as exc:
            self.move_task(task.id, TaskStatus.FAILED, error=f"could not take its lease: {exc}")
            return False

    def check_run_budget(self, agent: LocalAgentTaskState) -> None:
        """Stop every unfinished worker of `agent`'s coordinator run, `failed` with the limit
        named, once the run's tokens or tool uses are all spent (by the coordinator and its
        workers together: each worker's own limit is only what the run had left at its
        start, so parallel workers could together spend more)."""
        boss_id = agent.id if agent.coordinator else self._live_coordinator(agent.worker_of or "")
        boss = self.registry.get(boss_id) if boss_id else None
        if not isinstance(boss, LocalAgentTaskState) or not boss.budget or boss.is_terminal:
            return
        workers = self.workers_of(boss.agent_id)
        why = coordinator.overspent(boss, workers)
        if why is None:
            return
        stopped = [  # (one already ending is let be: what it did is done)
            w.id
            for w in workers
            if not w.kill_reason
            and (w.id in self.agents.runs or w.status is TaskStatus.PENDING)
            and w.id in self.registry
        ]
        for worker_id in stopped:
            self.stop(worker_id, reason=f"{OVER_BUDGET}{why}")
        if stopped:
            self.note(f"{why}: stopped worker(s) {', '.join(stopped)} of {boss.id}")

    def workers_of(self, agent_id: str) -> list[LocalAgentTaskState]:
        """Every worker of coordinator `agent_id` in this session (live and evicted)."""
        found: dict[str, LocalAgentTaskState] = {}
        for raw in self.history().values():
            if raw.get("worker_of") == agent_id:
                task = parse_task_state(raw)
                if isinstance(task, LocalAgentTaskState):
                    found[task.id] = task
        for task in self.registry.get_all_tasks():
            if isinstance(task, LocalAgentTaskState) and task.worker_of == agent_id:
                found[task.id] = task
        return list(found.values())

    def find_agent(self, task_id: str) -> LocalAgentTaskState:
        """The agent task `task_id` (live, or from the session's history)."""
        task = self.registry.get(task_id)
        if task is None:
            raw = self.history().get(task_id)
            if raw is not None:
                task = parse_task_state(raw)
        if not isinstance(task, LocalAgentTaskState):
            what = "no task" if task is None else f"task {task_id} is not an agent task;"
            raise TaskError(f"{what} {task_id} in team {self.team!r} (see `shoal ps --all`)")
        return task

    def submit(self, tasks: list[LocalShellTaskState]) -> list[LocalShellTaskState]:
        """Register tasks and start them now (or as job slots free); one state write."""
        if not self._owns():
            return self.call(lambda: self.submit(tasks)).result()
        # Checked before anything is registered: a link planted at the session's directory or
        # its tasks/ refuses the request, where it would otherwise take the tasks' files.
        self.layout.ensure(self.session.tasks_dir)
        for task in tasks:
            self.register(task)
            self.scheduler.track(task)
            self.queue.append(task.id)
        # On disk before any of them starts: a leader killed right after a spawn leaves a
        # task its successor finds (pending, with the pid its wrapper recorded) and adopts,
        # not a process nobody knows of. (What the start changed is written before a control
        # reply, or by the loop's next write: a batch run submits many times a second.)
        self.persist(force=True)
        self.start_pending()
        self.wake()
        current = [self.registry.get(t.id) for t in tasks]
        return [t for t in current if isinstance(t, LocalShellTaskState)]

    def submit_shell(self, command: list[str], **options: Any) -> LocalShellTaskState:
        """Register one shell task and start it (see `make_shell_task` for the options)."""
        return self.submit([self.make_shell_task(command, **options)])[0]

    def start_shell(self, specs: list[ShellSpec]) -> list[AnyTaskState]:
        tasks = [  # all checked before any runs
            self.make_shell_task(
                list(s.command),
                description=s.description,
                agent=s.agent,
                cwd=s.cwd,
                env_values=s.env,  # (a request's: the values stay in this memory only)
                kind=s.kind,
                background=s.background,
                stdin=s.stdin,
                sandbox=_checked_policy(s.sandbox),
                **task_ops.queueing_options(self, s),
            )
            for s in specs
        ]
        return list(self.submit(tasks))

    def queue_control(self, request: QueueRequest) -> Any:
        """A request about queued and running tasks (see task_ops.py)."""
        if not self._owns():
            return self.call(lambda: self.queue_control(request)).result()
        return task_ops.handle(self, request)

    def view_request(self, request: ViewRequest) -> Any:
        """A view holds or releases a task it shows (holds.py), or `shoal chat` moves its
        query to or from the background."""
        if not self._owns():
            return self.call(lambda: self.view_request(request)).result()
        if isinstance(request, HoldRequest):
            held = self.holds.hold(
                self,
                request.task_id,
                request.holder,
                pid=request.pid,
                pid_started_at=request.pid_started_at,
                lease=request.lease_s,
            )
            self._read_back(request.task_id)
            return held
        if isinstance(request, ReleaseRequest):
            return self.holds.release(self, request.task_id, request.holder)
        return self.background(request.task_id, request.background).model_dump(mode="json")

    def background(self, task_id: str, background: bool) -> LocalAgentTaskState:
        """Move main-session query `task_id` to the background (`is_backgrounded`: the pill
        and the board count it, its end is told as it comes) or back to the foreground."""
        task = self.registry.get(task_id)
        if task is None and task_id in self.history():
            raise TaskError(f"task {task_id} has ended and left the registry; it stays put")
        if not isinstance(task, LocalAgentTaskState) or task.agent_type != MAIN_SESSION_AGENT_TYPE:
            what = "no task" if task is None else f"task {task_id} is not a main-session query;"
            raise TaskError(
                f"{what} {task_id} to move (only `shoal chat`'s queries go to the background)"
            )
        self.set_task(task_id, is_backgrounded=background)
        current = self.registry.get(task_id)
        assert isinstance(current, LocalAgentTaskState)
        return current

    def _read_back(self, task_id: str) -> None:
        """A view holds an agent whose record has no messages (it ran before they were kept,
        or its runner died before telling any): they are read back from its transcript, off
        the loop's thread, and the record says so (`disk_loaded`)."""
        task = self.registry.get(task_id)
        if (
            not isinstance(task, LocalAgentTaskState)
            or task.messages
            or task.disk_loaded
            or task.id in self.agents.runs  # (a running one's runner gathers them)
            or not task.transcript
        ):
            return
        path = Path(task.transcript)

        def load() -> None:
            from shoal.workers.agent.loop import conversation_messages
            from shoal.workers.agent.transcript import Transcript

            try:
                messages = conversation_messages(Transcript.load(path).messages)
            except (ShoalError, OSError, ValueError) as exc:
                why = f"could not read {path} for a view: {exc}"
                self.call(lambda: self.note(why))
                return
            if messages:
                kept = tuple(messages)
                self.call(lambda: self.set_task(task_id, messages=kept, disk_loaded=True))

        threading.Thread(target=load, name="transcript-read", daemon=True).start()

    def stop(
        self,
        task_id: str,
        on_done: Callable[[AnyTaskState], None] | None = None,
        reason: str = STOPPED_ON_REQUEST,
    ) -> AnyTaskState:
        """Begin stopping a task (never waits); `on_done` gets its final state once it ended."""
        task = self.registry.get(task_id)
        if task is None:
            if task_id in self.history():
                raise TaskError(f"task {task_id} already finished")
            raise TaskError(f"no task {task_id} in team {self.team!r} (see `shoal ps --all`)")
        if task.is_terminal:
            raise TaskError(f"task {task_id} already finished ({task.status.value})")
        if on_done is not None:
            self._waiters.setdefault(task_id, []).append(on_done)
        if task_id in self.queue:  # (never started: its kind ends it at once)
            self.queue.remove(task_id)
        self.kinds[task.type].kill(task, self, reason)
        self.persist(force=True)
        self._answer_waiters()
        return self.registry.get(task_id) or task

    def _answer_waiters(self) -> None:
        """Hand each ended task's final record to whoever waits for it (a `stop` or `await`
        reply; the control server writes state.json before it sends one, so who then reads
        the session, `shoal ps` after `shoal stop`, finds the end there)."""
        ended = [i for i in self._waiters if (t := self.registry.get(i)) is None or t.is_terminal]
        for task_id in ended:
            final = self.registry.get(task_id)
            waiters = self._waiters.pop(task_id)
            if final is None:  # (evicted: its final record is in the history)
                raw = self.history().get(task_id)
                final = parse_task_state(raw) if raw is not None else None
            if final is not None:
                for waiter in waiters:
                    waiter(final)

    def await_end(self, task_id: str, on_done: Callable[[AnyTaskState], None]) -> None:
        """`on_done` gets the task's final state once it has ended (at once when it has)."""
        if self.registry.get(task_id) is None and task_id not in self.history():
            raise TaskError(f"no task {task_id} in team {self.team!r} (see `shoal ps --all`)")
        self._waiters.setdefault(task_id, []).append(on_done)
        self._answer_waiters()

    def stop_task(
        self, task_id: str, reason: str = STOPPED_ON_REQUEST, *, timeout: float = 60.0
    ) -> AnyTaskState:
        """Stop a task and wait until it has ended (from a thread other than the loop's; on
        the loop's own thread this only begins the stop, as `stop` does)."""
        if self._loop_thread is not None and self._owns():
            return self.stop(task_id, reason=reason)
        done: Future[AnyTaskState] = Future()
        started = self.call(lambda: self.stop(task_id, done.set_result, reason))
        started.result(timeout)  # (raises what `stop` refused)
        if self._loop_thread is None:  # nobody else runs the loop: run it here until it ended
            self.run_until(done.done, timeout)
        return done.result(timeout)

    def spawn(self, members: list[dict[str, Any]], answer: Callable[..., None]) -> None:
        self.swarm.spawn_many(members, answer)

    def request_stop(self) -> dict[str, Any]:
        """Ask the loop to shut down (from any thread): stop every task, then return."""
        self._stop_requested = True
        self.wake()
        return {
            "stopping": True,
            "running": self.shell.running() + self.remote.running(),
            "teammates": sorted(self.swarm.members),
        }


def _checked_policy(raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """A shell request's sandbox policy in its normal form; a bad one is a UsageError."""
    if raw is None:
        return None
    from shoal.core.sandbox import Policy

    try:
        return Policy.from_json(raw).to_json()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
