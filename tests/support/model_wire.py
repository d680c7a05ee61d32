"""The providers' streaming wire formats for loopback model servers: a whole Anthropic
message or OpenAI chat completion (what a server answers to a request without `stream`) as
the server-sent events the same server sends when the request asks to stream. These servers
stand in for the providers' services, which cannot be reached from here."""

from __future__ import annotations

import json
from typing import Any


def _events(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    return b"".join(
        (f"event: {name}\n" if name else "").encode() + f"data: {json.dumps(data)}\n\n".encode()
        for name, data in events
    )


def anthropic_events(message: dict[str, Any]) -> bytes:
    """An Anthropic Messages response as its stream: message_start, a start, delta and stop
    per content block, message_delta (stop reason, output tokens), message_stop."""
    usage = message.get("usage") or {}
    # (message_start carries the input counts, cache reads and writes included, as the API's)
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**usage, "input_tokens": usage.get("input_tokens", 0),
                       "output_tokens": 0}}  # fmt: skip
    events: list[tuple[str | None, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for i, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": i,
                                     "content_block": opened}),
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]  # fmt: skip
    events += [
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                           "usage": {"output_tokens": usage.get("output_tokens", 0)}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return _events(events)


def openai_events(completion: dict[str, Any]) -> bytes:
    """An OpenAI chat completion as its stream: one chunk with the message, one with the
    finish reason, one with the usage, then [DONE]."""
    choice = completion["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
    head = {k: completion[k] for k in ("id", "created", "model")}
    chunk = {**head, "object": "chat.completion.chunk"}
    events: list[tuple[str | None, dict[str, Any]]] = [
        (None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {},
                                      "finish_reason": choice["finish_reason"]}]}),
        (None, {**chunk, "choices": [], "usage": completion.get("usage")}),
    ]  # fmt: skip
    return _events(events) + b"data: [DONE]\n\n"


def stream_of(path: str, answer: dict[str, Any]) -> bytes:
    """`answer` (a whole response to a POST to `path`) in the stream format of its API."""
    return openai_events(answer) if path.endswith("/chat/completions") else anthropic_events(answer)


def first_bytes(path: str) -> bytes:
    """The opening event of a streamed response to `path` (a server that then stalls)."""
    if path.endswith("/chat/completions"):
        chunk = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0,
                 "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                 "content": "Thinking"},
                                            "finish_reason": None}]}  # fmt: skip
        return _events([(None, chunk)])
    start = {"type": "message_start", "message": {
        "id": "msg_0", "type": "message", "role": "assistant", "model": "m", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0}}}  # fmt: skip
    block = {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": ""}}  # fmt: skip
    delta = {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": "Thinking"}}  # fmt: skip
    return _events(
        [("message_start", start), ("content_block_start", block), ("content_block_delta", delta)]
    )
