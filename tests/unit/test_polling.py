"""The tests' polling helper: returns what the condition gave, fails naming what it waited for."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from tests.polling import describe, poll, wait_until, wait_until_async


def test_returns_the_first_truthy_value() -> None:
    calls: list[int] = []

    def third() -> int | None:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else None

    assert wait_until(third, timeout=5, interval=0) == 3


def test_the_failure_names_what_was_waited_for() -> None:
    got: list[int] = []
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for len\(got\) == 2$"):
        wait_until(lambda: len(got) == 2, timeout=0.05)
    with pytest.raises(AssertionError, match=r"waiting for the reader to stop$"):
        wait_until(lambda: False, timeout=0.01, what="the reader to stop")
    seen = ["a", "b"]
    with pytest.raises(AssertionError, match=r"waiting for c among \['a', 'b'\]$"):
        wait_until(lambda: "c" in seen, timeout=0.01, what=lambda: f"c among {seen}")


def test_conditions_are_described_readably(tmp_path: Path) -> None:
    def ready(name: str) -> bool:
        return False

    assert describe(functools.partial(ready, "bob")) == "ready('bob')"
    assert describe(ready) == "ready()"
    assert describe(tmp_path.exists) == f"{tmp_path!r}.exists()"


def test_poll_leaves_the_timeout_to_the_caller() -> None:
    assert poll(lambda: None, timeout=0.02) is None
    assert poll(lambda: "here", timeout=0.02) == "here"


def test_async_waits_let_the_loop_run() -> None:
    async def main() -> str:
        box: list[str] = []
        asyncio.get_running_loop().call_later(0.05, box.append, "done")
        return await wait_until_async(lambda: box[0] if box else None, timeout=5)

    assert asyncio.run(main()) == "done"
    with pytest.raises(AssertionError, match=r"waiting for nothing$"):
        asyncio.run(wait_until_async(lambda: False, timeout=0.01, what="nothing"))
