"""The control channel's two ends share one protocol: every request model has exactly one
handler on the server, and the operation names are read from the models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shoal.channel import protocol
from shoal.core.errors import TaskError
from shoal.core.paths import Layout
from shoal.orchestrator.control import ControlServer


def server(tmp_path: Path) -> ControlServer:
    return ControlServer(Layout(tmp_path), "t", target=object())  # type: ignore[arg-type]


def test_every_request_model_has_a_handler(tmp_path: Path) -> None:
    handlers = server(tmp_path)._handlers
    assert set(handlers) == set(protocol.REQUESTS)


def test_operation_names_are_unique_and_each_parses_to_its_model() -> None:
    assert len(protocol.OPERATIONS) == len(set(protocol.OPERATIONS))
    assert "down" in protocol.OPERATIONS and "task_attachments" in protocol.OPERATIONS
    by_op = {op: model for model in protocol.REQUESTS for op in protocol._ops(model)}
    assert set(by_op) == set(protocol.OPERATIONS)
    assert isinstance(protocol.parse_request("ping", {}), by_op["ping"])
    assert isinstance(protocol.parse_request("down", {}), by_op["down"])


@pytest.mark.parametrize(
    ("op", "args", "words"),
    [
        ("nope", {}, "unknown control operation 'nope'"),
        ("stop", {}, "bad 'stop' request: task_id: Field required"),
        ("stop", {"task_id": 5}, "bad 'stop' request: task_id: Input should be a valid string"),
    ],
)
def test_a_bad_request_is_refused_naming_what_is_wrong(
    op: str, args: dict[str, Any], words: str
) -> None:
    with pytest.raises(TaskError, match=words):
        protocol.parse_request(op, args)
