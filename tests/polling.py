"""Waiting by polling, for every test: check a condition until it holds, never a fixed sleep.

`wait_until` fails the test with what it waited for; `poll` is the same loop for a caller that
handles the timeout itself; `wait_until_async` polls from a coroutine (an asyncio loop or a
textual pilot keeps running between checks).
"""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import textwrap
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: What a wait is for, in a failure message: text, or a function that says it at failure time
#: (so the message can show the last thing seen); None describes the condition itself.
What = str | Callable[[], str] | None


def poll(cond: Callable[[], T | None], timeout: float, interval: float = 0.01) -> T | None:
    """The first truthy value `cond()` returns within `timeout` s, or None once it has passed.

    `cond` is always called at least once, and once more after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def wait_until(
    cond: Callable[[], T | None], timeout: float = 15.0, interval: float = 0.01, what: What = None
) -> T:
    """Poll `cond` until it returns something truthy (returned); fail the test after `timeout` s
    with a message naming `what` it waited for."""
    value = poll(cond, timeout, interval)
    if value is None:
        raise AssertionError(timed_out(cond, timeout, what))
    return value


async def wait_until_async(
    cond: Callable[[], T | None],
    timeout: float = 15.0,
    interval: float = 0.01,
    what: What = None,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """`wait_until` for a coroutine: awaits `sleep(interval)` between checks (asyncio's, or
    e.g. a textual pilot's `pause`, which lets the app process its messages)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(timed_out(cond, timeout, what))
        await sleep(interval)


def timed_out(cond: Callable[[], object], timeout: float, what: What = None) -> str:
    """The failure message of a wait that ran out of time."""
    if what is None:
        said = describe(cond)
    elif isinstance(what, str):
        said = what
    else:
        said = what()
    return f"timed out after {timeout:g}s waiting for {said}"


def describe(cond: Callable[..., object]) -> str:
    """A readable name of a condition: a lambda's expression, a function's or method's name,
    a partial's call."""
    if isinstance(cond, functools.partial):
        args = ", ".join([*map(repr, cond.args), *(f"{k}={v!r}" for k, v in cond.keywords.items())])
        return f"{describe(cond.func).removesuffix('()')}({args})"
    name = getattr(cond, "__name__", None)
    if name is None:
        return repr(cond)
    if name == "<lambda>":
        return _lambda_source(cond) or name
    owner = getattr(cond, "__self__", None)
    if owner is not None and not inspect.ismodule(owner):
        return f"{owner!r}.{name}()"
    return f"{name}()"


def _lambda_source(fn: Callable[..., object]) -> str | None:
    """The body of a lambda as written, or the source line that holds it."""
    try:
        lines, _ = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    source = textwrap.dedent("".join(lines)).strip()
    # The lines may be a fragment of a larger statement (a call's arguments): try it bracketed.
    for attempt in (source, f"({source.rstrip(',')})"):
        try:
            tree = ast.parse(attempt)
        except SyntaxError:
            continue
        bodies = [node.body for node in ast.walk(tree) if isinstance(node, ast.Lambda)]
        if len(bodies) == 1:
            return ast.unparse(bodies[0])
        break
    return source.splitlines()[0]
