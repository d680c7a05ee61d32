"""What the leader and an agent's runner share on disk: the job it runs and the status it
reports (`sessions/{s}/agents/{task_id}.job.json` and `.status.json`), plus the agent's
maildir inbox of pending messages (`sessions/{s}/agents/{task_id}.inbox/`). A dream's runner
shares the same: its job is a `RunnerJob` too, its status an `AgentStatus`.

The leader writes the job once, before the runner starts; the runner writes its status (the
progress at each round, then the outcome) with an atomic replace, and is its only writer. A
runner killed -9 leaves its last status and its transcript: the leader settles the task from
them, and a resume continues the conversation from the transcript.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Final, Literal, Protocol, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.core.errors import CorruptFileError, NotFoundError
from shoal.core.filestamp import Stamp, settled, stamp_of
from shoal.core.jsonio import atomic_write

# A process runner's exit code when it could not write its outcome because the disk is full
# (EX_IOERR of sysexits.h): the leader names the cause instead of "without an outcome".
EXIT_NO_SPACE: Final = 74
NO_SPACE_REASON: Final = "could not write its outcome: no space left on device under SHOAL_HOME"


AGENTS_DIR = "agents"


class JobLimits(BaseModel):
    """Caps of one agent run (None: no cap)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_tool_uses: int | None = Field(None, ge=1)
    timeout: float | None = Field(None, gt=0)
    # Seconds the model server may send no bytes (`--model-idle`; None: config.toml's, or 120).
    model_idle_s: float | None = Field(None, gt=0)


class RunnerJob(BaseModel):
    """What every runner job says (an agent's, a dream's): its task, the model and its
    prompt, its working directory (where a relative `scripted:FILE` is found), the files it
    writes, its caps."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    what: ClassVar[str] = "runner job"  # (as errors name the file)

    v: Literal[1] = 1
    task_id: str
    home: str
    prompt: str
    model: str
    cwd: str
    output_file: str
    transcript: str
    status_file: str
    limits: JobLimits = Field(default_factory=JobLimits)

    def save(self, path: Path) -> None:
        atomic_write(path, orjson.dumps(self.model_dump(mode="json")))

    @classmethod
    def load(cls, path: Path) -> Self:
        return cls.model_validate(_read(path, cls.what))


class AgentJob(RunnerJob):
    """Everything a runner needs to run one `local_agent` task."""

    what: ClassVar[str] = "agent job"

    agent_id: str
    team: str
    session_id: str
    agent_type: str = "general-purpose"
    instructions: str = ""
    tools: tuple[str, ...] | None = None
    custom: bool = False  # from a user's agent definition (see filters.py)
    fork: bool = False  # Agent without subagent_type forks it
    subagent: bool = False  # started by an Agent tool: no Agent tool of its own
    permission_mode: str = "default"
    env: dict[str, str] = Field(default_factory=dict)
    """Variables of its commands' environment that may be written (the leader writes none)."""
    env_values: dict[str, str] = Field(default_factory=dict, exclude=True, repr=False)
    """`--env` values: never saved; an in-process runner has them here, a process runner in
    the environment it was spawned with."""
    inbox: str | None = None
    mcp_servers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    notes: tuple[str, ...] = ()  # said once at the top of its output (files left out)
    resume: bool = False
    echo: bool = False  # also print the readable transcript on stdout (a tmux pane)
    coordinator: bool = False  # coordinator mode: Agent, SendMessage, TaskStop, PR activity
    coordinator_inbox: str | None = None  # where its workers' notifications arrive
    worker: bool = False  # a coordinator's worker: Write and Edit only inside `write_set`
    write_set: tuple[str, ...] | None = None
    scratchpad: str | None = None  # a coordinator's, and its workers': writable by all
    allow_network: bool = False  # a worker's commands may use TCP (its sandbox lets them)


class JobOutcome(BaseModel):
    """How a run ended (see loop.Outcome)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["completed", "failed", "killed"]
    result: str = ""
    error: str | None = None
    total_tokens: int = 0
    tool_uses: int = 0
    turns: int = 0
    duration_ms: int = 0


class AgentStatus(BaseModel):
    """What the runner reports: progress while it runs, the outcome at the end, and the
    messages that reached it too late to be drained (the leader resumes the agent with them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    state: Literal["running", "done"] = "running"
    pid: int | None = None
    progress: dict[str, Any] = Field(default_factory=dict)
    outcome: JobOutcome | None = None
    undrained: tuple[str, ...] = ()
    waiting: dict[str, Any] | None = None  # the permission request it waits on, if any
    commands: tuple[tuple[int, float | None], ...] = ()  # its running commands: (pgid, start)
    note: str | None = None  # e.g. what was wrong with the transcript it resumed from
    violations: tuple[dict[str, Any], ...] = ()  # a worker's changes outside its lease
    drained: int = 0  # messages sent to it that reached its conversation, so far
    messages: tuple[dict[str, Any], ...] = ()  # its conversation's last 50, for views
    from_disk: bool = False  # `messages` began with a transcript read back (a resume)
    updated_at: float = 0.0

    def save(self, path: Path) -> None:
        atomic_write(path, orjson.dumps(self.model_dump(mode="json")))

    @classmethod
    def load(cls, path: Path) -> AgentStatus | None:
        """The runner's last status; None when it never wrote one (or wrote garbage)."""
        try:
            return cls.model_validate(_read(path, "agent status"))
        except (NotFoundError, CorruptFileError, ValidationError):
            return None


class StatusWatch(Protocol):
    """A kind's hold on a runner's status file: where it is, and its stamp when last read."""

    status_file: Path
    status_seen: Stamp | None


def read_changed(watch: StatusWatch) -> AgentStatus | None:
    """The runner's status, read only when its file changed since `watch` last read it (see
    core/filestamp.py); None when it did not, or when it holds no status yet."""
    stamp = stamp_of(watch.status_file)
    if stamp is None or stamp == watch.status_seen:
        return None
    watch.status_seen = settled(stamp)
    return AgentStatus.load(watch.status_file)


def _read(path: Path, what: str) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"no {what} at {path}") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CorruptFileError(path, f"the {what} is not JSON ({exc})") from None


def job_paths(session_dir: Path, task_id: str) -> tuple[Path, Path, Path]:
    """(job file, status file, inbox directory) of agent task `task_id`."""
    base = session_dir / AGENTS_DIR
    return base / f"{task_id}.job.json", base / f"{task_id}.status.json", base / f"{task_id}.inbox"
