"""A spawn batch: each request checked and planned before anything starts (the name, the
agent and its script or command, the backend, the working directory or a worktree made for
it, the worker's options), and the batch's one answer once every member is ready or one
failed to start.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.core import git
from shoal.core.errors import ConflictError, ShoalError, UsageError
from shoal.core.names import validate_name
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.tasks import TaskType, new_task_id
from shoal.teams.backends.base import Backend, choose
from shoal.teams.backends.inprocess import InProcessBackend
from shoal.teams.models import LEAD_NAME
from shoal.workers.teammate.brains import Script
from shoal.workers.teammate.members import BatchReply, MemberRun, Reply, SwarmHost
from shoal.workers.teammate.worker import WorkerOptions


@dataclass
class SpawnPlan:
    """A checked spawn request, before anything is started."""

    name: str
    agent: str
    backend: Backend
    why: str
    cwd: str
    options: WorkerOptions
    task_id: str
    output: Path
    plan_mode: bool
    worktree: str | None
    prompt: str | None
    in_process: bool
    color: str | None


class SpawnBatch:
    """Answers a spawn batch once every member is ready or has failed."""

    def __init__(self, count: int, reply: BatchReply) -> None:
        self.count = count
        self.reply = reply
        self.results: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, ShoalError] = {}
        self.order: list[str] = []

    def for_member(self, name: str) -> Reply:
        self.order.append(name)

        def answer(result: dict[str, Any] | None, error: ShoalError | None) -> None:
            self.done(name, result, error)

        return answer

    def done(self, name: str, result: dict[str, Any] | None, error: ShoalError | None) -> None:
        if error is not None:
            self.errors[name] = error
        elif result is not None:
            self.results[name] = result
        if len(self.results) + len(self.errors) < self.count:
            return
        if self.errors:
            if self.count == 1:
                self.reply(None, next(iter(self.errors.values())))
            else:
                shown = list(self.errors.items())[:3]
                failed = "; ".join(f"{n}: {e}" for n, e in shown)
                if len(self.errors) > len(shown):
                    failed += f"; and {len(self.errors) - len(shown)} more"
                self.reply(
                    None,
                    ShoalError(
                        f"{len(self.errors)} of {self.count} teammates failed to start ({failed})"
                    ),
                )
            return
        self.reply([self.results[n] for n in self.order if n in self.results], None)


def check_program(leader: SwarmHost, agent: str, cmd: str | None, cwd: str) -> None:
    """Refuse (UsageError, exit 2) a teammate whose program is not there: the first word of
    --cmd, else the preset's own (`claude`, `codex`), looked up on the PATH its commands get
    (a path is taken from `cwd`). Else it would be "spawned", and fail in a log."""
    try:
        words = shlex.split(cmd) if cmd else [agent]
    except ValueError as exc:
        raise UsageError(f"--cmd {cmd!r} cannot be parsed: {exc}") from None
    if not words:
        raise UsageError("--cmd is empty")
    program = words[0]
    if os.sep in program:
        found = os.path.join(cwd, program)
        ok = os.path.isfile(found) and os.access(found, os.X_OK)
    else:
        path = leader.environ.get(b"PATH", os.defpath.encode())
        ok = shutil.which(program, path=os.fsdecode(path)) is not None
    if not ok:
        how = "give its path in --cmd" if agent != "exec" else "check --cmd"
        raise UsageError(
            f"--agent {agent}: no command {program!r} on the PATH of team "
            f"{leader.team!r}'s leader (install it, or {how})"
        )


def plan_spawn(
    host: SwarmHost,
    members: Mapping[str, MemberRun],
    in_process_backend: InProcessBackend,
    args: dict[str, Any],
    tf: Any,
) -> SpawnPlan:
    """Check one spawn request against team file `tf` and the running `members`, and plan
    it: the backend chosen (`in_process_backend` is the swarm's own), the worktree made,
    the worker's options; a UsageError or ConflictError says what is wrong."""
    leader = host
    team = leader.team
    name = validate_name(str(args.get("name") or ""), "member name")
    if name == LEAD_NAME:
        raise ConflictError(f"{LEAD_NAME!r} is the lead's name; pick another")
    agent = args.get("agent") or "scripted"
    if agent not in ("scripted", "exec", "llm", "claude", "codex"):
        raise UsageError(f"unknown agent {agent!r} (scripted, exec, llm or claude)")
    script, cmd, model = args.get("script"), args.get("cmd"), args.get("model")
    if agent == "llm":
        from shoal.workers.agent.models import ModelSpec, check_model

        if model:
            env = {os.fsdecode(k): os.fsdecode(v) for k, v in leader.environ.items()}
            check_model(ModelSpec.parse(str(model)), env, Path(str(args.get("cwd") or ".")))
    elif model:
        raise UsageError("--model goes with --agent llm")
    if agent == "exec" and not cmd:
        raise UsageError("--agent exec needs --cmd TEMPLATE (e.g. 'claude -p {prompt}')")
    if agent in ("exec", "claude", "codex"):
        check_program(leader, agent, str(cmd) if cmd else None, str(args.get("cwd") or "."))
    if script and not Path(script).is_file():
        raise UsageError(f"script {script} does not exist")
    if script:
        Script.load(Path(script))  # refuse a bad script now, not in the teammate
    current = members.get(name)
    if current is not None and current.backend.is_alive(current.handle):
        raise ConflictError(f"teammate {name!r} is already running in team {team!r}")
    existing = tf.member(name)
    if (
        existing is not None
        and existing.is_active
        and is_alive(existing.pid, existing.pid_started_at)
    ):
        raise ConflictError(f"member {name!r} is already active in team {team!r}")
    backend, why = choose(
        str(args.get("backend") or "auto"), provided={"in-process": in_process_backend}
    )
    cwd = str(args.get("cwd") or os.getcwd())
    if not os.path.isdir(cwd):
        raise UsageError(f"working directory {cwd!r} does not exist")
    worktree = None
    if args.get("worktree"):
        worktree = str(make_worktree(leader.layout, team, name, cwd))
        cwd = worktree
    task_id = new_task_id(TaskType.IN_PROCESS_TEAMMATE)
    output = leader.output_file(task_id)
    plan_mode = bool(args.get("plan_mode"))
    in_process = isinstance(backend, InProcessBackend)
    options = WorkerOptions(
        team=team,
        name=name,
        agent=agent,
        script=str(Path(script).resolve()) if script else None,
        cmd=str(cmd) if cmd else None,
        model=str(model) if model else None,
        plan_mode=plan_mode,
        sandbox=bool(args.get("sandbox")),
        task_id=task_id,
        output=str(output),
        cwd=cwd,
        backend=backend.name,
        joined=in_process,
        output_cap=leader.limits.output_cap,
    )
    return SpawnPlan(
        name=name,
        agent=agent,
        backend=backend,
        why=why,
        cwd=cwd,
        options=options,
        task_id=task_id,
        output=output,
        plan_mode=plan_mode,
        worktree=worktree,
        prompt=args.get("prompt"),
        in_process=in_process,
        color=existing.color if existing and existing.color else None,
    )


def make_worktree(layout: Layout, team: str, name: str, cwd: str) -> Path:
    """A detached git worktree for teammate `name`, of the repository `cwd` is in."""
    top = git.toplevel(cwd)
    if top is None:
        raise UsageError(f"--worktree needs a git repository, and {cwd} is not in one")
    path = layout.ensure(layout.worktrees_dir(team)) / name
    try:
        git.worktree_add(top, path, detach=True)
    except git.GitError as exc:
        raise ShoalError(f"cannot create a worktree for {name!r}: {exc.stderr}") from None
    return path
