"""Message schemas: per-kind validation, decoding failures as one DecodeError, the size cap."""

from __future__ import annotations

import orjson
import pytest

from shoal.core.errors import UsageError
from shoal.mailbox.router import make_message
from shoal.mailbox.schema import (
    KINDS,
    MAX_MESSAGE_BYTES,
    DecodeError,
    ShutdownRequestMessage,
    decode,
    encode,
)

VALID_DATA: dict[str, dict[str, object] | None] = {
    "text": None,
    "task_assignment": {"task_id": 3, "subject": "write tests"},
    "task_notification": {"task_id": "b12345678", "status": "completed"},
    "idle_notification": None,
    "progress": {"tool_use_count": 2, "token_count": 10},
    "shutdown_request": {"request_id": "r1"},
    "shutdown_response": {"request_id": "r1", "approve": False, "reason": "busy"},
    "plan_approval_request": {"request_id": "p1", "plan": "edit a.py"},
    "plan_approval_response": {"request_id": "p1", "approve": True},
    "permission_request": {"request_id": "q1", "tool": "Bash"},
    "permission_response": {"request_id": "q1", "approve": True},
    "control": {"request_id": "c1", "op": "ps"},
    "control_reply": {"request_id": "c1", "ok": True, "result": [1, 2]},
}


def test_every_kind_has_a_valid_example() -> None:
    assert set(VALID_DATA) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_per_kind(kind: str) -> None:
    msg = make_message(sender="team-lead", to="bob", kind=kind, text="hi", data=VALID_DATA[kind])
    raw = encode(msg)
    on_disk = orjson.loads(raw)
    assert on_disk["v"] == 1
    assert on_disk["from"] == "team-lead"
    assert on_disk["kind"] == kind
    assert set(on_disk) == {
        "v",
        "id",
        "from",
        "to",
        "kind",
        "sent_at",
        "text",
        "summary",
        "data",
        "reply_to",
    }
    assert decode(raw) == msg


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("shutdown_request", {}),
        ("shutdown_response", {"request_id": "r"}),
        ("task_notification", {"task_id": "b1", "status": "exploded"}),
        ("control", {"op": "ps"}),
        ("progress", {"tool_use_count": "many"}),
    ],
)
def test_wrong_payload_for_kind_is_refused(kind: str, data: dict[str, object]) -> None:
    with pytest.raises(UsageError) as err:
        make_message(sender="a", to="b", kind=kind, data=data)
    assert kind in str(err.value)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(UsageError):
        make_message(sender="a", to="b", kind="telepathy")


def test_decode_failures_are_one_error_type() -> None:
    good = orjson.loads(encode(make_message(sender="a", to="b", text="x")))
    cases = [
        b"{not json",
        b"[]",
        orjson.dumps({**good, "v": 2}),
        orjson.dumps({**good, "kind": "shutdown_request"}),  # data lacks request_id
        orjson.dumps({**good, "surprise": 1}),
        b"x" * (MAX_MESSAGE_BYTES + 1),
    ]
    for raw in cases:
        with pytest.raises(DecodeError) as err:
            decode(raw)
        assert err.value.reason


def test_decode_gives_the_kind_model() -> None:
    msg = make_message(
        sender="team-lead",
        to="b",
        kind="shutdown_request",
        data={"request_id": "r9", "reason": "done"},
    )
    back = decode(encode(msg))
    assert isinstance(back, ShutdownRequestMessage)
    assert back.data.request_id == "r9"


def test_scripted_write_stays_inside_the_working_directory(tmp_path: object) -> None:
    import asyncio
    from pathlib import Path

    from shoal.workers.teammate.brains import Script, ScriptedBrain, TurnContext

    base = Path(str(tmp_path))
    work = base / "work"
    work.mkdir()

    async def nothing(*_a: object) -> None:
        return None

    async def approve(_plan: str) -> tuple[bool, str | None]:
        return True, None

    def turn(path: str) -> tuple[bool, str]:
        brain = ScriptedBrain(Script.parse({"step": [{"write": path, "text": "x"}]}))
        ctx = TurnContext(
            name="a",
            team="t",
            prompt="p",
            cwd=str(work),
            output_file=base / "out",
            task=None,
            send=nothing,
            update_task=nothing,
            approve_plan=approve,
            activity=lambda _t: None,
        )
        result = asyncio.run(brain.turn(ctx))
        return result.ok, result.result

    assert turn("inside.txt")[0] and (work / "inside.txt").read_text() == "x"
    ok, why = turn("../escape.txt")
    assert not ok and "outside" in why and not (base / "escape.txt").exists()
    assert not turn("/tmp/abs-escape-shoal.txt")[0]


def test_a_decode_error_names_the_kind_and_the_field() -> None:
    good = orjson.loads(encode(make_message(sender="a", to="b", text="x")))
    with pytest.raises(DecodeError) as err:
        decode(orjson.dumps({**good, "kind": "shutdown_request"}))
    assert err.value.reason == "invalid message: shutdown_request.data.request_id: Field required"
    with pytest.raises(DecodeError) as err:
        decode(orjson.dumps({**good, "kind": "telepathy"}))
    assert "'telepathy'" in err.value.reason and "'control_reply'" in err.value.reason
