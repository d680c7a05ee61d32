"""`shoal chat`: the interactive main session, a prompt_toolkit REPL over the agent runtime.

The conversation runs as a `local_agent` task of the team's leader (agent_type
`main-session`, left out of a coordinator's workers and panel); the REPL sends it each line
and prints its readable transcript as it grows, and the ends of the session's other tasks as
they come. The query it follows is held against eviction while it does (holds.py). Ctrl+B
twice moves the running query to the background, in the leader's record too
(`is_backgrounded`: the pill and the board count it; it goes on, and tells when it is done),
and gives a fresh prompt; `/fg ID` brings a query back (the one in the foreground goes to
the background), `/stop ID` stops a task, `/tasks` lists them. Ctrl+C stops the running
turn; Ctrl+D or `/exit` leaves (a running query goes on in the background).
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click

from shoal.cli.common import DURATION, common_options, get_env
from shoal.cli.trust import settle, trust_option
from shoal.core.errors import ShoalError, UsageError

DOUBLE_PRESS_S: Final = 1.0
MAIN_SESSION: Final = "main-session"  # (the agent_type of its queries)
POLL_S: Final = 0.05
RESULT: Final = re.compile(r"<result>(.*?)</result>", re.DOTALL)
HELP: Final = (
    "/tasks  the session's tasks   /fg ID  bring a query back   /stop ID  stop a task\n"
    "/help   this                  /exit   leave (Ctrl+D)        Ctrl+B Ctrl+B: background"
)


@dataclass
class ChatState:
    """What the REPL follows: the foreground query, its output offset, what was announced."""

    current: str | None = None  # the foreground query's task id
    offset: int = 0
    output: Path | None = None
    backgrounded: set[str] = field(default_factory=set)
    announced: set[str] = field(default_factory=set)
    last_ctrl_b: float = 0.0


class Chat:
    """One interactive session against team `team`'s leader."""

    def __init__(self, env: Any, team: str, spec: dict[str, Any]) -> None:
        from shoal.cli.taskfiles import open_session

        self.env = env
        self.team = team
        self.spec = spec
        self.session = open_session(env.layout, team)
        self.state = ChatState()
        self._events_offset = self._events_size()
        self.hold: Any = None  # the hold on the followed query (a ViewHold), once started

    def start_holding(self) -> None:
        """Hold the followed query against eviction from now on (a thread renews it)."""
        from shoal.orchestrator.holds import ViewHold

        self.hold = ViewHold(self.env.layout, self.team, "chat")
        self.hold.show(self.state.current)

    def stop_holding(self) -> None:
        if self.hold is not None:
            self.hold.close()

    # -- the leader ------------------------------------------------------------------------

    def call(self, op: str, args: dict[str, Any]) -> Any:
        from shoal.channel.client import call

        return call(self.env.layout, self.team, op, args)

    def record(self, task_id: str) -> dict[str, Any] | None:
        from shoal.cli.taskfiles import task_records

        return task_records(self.session, include_history=True).get(task_id)

    # -- input -------------------------------------------------------------------------------

    def handle(self, line: str) -> bool:
        """One line from the user; False to leave."""
        text = line.strip()
        if not text:
            return True
        if text.startswith("/"):
            return self.command(text)
        if self.state.current is None:
            task = self.call("agent", {"spec": {**self.spec, "prompt": text}})
            self.follow(task["id"], from_start=True)
        else:
            answer = self.call("agent_send", {"task_id": self.state.current, "text": text})
            if answer["task_id"] != self.state.current:  # (it had finished: a continuation)
                self.follow(answer["task_id"], from_start=False, skip_prompt=True)
        return True

    def command(self, text: str) -> bool:
        word, _, rest = text.partition(" ")
        arg = rest.strip()
        if word in ("/exit", "/quit"):
            return False
        if word == "/help":
            click.echo(HELP)
        elif word == "/tasks":
            self.tasks()
        elif word == "/stop":
            if not arg:
                raise UsageError("/stop ID (see /tasks)")
            final = self.call("stop", {"task_id": arg})
            click.echo(f"[{arg} is {final['status']}]")
        elif word == "/fg":
            if not arg:
                raise UsageError("/fg ID (see /tasks)")
            record = self.record(arg)
            if record is None:
                raise UsageError(f"no task {arg} in this session (see /tasks)")
            current = self.state.current
            if current is not None and current != arg:  # (the one it replaces goes back)
                self.move(current, background=True, quiet=True)
                self.state.backgrounded.add(current)
            self.state.backgrounded.discard(arg)
            self.follow(arg, from_start=True)  # (moves its record first: then it is said)
            click.echo(f"[{arg} is in the foreground]")
        else:
            raise UsageError(f"unknown command {word} (/help lists them)")
        return True

    def tasks(self) -> None:
        from shoal.cli.taskfiles import task_records

        rows = sorted(
            task_records(self.session, include_history=True).values(), key=lambda t: t["start_time"]
        )
        if not rows:
            click.echo("[no tasks yet]")
        for t in rows:
            mark = "*" if t["id"] == self.state.current else " "
            kind = t.get("agent_type") or t["type"]
            click.echo(f"{mark} {t['id']}  {t['status']:<9}  {kind:<14} {t.get('description', '')}")

    def background(self) -> None:
        """Ctrl+B twice: the running query goes on in the background; a fresh prompt."""
        current = self.state.current
        if current is None:
            click.echo("[nothing runs in the foreground]")
            return
        self.pump()
        self.move(current, background=True)
        self.state.backgrounded.add(current)
        self.state.current, self.state.output = None, None
        if self.hold is not None:
            self.hold.show(None)
        click.echo(f"[{current} moved to the background; /fg {current} brings it back]")

    def move(self, task_id: str, *, background: bool, quiet: bool = False) -> None:
        """The query's record goes to the background or the foreground (one that has left
        the leader's registry has no place to move: said, unless `quiet`, and the chat goes
        on)."""
        try:
            self.call("background", {"task_id": task_id, "background": background})
        except ShoalError as exc:
            if not quiet:
                click.echo(f"[{task_id}: {exc}]")

    def stop_turn(self) -> None:
        if self.state.current is None:
            return
        with_turn = self.record(self.state.current) or {}
        if with_turn.get("status") == "running":
            self.call("stop", {"task_id": self.state.current, "turn": True})
            click.echo(f"[turn of {self.state.current} stopped]")

    # -- output -------------------------------------------------------------------------------

    def follow(self, task_id: str, *, from_start: bool, skip_prompt: bool = False) -> None:
        task = self.record(task_id) or {}
        if task.get("agent_type") == MAIN_SESSION and task.get("is_backgrounded"):
            # (followed, it is in the foreground: so is a continuation of it)
            ended = task.get("status") in ("completed", "failed", "killed")
            self.move(task_id, background=False, quiet=ended)
        self.state.current = task_id
        self.state.output = Path(task["output_file"]) if task.get("output_file") else None
        self.state.offset = 0
        self._skip_prompt = skip_prompt and not from_start
        if self.hold is not None:
            self.hold.show(task_id)

    def pump(self) -> None:
        """Print what the foreground query wrote since the last look."""
        path = self.state.output
        if path is None and self.state.current is not None:
            task = self.record(self.state.current) or {}
            if task.get("output_file"):
                path = self.state.output = Path(task["output_file"])
        if path is None:
            return
        try:
            with open(path, "rb") as f:
                f.seek(self.state.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self.state.offset += len(data)
        text = data.decode("utf-8", "replace")
        if getattr(self, "_skip_prompt", False) and text.startswith("> "):
            self._skip_prompt = False
            text = text.split("\n\n", 1)[-1] if "\n\n" in text else ""
        if text:
            click.echo(text, nl=False)

    def _events_size(self) -> int:
        try:
            return self.session.events_file.stat().st_size
        except OSError:
            return 0

    def notifications(self) -> None:
        """The ends of other tasks, as they come (one line each)."""
        import orjson

        try:
            with open(self.session.events_file, "rb") as f:
                f.seek(self._events_offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._events_offset += end
        for line in data[:end].splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            kind = event.get("subtype")
            task_id = event.get("task_id")
            if kind not in ("task_terminated", "task_notification"):
                continue
            if task_id == self.state.current or task_id in self.state.announced:
                continue
            background = task_id in self.state.backgrounded
            if background and kind != "task_notification":
                continue  # (told with its result, from its notification)
            self.state.announced.add(task_id)
            told = f"◆ {task_id} {event.get('status')}: {event.get('summary') or ''}".rstrip()
            if background:
                found = RESULT.search(str(event.get("notification") or ""))
                result = html.unescape(found.group(1)).strip() if found else ""
                first = result.splitlines()[0][:200] if result else ""
                told += f" (in the background: {first}; /fg {task_id})"
            click.echo(told)


async def _repl(chat: Chat) -> None:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyBindings
    from prompt_toolkit.patch_stdout import patch_stdout

    bindings = KeyBindings()

    @bindings.add("c-b")
    def _ctrl_b(event: Any) -> None:
        now = time.monotonic()
        if now - chat.state.last_ctrl_b <= DOUBLE_PRESS_S:
            chat.state.last_ctrl_b = 0.0
            chat.background()
        else:
            chat.state.last_ctrl_b = now

    @bindings.add("c-c")
    def _ctrl_c(event: Any) -> None:
        if chat.state.current is not None:
            chat.stop_turn()
        else:
            event.app.current_buffer.reset()

    session: PromptSession[str] = PromptSession(key_bindings=bindings)

    async def watch() -> None:
        while True:
            chat.pump()
            chat.notifications()
            await asyncio.sleep(POLL_S)

    with patch_stdout(raw=True):
        watcher = asyncio.ensure_future(watch())
        click.echo(f"shoal chat on team {chat.team}: /help for the commands, Ctrl+D to leave")
        chat.start_holding()
        try:
            while True:
                try:
                    line = await session.prompt_async("› ")
                except EOFError:
                    break
                try:
                    if not chat.handle(line):
                        break
                except ShoalError as exc:
                    click.echo(f"shoal: {exc}")
        finally:
            watcher.cancel()
            chat.stop_holding()
    if chat.state.current is not None:
        record = chat.record(chat.state.current) or {}
        if record.get("status") == "running":
            chat.move(chat.state.current, background=True)
            click.echo(f"{chat.state.current} goes on in the background (shoal ps)")


@click.command()
@click.option("--model", default=None, help="anthropic:NAME, openai:NAME, scripted:FILE, ...")
@click.option(
    "--model-idle",
    type=DURATION,
    default=None,
    help="Fail a model request whose server sends no bytes for DURATION (default: "
    "model_idle_s in config.toml, else 120).",
)
@click.option(
    "--coordinator/--no-coordinator",
    default=None,
    help="Coordinator mode (default: $SHOAL_COORDINATOR_MODE).",
)
@click.option(
    "--github-api",
    default=None,
    metavar="URL",
    help="A coordinator's GitHub REST API for subscribe_pr_activity, e.g. GitHub Enterprise's "
    "https://HOST/api/v3 (default: github_api in config.toml, else https://api.github.com).",
)
@click.option(
    "--permission-mode",
    default=None,
    type=click.Choice(["default", "acceptEdits", "plan", "bypassPermissions"]),
    help="What the session's agent may do without asking.",
)
@click.option(
    "--backend",
    default="in-process",
    type=click.Choice(["process", "in-process"]),
    help="Where the session's agent runs (default: inside the leader).",
)
@click.option("--cwd", default=None, type=click.Path(file_okay=False), help="Working directory.")
@click.option(
    "--resume",
    "resume",
    default=None,
    metavar="ID",
    help="Continue the conversation of agent task ID (it keeps its stored mode).",
)
@trust_option
@common_options
def chat(
    model: str | None,
    model_idle: float | None,
    coordinator: bool | None,
    github_api: str | None,
    permission_mode: str | None,
    backend: str,
    cwd: str | None,
    resume: str | None,
    trust_run: bool,
) -> None:
    """An interactive session with an agent (or, with --coordinator, a coordinator).

    Lines go to the agent; its transcript and the ends of other tasks print as they come.
    Ctrl+B twice moves the running query to the background; /fg ID, /stop ID, /tasks.
    """
    import sys

    from shoal.workers.agent.coordinator.mode import env_mode
    from shoal.workers.agent.models import ModelSpec

    if not sys.stdin.isatty():
        raise UsageError("shoal chat needs a terminal; use `shoal agent PROMPT` in scripts")
    if model is not None:
        ModelSpec.parse(model)
    env = get_env(click.get_current_context())
    spec: dict[str, Any] = {
        "model": model,
        "agent_type": None,
        "backend": backend,
        "cwd": os.path.abspath(cwd) if cwd else os.getcwd(),
        "permission_mode": permission_mode,
        "coordinator": coordinator if coordinator is not None else env_mode(os.environ),
        "main_session": True,
    }
    if model_idle is not None:
        spec["model_idle_s"] = model_idle
    if github_api is not None:
        from shoal.workers.agent.github import check_api_url

        spec["github_api"] = check_api_url(github_api)
    from shoal.core.trust import AGENT_SOURCES

    if settle(env.layout.home, Path(spec["cwd"]), AGENT_SOURCES, trust_run):
        spec["trust"] = True
    session = Chat(env, env.team(), spec)
    if resume is not None:
        from shoal.workers.agent.coordinator.mode import mode_message

        record = session.record(resume)
        if record is None or record.get("type") != "local_agent":
            raise UsageError(f"no agent task {resume} in this session (see `shoal ps --all`)")
        asked = coordinator if coordinator is not None else env_mode(os.environ)
        said = mode_message(bool(record.get("coordinator")), asked)
        if said and (coordinator is not None or env_mode(os.environ)):
            click.echo(f"shoal: {said}", err=True)
        session.follow(resume, from_start=True)
    asyncio.run(_repl(session))
