"""The background-task model: the frozen state of each task type, parsed from its record.

Types, ids and the status transition table are taskstatus.py's (re-exported here, the names
every layer imports the model by); the nested records are in taskrecords.py, checked changes
of a state in taskupdates.py.
"""

from __future__ import annotations

import functools
import time
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import Field, TypeAdapter, field_validator, model_validator

from shoal.core.errors import ShoalError
from shoal.core.taskrecords import (
    AgentProgress,
    DreamTurn,
    Frozen,
    ShellResult,
    TaskUsage,
    TeammateIdentity,
)
from shoal.core.taskstatus import (
    _TYPE_BY_PREFIX as _TYPE_BY_PREFIX,
)
from shoal.core.taskstatus import (
    AGENT_MESSAGES_UI_CAP as AGENT_MESSAGES_UI_CAP,
)
from shoal.core.taskstatus import (
    AGENT_TASK_TYPES as AGENT_TASK_TYPES,
)
from shoal.core.taskstatus import (
    DREAM_TURNS_CAP as DREAM_TURNS_CAP,
)
from shoal.core.taskstatus import (
    KILLED_DISPLAY_S as KILLED_DISPLAY_S,
)
from shoal.core.taskstatus import (
    MAIN_SESSION_AGENT_TYPE as MAIN_SESSION_AGENT_TYPE,
)
from shoal.core.taskstatus import (
    MAX_TASK_OUTPUT_BYTES as MAX_TASK_OUTPUT_BYTES,
)
from shoal.core.taskstatus import (
    MESSAGE_TEXT_CAP as MESSAGE_TEXT_CAP,
)
from shoal.core.taskstatus import (
    OUTPUT_READ_CHUNK as OUTPUT_READ_CHUNK,
)
from shoal.core.taskstatus import (
    PANEL_GRACE_S as PANEL_GRACE_S,
)
from shoal.core.taskstatus import (
    RECENT_ACTIVITIES_CAP as RECENT_ACTIVITIES_CAP,
)
from shoal.core.taskstatus import (
    STOPPED_ON_REQUEST as STOPPED_ON_REQUEST,
)
from shoal.core.taskstatus import (
    TASK_ID_ALPHABET as TASK_ID_ALPHABET,
)
from shoal.core.taskstatus import (
    TASK_ID_PATTERN as TASK_ID_PATTERN,
)
from shoal.core.taskstatus import (
    TASK_ID_PREFIXES as TASK_ID_PREFIXES,
)
from shoal.core.taskstatus import (
    TASK_ID_RANDOM_LENGTH as TASK_ID_RANDOM_LENGTH,
)
from shoal.core.taskstatus import (
    TEAMMATE_MESSAGES_UI_CAP as TEAMMATE_MESSAGES_UI_CAP,
)
from shoal.core.taskstatus import (
    TERMINAL_STATUSES as TERMINAL_STATUSES,
)
from shoal.core.taskstatus import (
    TIMED_OUT_REASON as TIMED_OUT_REASON,
)
from shoal.core.taskstatus import (
    TRANSITIONS as TRANSITIONS,
)
from shoal.core.taskstatus import (
    IllegalTransition as IllegalTransition,
)
from shoal.core.taskstatus import (
    JsonDict as JsonDict,
)
from shoal.core.taskstatus import (
    TaskStatus as TaskStatus,
)
from shoal.core.taskstatus import (
    TaskType as TaskType,
)
from shoal.core.taskstatus import (
    check_transition as check_transition,
)
from shoal.core.taskstatus import (
    is_terminal_task_status as is_terminal_task_status,
)
from shoal.core.taskstatus import (
    new_task_id as new_task_id,
)
from shoal.core.taskstatus import (
    retry_due as retry_due,
)
from shoal.core.taskstatus import (
    task_type_of_id as task_type_of_id,
)

PermissionMode = Literal["default", "plan", "accept_edits", "bypass_permissions", "bubble"]
RemoteTaskType = Literal[
    "remote-agent", "ultraplan", "ultrareview", "autofix-pr", "background-pr", "shell"
]
UltraplanPhase = Literal["running", "needs_input", "plan_ready"]

# --------------------------------------------------------------------------- task states

RETIRED_TEAMMATE_FIELDS: Final = frozenset({"pending_user_messages"})
"""Fields a teammate's record had in older versions, ignored when read: a message for a
teammate waits in its maildir inbox (`shoal inbox NAME`), which is its queue."""


class TaskStateBase(Frozen):
    """Fields every task has; subclasses fix `type`. Plain data only: no live handles."""

    id: str
    type: TaskType
    status: TaskStatus = TaskStatus.PENDING
    description: str
    tool_use_id: str | None = None
    start_time: float = Field(default_factory=time.time)
    end_time: float | None = None
    total_paused_ms: int = 0
    output_file: str
    output_offset: int = Field(default=0, ge=0)
    notified: bool = False
    owner: str | None = None
    """The inbox or agent that receives this task's notification."""
    is_backgrounded: bool = True
    retain: bool = False
    """Held open by a view (`hold`): never evicted while set (the leader keeps the holds; the
    seed has it on agent tasks, shoal's views show every kind)."""

    @model_validator(mode="after")
    def _id_matches_type(self) -> TaskStateBase:
        # The prefix encodes the type, so a mismatch is a corrupt or hand-made record.
        if not TASK_ID_PATTERN.fullmatch(self.id):
            raise ValueError(f"malformed task id {self.id!r} (prefix + 8 chars of [0-9a-z])")
        if _TYPE_BY_PREFIX[self.id[0]] != self.type:
            raise ValueError(
                f"task id {self.id!r} has the prefix of {_TYPE_BY_PREFIX[self.id[0]].value}, "
                f"not of {self.type.value}"
            )
        return self

    @property
    def is_terminal(self) -> bool:
        """True once the task completed, failed or was killed."""
        return self.status in TERMINAL_STATUSES


class LocalShellTaskState(TaskStateBase):
    """A shell command run in the background; its output goes straight to `output_file`."""

    type: Literal[TaskType.LOCAL_BASH] = TaskType.LOCAL_BASH
    command: str
    argv: tuple[str, ...] = ()
    cwd: str | None = None
    result: ShellResult | None = None
    pid: int | None = None
    pid_started_at: float | None = None
    agent_id: str | None = None
    """The agent that started the shell; its shells are killed when it exits."""
    kind: Literal["bash", "monitor"] = "bash"
    last_reported_total_lines: int = 0
    """Lines of its output its agent has been shown (see `agent_task`); with `output_offset`,
    advanced only once an attachment carrying them is in the agent's transcript."""
    completion_status_sent_in_attachment: bool = False
    """Its end and last output reached its agent in an attachment: its notification is not
    sent to the agent again (workers/agent/attachments.py)."""
    kill_reason: str | None = None
    error: str | None = None
    """Why the shell could not be started (a failure without an exit code)."""
    stall_notified: bool = False
    env: dict[str, str] | None = None
    """Variables a spec file or shoal itself gives the task (written to state.json)."""
    env_names: tuple[str, ...] = ()
    """The variables given with `--env`, by name only: their values are never written."""
    env_values: dict[str, str] | None = Field(None, exclude=True, repr=False)
    """The values of `env_names`, in the leader's memory only (see `missing_env`)."""
    sandbox: JsonDict | None = None
    """The kernel sandbox policy it runs confined to (an agent's background command)."""
    # -- queueing (`shoal sh --after/--priority/--group/...`; see orchestrator/scheduling.py)
    label: str | None = None
    group: str = "default"
    """The group whose parallelism limit it counts against (`shoal group`)."""
    priority: int = 0
    """Higher starts first when slots are limited (ties: first queued first)."""
    after: tuple[str, ...] = ()
    """Tasks that must complete before it starts; if one does not, it fails unstarted."""
    after_any: tuple[str, ...] = ()
    """Tasks that must have ended (however) before it starts."""
    not_before: float | None = None
    """Wall-clock time before which it does not start (`--delay`)."""
    timeout: float | None = None
    """Seconds of running (paused time excluded) after which it is killed."""
    retries: int = 0
    """Attempts left after this one: a failure or timeout starts a new attempt (a new id)."""
    retry_delay: float | None = None
    """Seconds before the next attempt starts; doubled for each attempt after it."""
    attempt: int = 1
    retry_of: str | None = None
    """The attempt this one retries."""
    retried_as: str | None = None
    """The attempt that retries this one (its end is then not notified: the last one's is)."""
    pending_reason: str | None = None
    """Why a pending task has not started yet (shown by ps)."""
    paused_at: float | None = None
    """When it was paused (`shoal pause`); None while it is not paused."""
    restarted_from: str | None = None
    """The finished task this one runs again (`shoal restart`)."""
    restarts: int = 0
    """How often it was run again in place (`shoal restart --in-place`)."""
    stdin_fifo: str | None = None
    """The FIFO its standard input reads (`sh --stdin`; `shoal send-input` writes to it)."""
    workflow_id: str | None = None
    """The workflow (`w...` task) this task is a step of, if any."""

    @property
    def agent_task(self) -> str | None:
        """The agent task that owns it (its Bash run_in_background, or `sh --agent` of an
        agent task) and so reads its new output as attachments at each tool round; None
        for a shell of the lead or of a teammate."""
        agent = self.agent_id
        if agent is None or agent != self.owner or not TASK_ID_PATTERN.fullmatch(agent):
            return None
        return agent if _TYPE_BY_PREFIX[agent[0]] == TaskType.LOCAL_AGENT else None


class LocalAgentTaskState(TaskStateBase):
    """A local agent subprocess (agent_type 'main-session' marks a backgrounded main session)."""

    type: Literal[TaskType.LOCAL_AGENT] = TaskType.LOCAL_AGENT
    agent_id: str
    prompt: str
    agent_type: str
    model: str | None = None
    error: str | None = None
    result: str | None = None
    usage: TaskUsage | None = None
    progress: AgentProgress | None = None
    pending_messages: tuple[str, ...] = ()
    """Messages sent to it while it runs that it has not taken into its conversation yet
    (each leaves as the agent drains it at a tool-round boundary)."""
    disk_loaded: bool = False
    """Its `messages` were read back from its transcript on disk (a resume, or a view that
    opened an agent whose record had none), not gathered as it ran."""
    evict_after: float | None = None
    messages: tuple[JsonDict, ...] = ()
    """The last AGENT_MESSAGES_UI_CAP messages of its conversation, for views: {role: user or
    assistant, kind: text or tool_use, text (cut to MESSAGE_TEXT_CAP), at}."""
    resumed_from: str | None = None
    """The agent task this one continues (same agent_id and transcript)."""
    backend: str = "process"
    pid: int | None = None
    pid_started_at: float | None = None
    pane_id: str | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    """Not written any more (records of older versions kept the `--env` values here)."""
    env_names: tuple[str, ...] = ()
    """The variables given with `--env`, by name only: their values are never written."""
    env_values: dict[str, str] | None = Field(None, exclude=True, repr=False)
    """The values of `env_names`, in the leader's memory only (see `missing_env`)."""
    permission_mode: str = "default"
    tools: tuple[str, ...] | None = None
    custom: bool = False
    """Of a user's agent definition (see workers/agent/filters.py)."""
    instructions: str | None = None
    """The system prompt (its definition's body)."""
    fork: bool = False
    """Forking is on: Agent without subagent_type forks this agent."""
    parent_agent: str | None = None
    """The agent task whose Agent tool started this one (it dies with it)."""
    subagent: bool = False
    """Started by another agent's Agent tool: it has no Agent tool (subagents do not nest)."""
    forked_from: str | None = None
    """The agent task this fork copies (tools, model, history)."""
    mcp_servers: dict[str, JsonDict] | None = None
    """Stdio MCP servers by name ({command, args, env}), from its MCP config."""
    trusted: str | None = None
    """The digest of its project's files (core/trust.py) when it may use them; the agents
    it starts carry that trust on while those files stay as they were."""
    project_note: str | None = None
    """The project files it runs without (its project untrusted) and the command that
    trusts them; said once, at the top of its output."""
    limits: JsonDict | None = None
    transcript: str | None = None
    kill_reason: str | None = None
    waiting_for: JsonDict | None = None
    """What it waits on: a permission request ({request_id, tool, input}: `shoal approve ID`)
    or, pending, the lease of another worker ({lease: holder id, write_set})."""
    coordinator: bool = False
    """Coordinator mode: it dispatches workers (Agent, SendMessage, TaskStop) and does not
    execute; it completes once no worker of its runs and every worker's end is in its
    transcript."""
    simple: bool = False
    """A coordinator's workers get only Bash, Read and Edit."""
    github_api: str | None = None
    """A coordinator's GitHub API address for subscribe_pr_activity (`--github-api`); None:
    `github_api` of config.toml, else https://api.github.com."""
    worker_of: str | None = None
    """The agent id of the coordinator this worker reports to (its notification goes there)."""
    write_set: tuple[str, ...] | None = None
    """A worker's write set (globs relative to its cwd); None: read-only (no Write, no Edit)."""
    allow_network: bool = False
    """A worker's commands may use TCP (granted by the user's --allow-network or its lease)."""
    lease: JsonDict | None = None
    """The write-set lease it holds ({fence, write_set}), from start to end."""
    budget: JsonDict | None = None
    """A coordinator's run budget, or a worker's share of it ({tokens, tool_uses, seconds})."""
    budget_held: tuple[str, ...] | None = None
    """A worker's: the keys of its budget it asked for, which the run holds for it while it
    runs; the others are limits only (what the run had left at its start), counted as spent.
    None (records before this field): every key is held."""
    violations: tuple[JsonDict, ...] = ()
    """Files a worker's Bash commands changed outside its lease ({command, paths})."""
    replay_workers: dict[str, str] | None = None
    """A replayed coordinator's: the recorded transcript of each worker of the run it
    re-drives, by the worker's description and prompt (its workers replay those)."""

    @field_validator("messages")
    @classmethod
    def _cap_messages(cls, value: tuple[JsonDict, ...]) -> tuple[JsonDict, ...]:
        return value[-AGENT_MESSAGES_UI_CAP:]


class RemoteAgentTaskState(TaskStateBase):
    """An agent running elsewhere, polled for completion; metadata also lives in a sidecar file."""

    type: Literal[TaskType.REMOTE_AGENT] = TaskType.REMOTE_AGENT
    remote_task_type: RemoteTaskType = "remote-agent"
    remote_task_metadata: JsonDict | None = None
    session_id: str | None = None
    command: str = ""
    title: str = ""
    todo_list: tuple[JsonDict, ...] = ()
    """The job's agent's task list as the job last reported it (its `todo` marker):
    {content, status: pending, in_progress or completed}."""
    log: tuple[JsonDict, ...] = ()
    is_long_running: bool = False
    poll_started_at: float = Field(default_factory=time.time)
    is_remote_review: bool = False
    review_progress: JsonDict | None = None
    is_ultraplan: bool = False
    ultraplan_phase: UltraplanPhase | None = None
    error: str | None = None
    result: str | None = None
    exit_code: int | None = None
    """The job's entrypoint exit code, once the cluster reports it."""
    host: str | None = None
    """The node the job ran on (its address), once the cluster reports it."""
    kill_reason: str | None = None


class InProcessTeammateTaskState(TaskStateBase):
    """A teammate running inside the leader process; `messages` keeps the last 50."""

    type: Literal[TaskType.IN_PROCESS_TEAMMATE] = TaskType.IN_PROCESS_TEAMMATE
    identity: TeammateIdentity
    prompt: str
    model: str | None = None
    awaiting_plan_approval: bool = False
    permission_mode: PermissionMode = "default"
    progress: AgentProgress | None = None
    messages: tuple[JsonDict, ...] = ()
    is_idle: bool = False
    shutdown_requested: bool = False
    error: str | None = None
    result: str | None = None
    usage: TaskUsage | None = None
    evict_after: float | None = None
    workflow_id: str | None = None
    """The workflow (`w...` task) that brought this member up for its steps, if any."""

    @model_validator(mode="before")
    @classmethod
    def _drop_retired(cls, data: Any) -> Any:
        # Records of older versions carry fields since dropped: they load without them.
        if isinstance(data, dict) and any(k in data for k in RETIRED_TEAMMATE_FIELDS):
            return {k: v for k, v in data.items() if k not in RETIRED_TEAMMATE_FIELDS}
        return data

    @field_validator("messages")
    @classmethod
    def _cap_messages(cls, value: tuple[JsonDict, ...]) -> tuple[JsonDict, ...]:
        return value[-TEAMMATE_MESSAGES_UI_CAP:]

    @property
    def agent_id(self) -> str:
        """The teammate's agent id, e.g. researcher@my-team."""
        return self.identity.agent_id


class DreamPhase(StrEnum):
    """Where a dream is: reading the sessions (starting), or rewriting memory (updating)."""

    STARTING = "starting"
    UPDATING = "updating"


DREAM_PHASE_TRANSITIONS: Final[dict[DreamPhase, frozenset[DreamPhase]]] = {
    # A dream starts updating with its first write and never goes back to reading only.
    DreamPhase.STARTING: frozenset({DreamPhase.UPDATING}),
    DreamPhase.UPDATING: frozenset(),
}


def check_dream_phase(task_id: str, current: DreamPhase, new: DreamPhase) -> None:
    """Raise ShoalError unless DREAM_PHASE_TRANSITIONS allows `current -> new` (or a no-op)."""
    if current != new and new not in DREAM_PHASE_TRANSITIONS[current]:
        raise ShoalError(
            f"dream {task_id}: illegal phase change {current.value} -> {new.value} "
            f"(allowed: {', '.join(sorted(DREAM_PHASE_TRANSITIONS[current])) or 'none'})"
        )


class DreamTaskState(TaskStateBase):
    """A memory-consolidation agent made visible; `turns` keeps the last 30."""

    type: Literal[TaskType.DREAM] = TaskType.DREAM
    phase: DreamPhase = DreamPhase.STARTING
    sessions_reviewing: int = 0
    files_touched: tuple[str, ...] = ()
    turns: tuple[DreamTurn, ...] = ()
    prior_mtime: float | None = None
    """The consolidation lock's mtime before this run, restored when the dream is killed."""
    memory_dir: str | None = None
    """The directory it rewrites (SHOAL_HOME/memory, or a project's .shoal/memory)."""
    sessions: tuple[str, ...] = ()
    """The ids of the sessions it reviews."""
    model: str | None = None
    pid: int | None = None
    pid_started_at: float | None = None
    result: str | None = None
    error: str | None = None
    kill_reason: str | None = None

    @field_validator("turns")
    @classmethod
    def _cap_turns(cls, value: tuple[DreamTurn, ...]) -> tuple[DreamTurn, ...]:
        return value[-DREAM_TURNS_CAP:]


class LocalWorkflowTaskState(TaskStateBase):
    """A workflow script run by the workflow engine."""

    type: Literal[TaskType.LOCAL_WORKFLOW] = TaskType.LOCAL_WORKFLOW
    workflow: str
    spec_path: str | None = None
    total_steps: int = 0
    completed_steps: int = 0
    current_step: str | None = None
    error: str | None = None
    result: str | None = None
    run_id: str | None = None
    """The run of its spec (its steps' SHOAL_RUN_ID; kept across a leader's resume)."""
    counts: dict[str, int] | None = None
    """Steps by verdict (the run report's counts), as of the last change."""
    steps: tuple[str, ...] = ()
    """The ids of the shell tasks it started, in order (one per attempt)."""
    report_file: str | None = None
    """The JSON report, written when it ends (`shoal run --report`'s format)."""
    record_file: str | None = None
    """Its run record (what a resumed leader continues from)."""
    kill_reason: str | None = None


class MonitorMcpTaskState(TaskStateBase):
    """A watch on an MCP server that reports its events."""

    type: Literal[TaskType.MONITOR_MCP] = TaskType.MONITOR_MCP
    server_name: str
    target: str | None = None
    """The tool called every `every_s` seconds, if any."""
    event_count: int = 0
    last_event_at: float | None = None
    error: str | None = None
    config_path: str | None = None
    """The MCP config file the server is named in."""
    every_s: float | None = None
    tool_args: JsonDict = Field(default_factory=dict)
    cwd: str | None = None
    pid: int | None = None
    pid_started_at: float | None = None
    kill_reason: str | None = None


AnyTaskState = (
    LocalShellTaskState
    | LocalAgentTaskState
    | RemoteAgentTaskState
    | InProcessTeammateTaskState
    | DreamTaskState
    | LocalWorkflowTaskState
    | MonitorMcpTaskState
)
TaskState = Annotated[AnyTaskState, Field(discriminator="type")]
"""Any task state, discriminated on `type` when validated."""

TASK_STATE_CLASSES: Final[dict[TaskType, type[TaskStateBase]]] = {
    TaskType.LOCAL_BASH: LocalShellTaskState,
    TaskType.LOCAL_AGENT: LocalAgentTaskState,
    TaskType.REMOTE_AGENT: RemoteAgentTaskState,
    TaskType.IN_PROCESS_TEAMMATE: InProcessTeammateTaskState,
    TaskType.DREAM: DreamTaskState,
    TaskType.LOCAL_WORKFLOW: LocalWorkflowTaskState,
    TaskType.MONITOR_MCP: MonitorMcpTaskState,
}


@functools.cache
def _task_state_adapter() -> TypeAdapter[AnyTaskState]:
    # Built on first use: building every task schema costs a CLI call tens of milliseconds.
    return TypeAdapter(TaskState)


def parse_task_state(data: JsonDict) -> AnyTaskState:
    """Validate a dict (e.g. from state.json) into the task state class its `type` names."""
    return _task_state_adapter().validate_python(data)


# --------------------------------------------------------------------------- predicates


def missing_env(task: TaskStateBase) -> tuple[str, ...]:
    """The `--env` variables of `task` whose values this leader does not hold: a leader that
    restarted has none (they are never written), so a task it had not started yet, or a retry,
    restart, resume or fork of one, must be given them again."""
    names: tuple[str, ...] = getattr(task, "env_names", ())
    values: dict[str, str] = getattr(task, "env_values", None) or {}
    return tuple(n for n in names if n not in values)


def is_background_task(task: TaskStateBase) -> bool:
    """True for a pending or running task that is not in the foreground."""
    return task.status in (TaskStatus.RUNNING, TaskStatus.PENDING) and task.is_backgrounded


def is_panel_agent_task(task: TaskStateBase) -> bool:
    """True for a local agent shown in the coordinator panel (not a backgrounded main session)."""
    return isinstance(task, LocalAgentTaskState) and task.agent_type != MAIN_SESSION_AGENT_TYPE


def in_grace(task: TaskStateBase, now: float) -> bool:
    """True while a task is held against removal: retained by a view, or an ended agent task
    within its panel grace (`evict_after`, default end_time + 30 s)."""
    if task.retain:
        return True
    if task.type not in AGENT_TASK_TYPES or not task.is_terminal:
        return False
    ended = task.end_time if task.end_time is not None else task.start_time
    evict_after: float | None = getattr(task, "evict_after", None)
    return now < (evict_after if evict_after is not None else ended + PANEL_GRACE_S)


def should_evict(task: TaskStateBase, now: float) -> bool:
    """True when a terminal, notified task may leave the registry at time `now`.

    Agent tasks stay for the panel grace (`evict_after`, default end_time + 30 s); killed tasks
    stay visible KILLED_DISPLAY_S after they end; a retained task is never evicted.
    """
    if not task.is_terminal or not task.notified or in_grace(task, now):
        return False
    ended = task.end_time if task.end_time is not None else task.start_time
    if task.type in AGENT_TASK_TYPES:
        return True
    if task.status == TaskStatus.KILLED:
        return now >= ended + KILLED_DISPLAY_S
    return True
