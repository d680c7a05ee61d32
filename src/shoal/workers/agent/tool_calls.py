"""How a model's tool call runs: its arguments validated (bad ones are a retry prompt), the
permission gate asked, the file tools kept in the order the model called them and run on a
thread of their own off the event loop, and a failure shoal can name returned to the model as
a tool error. `make_tools` turns a workspace's handlers into pydantic-ai tools this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.core.errors import ShoalError
from shoal.workers.agent.tool_args import (
    FILE_TOOLS,
    TOOL_SPECS,
    ToolFailure,
    parse_args,
    schema_of,
    tool_error,
)
from shoal.workers.agent.tools import Workspace

if TYPE_CHECKING:
    from pydantic_ai import Tool

T = TypeVar("T")


async def off_loop(call: Callable[[], T]) -> T:
    """`call()` on a daemon thread of its own, awaited: a slow file system stalls only the
    agent whose call it is, and a cancel (`stop`) ends the wait at once. The thread is left
    to finish on its own (a daemon, so it never holds the process open at exit)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.done():  # (cancelled meanwhile)
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)  # type: ignore[arg-type]

    def work() -> None:
        try:
            value, error = call(), None
        except BaseException as exc:  # (handed to the awaiting coroutine)
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile)
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name="agent-file-tool", daemon=True).start()
    return await done


class InOrder:
    """One agent's tool calls of a turn, kept in the order the model made them where a file
    tool is involved: a call starts its work only once every file tool call made before it
    has finished (a Write, then a Bash that reads the file, see the file written), as when
    the file tools ran on the event loop itself. Commands do not wait for one another (two
    Bash calls of one turn still run side by side)."""

    def __init__(self) -> None:
        self._earlier: list[asyncio.Future[None]] = []  # the file tool calls not yet done

    def take(
        self, file_tool: bool
    ) -> tuple[list[asyncio.Future[None]], asyncio.Future[None] | None]:
        """(the file tool calls to wait for, this call's own end when it is one). Taken
        before the call's first await, so the order is the order the calls were made in."""
        self._earlier = [f for f in self._earlier if not f.done()]
        earlier = list(self._earlier)
        mine: asyncio.Future[None] | None = None
        if file_tool:
            mine = asyncio.get_running_loop().create_future()
            self._earlier.append(mine)
        return earlier, mine

    @staticmethod
    def done(mine: asyncio.Future[None] | None) -> None:
        if mine is not None and not mine.done():
            with contextlib.suppress(RuntimeError):  # (its loop closed meanwhile)
                mine.set_result(None)


def tool_function(
    handlers: Sequence[Any],
    name: str,
    model: Any,
    gate: Any = None,
    in_order: InOrder | None = None,
) -> Callable[..., Any]:
    """The function pydantic-ai calls for tool `name`: validates, runs, turns a ToolFailure
    (or a refusal of shoal's: a missing list task, a stopped leader) into a tool error and bad
    arguments into a retry prompt."""
    from pydantic_ai import ModelRetry

    handler = next(getattr(h, name.lower()) for h in handlers if hasattr(h, name.lower()))

    file_tool = name in FILE_TOOLS and not inspect.iscoroutinefunction(handler)

    async def run(**kwargs: Any) -> str:
        earlier, mine = (in_order or InOrder()).take(file_tool)
        try:
            try:
                args = parse_args(model, kwargs)
            except ValueError as exc:
                raise ModelRetry(f"{name}: {exc}") from None
            if gate is not None:
                await gate.check(name, kwargs)
            if earlier:
                await asyncio.wait(earlier)
            if file_tool:
                result = await off_loop(functools.partial(handler, args))
            else:
                result = handler(args)
            if asyncio.iscoroutine(result):
                result = await result
        except (ToolFailure, ShoalError) as exc:
            return tool_error(str(exc))
        except OSError as exc:
            return tool_error(f"{name}: {exc}")
        finally:
            InOrder.done(mine)
        return str(result)

    return run


def make_tools(
    workspace: Workspace,
    allowed: Sequence[str] | None = None,
    team: Any = None,
    gate: Any = None,
) -> list[Tool[Any]]:
    """pydantic-ai tools: the file tools, the team tools when `team` (a TeamTools) is given,
    ExitPlanMode and the permission check when `gate` (a permissions.Gate) is; only the
    `allowed` ones, when given."""
    from pydantic_ai import Tool

    from shoal.workers.agent.permissions import PLAN_TOOL_SPECS
    from shoal.workers.agent.team_tools import TEAM_TOOL_SPECS

    specs = [
        *TOOL_SPECS,
        *(TEAM_TOOL_SPECS if team is not None else ()),
        *(PLAN_TOOL_SPECS if gate is not None else ()),
    ]
    handlers = [workspace, *([team] if team is not None else []), *([gate] if gate else [])]
    in_order = InOrder()
    return [
        Tool.from_schema(
            tool_function(handlers, name, model, gate, in_order), name, text, schema_of(model)
        )
        for name, model, text in specs
        if allowed is None or name in allowed
    ]
