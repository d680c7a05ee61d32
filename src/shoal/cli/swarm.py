"""`shoal spawn`, `shoal approve` and `shoal reject`: starting teammates and answering plans."""

from __future__ import annotations

import os
from typing import Any

import click

from shoal.cli.common import common_options, get_env, json_option, print_json
from shoal.core.errors import ConflictError, NotFoundError
from shoal.teams.backends.base import BACKEND_NAMES


@click.command()
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@click.option(
    "--agent",
    type=click.Choice(["scripted", "exec", "llm", "claude", "codex"]),
    default="scripted",
    show_default=True,
    help="The teammate's brain.",
)
@click.option(
    "--model", default=None, help="The llm brain's model (anthropic:NAME, openai:NAME, ...)."
)
@click.option(
    "--script",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Steps of a scripted brain (TOML or JSON).",
)
@click.option(
    "--cmd",
    "cmd",
    default=None,
    metavar="TEMPLATE",
    help="argv template of an exec brain, e.g. 'claude -p {prompt}'.",
)
@click.option("--prompt", default=None, help="First message to the teammate once it is ready.")
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    default="auto",
    show_default=True,
    help="Where it runs: auto picks iTerm2 in iTerm2, tmux in tmux, else process.",
)
@click.option("--plan-mode", is_flag=True, help="It must have its plan approved before writing.")
@click.option("--worktree", is_flag=True, help="Give it its own git worktree.")
@click.option(
    "--sandbox",
    is_flag=True,
    help="Run its commands in a kernel sandbox: writable only its working tree, tmp and "
    "[sandbox] writable of SHOAL_HOME/config.toml.",
)
@click.option(
    "--cwd",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Working directory (default: the current one).",
)
@json_option
@common_options
def spawn(
    names: tuple[str, ...],
    agent: str,
    model: str | None,
    script: str | None,
    cmd: str | None,
    prompt: str | None,
    backend: str,
    plan_mode: bool,
    worktree: bool,
    sandbox: bool,
    cwd: str | None,
    as_json: bool,
) -> None:
    """Start teammate NAME (or several) and wait until ready; they then take open tasks.

    With --json: the teammate as an object, or a list of them for several names.
    """
    from shoal.channel.client import call

    env = get_env(click.get_current_context())
    spec = {
        "agent": agent,
        "script": os.path.abspath(script) if script else None,
        "cmd": cmd,
        "model": model,
        "prompt": prompt,
        "backend": backend,
        "plan_mode": plan_mode,
        "worktree": worktree,
        "sandbox": sandbox,
        "cwd": os.path.abspath(cwd) if cwd else os.getcwd(),
    }
    if len(names) == 1:
        results = [call(env.layout, env.team(), "spawn", {**spec, "name": names[0]})]
    else:
        batch = [{**spec, "name": name} for name in names]
        results = call(env.layout, env.team(), "spawn", {"batch": batch}, timeout=300)
    if as_json:
        print_json(results[0] if len(names) == 1 else results)
        return
    for result in results:
        click.echo(
            f"spawned {result['name']} ({result['task_id']}) with backend "
            f"{result['backend']}: {result['why']}"
        )


def _remote_task(layout: Any, team: str, name: str) -> str | None:
    """The id of the session's remote task `name` names (an `r...` id or a unique prefix of
    one), if it names one; None for a member's name or a permission request's id."""
    if not name.startswith("r") or "." in name:
        return None
    from shoal.cli.taskfiles import task_records
    from shoal.teams.session import current_session

    session = current_session(layout, team)
    # (an ended one too, evicted to the history: the leader then says it waits for nothing)
    records = task_records(session, include_history=True) if session is not None else {}
    matches = [
        i for i, t in records.items() if i.startswith(name) and t.get("type") == "remote_agent"
    ]
    return matches[0] if len(matches) == 1 else None


def _answer_plan(name: str, approve: bool, feedback: str | None) -> str:
    from shoal.mailbox.router import send
    from shoal.teams.models import LEAD_NAME
    from shoal.teams.store import Teams

    env = get_env(click.get_current_context())
    team = env.team()
    remote_id = _remote_task(env.layout, team, name)
    if remote_id is not None:  # a remote ultraplan waiting for an answer or an approval
        from shoal.channel.client import call

        args = {"task_id": remote_id, "approve": approve, "text": feedback}
        return str(call(env.layout, team, "remote_answer", args)["id"])
    if "." in name:  # `{agent task id}.{n}`: an agent's permission request
        from shoal.channel.client import call

        _refuse_own_request(env.layout, team, name)
        args = {"request_id": name, "approve": approve, "reason": feedback}
        return str(call(env.layout, team, "permission", args)["request_id"])
    teams = Teams(env.layout)
    member = teams.read(team).member(name)
    if member is None:
        raise NotFoundError(f"no member {name!r} in team {team!r} (see `shoal team show {team}`)")
    from shoal.channel.client import leader_alive
    from shoal.workers.agent.approval import member_roots, refuse_inside

    roots = member_roots(member.model_dump(), leader_alive(env.layout, team))
    refuse_inside(f"the plan of {name}", roots)
    pending = (teams.read_status(team, name) or {}).get("awaiting_approval")
    if not isinstance(pending, dict) or not pending.get("request_id"):
        raise ConflictError(f"{name} is not waiting for a plan approval")
    send(
        teams.directory(team),
        to=name,
        sender=LEAD_NAME,
        kind="plan_approval_response",
        data={"request_id": pending["request_id"], "approve": approve, "feedback": feedback},
    )
    return str(pending["request_id"])


def _refuse_own_request(layout: Any, team: str, request_id: str) -> None:
    """Refuse (ConflictError) when this command runs inside the process tree of the agent
    that made request `request_id` (`{task id}.{n}`): an agent must not approve itself."""
    from shoal.channel.client import leader_alive
    from shoal.cli.taskfiles import task_records
    from shoal.teams.session_files import current_session_files
    from shoal.workers.agent.approval import agent_roots, refuse_inside

    session = current_session_files(layout, team)
    if session is None:
        return  # (no session: the leader says what is wrong)
    records = task_records(session, include_history=False)
    task_id = request_id.split(".", 1)[0]
    matches = [i for i in records if i.startswith(task_id)]
    if len(matches) == 1:
        refuse_inside(request_id, agent_roots(records, matches[0], leader_alive(layout, team)))


def _show_request(request_id: str, as_json: bool) -> None:
    """Print agent request `request_id` whole (wrapped, control characters made visible)."""
    from shoal.cli.taskfiles import task_records
    from shoal.core import consent
    from shoal.teams.session_files import current_session_files

    env = get_env(click.get_current_context())
    team = env.team()
    session = current_session_files(env.layout, team)
    records = task_records(session, include_history=False) if session is not None else {}
    for task_id, record in records.items():
        waiting = record.get("waiting_for") or {}
        if waiting.get("request_id") == request_id or (
            "." in request_id
            and task_id.startswith(request_id.split(".", 1)[0])
            and str(waiting.get("request_id", "")).endswith("." + request_id.split(".", 1)[1])
        ):
            if as_json:
                print_json(waiting)
            else:
                click.echo(consent.block(str(waiting.get("tool")), waiting.get("input") or {},
                                         limit=None))  # fmt: skip
            return
    raise NotFoundError(
        f"no agent of team {team!r} waits on request {request_id} (`shoal ps` lists them)"
    )


@click.command()
@click.argument("name")
@click.option("--feedback", default=None, help="A note for the teammate.")
@click.option(
    "--show",
    is_flag=True,
    help="Only print agent request NAME whole (every character of its command), answering nothing.",
)
@json_option
@common_options
def approve(name: str, feedback: str | None, show: bool, as_json: bool) -> None:
    """Approve a teammate's plan, an agent's permission request or a remote ultraplan.

    NAME is the teammate waiting on a plan, an agent's request id (`a1b2c3d4e.1`, shown by
    `shoal ps`), or a remote ultraplan's `r...` id: a ready plan completes it; a question is
    answered with --feedback. With --show, print the request whole instead (prompts cut a
    very long one and say so)."""
    if show:
        _show_request(name, as_json)
        return
    request_id = _answer_plan(name, True, feedback)
    if as_json:
        print_json({"name": name, "request_id": request_id, "approve": True})
    else:
        click.echo(
            f"approved {name}" if "." in name or request_id == name
            else f"approved the plan of {name}"
        )  # fmt: skip


@click.command()
@click.argument("name")
@click.option("--feedback", required=True, help="Why, and what to do instead.")
@json_option
@common_options
def reject(name: str, feedback: str, as_json: bool) -> None:
    """Reject a teammate's plan or an agent's permission request, with feedback.

    NAME is the teammate waiting on a plan, or an agent's request id (shown by `shoal ps`);
    the model is told the feedback."""
    request_id = _answer_plan(name, False, feedback)
    if as_json:
        print_json({"name": name, "request_id": request_id, "approve": False})
    else:
        click.echo(f"rejected {name}" if "." in name else f"rejected the plan of {name}")


@click.command()
@click.option(
    "--backend",
    type=click.Choice(BACKEND_NAMES),
    default=None,
    help="Where the teammates run (default: tmux when installed, else process).",
)
@click.option(
    "--coordinator",
    is_flag=True,
    help="Instead: a coordinator fixes a small project's failing test through six workers.",
)
@common_options
def demo(backend: str | None, coordinator: bool) -> None:
    """Watch a lead and three scripted teammates survey this directory (offline, read-only).

    They claim dependent tasks from a shared list, run real commands on the files here,
    message each other and report back; everything they started is gone at the end. With
    --coordinator: one coordinator researches, synthesises, implements (write-set leases:
    one writer per file) and verifies through workers, on a temporary project.
    """
    from shoal.demo.swarm import run_demo, tmux_available

    env = get_env(click.get_current_context())
    if coordinator:
        from shoal.demo.coordinator import run_coordinator_demo, summary

        agent_backend = backend if backend in ("process", "tmux", "in-process") else None
        if agent_backend is None:  # (as the teammates' demo: panes of a dedicated server)
            agent_backend = "tmux" if tmux_available() else "process"
        done = run_coordinator_demo(env.layout, backend=agent_backend, say=click.echo)
        for line in summary(done):
            click.echo(line)
        return
    if backend is not None:
        chosen, why = backend, "asked for with --backend"
    elif tmux_available():
        chosen, why = "tmux", "tmux is installed: panes of a dedicated tmux server"
    else:
        chosen, why = "process", "tmux is not installed: background processes"
    result = run_demo(env.layout, backend=chosen, cwd=os.getcwd(), say=click.echo, why=why)
    click.echo("")
    click.echo(
        f"done in {result.seconds:.1f}s with backend {result.backend}; "
        f"{result.messages} messages reached the lead"
    )
    for subject, who in result.done_by.items():
        click.echo(f"  {who:<5} {subject}")
    if result.report:
        click.echo("")
        click.echo(result.report.rstrip())
    click.echo("")
    click.echo(f"team {result.team} deleted; no teammate process or pane is left")
