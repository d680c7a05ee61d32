"""MCP tools for an agent: stdio servers from `.shoal/mcp.json` (in the agent's working
directory) or `--mcp-config FILE`, in the format Claude Code users have:

    {"mcpServers": {"time": {"command": "mcp-server-time", "args": [], "env": {}}}}

The project's file is used only when the project is trusted (core/trust.py); `--mcp-config`
is the user's own choice. A server gets a scrubbed environment (the mcp SDK's allow-list,
the locale, time zone and temp dir, and what its config names), never the agent's API keys.
Each server's tools are offered to the model as `mcp__{server}__{tool}` through the mcp SDK's
stdio client. A server that cannot start is noted in the agent's output and its tools are left
out; one that fails or exits during a call gives that call a tool error. Either way the note
carries the last lines the server wrote to its stderr. Never a crash.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoal.core.errors import UsageError
from shoal.core.sandbox import Policy, wrapper_argv
from shoal.core.trust import ProjectView
from shoal.core.validation import first_error

if TYPE_CHECKING:
    from pydantic_ai import Tool

PROJECT_CONFIG: Final = Path(".shoal") / "mcp.json"
SERVER_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
START_TIMEOUT_S: Final = 30.0
CALL_TIMEOUT_S: Final = 120.0
STDERR_TAIL_CHARS: Final = 500

Guard = Callable[[str, Callable[[], Awaitable[str]]], Awaitable[str]]
"""Wraps one tool call: (the tool's name, the call) -> its result."""
Check = Callable[[str, dict[str, Any]], Awaitable[None]]
"""The permission check before a call: (the tool's name, its arguments); raises a
ToolFailure (the call's tool error) when the call may not run."""


class McpServer(BaseModel):
    """How to start one stdio MCP server."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


def load_config(path: Path) -> dict[str, McpServer]:
    """The servers of an MCP config file; a UsageError naming the file and what is wrong."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"MCP config {path} not found") from None
    except OSError as exc:
        raise UsageError(f"MCP config {path}: {exc}") from None
    return parse_config(data, path)


def parse_config(data: bytes, path: Path) -> dict[str, McpServer]:
    """The servers of the MCP config `data` (read from `path`, which errors name)."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"MCP config {path}: {exc}") from None
    servers = raw.get("mcpServers") if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise UsageError(f'MCP config {path}: no "mcpServers" object')
    found: dict[str, McpServer] = {}
    for name, spec in servers.items():
        if not SERVER_NAME.fullmatch(name):
            raise UsageError(f"MCP config {path}: bad server name {name!r} (letters, digits, _-)")
        try:
            found[name] = McpServer.model_validate(spec)
        except ValidationError as exc:
            where = first_error(exc, "server")
            raise UsageError(f"MCP config {path}: {name}.{where}") from None
    return found


def find_config(project: ProjectView, explicit: str | None) -> dict[str, McpServer]:
    """`--mcp-config FILE` if given (the user's choice), else the project's `.shoal/mcp.json`
    when `project` lets this run use it (trusted), as it was when its trust was decided."""
    if explicit:
        return load_config(Path(explicit))
    data = project.data(PROJECT_CONFIG.as_posix())
    return parse_config(data, project.directory / PROJECT_CONFIG) if data is not None else {}


PASSED_ENV: Final = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
"""Passed to a server beside the mcp SDK's allow-list: locale, time zone, temp dir."""


def server_environment(env: Mapping[str, str], named: Mapping[str, str]) -> dict[str, str]:
    """A server's environment: from `env`, only the mcp SDK's default allow-list (PATH, HOME,
    USER, ...) and PASSED_ENV, then what its config names; never the rest (API keys)."""
    from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS

    chosen = {
        k: env[k]
        for k in (*DEFAULT_INHERITED_ENV_VARS, *PASSED_ENV)
        if k in env and not env[k].startswith("()")  # (as the SDK: no shell functions)
    }
    return {**chosen, **named}


def _text_of(result: Any) -> str:
    parts = []
    for item in getattr(result, "content", None) or ():
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured))
    return "\n".join(parts) or "(no content)"


async def open_servers(
    servers: dict[str, McpServer],
    stack: contextlib.AsyncExitStack,
    env: Mapping[str, str],
    cwd: Path,
    note: Callable[[str], None],
    guard: Guard | None = None,
    sandbox: Policy | None = None,
    check: Check | None = None,
) -> list[Tool[Any]]:
    """Start every server inside `stack` and return their tools (a failed one is noted).
    `guard`, when given, wraps every call (a worker's lease check: what the server changed
    outside the worker's write set is reported with the result); `check` comes first (the
    agent's permission mode: an MCP tool asks, or is refused, as Bash is). With `sandbox`
    each server runs confined to that policy, as the agent's commands do."""
    import asyncio

    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from pydantic_ai import Tool

    from shoal.workers.agent.tool_args import tool_error

    tools: list[Tool[Any]] = []
    for name, spec in servers.items():
        argv = [spec.command, *spec.args]
        if sandbox is not None:  # (the SDK's spawn has no pre-exec hook: the exec wrapper)
            argv = wrapper_argv(sandbox, argv)
        params = StdioServerParameters(
            command=argv[0], args=argv[1:], env=server_environment(env, spec.env), cwd=cwd
        )
        inner = contextlib.AsyncExitStack()
        # (closed with the server's stack: the stderr it wrote, for the notes of its failures)
        errlog = inner.enter_context(tempfile.TemporaryFile("w+", errors="replace"))  # noqa: SIM115
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                read, write = await inner.enter_async_context(stdio_client(params, errlog))
                session = await inner.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listed = await session.list_tools()
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            stderr = _tail(errlog)
            with contextlib.suppress(BaseException):
                await inner.aclose()
            why = f"MCP server {name} could not start ({spec.command}): {_why(exc)}"
            note(f"{why} (its stderr: {stderr})" if stderr else why)
            continue
        stack.push_async_callback(inner.aclose)
        for tool in listed.tools:
            tools.append(
                Tool.from_schema(
                    _caller(session, name, tool.name, tool_error, errlog, guard, check),
                    f"mcp__{name}__{tool.name}",
                    tool.description or "",
                    dict(tool.input_schema or {"type": "object", "properties": {}}),
                )
            )
    return tools


def _tail(errlog: Any) -> str:
    """The last STDERR_TAIL_CHARS of what a server wrote to its stderr, on one line."""
    errlog.flush()
    errlog.seek(0, 2)
    size = errlog.tell()
    errlog.seek(max(0, size - STDERR_TAIL_CHARS * 4))
    text = " ⏎ ".join(line.strip() for line in errlog.read().splitlines() if line.strip())
    return text[-STDERR_TAIL_CHARS:]


def _caller(
    session: Any,
    server: str,
    tool: str,
    tool_error: Callable[[str], str],
    errlog: Any,
    guard: Guard | None,
    check: Check | None = None,
) -> Any:
    import asyncio

    from shoal.workers.agent.tool_args import ToolFailure

    async def call(**kwargs: Any) -> str:
        if check is not None:
            try:
                await check(f"mcp__{server}__{tool}", kwargs)
            except ToolFailure as exc:
                return tool_error(str(exc))
        if guard is None:
            return await plain(**kwargs)
        return await guard(f"mcp__{server}__{tool}", lambda: plain(**kwargs))

    async def plain(**kwargs: Any) -> str:
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                result = await session.call_tool(tool, kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            why = f"MCP server {server} failed during {tool}: {_why(exc)}"
            stderr = _tail(errlog) if not errlog.closed else ""
            return tool_error(f"{why} (its stderr: {stderr})" if stderr else why)
        text = _text_of(result)
        return tool_error(text) if getattr(result, "is_error", False) else text

    return call


def _why(exc: BaseException) -> str:
    """The innermost useful message of an exception (task groups wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
