"""`shoal agent` (start a `local_agent` task, or resume one) and `shoal agents` (definitions)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from shoal.cli.common import DURATION, common_options, get_env, json_option, print_json
from shoal.cli.trust import settle, trust_option
from shoal.core.errors import EXIT_FAILED, EXIT_INTERRUPTED, ShoalError, UsageError


def _env_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    extra: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env takes KEY=VALUE, not {pair!r}")
        extra[key] = value
    return extra


def _tool_list(text: str | None) -> list[str] | None:
    """`Read,Grep` -> ["Read", "Grep"]; an empty --tools means no tools at all."""
    if text is None:
        return None
    return [t.strip() for t in text.split(",") if t.strip()]


@click.command()
@click.argument("prompt", required=False)
@click.option(
    "--model", default=None, help="anthropic:NAME, openai:NAME, scripted:FILE, replay:FILE."
)
@click.option(
    "--type", "agent_type", default=None, metavar="NAME", help="Agent type (a definition)."
)
@click.option("--tools", default=None, metavar="T,..", help="Only these tools.")
@click.option("--disallowed-tools", default=None, metavar="T,..", help="Not these tools.")
@click.option(
    "--permission-mode",
    default=None,
    type=click.Choice(["default", "acceptEdits", "plan", "bypassPermissions", "bubble"]),
    help="What the agent may do without asking (default: its definition's, else default).",
)
@click.option(
    "--allow-network",
    is_flag=True,
    help="A coordinator's workers (or this worker) may use TCP in their sandboxed commands.",
)
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Model requests.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Token budget.")
@click.option("--max-tool-uses", type=click.IntRange(min=1), default=None, help="Tool calls.")
@click.option("--timeout", type=DURATION, default=None, help="Wall time (90, 1.5s, 5m).")
@click.option(
    "--model-idle",
    type=DURATION,
    default=None,
    help="Fail a model request whose server sends no bytes for DURATION (after the SDK's "
    "retries; default: model_idle_s in config.toml, else 120).",
)
@click.option(
    "--backend",
    default="auto",
    type=click.Choice(["auto", "process", "tmux", "in-process"]),
    help="Where the agent runs (auto: tmux inside tmux, else a process).",
)
@click.option("--cwd", default=None, type=click.Path(file_okay=False), help="Working directory.")
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A variable of the agent's environment (its commands see it too). The value is never "
    "written to disk, only the name: after a leader restart, --resume needs --env KEY=VALUE again.",
)
@click.option(
    "--fork/--no-fork",
    default=None,
    help="Its Agent tool without subagent_type forks it (a copy); default: `fork` in config.toml.",
)
@click.option(
    "--coordinator/--no-coordinator",
    default=None,
    help="Coordinator mode: it dispatches workers and does not execute "
    "(default: $SHOAL_COORDINATOR_MODE; a resumed session keeps its stored mode).",
)
@click.option("--simple", is_flag=True, help="A coordinator's workers get only Bash, Read, Edit.")
@click.option(
    "--replay",
    "replay",
    default=None,
    metavar="ID",
    help="With --coordinator: re-drive a recorded coordinator run (its task id, or a session "
    "id) with zero model calls, its workers too; the first divergence is reported.",
)
@click.option(
    "--budget-tokens", type=click.IntRange(min=1), default=None, help="A coordinator run's tokens."
)
@click.option(
    "--budget-tool-uses",
    type=click.IntRange(min=1),
    default=None,
    help="A coordinator run's tool uses.",
)
@click.option(
    "--budget-seconds",
    type=DURATION,
    default=None,
    help="A coordinator run's worker time (s): each worker's wall time comes out of it.",
)
@click.option(
    "--github-api",
    default=None,
    metavar="URL",
    help="A coordinator's GitHub REST API for subscribe_pr_activity, e.g. GitHub Enterprise's "
    "https://HOST/api/v3 (default: github_api in config.toml, else https://api.github.com).",
)
@click.option(
    "--mcp-config",
    default=None,
    type=click.Path(dir_okay=False),
    help='MCP servers ({"mcpServers": ...}; default: the project\'s .shoal/mcp.json).',
)
@click.option(
    "--resume",
    default=None,
    metavar="ID",
    help="Continue agent task ID's conversation (with its --env, while the leader that ran it "
    "still runs; else pass each --env KEY=VALUE again, as the error names them).",
)
@trust_option
@click.option(
    "--foreground",
    "-f",
    is_flag=True,
    help="Stream the transcript; exit 0 completed, 1 failed or killed, 130 on Ctrl-C.",
)
@json_option
@common_options
def agent(
    prompt: str | None,
    model: str | None,
    agent_type: str | None,
    tools: str | None,
    disallowed_tools: str | None,
    permission_mode: str | None,
    allow_network: bool,
    max_turns: int | None,
    max_tokens: int | None,
    max_tool_uses: int | None,
    timeout: float | None,
    model_idle: float | None,
    backend: str,
    cwd: str | None,
    env_pairs: tuple[str, ...],
    fork: bool | None,
    coordinator: bool | None,
    simple: bool,
    replay: str | None,
    budget_tokens: int | None,
    budget_tool_uses: int | None,
    budget_seconds: float | None,
    github_api: str | None,
    mcp_config: str | None,
    resume: str | None,
    trust_run: bool,
    foreground: bool,
    as_json: bool,
) -> None:
    """Start an agent on PROMPT as a background task of the team's leader; prints its id.

    The agent calls its model with tools (Bash, Read, Write, Edit, Glob, Grep) until the
    model answers without a tool call. PROMPT `-` reads standard input. Without --model it
    runs on $SHOAL_MODEL, `model` in SHOAL_HOME/config.toml, or the embedded scripted model.

    The project's .shoal/mcp.json and agent definitions are used only in a trusted directory
    (`shoal trust`, or --trust for this run); on a terminal an untrusted one is asked about.
    """
    from shoal.channel.client import call
    from shoal.workers.agent.coordinator.mode import env_mode
    from shoal.workers.agent.models import ModelSpec

    env = get_env(click.get_current_context())
    if prompt == "-":
        prompt = sys.stdin.read()
    if coordinator is None and env_mode(os.environ):
        coordinator = True
    if replay is not None:
        if not coordinator:
            raise UsageError("--replay re-drives a coordinator run: add --coordinator")
        if resume is not None or model is not None:
            raise UsageError(
                "--replay takes neither --resume nor --model (it answers from the run)"
            )
        prompt = prompt or "replay"
    if resume is None and not (prompt or "").strip():
        raise UsageError("no prompt given (usage: shoal agent PROMPT, or - for standard input)")
    if model is not None:
        ModelSpec.parse(model)  # an unknown provider is a usage error (exit 2), here and now
    if trust_run and resume is not None:
        raise UsageError("--trust goes with a new agent (a resumed one keeps its own trust)")
    team = env.team()
    spec: dict[str, Any] = {
        "model": model,
        "agent_type": agent_type,
        "tools": _tool_list(tools),
        "disallowed_tools": _tool_list(disallowed_tools),
        "permission_mode": permission_mode,
        "max_turns": max_turns,
        "max_tokens": max_tokens,
        "max_tool_uses": max_tool_uses,
        "timeout": timeout,
        "model_idle_s": model_idle,
        "backend": backend,
        "cwd": os.path.abspath(cwd) if cwd else os.getcwd(),
        "env": _env_pairs(env_pairs) or None,
        "mcp_config": os.path.abspath(mcp_config) if mcp_config else None,
        "fork": fork,
    }
    if allow_network:
        spec["allow_network"] = True
    budget = {
        k: v
        for k, v in (
            ("tokens", budget_tokens),
            ("tool_uses", budget_tool_uses),
            ("seconds", budget_seconds),
        )
        if v is not None
    }
    if (budget or simple or github_api) and not coordinator and resume is None:
        raise UsageError(
            "--budget-*, --simple and --github-api are for a coordinator (add --coordinator)"
        )
    if github_api is not None:
        from shoal.workers.agent.github import check_api_url

        spec["github_api"] = check_api_url(github_api)
    if coordinator is not None:
        spec["coordinator"] = coordinator
    if simple:
        spec["simple"] = True
    if budget:
        spec["budget"] = budget
    if budget_seconds is not None and timeout is None:
        spec["timeout"] = budget_seconds  # (the run as a whole lasts no longer than its budget)
    if replay is not None:
        spec["replay"] = replay
        if cwd is None:
            spec["cwd"] = None  # (the recorded run's)
    if resume is None:
        from shoal.core.trust import AGENT_SOURCES, DEFINITION_SOURCES

        sources = AGENT_SOURCES if mcp_config is None else DEFINITION_SOURCES
        if settle(env.layout.home, Path(spec["cwd"] or os.getcwd()), sources, trust_run):
            spec["trust"] = True
    if resume is not None:
        text = (prompt or "").strip() or "Continue."
        from shoal.cli.taskfiles import full_task_id

        resume = full_task_id(env.layout, team, resume)
        sent: dict[str, Any] = {"task_id": resume, "text": text}
        if spec["env"]:
            sent["env"] = spec["env"]
        answer = call(env.layout, team, "agent_send", sent)
        task_id = answer["task_id"]
        if coordinator is not None:
            _say_mode(env.layout, team, task_id, coordinator)
        if as_json and not foreground:
            print_json(answer)
        elif not foreground:
            click.echo(task_id)
    else:
        task = call(env.layout, team, "agent", {"spec": {**spec, "prompt": prompt}})
        task_id = task["id"]
        if task.get("project_note") and not foreground:  # (in the foreground: its output)
            click.echo(f"shoal: {task['project_note']}", err=True)
        if as_json and not foreground:
            print_json(task)
        elif not foreground:
            click.echo(task_id)
    if foreground:
        _foreground(env.layout, team, task_id, as_json)


def _say_mode(layout: Any, team: str, task_id: str, asked: bool) -> None:
    """A resumed session keeps its stored mode: say so when it differs from the asked one."""
    from shoal.cli.taskfiles import open_session
    from shoal.workers.agent.coordinator.mode import mode_message

    record = (open_session(layout, team).read_tasks_raw() or {}).get(task_id) or {}
    message = mode_message(bool(record.get("coordinator")), asked)
    if message:
        click.echo(f"shoal: {message}", err=True)


def _foreground(layout: Any, team: str, task_id: str, as_json: bool) -> None:
    from shoal.channel.client import call
    from shoal.cli.taskfiles import open_session, print_output
    from shoal.core import consent as consent_text

    session = open_session(layout, team)
    asked: set[str] = set()

    def consent(task: dict[str, Any]) -> None:
        """On a terminal, ask here what the agent asks the lead; else say how to answer."""
        waiting = task.get("waiting_for") or {}
        request_id = waiting.get("request_id")
        if not request_id or request_id in asked:
            return
        asked.add(request_id)
        # The whole request, wrapped (a cut one could hide `; curl …|sh` past the cut): on one
        # line when it is short, else a block saying how long each part is.
        tool, inputs = str(waiting.get("tool")), waiting.get("input") or {}
        short = consent_text.compact(tool, inputs)
        shown = short or consent_text.block(tool, inputs, request_id)
        if not sys.stdin.isatty():
            click.echo(
                f"shoal: agent {task_id} waits for consent to {shown}"
                + (": " if short else "\n")
                + f"`shoal approve {request_id}` or `shoal reject {request_id} --feedback ...`",
                err=True,
            )
            return
        if short is None:
            click.echo(f"\n{shown}", err=True)
        question = f"Allow {short}?" if short else f"Allow this {tool}?"
        ok = click.confirm(f"\n{question}" if short else question, default=False, err=True)
        feedback = None if ok else click.prompt("Why not (told to the agent)", default="", err=True)
        try:
            call(
                layout, team, "permission",
                {"request_id": request_id, "approve": ok, "reason": feedback or None},
            )  # fmt: skip
        except ShoalError as exc:
            click.echo(f"shoal: could not answer {request_id}: {exc}", err=True)

    try:
        final = print_output(session, task_id, stream=True, on_poll=consent)
    except KeyboardInterrupt:
        try:
            call(layout, team, "stop", {"task_id": task_id}, timeout=30)
        except ShoalError as exc:
            click.echo(f"shoal: could not stop {task_id}: {exc}", err=True)
        else:
            click.echo(f"shoal: agent {task_id} stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if as_json:
        print_json(final)
    if final["status"] != "completed":
        why = final.get("error") or final.get("kill_reason") or final["status"]
        click.echo(f"shoal: agent {task_id} {final['status']}: {why}", err=True)
        sys.exit(EXIT_FAILED)


@click.command()
@click.option(
    "--cwd",
    default=None,
    type=click.Path(file_okay=False),
    help="The project whose .shoal/agents/ and .claude/agents/ are read (default: here).",
)
@json_option
@common_options
def agents(cwd: str | None, as_json: bool) -> None:
    """List the agent definitions, with the file each comes from.

    They come from the built-in ones, SHOAL_HOME/agents/, the project's .claude/agents/ and
    .shoal/agents/. A malformed one is reported (file:line)
    on standard error and skipped; so are an untrusted project's (see `shoal trust`)."""
    from shoal.workers.agent.definitions import load_catalog

    env = get_env(click.get_current_context())
    catalog = load_catalog(env.layout.home, Path(cwd or os.getcwd()))
    for problem in catalog.problems:
        click.echo(f"shoal: warning: {problem}", err=True)
    if catalog.note:
        click.echo(f"shoal: {catalog.note}", err=True)
    found = sorted(catalog.agents.values(), key=lambda d: d.name)
    if as_json:
        print_json([d.to_json() for d in found])
        return
    width = max(len(d.name) for d in found)
    for d in found:
        click.echo(f"{d.name:<{width}}  {d.description}")
        details = [f"source: {d.source}"]
        if d.model:
            details.append(f"model: {d.model}")
        if d.tools is not None:
            details.append(f"tools: {', '.join(d.tools) or '(none)'}")
        if d.permission_mode:
            details.append(f"permission mode: {d.permission_mode}")
        click.echo(f"{'':<{width}}  " + "; ".join(details))
