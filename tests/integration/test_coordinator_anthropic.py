"""One whole four-phase coordinator run on `anthropic:` models, through the real anthropic SDK,
against a loopback HTTP server speaking the Anthropic Messages wire format (a stand-in for
the service, which cannot be reached from here). The server plays the model: as coordinator
(its system prompt is shoal's coordinator prompt) it researches in parallel, synthesises,
implements with a write set and verifies; as a worker it follows its prompt's first word."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.integration.test_agent_providers import Responder, Server
from tests.integration.test_coordinator import notified_ids
from tests.polling import wait_until

TEAM = "ac"
ENDED = re.compile(r"<task-notification>.*?<status>completed</status>", re.DOTALL)


def _texts(messages: list[dict[str, Any]], role: str) -> list[str]:
    out: list[str] = []
    for message in messages:
        if message["role"] != role:
            continue
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
            continue
        for block in content:
            if block.get("type") == "text":
                out.append(block["text"])
            elif block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    inner = "".join(b.get("text", "") for b in inner if isinstance(b, dict))
                out.append(str(inner))
    return out


def _calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        block
        for m in messages
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_use"
    ]


def _answer(n: int, content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    return {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": "claude-test",
        "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 10},
    }  # fmt: skip


def _use(name: str, args: dict[str, Any], n: int, i: int = 0) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": name, "input": args}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _coordinator(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    messages = body["messages"]
    asked = {c["input"].get("description") for c in _calls(messages) if c["name"] == "Agent"}
    ends = sum(len(ENDED.findall(t)) for t in _texts(messages, "user"))
    if not asked:
        return 200, _answer(n, [
            _text("Phase 1, research in parallel."),
            _use("Agent", {"description": "find divide", "prompt": "Research where divide is"},
                 n, 0),
            _use("Agent", {"description": "run tests", "prompt": "Research the failing test"},
                 n, 1),
        ], "tool_use")  # fmt: skip
    if ends >= 2 and "fix divide" not in asked:
        return 200, _answer(n, [
            _text("Phase 2, synthesis: divide floors with //. Phase 3: fix it."),
            _use("Agent", {"description": "fix divide", "write_set": ["calc/ops.py"],
                           "prompt": "Implement: in calc/ops.py replace `a // b` by `a / b`."}, n),
        ], "tool_use")  # fmt: skip
    if ends >= 3 and "verify" not in asked:
        return 200, _answer(n, [
            _text("Phase 4, verification by a fresh worker."),
            _use("Agent", {"description": "verify", "prompt": "Verify: run the tests"}, n),
        ], "tool_use")  # fmt: skip
    if ends >= 4:
        return 200, _answer(n, [_text("Report: divide fixed and verified.")], "end_turn")
    return 200, _answer(n, [_text("Waiting for the workers.")], "end_turn")


TESTS = f"{sys.executable} -m unittest discover -s tests -t . 2>&1 | tail -1"


def _worker(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    messages = body["messages"]
    prompt = _texts(messages[:1], "user")[0]
    done = len(_calls(messages))
    last = _texts(messages[-1:], "user")[-1] if done else ""
    if prompt.startswith("Research where"):
        steps = [("Grep", {"pattern": "return a", "path": "calc", "output_mode": "content"})]
    elif prompt.startswith("Research the failing"):
        steps = [("Bash", {"command": TESTS})]
    elif prompt.startswith("Implement"):
        steps = [("Read", {"file_path": "calc/ops.py"}),
                 ("Edit", {"file_path": "calc/ops.py", "old_string": "a // b",
                           "new_string": "a / b"})]  # fmt: skip
    else:
        steps = [("Bash", {"command": TESTS})]
    if done < len(steps):
        name, args = steps[done]
        return 200, _answer(n, [_use(name, args, n)], "tool_use")
    return 200, _answer(n, [_text(f"finished: {last.strip()[:200]}")], "end_turn")


def model_server(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    system = body.get("system")
    text = system if isinstance(system, str) else json.dumps(system or "")
    if "You are a coordinator" in text:
        return _coordinator(body, n)
    return _worker(body, n)


@pytest.fixture
def served() -> Iterator[Server]:
    responder: Responder = model_server
    server = Server(responder)
    yield server
    server.close()


def test_a_four_phase_run_on_anthropic_models(cli: Cli, served: Server, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "calc").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "calc" / "__init__.py").write_text("")
    (project / "calc" / "ops.py").write_text("def divide(a, b):\n    return a // b\n")
    (project / "tests" / "__init__.py").write_text("")
    (project / "tests" / "test_ops.py").write_text(
        "import unittest\nfrom calc.ops import divide\n\n\nclass T(unittest.TestCase):\n"
        "    def test_divide(self):\n        self.assertEqual(divide(5, 2), 2.5)\n"
    )
    env = {"SHOAL_POLL_INTERVAL": "0.1", "ANTHROPIC_API_KEY": "test-key",
           "ANTHROPIC_BASE_URL": served.url}  # fmt: skip
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=env)
    assert up.returncode == 0, up.stderr
    try:
        out = cli("agent", "--team", TEAM, "--coordinator", "--model", "anthropic:claude-test",
                  "--cwd", str(project), "--backend", "in-process",
                  "--permission-mode", "bypassPermissions", "fix the failing test")  # fmt: skip
        assert out.returncode == 0, out.stderr
        coord = out.stdout.strip()

        def final() -> dict[str, Any] | None:
            rows = json.loads(cli("ps", "--team", TEAM, "--all", "--json").stdout)
            task = next(t for t in rows if t["id"] == coord)
            return task if task["status"] in ("completed", "failed", "killed") else None

        task: dict[str, Any] = wait_until(final, timeout=90, what="the coordinator to end")
        assert task["status"] == "completed", task
        assert task["result"] == "Report: divide fixed and verified."
        rows = json.loads(cli("ps", "--team", TEAM, "--all", "--json").stdout)
        workers = {t["description"]: t for t in rows if t.get("worker_of")}
        assert set(workers) == {"find divide", "run tests", "fix divide", "verify"}
        assert all(w["model"] == "anthropic:claude-test" for w in workers.values())
        assert "FAILED" in workers["run tests"]["result"]
        assert workers["verify"]["result"] == "finished: OK"
        assert workers["fix divide"]["lease"]["write_set"] == ["calc/ops.py"]
        assert "a / b" in (project / "calc" / "ops.py").read_text()
        assert sorted(notified_ids(Path(task["transcript"]))) == sorted(
            w["id"] for w in workers.values()
        )
        paths = {path for path, _ in served.requests}
        assert paths == {"/v1/messages"}
        first = served.requests[0][1]
        assert {t["name"] for t in first["tools"]} == {
            "Agent", "SendMessage", "TaskStop", "subscribe_pr_activity", "unsubscribe_pr_activity",
        }  # fmt: skip
        agent = next(t for t in first["tools"] if t["name"] == "Agent")
        assert {"write_set", "budget"} <= set(agent["input_schema"]["properties"])
    finally:
        cli("down", "--team", TEAM)
