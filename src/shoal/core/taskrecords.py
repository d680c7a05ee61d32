"""The nested records of task states, frozen as the states are: how a shell's process
ended, an agent's progress, tool activity and usage, a teammate's identity, a dream's turns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from shoal.core.taskstatus import RECENT_ACTIVITIES_CAP


class Frozen(BaseModel):
    """A frozen record: no field changes after it is built, no unknown field is accepted."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class ShellResult(Frozen):
    """How a shell task's process ended."""

    code: int
    interrupted: bool = False


class ToolActivity(Frozen):
    """One tool call an agent made, for progress display; `at` is when it was made (epoch
    seconds; None only in the records of shoal versions that did not say)."""

    tool_name: str
    description: str = ""
    at: float | None = None


class AgentProgress(Frozen):
    """Live progress of an agent; `recent_activities` keeps the last 5. `token_count` is
    counted as the seed counts it: the latest request's input (cache reads and writes
    included: each request carries the whole conversation) plus every request's output."""

    tool_use_count: int = 0
    token_count: int = 0
    latest_input_tokens: int = 0
    cumulative_output_tokens: int = 0
    last_activity: ToolActivity | None = None
    recent_activities: tuple[ToolActivity, ...] = ()
    summary: str | None = None

    @field_validator("recent_activities")
    @classmethod
    def _cap_activities(cls, value: tuple[ToolActivity, ...]) -> tuple[ToolActivity, ...]:
        return value[-RECENT_ACTIVITIES_CAP:]


class TaskUsage(Frozen):
    """What an agent task cost; sent in the `<usage>` element of its notification."""

    total_tokens: int = 0
    tool_uses: int = 0
    duration_ms: int = 0


class TeammateIdentity(Frozen):
    """Who an in-process teammate is within its team."""

    agent_id: str
    agent_name: str
    team_name: str
    color: str | None = None
    plan_mode_required: bool = False
    parent_session_id: str


class DreamTurn(Frozen):
    """One turn of a memory-consolidation (dream) agent."""

    text: str
    tool_use_count: int = 0
