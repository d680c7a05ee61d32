"""A loopback model server that misbehaves in time, speaking the Anthropic Messages or OpenAI
Chat Completions streaming format (a stand-in for the providers' services, which cannot be
reached from here). Modes:

- `silent`: reads each request and never answers;
- `stalls`: sends the response headers and the stream's first event, then nothing;
- `held`: sends nothing until `release()`, then the whole answer (text `answer`);
- `trickles`: sends the answer's events one by one, `gap` s apart.

A request held open is let go at `close()`.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from tests.support.model_wire import first_bytes, stream_of

Mode = Literal["silent", "stalls", "held", "trickles"]


def whole_answer(path: str, text: str) -> dict[str, Any]:
    """A final text answer (no tool call) to a POST to `path`, in its API's format."""
    if path.endswith("/chat/completions"):
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                          "total_tokens": 15}}  # fmt: skip
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5}}  # fmt: skip


class StallServer:
    """Serves on 127.0.0.1 until `close`; `requests` counts the POSTs to the model's API."""

    def __init__(self, mode: Mode, answer: str = "done", gap: float = 0.2) -> None:
        self.mode, self.answer, self.gap = mode, answer, gap
        self.requests = 0
        self.released = threading.Event()
        self.closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                server.requests += 1
                server.serve(self)

            def log_message(self, *_args: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def serve(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        if self.mode == "silent":
            self.closing.wait()
            return
        if self.mode == "held":
            self.released.wait()  # (nothing is sent before: not even the headers)
            if self.closing.is_set():
                return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()
        if self.mode == "stalls":
            handler.wfile.write(first_bytes(path))
            handler.wfile.flush()
            self.closing.wait()
            return
        events = stream_of(path, whole_answer(path, self.answer)).split(b"\n\n")
        for event in events:
            if event:
                handler.wfile.write(event + b"\n\n")
                handler.wfile.flush()
                if self.mode == "trickles":
                    time.sleep(self.gap)  # (the server's pace, not a test's synchronisation)
        handler.close_connection = True

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.closing.set()
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def env_for(provider: str, url: str) -> dict[str, str]:
    """The environment that points `provider`'s SDK at `url`."""
    if provider == "openai":
        return {"OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": f"{url}/v1"}
    return {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": url}
