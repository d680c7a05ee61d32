"""The provider adapters through their real SDKs (anthropic, openai) against loopback HTTP
servers that speak the Anthropic Messages and OpenAI Chat Completions wire formats. These
servers are stand-ins for the providers' services, which cannot be reached from here."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shoal.workers.agent.loop import AgentLoop, Outcome, make_tools
from shoal.workers.agent.models import ModelSpec, build_model
from shoal.workers.agent.tools import Workspace
from tests.support.model_wire import stream_of

SSE = "text/event-stream"
Responder = Callable[[dict[str, Any], int], tuple[int, dict[str, Any]]]


class Server:
    """A loopback HTTP server answering POSTs with `responder(body, n)` (n counts from 0): the
    whole response, sent as its stream when the request asks for one (shoal's always do)."""

    def __init__(self, responder: Responder) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, body))
                code, answer = responder(body, len(server.requests) - 1)
                streams = code == 200 and bool(body.get("stream"))
                data = stream_of(self.path, answer) if streams else json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", SSE if streams else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Responder], Server]]:
    servers: list[Server] = []

    def start(responder: Responder) -> Server:
        servers.append(Server(responder))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _openai(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    if n == 0:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"command": "echo from-bash"}'},
                }
            ],
        }
        finish = "tool_calls"
    else:
        result = body["messages"][-1]["content"]
        message = {"role": "assistant", "content": f"the tool said {result}"}
        finish = "stop"
    return 200, {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _anthropic(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    if n == 0:
        content: list[dict[str, Any]] = [
            {"type": "text", "text": "running it"},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo hi"}},
        ]
        stop = "tool_use"
    else:
        result = body["messages"][-1]["content"][0]["content"]
        text = result if isinstance(result, str) else result[0]["text"]
        content = [{"type": "text", "text": f"the tool said {text}"}]
        stop = "end_turn"
    return 200, {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def _run(spec: str, env: dict[str, str], cwd: Path) -> Outcome:
    model = build_model(ModelSpec.parse(spec), env)
    loop = AgentLoop(model, instructions="test", tools=make_tools(Workspace(cwd)))
    return asyncio.run(loop.run("please run it"))


def test_openai_compatible_server(serve: Callable[[Responder], Server], tmp_path: Path) -> None:
    server = serve(_openai)
    env = {"OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": f"{server.url}/v1"}
    outcome = _run("openai:local-model", env, tmp_path)
    assert outcome.status == "completed", outcome.error
    assert outcome.result == "the tool said from-bash"
    assert outcome.total_tokens == 30 and outcome.tool_uses == 1 and outcome.turns == 2
    path, first = server.requests[0]
    assert path == "/v1/chat/completions" and first["model"] == "local-model"
    assert {t["function"]["name"] for t in first["tools"]} >= {"Bash", "Read", "Grep"}
    grep = next(t for t in first["tools"] if t["function"]["name"] == "Grep")
    assert {"-i", "-n", "head_limit"} <= set(grep["function"]["parameters"]["properties"])


def test_anthropic_messages_server(serve: Callable[[Responder], Server], tmp_path: Path) -> None:
    server = serve(_anthropic)
    env = {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": server.url}
    outcome = _run("anthropic:claude-test", env, tmp_path)
    assert outcome.status == "completed", outcome.error
    assert outcome.result == "the tool said hi"
    assert outcome.total_tokens == 30 and outcome.tool_uses == 1
    path, first = server.requests[0]
    assert path == "/v1/messages" and first["model"] == "claude-test"
    assert first["stream"] is True  # (streamed: an idle timeout then means no bytes came)
    assert first["system"]  # the instructions went as the system prompt


def test_a_server_error_is_retried_then_fails_with_its_message(
    serve: Callable[[Responder], Server], tmp_path: Path
) -> None:
    server = serve(lambda body, n: (500, {"error": {"message": "the backend is on fire"}}))
    env = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": f"{server.url}/v1"}
    outcome = _run("openai:m", env, tmp_path)
    assert outcome.status == "failed" and outcome.error is not None
    assert "the backend is on fire" in outcome.error
    assert len(server.requests) > 1  # the SDK retried before giving up


def test_an_unreachable_base_url_fails_the_run_with_a_reason(tmp_path: Path) -> None:
    env = {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    outcome = _run("anthropic:m", env, tmp_path)
    assert outcome.status == "failed" and outcome.error is not None
    assert "onnect" in outcome.error  # Connection error / ConnectError, from the SDK
