"""Who may answer a permission or plan request: never a process inside the requester's tree.

An agent's Bash that runs `shoal approve` on the agent's own request (or on one of its
subagent's, or of its parent's) would grant what only the user may grant. The requester's
processes are known from the session's records: the agent's runner (the leader itself for an
in-process agent, whose commands are the leader's children), its background shell tasks, and
the same for every agent of its family (parent and subagents); a teammate's runner is in the
team file. `shoal approve` looks up its own ancestors (pid and start time, so a reused pid
never matches) and refuses when one of them is such a process.

This is the CLI's half. A process of the same user can still write the control request's file
by hand, and the leader cannot tell who wrote it (a file carries its owner, not its writer's
pid): the other half is the sandbox, in which an agent's commands cannot write in SHOAL_HOME.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.core.errors import ConflictError
from shoal.core.procs import START_TIME_TOLERANCE_S, lineage


@dataclass(frozen=True)
class Root:
    """A process of the requester: everything below it is the requester's too."""

    pid: int
    started_at: float | None
    what: str


def _family(records: Mapping[str, Mapping[str, Any]], task_id: str) -> list[str]:
    """Agent task `task_id`, the agents above it (parent_agent) and every agent below them."""
    top = task_id
    seen = {top}
    while (parent := (records.get(top) or {}).get("parent_agent")) and parent not in seen:
        seen.add(parent)
        top = parent
    family = [top]
    frontier = [top]
    while frontier:
        below = [
            i
            for i, r in records.items()
            if r.get("type") == "local_agent" and r.get("parent_agent") in frontier
            and i not in family
        ]  # fmt: skip
        family += below
        frontier = below
    return family


def agent_roots(
    records: Mapping[str, Mapping[str, Any]],
    task_id: str,
    leader: tuple[int, float] | None,
) -> list[Root]:
    """The processes whose trees are agent `task_id`'s: its family's runners (the leader for
    an in-process one) and their background shell tasks."""
    if task_id not in records:
        return []
    family = _family(records, task_id)
    roots: list[Root] = []
    names = set(family)
    for agent in family:
        record = records.get(agent) or {}
        names.add(str(record.get("agent_id") or agent))
        pid = record.get("pid")
        if record.get("backend") == "in-process" or (leader is not None and pid == leader[0]):
            if leader is not None:
                roots.append(Root(leader[0], leader[1], f"the leader, which runs agent {agent}"))
        elif isinstance(pid, int):
            roots.append(Root(pid, record.get("pid_started_at"), f"agent {agent}'s runner"))
    for shell_id, record in records.items():
        pid, owner = record.get("pid"), record.get("agent_id")
        if record.get("type") == "local_bash" and owner in names and isinstance(pid, int):
            what = f"background command {shell_id} of agent {owner}"
            roots.append(Root(pid, record.get("pid_started_at"), what))
    return roots


def member_roots(member: Mapping[str, Any], leader: tuple[int, float] | None) -> list[Root]:
    """The process whose tree is teammate `member`'s (the leader's for an in-process one)."""
    name = member.get("name")
    pid = member.get("pid")
    if member.get("backend") == "in-process" or (leader is not None and pid == leader[0]):
        return [] if leader is None else [Root(*leader, f"the leader, which runs {name}")]
    if isinstance(pid, int):
        return [Root(pid, member.get("pid_started_at"), f"teammate {name}'s runner")]
    return []


def inside(roots: list[Root], chain: list[tuple[int, float]] | None = None) -> Root | None:
    """The root among `roots` that this process (or `chain`, a lineage) runs under, if any."""
    chain = lineage() if chain is None else chain
    for pid, started in chain:
        for root in roots:
            if root.pid == pid and (
                root.started_at is None or abs(root.started_at - started) <= START_TIME_TOLERANCE_S
            ):
                return root
    return None


def refuse_inside(request: str, roots: list[Root]) -> None:
    """ConflictError when this process runs inside one of `roots`: the requester would be
    answering its own request `request`."""
    root = inside(roots)
    if root is not None:
        raise ConflictError(
            f"refusing to answer {request}: this command runs inside the process tree of "
            f"{root.what} (pid {root.pid}), which asked; a request is answered by the user, "
            "from a terminal outside it"
        )
