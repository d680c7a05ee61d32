"""Team files on disk: create, read, list, delete, and member join/leave/update under the lock.

The team file is also the directory the mailbox router resolves recipients through.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

from shoal.core.clock import iso_now
from shoal.core.errors import (
    ConflictError,
    CorruptFileError,
    NotFoundError,
    UnknownRecipientError,
    UsageError,
)
from shoal.core.git import GitError, worktree_remove
from shoal.core.jsonio import atomic_write, dumps, lock_for, locked_update, read_bytes_nofollow
from shoal.core.jsonio import read_model as _read_model
from shoal.core.names import validate_name, with_slug
from shoal.core.paths import Layout, check_path
from shoal.core.procs import is_alive, process_start_time, terminate
from shoal.mailbox.store import Maildir
from shoal.teams.colors import pick_color
from shoal.teams.models import LEAD_NAME, AllowedPath, Member, TeamFile, agent_id

# path -> ((inode, size, mtime_ns), parsed team file); team files are small and few.
_READ_CACHE: dict[str, tuple[tuple[int, int, int], TeamFile]] = {}


class MemberState(StrEnum):
    """What a member is doing, derived from its process and its status file, never a flag alone."""

    ACTIVE = "active"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True)
class MemberView:
    """A member with its derived state, for display and routing."""

    member: Member
    state: MemberState

    @property
    def alive(self) -> bool:
        return self.state not in (MemberState.DEAD, MemberState.LEFT)

    def to_json(self) -> dict[str, Any]:
        return {**self.member.model_dump(mode="json"), "state": self.state.value}


@dataclass(frozen=True)
class JoinSpec:
    """One member to add with `Teams.join_many` (or `Teams.join`)."""

    name: str
    agent_type: str = "worker"
    backend: str | None = None
    cwd: str | None = None
    plan_mode_required: bool = False
    worktree_path: str | None = None
    color: str | None = None
    pid: int | None = None
    pid_started_at: float | None = None
    prompt: str | None = None
    model: str | None = None
    pane_id: str | None = None
    # With no `prompt`, keep the one of an active record of this name: a worker joining a
    # member its spawner listed does not know the prompt the spawner saved.
    keep_listed_prompt: bool = False


def _admit(
    team: str, spec: JoinSpec, existing: Member | None, taken: list[str], now: str
) -> Member:
    """The member record `spec` makes, given the `existing` record of its name: the one set
    of rules for every join.

    A live, active member of the name is refused (ConflictError naming it and the team)
    unless it is the joining process itself (same pid and start time: a pre-listed member
    whose own worker joins, or an in-process teammate joined with its leader's pid). A dead
    or departed record of the name is replaced, keeping its colour and worktree. `taken`
    holds the colours in use and gets the new member's.
    """
    if (
        existing is not None
        and existing.is_active
        and is_alive(existing.pid, existing.pid_started_at)
        and (existing.pid, existing.pid_started_at) != (spec.pid, spec.pid_started_at)
    ):
        raise ConflictError(
            f"member {spec.name!r} is already active in team {team!r} (pid {existing.pid}); "
            "pick another name"
        )
    color = spec.color or (
        existing.color if existing is not None and existing.color else pick_color(taken)
    )
    taken.append(color)
    prompt = spec.prompt
    if prompt is None and spec.keep_listed_prompt and existing is not None and existing.is_active:
        prompt = existing.prompt
    member = Member(
        agent_id=agent_id(spec.name, team),
        name=spec.name,
        agent_type=spec.agent_type,
        model=spec.model,
        prompt=prompt,
        color=color,
        plan_mode_required=spec.plan_mode_required,
        joined_at=now,
        backend=spec.backend,
        pane_id=spec.pane_id,
        pid=spec.pid,
        pid_started_at=spec.pid_started_at,
        cwd=spec.cwd or os.getcwd(),
        worktree_path=spec.worktree_path
        or (existing.worktree_path if existing is not None else None),
        is_active=True,
    )
    return member


class Teams:
    """All teams under one SHOAL_HOME."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._team_files: dict[str, str] = {}  # team -> its file's path (checked name)

    # -- reading -----------------------------------------------------------------------------

    def read(self, team: str) -> TeamFile:
        """The validated team file of `team`; NotFoundError or CorruptFileError naming the file.

        A file unchanged since the last read (same inode, size and mtime: every write is an
        atomic replace, so a new version is a new inode) is not parsed again; routing a message
        costs a stat, not a parse of every member.
        """
        path = self._team_files.get(team)
        if path is None:  # (a message send reads the team file: no Path arithmetic each time)
            path = self._team_files[team] = str(self.layout.team_file(team))
        st = check_path(path, "file")  # (a planted link is refused by name, never followed)
        if st is None:
            _READ_CACHE.pop(path, None)
            self.layout.checked(Path(path))  # (a linked team directory is not "no team")
            raise NotFoundError(self._no_team(team))
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        hit = _READ_CACHE.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        self.layout.checked(Path(path))  # a new version: its directories are checked too
        try:
            tf = _read_model(Path(path), TeamFile, "team file")
        except NotFoundError:
            raise NotFoundError(self._no_team(team)) from None
        _READ_CACHE[path] = (key, tf)
        return tf

    def _no_team(self, team: str) -> str:
        """What to say of a missing team: how to make it, and which teams there are."""
        others = [n for n in self.names() if n != team]
        there = (
            f"; teams on disk: {', '.join(others)} (pass --team NAME or set SHOAL_TEAM)"
            if others
            else ""
        )
        return f"no team {team!r} (start its leader with `shoal up --team {team}`{there})"

    def exists(self, team: str) -> bool:
        return os.path.lexists(self.layout.team_file(team))  # (a link: refused when read)

    def names(self) -> list[str]:
        """Names of all teams on disk, sorted."""
        try:
            entries = sorted(os.listdir(self.layout.teams_dir))
        except FileNotFoundError:
            return []
        return [
            e
            for e in entries
            if not e.startswith(".") and (self.layout.teams_dir / e / "team.json").exists()
        ]

    def all(self) -> list[TeamFile | CorruptFileError]:
        """Every team file; a corrupt one is returned as its error so a listing still shows it."""
        out: list[TeamFile | CorruptFileError] = []
        for name in self.names():
            try:
                out.append(self.read(name))
            except CorruptFileError as exc:
                out.append(exc)
            except NotFoundError:
                continue  # deleted while listing
        return out

    def members(self, team: str) -> list[MemberView]:
        """Members with their derived state, in join order."""
        tf = self.read(team)
        return [MemberView(m, self.member_state(team, m)) for m in tf.members]

    def member_state(self, team: str, member: Member) -> MemberState:
        """Liveness from pid + start time, refined by the member's own status file."""
        if not member.is_active:
            return MemberState.LEFT
        if not is_alive(member.pid, member.pid_started_at):
            return MemberState.DEAD
        status = self.read_status(team, member.name)
        state = status.get("state") if status else None
        if state in (MemberState.IDLE, MemberState.BUSY, MemberState.STOPPING):
            return MemberState(state)
        return MemberState.ACTIVE

    def read_status(self, team: str, member: str) -> dict[str, Any] | None:
        """The member's `status/{member}.json`, or None when absent or unreadable."""
        path = self.layout.status_dir(team) / f"{validate_name(member, 'member name')}.json"
        try:
            data = orjson.loads(read_bytes_nofollow(self.layout.checked(path)))
        except (OSError, orjson.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def write_status(self, team: str, member: str, status: dict[str, Any]) -> None:
        """Replace the member's status file (only the member itself writes it)."""
        path = self.layout.status_dir(team) / f"{validate_name(member, 'member name')}.json"
        data = dumps({"v": 1, **status, "updated_at": iso_now()})
        try:
            atomic_write(self.layout.checked(path), data)
        except FileNotFoundError:  # first write: make the directory (safely), then retry
            self.layout.ensure(path.parent)
            atomic_write(path, data)

    # -- creating and deleting ---------------------------------------------------------------

    def create(
        self,
        team: str,
        description: str = "",
        *,
        unique: bool = False,
        lead_session_id: str | None = None,
    ) -> TeamFile:
        """Create a team with its lead; a taken name is refused, or slug-suffixed with `unique`
        (the leader's and a batch run's own teams; TeamCreate is `shoal.teams.founding`)."""
        validate_name(team, "team name")
        self.layout.ensure(self.layout.teams_dir)
        name = team
        for _ in range(20):
            created = self.try_create(name, description, lead_session_id)
            if created is not None:
                return created
            if not unique:
                raise ConflictError(
                    f"team {team!r} already exists; pick another name, delete it with "
                    f"`shoal team delete {team}`, or pass --unique (e.g. {with_slug(team)!r})"
                )
            name = with_slug(team)
        raise ConflictError(f"could not find a free name for team {team!r}")

    def try_create(
        self, team: str, description: str = "", lead_session_id: str | None = None
    ) -> TeamFile | None:
        """Create team `team` under its file's lock, or None when the name is taken."""
        path = self.layout.team_file(team)
        self.layout.ensure(path.parent)
        with lock_for(path):
            if os.path.lexists(path):  # (a planted link counts as taken, never followed)
                return None
            now = iso_now()
            lead = Member(
                agent_id=agent_id(LEAD_NAME, team),
                name=LEAD_NAME,
                agent_type="team-lead",
                color=pick_color(()),
                joined_at=now,
                cwd=os.getcwd(),
            )
            tf = TeamFile(
                name=team,
                description=description,
                created_at=now,
                lead_agent_id=lead.agent_id,
                lead_session_id=lead_session_id,
                members=(lead,),
            )
            for sub in ("inboxes", "status", "tasklist", "scratchpad"):
                self.layout.ensure(self.layout.team_dir(team) / sub)
            Maildir.create(self.layout.inbox_dir(team, LEAD_NAME), self.layout.home)
            atomic_write(path, dumps(tf, pretty=True), durable=True)
            return tf

    def delete(
        self,
        team: str,
        *,
        force: bool = False,
        stop_member: Callable[[str, Member], None] | None = None,
    ) -> TeamFile:
        """Delete a team; refused while non-lead members are alive unless `force`.

        With `force`, `stop_member(team, member)` is called for each alive member first (the
        shutdown handshake lives above this layer); by default the member's process is
        terminated.
        """
        tf = self.read(team)
        views = [v for v in self.members(team) if v.alive and v.member.name != LEAD_NAME]
        alive = [v.member for v in views]
        if views and not force:
            raise ConflictError(_still_active(team, views))
        lead = tf.member(LEAD_NAME)
        if lead is not None and is_alive(lead.pid, lead.pid_started_at):
            raise ConflictError(
                f"the leader of team {team!r} is running (pid {lead.pid}); "
                f"stop it first with `shoal down --team {team}`"
            )
        for member in alive:
            (stop_member or _terminate_member)(team, member)
        for member in tf.members:
            if member.worktree_path:
                _remove_worktree(Path(member.worktree_path))
        path = self.layout.team_file(team)
        graveyard = self.layout.teams_dir / f".deleted-{team}-{secrets.token_hex(4)}"
        with lock_for(path):
            if not path.exists():
                raise NotFoundError(f"no team {team!r}")
            os.rename(self.layout.team_dir(team), graveyard)
        shutil.rmtree(graveyard, ignore_errors=True)
        return tf

    # -- members -----------------------------------------------------------------------------

    def update(self, team: str, fn: Callable[[TeamFile], TeamFile]) -> TeamFile:
        """Read-modify-write the team file under its lock."""
        path = self.layout.team_file(team)
        if not path.exists():
            self.read(team)  # raises the friendly NotFoundError
        return locked_update(path, TeamFile, fn, what="team file")

    def join(
        self,
        team: str,
        name: str,
        *,
        pid: int | None = None,
        pid_started_at: float | None = None,
        agent_type: str = "worker",
        model: str | None = None,
        prompt: str | None = None,
        backend: str | None = None,
        pane_id: str | None = None,
        cwd: str | None = None,
        plan_mode_required: bool = False,
        worktree_path: str | None = None,
    ) -> Member:
        """Add `name` to `team` (or re-join a departed or dead member of that name).

        Refused when a live member already has the name (see `join_many`: one set of rules).
        With no `prompt`, a member listed by its spawner keeps the prompt saved for it.
        """
        spec = JoinSpec(
            name=name,
            agent_type=agent_type,
            backend=backend,
            cwd=cwd,
            plan_mode_required=plan_mode_required,
            worktree_path=worktree_path,
            pid=pid,
            pid_started_at=pid_started_at,
            prompt=prompt,
            model=model,
            pane_id=pane_id,
            keep_listed_prompt=True,
        )
        return self.join_many(team, [spec])[0]

    def join_many(self, team: str, specs: list[JoinSpec]) -> list[Member]:
        """Add (or re-list) many members with one locked update of the team file.

        Each goes through the same rules (`_admit`): a live, active member of a name is
        refused with ConflictError and nothing is written; a dead or departed one is replaced,
        keeping its colour and worktree. A pid without a start time gets it looked up here.
        The inboxes are created before the team file lists anyone.
        """
        names = [validate_name(spec.name, "member name") for spec in specs]
        joining = set(names)
        dupes = sorted(n for n, count in Counter(names).items() if count > 1)
        if dupes:
            raise UsageError(f"member name(s) given twice: {', '.join(dupes)}")
        specs = [_with_start_time(spec) for spec in specs]
        for spec in specs:
            Maildir.create(self.layout.inbox_dir(team, spec.name), self.layout.home)
        now = iso_now()
        added: list[Member] = []

        def add(tf: TeamFile) -> TeamFile:
            members = {m.name: m for m in tf.members}
            taken = [
                m.color for m in tf.members if m.is_active and m.color and m.name not in joining
            ]
            for spec in specs:
                member = _admit(team, spec, members.get(spec.name), taken, now)
                members[spec.name] = member
                added.append(member)
            listed = {m.name for m in tf.members}
            order = [m.name for m in tf.members] + [n for n in names if n not in listed]
            return tf.model_copy(update={"members": tuple(members[n] for n in order)})

        self.update(team, add)
        return added

    def leave(self, team: str, name: str) -> Member:
        """Mark `name` as departed (kept in the file for history; its inbox stays readable)."""
        result: list[Member] = []

        def drop(tf: TeamFile) -> TeamFile:
            existing = tf.member(name)
            if existing is None:
                raise NotFoundError(f"no member {name!r} in team {team!r}")
            if existing.name == LEAD_NAME:
                raise ConflictError(f"the lead cannot leave team {team!r}; delete the team instead")
            member = existing.model_copy(
                update={"is_active": False, "pid": None, "pid_started_at": None}
            )
            result.append(member)
            return tf.with_member(member)

        self.update(team, drop)
        return result[0]

    def leave_many(self, team: str, names: list[str], *, departed: bool = True) -> None:
        """Mark many members as departed (or, with `departed=False`, as having no process:
        dead) in one locked update; unknown names are ignored."""
        wanted = set(names) - {LEAD_NAME}
        if not wanted:
            return

        def drop(tf: TeamFile) -> TeamFile:
            members = tuple(
                m.model_copy(
                    update={
                        "is_active": m.is_active and not departed,
                        "pid": None,
                        "pid_started_at": None,
                    }
                )
                if m.name in wanted
                else m
                for m in tf.members
            )
            return tf.model_copy(update={"members": members})

        self.update(team, drop)

    def update_member(self, team: str, name: str, **changes: Any) -> Member:
        """Change fields of one member under the lock (validated like the rest of the file)."""
        result: list[Member] = []

        def change(tf: TeamFile) -> TeamFile:
            existing = tf.member(name)
            if existing is None:
                raise NotFoundError(f"no member {name!r} in team {team!r}")
            member = Member.model_validate({**existing.model_dump(), **changes})
            result.append(member)
            return tf if member == existing else tf.with_member(member)

        self.update(team, change)
        return result[0]

    def add_allowed_path(self, team: str, path: str, added_by: str) -> TeamFile:
        """Allow every member of `team` to write under `path`."""
        entry = AllowedPath(path=os.path.abspath(path), added_by=added_by, added_at=iso_now())

        def add(tf: TeamFile) -> TeamFile:
            if any(p.path == entry.path for p in tf.team_allowed_paths):
                return tf
            return tf.model_copy(update={"team_allowed_paths": (*tf.team_allowed_paths, entry)})

        return self.update(team, add)

    def directory(self, team: str) -> TeamDirectory:
        """The recipient directory of `team`, as the mailbox router wants it."""
        return TeamDirectory(self, team)


class TeamDirectory:
    """Resolves recipients of one team for the mailbox router (see shoal.mailbox.router)."""

    def __init__(self, teams: Teams, team: str) -> None:
        self.teams = teams
        self.team = team
        self.layout = teams.layout
        self._known: dict[str, tuple[TeamFile, Path]] = {}

    @property
    def lead_name(self) -> str:
        return LEAD_NAME

    def inbox(self, name: str) -> Path:
        """The inbox of member `name`; UnknownRecipientError when there is no such member."""
        tf = self.teams.read(self.team)
        hit = self._known.get(name)
        if hit is not None and hit[0] is tf:  # same team file as last time: same answer
            return hit[1]
        validate_name(name, "recipient name")
        if tf.member(name) is None:
            known = ", ".join(m.name for m in tf.members)
            raise UnknownRecipientError(
                f"no member {name!r} in team {self.team!r} (members: {known}); nothing was sent"
            )
        path = self.layout.inbox_dir(self.team, name)
        self._known[name] = (tf, path)
        return path

    def broadcast(self, sender: str) -> list[tuple[str, Path]]:
        """Every alive member but the sender."""
        return [
            (v.member.name, self.layout.inbox_dir(self.team, v.member.name))
            for v in self.teams.members(self.team)
            if v.alive and v.member.name != sender
        ]

    def bridge_inbox(self, session: str) -> Path:
        """The lead inbox of the team whose leader runs session `session`."""
        for tf in self.teams.all():
            if isinstance(tf, TeamFile) and tf.lead_session_id == session:
                return self.layout.inbox_dir(tf.name, LEAD_NAME)
        raise UnknownRecipientError(f"no running leader session {session!r}; nothing was sent")


def _with_start_time(spec: JoinSpec) -> JoinSpec:
    """`spec` with the start time of its pid filled in; NotFoundError if no such process."""
    if spec.pid is None or spec.pid_started_at is not None:
        return spec
    started = process_start_time(spec.pid)
    if started is None:
        raise NotFoundError(f"no process with pid {spec.pid}; cannot join {spec.name!r} with it")
    return dataclasses.replace(spec, pid_started_at=started)


def _still_active(team: str, views: list[MemberView]) -> str:
    """Why team `team` cannot be deleted yet: its active non-lead members, and how to stop
    them (the seed's TeamDelete asks for their shutdown first)."""
    names = ", ".join(f"{v.member.name} ({v.state.value})" for v in views)
    first = views[0].member.name
    return (
        f"team {team!r} still has active members: {names}; stop them first: send each a "
        f"shutdown request (`shoal send {first} --kind shutdown_request --data "
        f'\'{{"request_id": "delete-{team}"}}\' --team {team}`), or '
        "pass --force to shut them all down; nothing was deleted"
    )


def _terminate_member(team: str, member: Member) -> None:
    """Stop a member's process: SIGTERM, a short grace, then SIGKILL (only the same process)."""
    if member.pid is not None:
        terminate(member.pid, member.pid_started_at)


def _remove_worktree(path: Path) -> None:
    """Remove a member's git worktree (`git worktree remove --force`), ignoring a missing one.

    A failure (the repository moved or gone) does not stop the delete half-way: the worktree
    lies in the team's directory, which is removed next, and git prunes the record of a
    worktree whose directory is gone (`git worktree prune`, or its next gc)."""
    if not path.exists():
        return
    with contextlib.suppress(GitError):
        worktree_remove(path, force=True)
