"""The team file: frozen, validated models of `teams/{team}/team.json` (format version 1)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shoal.core.names import LEAD_NAME as LEAD_NAME
from shoal.core.names import NAME_PATTERN
from shoal.core.paths import SESSION_ID


def agent_id(name: str, team: str) -> str:
    """The agent id of member `name` in `team`: `{name}@{team}`."""
    return f"{name}@{team}"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class AllowedPath(_Frozen):
    """A path every member of the team may write to without asking."""

    path: str
    added_by: str
    added_at: str


class Member(_Frozen):
    """One member of a team as recorded in the team file."""

    agent_id: str
    name: str
    agent_type: str = "worker"
    model: str | None = None
    prompt: str | None = None
    color: str | None = None
    plan_mode_required: bool = False
    joined_at: str
    backend: str | None = None
    pane_id: str | None = None
    pid: int | None = None
    pid_started_at: float | None = None
    cwd: str | None = None
    worktree_path: str | None = None
    subscriptions: tuple[str, ...] = ()
    is_active: bool = True

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(f"invalid member name {value!r}")
        return value


class TeamFile(_Frozen):
    """The whole team file; `members` includes the lead."""

    v: Literal[1] = 1
    name: str
    description: str = ""
    created_at: str
    lead_agent_id: str
    lead_session_id: str | None = None
    team_allowed_paths: tuple[AllowedPath, ...] = ()
    members: tuple[Member, ...] = Field(default_factory=tuple)

    @field_validator("name")
    @classmethod
    def _valid_team_name(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(f"invalid team name {value!r}")
        return value

    @field_validator("lead_session_id")
    @classmethod
    def _valid_session(cls, value: str | None) -> str | None:
        if value is not None and not SESSION_ID.fullmatch(value):
            raise ValueError(f"invalid session id {value!r}")
        return value

    def member(self, name: str) -> Member | None:
        """The member called `name`, or None."""
        for m in self.members:
            if m.name == name:
                return m
        return None

    def with_member(self, member: Member) -> TeamFile:
        """A copy with `member` added, or replacing the member of the same name."""
        others = tuple(m for m in self.members if m.name != member.name)
        if len(others) == len(self.members):
            return self.model_copy(update={"members": (*self.members, member)})
        return self.model_copy(
            update={"members": tuple(member if m.name == member.name else m for m in self.members)}
        )
