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

from shoal.workers.agent.loop import AgentLoop, Limits, Outcome
from shoal.workers.agent.models import ModelSpec, build_model
from shoal.workers.agent.tool_calls import make_tools
from shoal.workers.agent.tools import Workspace
from shoal.workers.agent.transcript import Transcript
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
    # (the latest request's input, 10, and both outputs: the seed's count)
    assert outcome.total_tokens == 20 and outcome.tool_uses == 1 and outcome.turns == 2
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
    assert outcome.total_tokens == 20 and outcome.tool_uses == 1
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


# Per request n: (uncached input, cache read, cache write, output) as the provider reports it.
# Requests 0-2 call Bash, 3 answers (the first run); 4 answers the second run, 5 the resume.
USAGE = [(50, 0, 1000, 7), (60, 1000, 20, 9), (70, 1020, 0, 11), (80, 1020, 30, 13),
         (90, 1050, 0, 5), (100, 1050, 40, 6)]  # fmt: skip
INPUTS = [sum(u[:3]) for u in USAGE]  # 1050, 1080, 1090, 1130, 1140, 1190


def _anthropic_rounds(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    fresh, read, write, out = USAGE[n]
    if n < 3:
        content: list[dict[str, Any]] = [
            {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash",
             "input": {"command": f"echo round {n}"}},
        ]  # fmt: skip
        stop = "tool_use"
    else:
        content, stop = [{"type": "text", "text": f"answer {n}"}], "end_turn"
    usage = {"input_tokens": fresh, "cache_read_input_tokens": read,
             "cache_creation_input_tokens": write, "output_tokens": out}  # fmt: skip
    return 200, {
        "id": f"msg_{n}", "type": "message", "role": "assistant", "model": body["model"],
        "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage,
    }  # fmt: skip


def _openai_rounds(body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
    fresh, read, write, out = USAGE[n]
    message: dict[str, Any] = {"role": "assistant", "content": f"answer {n}"}
    finish = "stop"
    if n < 3:
        arguments = json.dumps({"command": f"echo round {n}"})
        call = {"id": f"call_{n}", "type": "function",
                "function": {"name": "Bash", "arguments": arguments}}  # fmt: skip
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    # (OpenAI's prompt_tokens holds the cached ones)
    usage = {"prompt_tokens": fresh + read + write, "completion_tokens": out,
             "total_tokens": fresh + read + write + out,
             "prompt_tokens_details": {"cached_tokens": read}}  # fmt: skip
    return 200, {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage,
    }  # fmt: skip


PROVIDERS = {
    "anthropic": (_anthropic_rounds, "anthropic:claude-test", "ANTHROPIC_API_KEY",
                  "ANTHROPIC_BASE_URL", ""),
    "openai": (_openai_rounds, "openai:local", "OPENAI_API_KEY", "OPENAI_BASE_URL", "/v1"),
}  # fmt: skip


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_tokens_are_the_latest_input_and_every_output_over_rounds_runs_and_a_resume(
    serve: Callable[[Responder], Server], tmp_path: Path, provider: str
) -> None:
    responder, spec, key, base, suffix = PROVIDERS[provider]
    server = serve(responder)
    env = {key: "k", base: server.url + suffix}
    transcript = tmp_path / "agent.jsonl"

    def loop_of(history: list[Any]) -> AgentLoop:
        model = build_model(ModelSpec.parse(spec), env)
        tools = make_tools(Workspace(tmp_path))
        loop = AgentLoop(
            model, instructions="t", tools=tools, transcript=Transcript(transcript),
            history=history,
        )  # fmt: skip
        loop.progress.count_history(history)  # (what the runner does on a resume)
        return loop

    loop = loop_of([])
    first = asyncio.run(loop.run("go"))
    assert first.status == "completed" and first.turns == 4, first.error
    progress = loop.progress
    assert progress.latest_input_tokens == INPUTS[3] == 1130  # input + cache read + write
    assert progress.cumulative_output_tokens == 7 + 9 + 11 + 13
    assert first.total_tokens == progress.token_count == 1130 + 40  # (summed inputs: 4390)
    second = asyncio.run(loop.run("again"))  # (a coordinator's next batch: the counts go on)
    assert second.total_tokens == INPUTS[4] + 45 == 1185
    assert loop.progress.to_record()["latest_input_tokens"] == 1140
    resumed = loop_of(Transcript.load(transcript).messages)
    assert resumed.progress.token_count == 1185  # (read back from the transcript)
    third = asyncio.run(resumed.run("once more"))
    assert third.total_tokens == INPUTS[5] + 51 == 1241
    assert len(server.requests) == 6


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_max_tokens_counts_what_the_seed_counts(
    serve: Callable[[Responder], Server], tmp_path: Path, provider: str
) -> None:
    # 1057, then 1096 (not 2146: inputs are not summed), then 1117 > 1100: the third
    # response's tool call never runs.
    responder, spec, key, base, suffix = PROVIDERS[provider]
    server = serve(responder)
    model = build_model(ModelSpec.parse(spec), {key: "k", base: server.url + suffix})
    loop = AgentLoop(
        model, instructions="t", tools=make_tools(Workspace(tmp_path)),
        limits=Limits(max_tokens=1100),
    )  # fmt: skip
    outcome = asyncio.run(loop.run("go"))
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error.startswith("limit reached: max tokens (1100)"), outcome.error
    assert outcome.total_tokens == 1090 + 27 and outcome.tool_uses == 2
    assert len(server.requests) == 3
