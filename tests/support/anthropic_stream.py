"""A loopback server speaking the Anthropic Messages format with streaming (server-sent
events), a stand-in for Anthropic's API, which cannot be reached from here. It answers a
conversation with one tool call (`tool`, `tool_input`), then, once the tool's result is in
the request, with the text `final` + that result."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def _message(
    n: int, blocks: list[dict[str, Any]], deltas: list[dict[str, Any]], stop: str
) -> bytes:
    events: list[dict[str, Any]] = [{
        "type": "message_start",
        "message": {
            "id": f"msg_{n}", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 1},
        },
    }]  # fmt: skip
    for i, (block, delta) in enumerate(zip(blocks, deltas, strict=True)):
        events.append({"type": "content_block_start", "index": i, "content_block": block})
        events.append({"type": "content_block_delta", "index": i, "delta": delta})
        events.append({"type": "content_block_stop", "index": i})
    events.append({
        "type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
        "usage": {"output_tokens": 10},
    })  # fmt: skip
    events.append({"type": "message_stop"})
    return _sse(events)


def _tool_result(body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict) and part.get("type") == "tool_result":
            inner = part.get("content")
            if isinstance(inner, list):
                return "".join(str(p.get("text", "")) for p in inner if isinstance(p, dict))
            return str(inner or "")
    return None


class AnthropicStream:
    """Serves on 127.0.0.1 until `close`; `requests` holds (path, body) of every POST."""

    def __init__(self, tool: str, tool_input: dict[str, Any], final: str) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                server.requests.append((self.path, body))
                if "count_tokens" in self.path:
                    data, kind = json.dumps({"input_tokens": 100}).encode(), "application/json"
                else:
                    data, kind = server.answer(body), "text/event-stream"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                return

        self.tool, self.tool_input, self.final = tool, tool_input, final
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, body: dict[str, Any]) -> bytes:
        n = len(self.requests)
        result = _tool_result(body)
        if result is None and body.get("tools"):
            block = {"type": "tool_use", "id": f"toolu_{n}", "name": self.tool, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(self.tool_input)}
            return _message(n, [block], [delta], "tool_use")
        text = f"{self.final}{(result or '').strip()}"
        return _message(
            n, [{"type": "text", "text": ""}], [{"type": "text_delta", "text": text}], "end_turn"
        )

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
