"""The replay model: re-drives a recorded run from its transcript with zero model calls.

Request N is answered with the N-th recorded response. Before answering, the tool results the
run produced are compared with the ones recorded at that point; the first difference stops the
run with `ReplayDiverged`, naming the turn, the tool and both results. Task ids in results
(`started worker a1b2c3d4e`) are new in every run, so they are compared as `<task-id>`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from shoal.core.errors import ShoalError
from shoal.core.tasks import TASK_ID_PREFIXES
from shoal.workers.agent.transcript import Transcript

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel


class ReplayDiverged(ShoalError):
    """The replayed run's tool results differ from the recorded ones."""


_TASK_ID: Final = re.compile(r"\b[" + "".join(TASK_ID_PREFIXES.values()) + r"][0-9a-z]{8}\b")


def _results(message: ModelMessage) -> list[tuple[str, str]]:
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    if not isinstance(message, ModelRequest):
        return []
    parts = [p for p in message.parts if isinstance(p, ToolReturnPart)]
    return [(p.tool_name, _TASK_ID.sub("<task-id>", p.model_response_str())) for p in parts]


def replay_model(path: Path) -> FunctionModel:
    """A FunctionModel answering from the transcript at `path`."""
    from pydantic_ai.messages import ModelRequest, ModelResponse
    from pydantic_ai.models.function import FunctionModel

    loaded = Transcript.load(path)
    recorded = loaded.messages
    responses = [m for m in recorded if isinstance(m, ModelResponse)]
    requests = [m for m in recorded if isinstance(m, ModelRequest)]

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)  # answered so far
        if turn >= len(responses):
            raise ReplayDiverged(
                f"replay of {path}: the run asked for turn {turn + 1}, "
                f"but only {len(responses)} were recorded"
            )
        if turn < len(requests):
            got, want = _results(messages[-1]), _results(requests[turn])
            if got != want:
                for (tool, g), (_, w) in zip(got, want, strict=False):
                    if g != w:
                        raise ReplayDiverged(
                            f"replay of {path} diverged at turn {turn + 1}: {tool} returned "
                            f"{g[:200]!r}, the recording has {w[:200]!r}"
                        )
                raise ReplayDiverged(
                    f"replay of {path} diverged at turn {turn + 1}: {len(got)} tool result(s), "
                    f"the recording has {len(want)}"
                )
        return responses[turn]

    return FunctionModel(answer, model_name=f"replay:{path.name}")
