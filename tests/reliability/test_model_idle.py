"""A model call cannot hang silently: through a real leader, a real runner process and the
providers' real SDKs against a loopback server speaking their streaming wire format, a server
that sends no bytes for `model_idle_s` ends the attempt, the SDK's retries (or, once the
stream has begun, shoal's) run, and the task fails naming the model, its server and the idle
seconds. A server that keeps sending, however slowly in all, is not cut off; and while a
request is out, the agent's progress says how long it has waited for the model."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.polling import wait_until
from tests.support.stall_server import Mode, StallServer, env_for

TEAM = "idle"
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}
PROVIDERS = ["anthropic", "openai"]


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


@pytest.fixture
def servers() -> Iterator[list[StallServer]]:
    started: list[StallServer] = []
    yield started
    for server in started:
        server.close()


def start_agent(
    cli: Cli, provider: str, server: StallServer, *flags: str, backend: str = "process"
) -> str:
    pairs = [f"--env={k}={v}" for k, v in env_for(provider, server.url).items()]
    out = cli("agent", "--team", TEAM, "--model", f"{provider}:test-model", "--backend",
              backend, *pairs, *flags, "say hello")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def record(cli: Cli, task_id: str) -> dict[str, Any]:
    rows = json.loads(cli("ps", "--team", TEAM, "--all", "--json").stdout)
    task: dict[str, Any] = next(t for t in rows if t["id"] == task_id)
    return task


def outcome(cli: Cli, task_id: str) -> dict[str, Any]:
    """The task's record once `shoal wait` has seen it end (its end event, not a sleep)."""
    done = cli("wait", "--team", TEAM, task_id, "--timeout", "60", timeout=90)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # (124: it never ended)
    return record(cli, task_id)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("mode", ["silent", "stalls"])
def test_a_server_that_goes_quiet_fails_the_agent_naming_the_idle_timeout(
    leader: Cli, home: Path, servers: list[StallServer], provider: str, mode: Mode
) -> None:
    server = StallServer(mode)
    servers.append(server)
    if mode == "silent":  # (one case set in config.toml, the other by the flag)
        (home / "config.toml").write_text("model_idle_s = 1\n")
        task_id = start_agent(leader, provider, server)
    else:
        task_id = start_agent(leader, provider, server, "--model-idle", "1")
    task = outcome(leader, task_id)
    assert task["status"] == "failed", task
    error = task["error"]
    assert f"model {provider}:test-model at http://127.0.0.1:" in error, error
    assert "sent no bytes for 1s" in error and "model_idle_s" in error, error
    # Three tries: the SDK's own retries before a response, shoal's once the stream began.
    assert server.requests == 3, server.requests
    assert "sent no bytes for 1s" in Path(task["output_file"]).read_text()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_slow_answer_that_keeps_sending_is_not_cut_off(
    leader: Cli, servers: list[StallServer], provider: str
) -> None:
    # ~10 events 0.3 s apart: the answer takes longer than the idle timeout, no gap does.
    server = StallServer("trickles", answer="slow but steady", gap=0.3)
    servers.append(server)
    task_id = start_agent(leader, provider, server, "--model-idle", "2", backend="in-process")
    task = outcome(leader, task_id)
    assert task["status"] == "completed", task
    assert task["result"] == "slow but steady"
    assert server.requests == 1


WAIT = re.compile(r"\[waiting for the model for (\d+) s\]")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_while_a_request_is_out_progress_says_how_long_it_has_waited(
    leader: Cli, servers: list[StallServer], provider: str
) -> None:
    server = StallServer("held", answer="worth the wait")
    servers.append(server)
    backend = "process" if provider == "anthropic" else "in-process"  # (both status paths)
    task_id = start_agent(leader, provider, server, backend=backend)
    seen: list[int] = []

    def waited(at_least: int) -> bool:
        line = next(
            (ln for ln in leader("ps", "--team", TEAM).stdout.splitlines() if task_id in ln), ""
        )
        found = WAIT.search(line)
        if found:
            seen.append(int(found.group(1)))
        return found is not None and int(found.group(1)) >= at_least

    wait_until(lambda: waited(1), timeout=30, what=lambda: f"a wait in ps (saw {seen})")
    first = seen[-1]
    wait_until(lambda: waited(first + 1), timeout=30, what=lambda: f"the wait to grow ({seen})")
    server.release()
    task = outcome(leader, task_id)
    assert task["status"] == "completed" and task["result"] == "worth the wait", task
    assert not WAIT.search(leader("ps", "--team", TEAM, "--all").stdout)  # (ended: no wait)
    # Each renewal is one progress event at most, never a stream of them.
    out = leader("events", "--team", TEAM, "--json")
    summaries = [
        e.get("summary")
        for e in map(json.loads, out.stdout.splitlines())
        if e.get("task_id") == task_id and "waiting for the model" in str(e.get("summary"))
    ]
    assert summaries, "no progress event told of the wait"
    assert len(summaries) == len(set(summaries)), summaries
