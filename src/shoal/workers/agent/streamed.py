"""A network model asked by streaming, so that an idle timeout means idle.

The providers' SDKs wait up to 600 s for a response, three times. Asked without streaming,
a server sends nothing until its whole answer is ready, so no read timeout can tell a stalled
server from a long answer. Streamed, bytes flow while the model writes (Anthropic also sends
pings), and the SDK's per-read timeout, set to `model_idle_s`, ends an attempt only when the
server has sent no bytes for that long. The graph still sees one plain request: the stream is
read to its end here, so a half answer never reaches the conversation.

Retries: a stall before the response starts is retried by the SDK (its own policy: two
retries, with backoff, as for a 5xx); once the stream has begun the SDK never retries, so a
stall after the first event is retried here the same number of times. A stall between the
response's headers and its first event is not retried (neither the SDK nor this wrapper can
tell it from one the SDK already retried). The error, either way, names the model, its server
and the idle seconds.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Final

from pydantic_ai.exceptions import ModelTimeoutError
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from shoal.core.errors import ShoalError

STREAM_RETRIES: Final = 2  # as the SDKs' default max_retries
RETRY_DELAY_S: Final = 0.5  # the first retry's wait, doubled for each one after it


class ModelIdleError(ShoalError):
    """A model server sent no bytes for `model_idle_s` seconds, after the retries."""


def _connect_timeout(exc: BaseException) -> bool:
    """Whether the timeout was in connecting (the SDK's connect timeout, not idleness). By the
    class names of the transport's exceptions: this module does not import the HTTP client."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ == "ConnectTimeout":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(init=False)
class Streamed(WrapperModel):
    """`wrapped`, each request streamed and read whole, with reads of at most `idle_s`."""

    spec: str  # as the user wrote it: anthropic:NAME
    idle_s: float

    def __init__(self, wrapped: Model, *, spec: str, idle_s: float) -> None:
        super().__init__(wrapped)
        self.spec = spec
        self.idle_s = idle_s

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        settings: ModelSettings = {**(model_settings or {}), "timeout": self.idle_s}
        for retry in range(STREAM_RETRIES + 1):
            began = False
            try:
                async with self.wrapped.request_stream(
                    messages, settings, model_request_parameters
                ) as stream:
                    began = True
                    async for _event in stream:
                        pass
                return stream.get()
            except ModelTimeoutError as exc:
                if _connect_timeout(exc):
                    raise ShoalError(f"model {self.spec} at {self._server()}: {exc}") from exc
                if not began or retry == STREAM_RETRIES:
                    raise ModelIdleError(self._idle_message()) from exc
            await asyncio.sleep(RETRY_DELAY_S * 2**retry * (1 - 0.25 * random.random()))
        raise AssertionError("unreachable")  # (the last try returns or raises)

    def _server(self) -> str:
        return str(self.wrapped.base_url or "its default server")

    def _idle_message(self) -> str:
        return (
            f"model {self.spec} at {self._server()} sent no bytes for {self.idle_s:g}s "
            "(model_idle_s in config.toml, or --model-idle), after retries"
        )
