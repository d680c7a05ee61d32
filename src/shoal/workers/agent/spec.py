"""Building a `local_agent` task from a request: everything is checked before anything is
registered (the model spec and its API key, the tools, the working directory, the backend),
so a bad request is one clear error and nothing is created."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import BaseModel, ConfigDict, Field

from shoal.core import trust
from shoal.core.config import config_value
from shoal.core.errors import TaskError, UsageError
from shoal.core.paths import Layout
from shoal.core.secretenv import lost_env_error
from shoal.core.tasks import (
    MAIN_SESSION_AGENT_TYPE,
    LocalAgentTaskState,
    TaskStatus,
    TaskType,
    new_task_id,
)
from shoal.core.writeset import check_write_set
from shoal.teams.models import LEAD_NAME
from shoal.teams.session import Session
from shoal.workers.agent.coordinator import mode as coordinator
from shoal.workers.agent.definitions import catalog_of, load_catalog
from shoal.workers.agent.launch import AGENT_BACKENDS, transcript_path
from shoal.workers.agent.mcp_tools import McpServer, find_config
from shoal.workers.agent.models import check_model, choose_model
from shoal.workers.agent.permissions import BUBBLE, MODES, check_mode, narrowest
from shoal.workers.agent.team_tools import FORK_TAG, TEAM_TOOL_SPECS
from shoal.workers.agent.tool_args import TOOL_SPECS


class AgentHost(Protocol):
    """What building an agent task needs of the leader."""

    @property
    def layout(self) -> Layout: ...

    @property
    def environ(self) -> dict[bytes, bytes]: ...

    @property
    def session(self) -> Session: ...

    def find_agent(self, task_id: str) -> LocalAgentTaskState: ...

    def workers_of(self, agent_id: str) -> list[LocalAgentTaskState]: ...


KNOWN_TOOLS: Final = tuple(name for name, _model, _text in (*TOOL_SPECS, *TEAM_TOOL_SPECS))
DEFAULT_AGENT_TYPE: Final = "general-purpose"
COORDINATOR_TYPE: Final = "coordinator"
# The original's name for a coordinator's worker: in `Agent(subagent_type=...)` of a
# coordinator it is the built-in worker, as an omitted type is.
WORKER_TYPE: Final = "worker"


class AgentSpec(BaseModel):
    """One agent to start (the fields of `shoal agent`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str
    model: str | None = None
    agent_type: str | None = None
    tools: list[str] | None = None
    disallowed_tools: list[str] | None = None
    permission_mode: str | None = None
    max_turns: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_tool_uses: int | None = Field(None, ge=1)
    timeout: float | None = Field(None, gt=0)
    model_idle_s: float | None = Field(None, gt=0)  # `--model-idle` (None: config.toml's)
    backend: str = "auto"
    cwd: str | None = None
    env: dict[str, str] | None = None  # `--env`: held in memory, the task keeps the names
    description: str | None = None
    limits: dict[str, Any] | None = None  # (a resume carries its parent's)
    fork: bool | None = None  # Agent without subagent_type forks it (None: config's `fork`)
    subagent: bool = False  # started by an agent's Agent tool (it gets no Agent tool)
    parent_agent: str | None = None  # the agent task whose Agent tool asked (it dies with it)
    inherit_model: str | None = None  # a subagent's: its parent's model, unless it names one
    fork_of: str | None = None  # make this a fork of that agent task (its Agent tool asked)
    mcp_config: str | None = None  # an MCP config file (default: the project's .shoal/mcp.json)
    resume: str | None = None  # the agent task this one continues
    coordinator: bool | None = None  # coordinator mode (None: $SHOAL_COORDINATOR_MODE, or
    # as the session it resumes)
    simple: bool = False  # a coordinator's workers get only Bash, Read and Edit
    github_api: str | None = None  # a coordinator's GitHub API address (`--github-api`)
    budget: dict[str, Any] | None = None  # a coordinator's run budget, or a worker's share
    write_set: list[Any] | Any | None = None  # a worker's write set (checked here)
    allow_network: bool = False  # a coordinator's: for its workers; a worker's: its own
    worker_for: str | None = None  # the coordinator task whose Agent tool asked
    replay: str | None = None  # re-drive this recorded coordinator run (zero model calls)
    main_session: bool = False  # `shoal chat`'s conversation (agent_type main-session)
    trust: bool = False  # `--trust`: its project's files are trusted for this run (unrecorded)


def _environ(host: AgentHost, extra: dict[str, str] | None) -> dict[str, str]:
    env = {os.fsdecode(k): os.fsdecode(v) for k, v in host.environ.items()}
    env.update(extra or {})
    return env


def _env_values(spec: AgentSpec, parent: LocalAgentTaskState | None) -> dict[str, str]:
    """The `--env` values of a new agent: the request's, over those of the agent it resumes
    (which this leader holds in memory; one that restarted since has lost them, and the
    resume is refused, naming the flags to give again)."""
    values = {**((parent.env_values or {}) if parent is not None else {}), **(spec.env or {})}
    lost = [n for n in (parent.env_names if parent is not None else ()) if n not in values]
    if parent is not None and lost:
        raise UsageError(lost_env_error(parent.id, lost, f"shoal agent --resume {parent.id}"))
    return values


def _project(
    host: AgentHost, spec: AgentSpec, cwd: Path, parent: LocalAgentTaskState | None
) -> trust.ProjectView:
    """The project's files as this agent may use them: trusted in SHOAL_HOME/trust.json, for
    this run (`--trust`), or as the agent it continues or that started it had them (while
    they are as they were then)."""
    home = host.layout.home
    if spec.trust:
        return trust.grant(home, cwd)
    starter = parent or (host.find_agent(spec.parent_agent) if spec.parent_agent else None)
    return trust.view(home, cwd, starter.trusted if starter is not None else None)


def _backend(name: str, env: dict[str, str]) -> str:
    if name == "auto":
        return "tmux" if env.get("TMUX") else "process"
    if name not in AGENT_BACKENDS:
        raise UsageError(
            f"unknown backend {name!r} for an agent (choose from auto, {', '.join(AGENT_BACKENDS)})"
        )
    return name


def _tools(spec: AgentSpec) -> tuple[str, ...] | None:
    for given in (spec.tools, spec.disallowed_tools):
        unknown = sorted(set(given or ()) - set(KNOWN_TOOLS))
        if unknown:
            raise UsageError(
                f"unknown tool(s) {', '.join(unknown)} (known: {', '.join(KNOWN_TOOLS)})"
            )
    if spec.tools is None and not spec.disallowed_tools:
        return None
    allowed = spec.tools if spec.tools is not None else list(KNOWN_TOOLS)
    return tuple(t for t in allowed if t not in set(spec.disallowed_tools or ()))


def _describe(spec: AgentSpec) -> str:
    first = spec.prompt.strip().splitlines()[0]
    return spec.description or (first[:77] + "…" if len(first) > 78 else first)


def _forking(host: AgentHost, spec: AgentSpec, parent: LocalAgentTaskState | None) -> bool:
    """Whether the agent's Agent tool forks it when given no subagent_type: `--fork` or
    `--no-fork`, else as the agent it resumes, else `fork` in config.toml (default off)."""
    if spec.fork is not None:
        return spec.fork
    if parent is not None:
        return parent.fork
    return bool(config_value(host.layout.home, "fork", bool, "true or false"))


def new_fork_task(host: AgentHost, spec: AgentSpec) -> LocalAgentTaskState:
    """A fork of agent `spec.fork_of`: its tools, model, instructions and history so far (its
    transcript copied), permission `bubble`; its first message carries FORK_TAG, so it cannot
    fork again."""
    assert spec.fork_of is not None
    source = host.find_agent(spec.fork_of)
    if source.forked_from is not None:
        raise UsageError(f"agent {source.id} is a fork; a fork cannot fork")
    task_id = new_task_id(TaskType.LOCAL_AGENT)
    transcript = transcript_path(host.session.dir, task_id)
    host.layout.ensure(transcript.parent)
    if source.transcript and Path(source.transcript).is_file():
        shutil.copyfile(source.transcript, transcript)
        os.chmod(transcript, 0o600)
    prompt = (
        f"{FORK_TAG}You are a fork of agent {source.id}: you have its tools and its "
        f"conversation so far. Do only this, then answer with the result.</fork-boilerplate>"
        f"\n\n{spec.prompt}"
    )
    return source.model_copy(
        update={
            "id": task_id,
            "status": TaskStatus.PENDING,
            "description": _describe(spec),
            "output_file": str(host.session.output_file(task_id)),
            "owner": LEAD_NAME,
            "agent_id": task_id,
            "prompt": prompt,
            "agent_type": "fork",
            "permission_mode": narrowest(source.permission_mode, BUBBLE),
            "fork": False,
            "forked_from": source.id,
            "parent_agent": spec.parent_agent or source.id,
            "resumed_from": None,
            "transcript": str(transcript),
            "backend": _backend(spec.backend, _environ(host, source.env_values)),
            "result": None,
            "error": None,
            "usage": None,
            "progress": None,
            "pending_messages": (),
            "waiting_for": None,
            "pid": None,
            "pid_started_at": None,
            "pane_id": None,
            "kill_reason": None,
            "notified": False,
            "start_time": time.time(),
            "end_time": None,
        }
    )


def top_mode(host: AgentHost, asked: str | None) -> str:
    """The mode an agent started by the user (no parent) may have at most: `asked` on the
    command line, else `permission_mode` in SHOAL_HOME/config.toml, else default."""
    if asked is not None:
        return check_mode(asked)
    configured = config_value(
        host.layout.home, "permission_mode", str, f"one of {', '.join(MODES)}"
    )
    if configured is None:
        return "default"
    try:
        return check_mode(configured)
    except UsageError as exc:
        raise UsageError(f"{host.layout.home / 'config.toml'}: permission_mode: {exc}") from None


def permission_mode(
    host: AgentHost,
    spec: AgentSpec,
    resumed: LocalAgentTaskState | None,
    defined: str | None,
) -> str:
    """The mode of a new agent task, on the ladder (see permissions.py): never above its
    parent, whose mode is read from the parent's own record (the agent whose Agent tool
    asked, the task it resumes), never from what the request says; a definition's
    `permissionMode` and the spec's mode (a flag, a sender's) only narrow it. Without a
    parent the ceiling is the user's: the command line, else SHOAL_HOME/config.toml."""
    ceilings: list[str] = []
    if spec.parent_agent is not None:
        ceilings.append(host.find_agent(spec.parent_agent).permission_mode)
    if resumed is not None:
        ceilings.append(resumed.permission_mode)
    if not ceilings:
        return narrowest(top_mode(host, spec.permission_mode), defined)
    return narrowest(ceilings[0], *ceilings[1:], spec.permission_mode, defined)


def new_agent_task(host: AgentHost, spec: AgentSpec) -> LocalAgentTaskState:
    """A checked, pending `local_agent` task for `spec` (nothing registered yet)."""
    if not spec.prompt.strip():
        raise UsageError("the agent's prompt is empty (give PROMPT, or - to read it from stdin)")
    if spec.fork_of is not None:
        return new_fork_task(host, spec)
    if spec.worker_for is not None:
        return new_worker_task(host, spec)
    if spec.replay is not None:
        return new_replay_task(host, spec)
    if spec.permission_mode is not None:
        check_mode(spec.permission_mode)
    cwd = Path(spec.cwd or os.getcwd())
    if not cwd.is_dir():
        raise TaskError(f"working directory {cwd} does not exist")
    parent = host.find_agent(spec.resume) if spec.resume else None
    values = _env_values(spec, parent)
    env = _environ(host, values)
    # A resumed session keeps its stored mode (see mode_message); else the caller decides,
    # $SHOAL_COORDINATOR_MODE included: the leader's environment must not make every agent it
    # starts, subagents too, a coordinator.
    coordinating = parent.coordinator if parent is not None else bool(spec.coordinator)
    agent_type = spec.agent_type or (parent.agent_type if parent else DEFAULT_AGENT_TYPE)
    if coordinating:
        agent_type = COORDINATOR_TYPE
    elif spec.main_session:
        agent_type = MAIN_SESSION_AGENT_TYPE
    project = _project(host, spec, cwd, parent)
    definition = catalog_of(host.layout.home, project).get(
        DEFAULT_AGENT_TYPE
        if agent_type in (COORDINATOR_TYPE, MAIN_SESSION_AGENT_TYPE)
        else agent_type
    )
    asked = spec.model or (parent.model if parent is not None else None)
    model = choose_model(asked, definition.model or spec.inherit_model, env, host.layout.home)
    check_model(model, env, cwd)
    tools = _tools(spec)
    servers = find_config(project, spec.mcp_config)
    sources = trust.DEFINITION_SOURCES if spec.mcp_config else trust.AGENT_SOURCES
    if parent is not None and not servers:
        servers = {k: McpServer.model_validate(v) for k, v in (parent.mcp_servers or {}).items()}
    if tools is None and definition.tools is not None:
        tools = tuple(t for t in definition.tools if t not in set(spec.disallowed_tools or ()))
    task_id = new_task_id(TaskType.LOCAL_AGENT)
    agent_id = parent.agent_id if parent is not None else task_id
    limits = dict(parent.limits or {}) if parent is not None else {}
    for key in ("max_turns", "max_tokens", "max_tool_uses", "timeout", "model_idle_s"):
        value = getattr(spec, key)
        if value is not None:
            limits[key] = value

    transcript = (
        parent.transcript
        if parent is not None and parent.transcript
        else str(transcript_path(host.session.dir, agent_id))
    )
    prompt = spec.prompt
    instructions = definition.prompt or None
    budget = parent.budget if parent is not None else None
    if coordinating:
        instructions = coordinator.system_prompt()
        budget = coordinator.check_budget(spec.budget, "the run budget") or budget
        if parent is None:  # (its context block opens the conversation)
            pad = coordinator.scratchpad_dir(host.session.dir)
            context = coordinator.user_context(spec.simple, servers, pad)
            prompt = f"{context}\n\n{prompt}"
    return LocalAgentTaskState(
        id=task_id,
        description=_describe(spec),
        output_file=str(host.session.output_file(task_id)),
        owner=LEAD_NAME,
        agent_id=agent_id,
        prompt=prompt,
        agent_type=agent_type,
        model=str(model),
        backend=_backend(spec.backend, env),
        cwd=str(cwd),
        env_names=tuple(values),
        env_values=values or None,
        permission_mode=permission_mode(host, spec, parent, definition.permission_mode),
        tools=tools,
        custom=definition.custom,
        fork=False if coordinating else _forking(host, spec, parent),
        subagent=spec.subagent or (parent.subagent if parent is not None else False),
        parent_agent=spec.parent_agent,
        mcp_servers={k: v.model_dump() for k, v in servers.items()} or None,
        trusted=project.granted,
        project_note=trust.left_out_note(project, sources),
        instructions=instructions,
        limits=limits or None,
        transcript=transcript,
        resumed_from=parent.id if parent is not None else None,
        coordinator=coordinating,
        simple=spec.simple or (parent.simple if parent is not None else False),
        github_api=spec.github_api or (parent.github_api if parent is not None else None),
        budget=budget,
        budget_held=parent.budget_held if parent is not None else None,
        # (a worker continued by a message stays its coordinator's, with its write set)
        worker_of=parent.worker_of if parent is not None else None,
        write_set=parent.write_set if parent is not None else None,
        allow_network=spec.allow_network or (parent.allow_network if parent else False),
        # A main-session query runs in its chat's foreground until Ctrl+B twice sends it to
        # the background; a continuation stays where the query it continues was.
        is_backgrounded=agent_type != MAIN_SESSION_AGENT_TYPE
        or (parent is not None and parent.is_backgrounded),
    )


def new_replay_task(host: AgentHost, spec: AgentSpec) -> LocalAgentTaskState:
    """A coordinator that re-drives the recorded run `spec.replay` with zero model calls: it
    answers from its transcript, and each worker it starts from the recorded worker with the
    same description and prompt."""
    assert spec.replay is not None
    boss, workers = coordinator.recorded_run(host.layout, spec.replay)
    transcript = boss.get("transcript")
    if not transcript or not Path(transcript).is_file():
        raise UsageError(f"coordinator run {boss['id']} has no transcript to replay")
    mapping = {
        coordinator.replay_key(w.get("description", ""), w.get("prompt", "")): str(w["transcript"])
        for w in workers
        if w.get("transcript")
    }
    prompt = str(boss.get("prompt") or "")
    if prompt.startswith(coordinator.CONTEXT_OPEN):  # (a fresh context block opens it again)
        prompt = prompt.split("\n\n", 1)[-1] if "\n\n" in prompt else prompt
    task = new_agent_task(
        host,
        spec.model_copy(
            update={
                "replay": None,
                "coordinator": True,
                "model": f"replay:{transcript}",
                "prompt": prompt or "replay",
                "cwd": spec.cwd or boss.get("cwd"),
                "permission_mode": spec.permission_mode or boss.get("permission_mode"),
                "budget": spec.budget or boss.get("budget"),
                "description": spec.description or f"replay of {boss['id']}",
            }
        ),
    )
    return task.model_copy(update={"replay_workers": mapping})


def new_worker_task(host: AgentHost, spec: AgentSpec) -> LocalAgentTaskState:
    """A worker for the coordinator task `spec.worker_for` (its Agent tool asked): the run's
    model, the coordinator's cwd, MCP servers and permission mode (`default` gives
    `acceptEdits`), the workers' tools (no Write or Edit without a write set), a share of the
    run budget, and its notification addressed to the coordinator."""
    assert spec.worker_for is not None
    boss = host.find_agent(spec.worker_for)
    if not boss.coordinator:
        raise UsageError(f"agent {boss.id} is not a coordinator; it cannot start workers")
    write_set = check_write_set(spec.write_set, "write_set") if spec.write_set is not None else None
    asked = coordinator.check_budget(spec.budget, "budget")
    remaining = coordinator.left(boss, host.workers_of(boss.agent_id))
    share, limits = coordinator.worker_limits(asked, remaining)
    tools = coordinator.worker_tools(boss.simple)
    if write_set is None:
        tools = tuple(t for t in tools if t not in ("Write", "Edit"))
    worker_mode: str | None = None
    agent_type = spec.agent_type if spec.agent_type != WORKER_TYPE else None
    if agent_type is not None and agent_type != DEFAULT_AGENT_TYPE:
        cwd = Path(boss.cwd or os.getcwd())
        definition = load_catalog(host.layout.home, cwd, boss.trusted).get(agent_type)
        instructions = definition.prompt or None
        worker_mode = definition.permission_mode  # (it can only narrow the coordinator's)
        if definition.tools is not None:
            tools = tuple(t for t in tools if t in definition.tools)
    else:
        instructions = None
    model = boss.model
    if boss.replay_workers is not None:  # (a replayed run: this worker replays its recording)
        recorded = boss.replay_workers.get(coordinator.replay_key(_describe(spec), spec.prompt))
        if recorded is None:
            raise UsageError(
                f"replay of {boss.id} diverged: the recorded run started no worker "
                f"{_describe(spec)!r} with this prompt"
            )
        model = f"replay:{recorded}"
    task_id = new_task_id(TaskType.LOCAL_AGENT)
    return LocalAgentTaskState(
        id=task_id,
        description=_describe(spec),
        output_file=str(host.session.output_file(task_id)),
        owner=LEAD_NAME,
        agent_id=task_id,
        prompt=spec.prompt,
        agent_type=agent_type or DEFAULT_AGENT_TYPE,
        model=model,
        backend=boss.backend,
        cwd=boss.cwd,
        env=boss.env,
        env_names=boss.env_names,
        env_values=boss.env_values,
        permission_mode=coordinator.worker_permission(boss.permission_mode, worker_mode),
        tools=tools,
        subagent=True,
        parent_agent=boss.id,
        mcp_servers=boss.mcp_servers,
        trusted=boss.trusted,
        instructions=instructions,
        limits=limits or None,
        transcript=str(transcript_path(host.session.dir, task_id)),
        worker_of=boss.agent_id,
        write_set=write_set,
        allow_network=spec.allow_network or boss.allow_network,
        budget=share or None,
        budget_held=tuple(asked or ()),
    )
