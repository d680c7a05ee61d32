"""The catalog of `shoal`'s commands: where each lives, the job it belongs to and its summary.

`shoal --help` is printed from this table alone, so it imports no command module (each
loads only when its command runs). A test holds every summary equal to the first paragraph
of its command's own help, so the two cannot drift.
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Entry(NamedTuple):
    """A command: "module:attribute" under shoal.cli, and the summary `shoal --help` shows."""

    target: str
    summary: str


COMMANDS: Final[dict[str, Entry]] = {
    # core: background tasks
    "up": Entry(
        "leader:up",
        "Start the team's leader (creating the team if needed; default team 'default').",
    ),
    "down": Entry(
        "leader:down",
        "Stop the team's leader and everything it owns; no process is left behind.",
    ),
    "sh": Entry("sh:sh", "Run COMMAND as a background task; prints its id."),
    "ps": Entry(
        "tasks:ps",
        "List the team's tasks (with --watch, a live board redrawn as they change).",
    ),
    "logs": Entry(
        "tasks:logs",
        "Print the output of tasks, each under a header with its status and exit code.",
    ),
    "follow": Entry(
        "tasks:follow",
        "Print the output of a task as it grows, until it ends (`shoal logs -f`).",
    ),
    "stop": Entry(
        "tasks:stop",
        "Stop running tasks (TERM to each one's process group, then KILL; an agent with its "
        "commands).",
    ),
    "wait": Entry(
        "wait:wait",
        "Wait for tasks to finish (default: every task of the session since the last `wait`, "
        "those that already ended included).",
    ),
    "restart": Entry(
        "control_cmds:restart",
        "Run finished shell tasks again; prints the new tasks' ids.",
    ),
    "clean": Entry(
        "control_cmds:clean",
        "Remove finished tasks (and their output) from the session's listing.",
    ),
    "pause": Entry(
        "control_cmds:pause",
        "Pause tasks (SIGSTOP to each one's process group; a queued one is held), or a group "
        "(nothing more of it starts, its running tasks are paused).",
    ),
    "resume": Entry(
        "control_cmds:resume",
        "Resume paused tasks (SIGCONT), or a group (it starts tasks again).",
    ),
    "group": Entry(
        "control_cmds:group",
        "Task groups, each with its own parallelism (`shoal sh --group NAME`).",
    ),
    "parallel": Entry(
        "control_cmds:parallel",
        "Let COUNT tasks of a group run at once (0: no limit); takes effect at once.",
    ),
    "send-input": Entry(
        "control_cmds:send_input",
        "Write TEXT and a newline to the stdin of running task TASK_ID (started with `shoal sh "
        "--stdin`); TEXT `-` reads standard input.",
    ),
    "events": Entry(
        "tasks:events",
        "Print the session's event stream: one human line per event (--json: the records).",
    ),
    # swarm: teammates, their messages and shared task list
    "team": Entry(
        "team:team",
        "Create, inspect and delete teams; join or leave them from any program.",
    ),
    "spawn": Entry(
        "swarm:spawn",
        "Start teammate NAME (or several) and wait until ready; they then take open tasks.",
    ),
    "task": Entry(
        "tasklist:task",
        "The team's shared task list: add, list, get, update and claim items.",
    ),
    "send": Entry(
        "mail:send",
        "Send TEXT to TO (a member, '*' for all alive members, an agent task id, uds:PATH or "
        "bridge:SESSION).",
    ),
    "inbox": Entry(
        "mail:inbox",
        "Print (and consume) the messages waiting in NAME's inbox, in priority order.",
    ),
    "approve": Entry(
        "swarm:approve",
        "Approve a teammate's plan, an agent's permission request or a remote ultraplan.",
    ),
    "reject": Entry(
        "swarm:reject",
        "Reject a teammate's plan or an agent's permission request, with feedback.",
    ),
    "attach": Entry(
        "attach:attach",
        "Open the team's tmux window: attach to its server, or select it when inside tmux.",
    ),
    "ui": Entry("ui:ui", "Browse the team's tasks and members full-screen."),
    "demo": Entry(
        "swarm:demo",
        "Watch a lead and three scripted teammates survey this directory (offline, read-only).",
    ),
    # CI: batch runs
    "run": Entry(
        "run:run", "Run the tasks of SPEC (a TOML spec, or a file of commands) to a verdict."
    ),
    "workflow": Entry(
        "workflow:workflow",
        "Run the tasks of SPEC (a `shoal run` spec) as steps of one background task of the "
        "team's leader; prints its id.",
    ),
    # agents
    "agent": Entry(
        "agent:agent",
        "Start an agent on PROMPT as a background task of the team's leader; prints its id.",
    ),
    "agents": Entry("agent:agents", "List the agent definitions, with the file each comes from."),
    "chat": Entry(
        "chat:chat",
        "An interactive session with an agent (or, with --coordinator, a coordinator).",
    ),
    "remote": Entry(
        "remote:remote",
        "Run agents and commands on a Ray cluster (`r...` tasks, polled by the team's leader).",
    ),
    "dream": Entry(
        "dream:dream",
        "Consolidate memory from recent sessions; prints the dream's task id.",
    ),
    "monitor": Entry(
        "monitor:monitor",
        "Watch MCP server SERVER as a background task; prints its id.",
    ),
    "trust": Entry(
        "trust:trust",
        "Trust a project directory: its agents may use its MCP servers and agent definitions.",
    ),
    # advanced
    "worker": Entry(
        "worker:worker",
        "Run as teammate NAME of the team (backends start this; rarely run by hand).",
    ),
    "pill": Entry(
        "ui:pill",
        "Print the pill label of the team's background tasks (nothing when none run).",
    ),
    "completion": Entry(
        "completion:completion",
        "Print the shell completion script for SHELL (bash, zsh or fish).",
    ),
}

SECTIONS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("Background tasks", ("up", "down", "sh", "ps", "logs", "follow", "stop", "wait", "restart",
                          "clean", "pause", "resume", "group", "parallel", "send-input",
                          "events")),
    ("Swarms", ("team", "spawn", "task", "send", "inbox", "approve", "reject", "attach", "ui",
                "demo")),
    ("CI batch runs", ("run", "workflow")),
    ("Agents", ("agent", "agents", "chat", "remote", "dream", "monitor", "trust")),
    ("Advanced", ("worker", "pill", "completion")),
)  # fmt: skip
"""The jobs `shoal --help` groups the commands by, in order; every command is in one."""

ALIASES: Final[dict[str, str]] = {
    "status": "ps",
    "add": "sh",
    "kill": "stop",
    "log": "logs",
    "remove": "clean",
}
"""The words of pueue for shoal's commands: each runs the command it names, options and all."""

HINTS: Final[dict[str, str]] = {
    "start": "'resume' (start paused tasks again) or 'up' (start a leader)",
    "shutdown": "'down'",
    "stash": "'pause'",
    "enqueue": "'resume'",
    "list": "'ps'",
    "ls": "'ps'",
    "tail": "'follow'",
    "rm": "'remove'",
    "cancel": "'stop'",
    "submit": "'sh'",
}
"""Words of other tools that are not shoal commands, and the commands that do their job."""


def target_of(name: str) -> str | None:
    """The "module:attribute" of command or alias `name`, or None when it is neither."""
    entry = COMMANDS.get(ALIASES.get(name, name))
    return entry.target if entry is not None else None


def names() -> list[str]:
    """Every name `shoal NAME` accepts: the commands and their aliases."""
    return [*COMMANDS, *ALIASES]
