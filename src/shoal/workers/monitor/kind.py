"""`monitor_mcp` tasks: a long-lived MCP client that writes what a server says, one line each.

The monitor is a process of its own (`python -m shoal.workers.monitor.kind`), started by the
leader in a session of its own with its output file as stdout, so that a server that hangs or
crashes takes nothing else with it. It connects to one stdio server of an MCP config
(`{"mcpServers": {name: {command, args, env}}}`), subscribes to the server's resources when it
offers subscriptions, and writes every server notification, resource update and (with
`--tool NAME --every S`) every result of a periodic tool call as one JSON line:

    {"ts": 1796352913.93, "kind": "notification", "method": "notifications/message", ...}

SIGTERM closes the session politely (the SDK ends the server's stdin and waits for it) and
exits 0; a server that exits, or stops answering pings, ends the monitor with exit 1 and a
last line naming it with the tail of its stderr. Monitors are exempt from the stall watchdog:
the leader's kind below never asks them about prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from shoal.core.errors import UsageError
from shoal.core.events import task_started
from shoal.core.procs import find_by_stdout, is_alive
from shoal.core.tasks import (
    STOPPED_ON_REQUEST,
    AnyTaskState,
    MonitorMcpTaskState,
    TaskStatus,
    TaskType,
    new_task_id,
)
from shoal.workers.kinds import TaskStore, end_unannounced
from shoal.workers.process_kind import ProcessKind, spawn_logged
from shoal.workers.shell.process import ShellProcess

PING_EVERY_S: Final = 2.0
PING_TIMEOUT_S: Final = 10.0
# How a hung server (alive, but silent) is told from one that went away.
HUNG: Final = "the server hung"
START_TIMEOUT_S: Final = 30.0
STDERR_TAIL: Final = 600
EXIT_SERVER_GONE: Final = 1


# --------------------------------------------------------------------------- the process


def _line(kind: str, **fields: Any) -> None:
    sys.stdout.buffer.write(
        orjson.dumps(
            {"ts": round(time.time(), 3), "kind": kind, **fields},
            option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS,
        )
    )
    sys.stdout.flush()


def _tail(errlog: Any) -> str:
    errlog.flush()
    errlog.seek(0)
    text = " | ".join(line.strip() for line in errlog.read().splitlines() if line.strip())
    return text[-STDERR_TAIL:]


def _why(exc: BaseException) -> str:
    """An error in one line: the first real exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _dump(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else obj


def _result_text(result: Any) -> str:
    parts = []
    for item in getattr(result, "content", None) or ():
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')}]")
    return "\n".join(parts)


async def _monitor(args: argparse.Namespace) -> int:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from shoal.workers.agent.mcp_tools import load_config, server_environment

    servers = load_config(Path(args.config))
    server = servers.get(args.server)
    if server is None:
        _line("error", message=f"no server {args.server!r} in {args.config}")
        return 2
    tool_args = orjson.loads(args.args) if args.args else {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    broken: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):
            broken.append(f"{type(message).__name__}: {message}")
            stop.set()
            return
        method = getattr(message, "method", type(message).__name__)
        params = _dump(getattr(message, "params", None))
        if method == "notifications/resources/updated":
            _line("resource-updated", uri=(params or {}).get("uri"), params=params)
        else:
            _line("notification", method=method, params=params)

    async def on_log(params: Any) -> None:
        return None  # (logging notifications reach on_message too: written once, there)

    params = StdioServerParameters(
        command=server.command,
        args=server.args,
        env=server_environment(os.environ, server.env),
        cwd=args.cwd or os.getcwd(),
    )
    with tempfile.TemporaryFile("w+", errors="replace") as errlog:
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(START_TIMEOUT_S):
                    read, write = await stack.enter_async_context(stdio_client(params, errlog))
                    session = await stack.enter_async_context(
                        ClientSession(
                            read, write, message_handler=on_message, logging_callback=on_log
                        )
                    )
                    init = await session.initialize()
                info = _dump(getattr(init, "server_info", None))
                _line("connected", server=args.server, server_info=info)
                await _subscribe(session, init)
                await _watch(session, stop, args.tool, tool_args, args.every, broken)
        except Exception as exc:  # the server went away (or never came): said, with its stderr
            broken.append(_why(exc))
        if broken:
            _line(
                "server-exited",
                server=args.server,
                error=broken[0],
                stderr=_tail(errlog),
                hung=broken[0].startswith(HUNG),
            )
            return EXIT_SERVER_GONE
    _line("closed", server=args.server)
    return 0


async def _subscribe(session: Any, init: Any) -> None:
    """Subscribe to every resource, when the server offers resource subscriptions."""
    from mcp.shared.exceptions import MCPDeprecationWarning

    caps = getattr(init, "capabilities", None)
    resources = getattr(caps, "resources", None)
    if resources is None or not getattr(resources, "subscribe", False):
        return
    try:
        listed = await session.list_resources()
    except Exception as exc:
        _line("subscribe-error", error=f"could not list resources: {exc}")
        return
    for resource in listed.resources:
        uri = str(resource.uri)
        try:
            # The session speaks a handshake-era version (initialize), where resources/subscribe
            # is the way; the SDK's warning that 2026-07-28 removed it is shown by default, and
            # on our stderr (the output file) it would be lines that are not JSON.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await session.subscribe_resource(uri)
        except Exception as exc:
            _line("subscribe-error", uri=uri, error=str(exc))
        else:
            _line("subscribed", uri=uri)


async def _watch(
    session: Any,
    stop: asyncio.Event,
    tool: str | None,
    tool_args: dict[str, Any],
    every: float,
    broken: list[str],
) -> None:
    """Until stopped: call the tool every `every` s (if any) and ping the server, so a server
    that died or hangs is noticed."""
    next_call = time.monotonic()
    next_ping = time.monotonic() + PING_EVERY_S
    calls = 0
    while not stop.is_set():
        now = time.monotonic()
        if tool is not None and now >= next_call:
            calls += 1
            next_call = now + every
            try:
                async with asyncio.timeout(PING_TIMEOUT_S + every):
                    result = await session.call_tool(tool, tool_args)
            except TimeoutError:
                _line("tool-error", tool=tool, call=calls, error="no answer in time")
            except Exception as exc:
                _line("tool-error", tool=tool, call=calls, error=f"{type(exc).__name__}: {exc}")
            else:
                kind = "tool-error" if getattr(result, "is_error", False) else "tool-result"
                _line(
                    kind,
                    tool=tool,
                    call=calls,
                    text=_result_text(result),
                    structured=_dump(getattr(result, "structured_content", None)),
                )
        if now >= next_ping:
            next_ping = now + PING_EVERY_S
            try:
                async with asyncio.timeout(PING_TIMEOUT_S):
                    await session.send_ping()
            except TimeoutError:
                broken.append(f"{HUNG} (no answer to a ping in {PING_TIMEOUT_S:g}s)")
                return
            except Exception as exc:
                broken.append(f"the server stopped answering: {type(exc).__name__}: {exc}")
                return
        wait = min(next_ping, next_call if tool is not None else next_ping) - time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.01, wait))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shoal.workers.monitor.kind")
    parser.add_argument("--config", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--tool", default=None)
    parser.add_argument("--every", type=float, default=60.0)
    parser.add_argument("--args", default=None)
    parser.add_argument("--cwd", default=None)
    args = parser.parse_args(argv)
    try:
        code = asyncio.run(_monitor(args))
    except UsageError as exc:
        _line("error", message=str(exc))
        code = 2
    sys.exit(code)


# --------------------------------------------------------------------------- the request


def check_monitor(config: Path, server: str, tool: str | None, every: float | None) -> None:
    """Refuse, before a task exists: a config that does not load, an unknown server name
    (listing the known ones), `--every` without `--tool`, a period that is not positive."""
    from shoal.workers.agent.mcp_tools import load_config

    servers = load_config(config)
    if server not in servers:
        known = ", ".join(sorted(servers)) or "none"
        raise UsageError(f"no MCP server {server!r} in {config} (it has: {known})")
    if every is not None and tool is None:
        raise UsageError("--every goes with --tool (the tool to call every S seconds)")
    if every is not None and every <= 0:
        raise UsageError(f"--every must be a positive number of seconds, not {every:g}")


def new_monitor_task(
    output_file: Callable[[str], Path],
    *,
    server: str,
    config: str,
    tool: str | None = None,
    every: float | None = None,
    args: dict[str, Any] | None = None,
    cwd: str | None = None,
) -> MonitorMcpTaskState:
    """A pending `monitor_mcp` task (`m...`), checked (see check_monitor)."""
    check_monitor(Path(config), server, tool, every)
    task_id = new_task_id(TaskType.MONITOR_MCP)
    return MonitorMcpTaskState(
        id=task_id,
        description=f"monitor {server}" + (f" ({tool} every {every or 60:g}s)" if tool else ""),
        output_file=str(output_file(task_id)),
        server_name=server,
        target=tool,
        config_path=config,
        every_s=every or (60.0 if tool else None),
        tool_args=args or {},
        cwd=cwd,
    )


# --------------------------------------------------------------------------- the kind


@dataclass
class _Live:
    """What the kind holds in memory about one running monitor."""

    task_id: str
    proc: ShellProcess
    size: int = 0  # bytes of its output read (whole lines)
    code: int | None = None  # its exit code, once reaped (-N after signal N)


class MonitorKind(ProcessKind[_Live]):
    """The TaskKind of `monitor_mcp` tasks: one monitor process each."""

    types = frozenset({TaskType.MONITOR_MCP})

    def __init__(self) -> None:
        self.procs: dict[str, _Live] = {}
        super().__init__(self.procs)

    def start(self, task: AnyTaskState, store: TaskStore) -> None:
        assert isinstance(task, MonitorMcpTaskState)
        argv = [
            sys.executable,
            "-m",
            "shoal.workers.monitor.kind",
            "--config",
            task.config_path or "",
            "--server",
            task.server_name,
        ]
        if task.target:
            argv += ["--tool", task.target, "--every", f"{task.every_s or 60:g}"]
            argv += ["--args", orjson.dumps(task.tool_args).decode()]
        if task.cwd:
            argv += ["--cwd", task.cwd]
        if not store.write_ahead(task.id):
            store.emit(task_started(store.get(task.id) or task))
            return
        try:
            proc = spawn_logged(argv, dict(store.environ), task.output_file)
        except OSError as exc:
            store.move_task(task.id, TaskStatus.FAILED, error=f"could not start the monitor: {exc}")
            store.emit(task_started(store.get(task.id) or task))
            return
        self._running(
            task, _Live(task.id, proc), store, pid=proc.pid, pid_started_at=proc.started_at
        )

    def _is_done(self, task_id: str, run: _Live) -> bool:
        return self._done_with(task_id, alive=not self._gone(run))

    def _settle_run(self, task_id: str, run: _Live, store: TaskStore) -> None:
        self._settle(run, store)

    def _poll_output(self, ids: list[str], store: TaskStore, now: float) -> None:
        for task_id in ids:
            self._read(task_id, store)

    # (never asked about stalls: a monitor is quiet by nature)

    def kill(self, task: AnyTaskState, store: TaskStore, reason: str) -> None:
        live = self.procs.get(task.id)
        if live is None:
            store.move_task(task.id, TaskStatus.KILLED, error=reason, kill_reason=reason)
            self._quietly(task.id, store, reason)
            return
        store.set_task(task.id, kill_reason=reason)
        if task.id not in self.killing:
            self._begin_kill(task.id, live.proc, store)
        self._news.add(task.id)  # (looked at in the next quick pass: it may be gone already)

    def adopt(self, task: AnyTaskState, store: TaskStore) -> None:
        """A monitor a crashed leader left running is taken back; one that ended meanwhile
        is settled from its last line."""
        assert isinstance(task, MonitorMcpTaskState)
        if task.is_terminal or task.status == TaskStatus.PENDING:
            return
        if task.pid is None:  # (written ahead as running; its leader died before the pid)
            found = find_by_stdout(task.output_file, since=task.start_time or 0.0)
            if found is None:
                store.move_task(
                    task.id,
                    TaskStatus.FAILED,
                    error="its leader stopped while starting it, and it was not started again",
                )
                return
            store.set_task(task.id, pid=found[0], pid_started_at=found[1])
            task = store.get(task.id) or task
            assert isinstance(task, MonitorMcpTaskState) and task.pid is not None
        proc = ShellProcess(task.pid, task.pid_started_at, child=False)
        live = _Live(task.id, proc, size=_size(Path(task.output_file)))
        self.procs[task.id] = live
        if is_alive(task.pid, task.pid_started_at):
            store.watch_pid(task.id, task.pid)
        else:
            self._settle(live, store)

    def notification(self, task: AnyTaskState) -> dict[str, Any]:
        return {}

    def _process(self, run: _Live) -> ShellProcess:
        return run.proc

    def running(self) -> int:
        return 0  # (a monitor holds no job slot: it waits on a server, not on a CPU)

    # -- helpers ---------------------------------------------------------------------------

    def _gone(self, live: _Live) -> bool:
        """Whether the monitor's process has ended (reaping it, with its exit code, when it
        is our child)."""
        proc = live.proc
        if proc.child:
            try:
                pid, status = os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            live.code = os.waitstatus_to_exitcode(status)
            return True
        return not is_alive(proc.pid, proc.started_at)

    def _read(self, task_id: str, store: TaskStore) -> None:
        live = self.procs.get(task_id)
        task = store.get(task_id)
        if live is None or not isinstance(task, MonitorMcpTaskState):
            return
        path = Path(task.output_file)
        size = _size(path)
        if size <= live.size:
            return
        with open(path, "rb") as fh:
            fh.seek(live.size)
            chunk = fh.read(size - live.size)
        whole = chunk[: chunk.rfind(b"\n") + 1]
        live.size += len(whole)
        lines = [line for line in whole.splitlines() if line.strip()]
        events = 0
        error = task.error
        for line in lines:
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict) and record.get("kind") in (
                    "notification",
                    "resource-updated",
                    "tool-result",
                    "tool-error",
                ):
                    events += 1
                if isinstance(record, dict) and record.get("kind") == "tool-error":
                    error = f"{record.get('tool')}: {record.get('error') or record.get('text')}"
        if events:
            store.set_task(
                task_id,
                event_count=task.event_count + events,
                last_event_at=time.time(),
                error=error,
            )

    def _settle(self, live: _Live, store: TaskStore) -> None:
        self._forget(live.task_id, store)
        self._read_rest(live, store)
        task = store.get(live.task_id)
        if not isinstance(task, MonitorMcpTaskState) or task.is_terminal:
            return
        last = _last_record(Path(task.output_file))
        if task.kill_reason:
            store.move_task(task.id, TaskStatus.KILLED, error=task.kill_reason)
            self._quietly(task.id, store, task.kill_reason)
            return
        if last.get("kind") == "server-exited":
            how = "hung" if last.get("hung") else "exited"
            why = f"MCP server {task.server_name} {how}: {last.get('error')}"
            if last.get("stderr"):
                why += f" (its stderr: {last['stderr']})"
            store.move_task(task.id, TaskStatus.FAILED, error=why)
        elif last.get("kind") == "error":
            store.move_task(task.id, TaskStatus.FAILED, error=str(last.get("message")))
        elif live.code == 0 or last.get("kind") == "closed":
            store.move_task(task.id, TaskStatus.COMPLETED)
        else:
            how = f"exit code {live.code}" if live.code is not None else "no exit status"
            store.move_task(task.id, TaskStatus.FAILED, error=f"the monitor ended ({how})")

    def _read_rest(self, live: _Live, store: TaskStore) -> None:
        self.procs[live.task_id] = live
        try:
            self._read(live.task_id, store)
        finally:
            self.procs.pop(live.task_id, None)

    def _quietly(self, task_id: str, store: TaskStore, reason: str) -> None:
        """A stop the user asked for is not news (no notification), as for shells."""
        if reason == STOPPED_ON_REQUEST:
            end_unannounced(store, task_id)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _last_record(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, _size(path) - 8192))
            lines = [line for line in fh.read().splitlines() if line.strip()]
    except OSError:
        return {}
    for line in reversed(lines):
        with contextlib.suppress(orjson.JSONDecodeError):
            record = orjson.loads(line)
            if isinstance(record, dict):
                return record
    return {}


if __name__ == "__main__":
    main()
