"""One agent run: pydantic-ai's `Agent.iter()` driven node by node, with what shoal adds on
top — the sidechain transcript appended after every node, the readable output file and the
progress at each round (progress.py), pending messages drained at tool round boundaries
(pydantic-ai's own `AgentRun.enqueue`, each counted as it reaches a request), the new output
of the agent's background tasks attached before each model request (attachments.py), and
limits that end the run `failed` with the limit named: turns (model requests), tokens, tool
uses and wall time. While a request is out, the progress summary adds "waiting for the model
for N s", renewed every WAIT_TICK_S.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from shoal.core.config import TOOL_RETRIES
from shoal.core.errors import NoSpaceError, ShoalError
from shoal.workers.agent.attachments import AttachSource, attached_ends
from shoal.workers.agent.progress import (
    Output,
    Progress,
    describe_call,
    prompt_texts,
    short_result,
    summary_of,
)
from shoal.workers.agent.transcript import Transcript

if TYPE_CHECKING:
    from pydantic_ai import Tool
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.models import Model

# How often the wait for a model response is renewed in the progress (the leader's event
# throttle, PROGRESS_EVENT_INTERVAL_S, is shorter, so each renewal is at most one event).
WAIT_TICK_S: Final = 2.0
# How often, while a request is out, the messages it took are counted (see _tick_waits).
DRAIN_CHECK_S: Final = 0.5


@dataclass(frozen=True)
class Limits:
    """Caps of one run; None is no cap."""

    max_turns: int | None = None
    max_tokens: int | None = None
    max_tool_uses: int | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class Outcome:
    """How a run ended: `completed` with the final text, or `failed` with the reason."""

    status: str  # completed | failed
    result: str
    error: str | None
    total_tokens: int
    tool_uses: int
    turns: int
    duration_ms: int


class AgentLoop:
    """Runs one agent conversation turn by turn; `enqueue` queues a message for the next tool
    round boundary (or, once the run is over, for the next run)."""

    def __init__(
        self,
        model: Model,
        *,
        instructions: str,
        tools: Sequence[Tool[Any]],
        transcript: Transcript | None = None,
        output: Output | None = None,
        history: Sequence[ModelMessage] = (),
        limits: Limits = Limits(),
        on_progress: Callable[[Progress], None] | None = None,
        journal: Path | None = None,
        tool_retries: int = TOOL_RETRIES,
        attach: AttachSource | None = None,
    ) -> None:
        from pydantic_ai import Agent

        # (bad arguments to one tool in a row before the run fails: `tool_retries`)
        self.tool_retries = tool_retries
        self.agent: Agent[None, str] = Agent(
            model, instructions=instructions, tools=list(tools), retries=tool_retries
        )
        self.transcript = transcript
        self.output = output or Output(None)
        self.history: list[ModelMessage] = list(history)
        if transcript is not None:
            transcript.resume(self.history)
        self.limits = limits
        self.progress = Progress()
        self.on_progress = on_progress
        self.journal = journal  # a coordinator's texts, kept where its workers can read them
        self.attach = attach  # what the background tasks wrote, before each request
        self._pending: list[str] = []
        self._run: Any = None
        self._into_run: list[str] = []  # what was enqueued into the run in progress
        # Texts enqueued that count as the task's pending messages (sent to it, not a
        # coordinator's worker notifications), by text, until each reaches a request.
        self._counted: Counter[str] = Counter()
        self._run_drained: Counter[str] = Counter()  # of `_into_run`, those already counted
        self._since = 0  # where the run in progress began in the history
        self._work_summary: str | None = None  # the latest the agent said or did
        self._run_prompt: str | None = None  # the prompt the run in progress began with
        self._acks: list[tuple[str, Callable[[], None]]] = []  # run once a text is recorded
        self._asked_at: float | None = None  # when the request now out was sent

    def on_recorded(self, text: str, ack: Callable[[], None]) -> None:
        """Call `ack` once `text` is in a request of the transcript (at once if it is)."""
        self._acks.append((text, ack))
        self._fire_acks()

    def _fire_acks(self) -> None:
        if not self._acks:
            return
        said = self.user_texts()
        for item in list(self._acks):
            if any(item[0] in content for content in said):
                self._acks.remove(item)
                item[1]()

    def user_texts(self) -> list[str]:
        """The text of every user prompt in the conversation so far."""

        return prompt_texts(self.history)

    def _not_yet_said(self, texts: list[str]) -> list[str]:
        """`texts` less the notifications of task ends already in the conversation (a task
        ends once: its end is never told twice, whatever path brought it again)."""
        from shoal.core.notify import END_NOTIFICATION

        texts_so_far = self.user_texts()
        said = {m.group(1) for text in texts_so_far for m in END_NOTIFICATION.finditer(text)}
        said |= attached_ends(texts_so_far)  # (an attachment told it)
        kept: list[str] = []
        for text in texts:
            found = END_NOTIFICATION.match(text.lstrip())
            if found is None or found.group(1) not in said:
                kept.append(text)
        return kept

    def enqueue(self, text: str, *, counted: bool = True) -> None:
        """A message for the agent: drained at the next tool round as a user message.
        `counted`: one of the task's pending messages (`Progress.drained` counts it once it
        reaches a request); a coordinator's worker notifications are not."""
        if counted:
            self._counted[text] += 1
        if self._run is not None and self._run.result is None:
            self._run.enqueue(text)
            self._into_run.append(text)
        else:
            self._pending.append(text)

    def took(self, texts: Iterable[str]) -> None:
        """`texts` left the queue for the conversation: each counted one is drained."""
        for text in texts:
            if self._counted[text] > 0:
                self._counted[text] -= 1
                if not self._counted[text]:
                    del self._counted[text]
                self.progress.drained += 1

    def _count_run_drained(self, messages: Sequence[ModelMessage] | None = None) -> None:
        """Count the texts enqueued into the run in progress that have reached a request (of
        the history, or of `messages`: the run's own, with the request now out)."""
        if not self._into_run:
            return
        left = self._undelivered(self._since, messages)
        delivered = Counter(self._into_run) - Counter(left)
        self.took((delivered - self._run_drained).elements())
        self._run_drained = delivered

    def _undelivered(self, since: int, messages: Sequence[ModelMessage] | None = None) -> list[str]:
        """The texts enqueued into the run that never reached a request of its history (or
        `messages`) after message `since` (a run stopped or failed before its next request):
        kept for the next."""

        delivered = prompt_texts((self.history if messages is None else messages)[since:])
        if self._run_prompt is not None and self._run_prompt in delivered:
            delivered.remove(self._run_prompt)  # (the run's own prompt delivers none of them)
        # (several queued texts may reach one request together, joined in one prompt part)
        left: list[str] = []
        asked: dict[str, int] = {}
        for text in self._into_run:
            asked[text] = asked.get(text, 0) + 1
            if asked[text] > sum(content.count(text) for content in delivered):
                left.append(text)
        return left

    def drop_in_flight(self) -> None:
        """After a stopped turn: forget a last response whose tool calls have no results (a
        model must never see a call without its result)."""
        from pydantic_ai.messages import ModelResponse, ToolCallPart

        while self.history and (
            isinstance(self.history[-1], ModelResponse)
            and any(isinstance(p, ToolCallPart) for p in self.history[-1].parts)
        ):
            self.history.pop()

    def pending(self, *, drained: bool = True) -> list[str]:
        """Take the messages queued for a next run (they came after this one ended);
        `drained`: they go into the conversation now (else they are handed on, undrained)."""
        texts, self._pending = self._pending, []
        if drained:
            self.took(texts)
        return self._not_yet_said(texts)

    async def run(self, prompt: str | None) -> Outcome:
        """One run from `prompt` (None: continue from the history's last request)."""
        from pydantic_ai import Agent
        from pydantic_ai.exceptions import (
            AgentRunError,
            UnexpectedModelBehavior,
            UsageLimitExceeded,
        )
        from pydantic_ai.usage import UsageLimits

        started = time.monotonic()
        limits = UsageLimits(
            request_limit=self.limits.max_turns,  # (max_tokens: see _count, as the seed counts)
            tool_calls_limit=self.limits.max_tool_uses,
        )
        texts = [*self._not_yet_said(self._pending), *([prompt] if prompt else [])]
        self.took(self._pending)
        self._pending.clear()
        since = self._since = len(self.history)
        self._run_drained = Counter()
        self._run_prompt = "\n\n".join(texts) if texts else None
        if texts:
            self.output.write("".join(f"> {t}\n\n" for t in texts))
        error: str | None = None
        result = ""
        run = None
        ticker = asyncio.create_task(self._tick_waits())
        try:
            async with asyncio.timeout(self.limits.timeout):
                async with self.agent.iter(
                    "\n\n".join(texts) if texts else None,
                    message_history=self.history,
                    usage_limits=limits,
                ) as run:
                    self._run = run
                    async for node in run:
                        self._after(node, run)
                        if self.attach is not None and Agent.is_model_request_node(node):
                            await self._attach(run)
                    assert run.result is not None
                    result = run.result.output
        except TimeoutError:
            error = f"wall time limit reached ({self.limits.timeout:g}s)"
        except UsageLimitExceeded as exc:
            error = f"limit reached: {_limit_name(str(exc), self.limits)}"
        except UnexpectedModelBehavior as exc:
            error = self._model_error(exc)
        except AgentRunError as exc:
            error = f"{type(exc).__name__}: {exc}"
        except ShoalError as exc:  # a replay that diverged, a script that cannot go on
            error = str(exc)
        finally:
            ticker.cancel()
            self._waited(None)
            self._run = None
            if run is not None:
                self.history = list(run.all_messages())
                try:
                    self._record()
                except NoSpaceError as exc:  # (the run ends failed, naming the file)
                    error = error or str(exc)
            self._count_run_drained()
            self._pending[:0] = self._undelivered(since)
            self._into_run = []
            self._run_drained = Counter()
        usage = run.usage if run is not None else None
        # (the counts go on over every run of this loop: a coordinator runs once per batch)
        total = self.progress.token_count
        if error is not None:
            self.output.write(f"\n[failed: {error}]\n")
        return Outcome(
            status="completed" if error is None else "failed",
            result=result,
            error=error,
            total_tokens=total,
            tool_uses=self.progress.tool_use_count,
            turns=usage.requests if usage is not None else 0,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    async def _attach(self, run: Any) -> None:
        """Before a model request: what the agent's background tasks wrote since the last
        one goes into it (acked once it is in the transcript)."""
        assert self.attach is not None
        got = await self.attach.fetch()
        if got is None:
            return
        run.enqueue(got.text)
        self.output.write(got.note)
        self.on_recorded(got.text, got.ack)

    def _model_error(self, exc: Exception) -> str:
        """The reason of a run the model ended: pydantic-ai's words, or shoal's for a tool
        that got bad arguments more than `tool_retries` times in a row."""
        text = str(exc)
        found = re.match(r"Tool '([^']+)' exceeded max retries", text)
        if found is None:
            return f"{type(exc).__name__}: {text}"
        return (
            f"the model sent tool {found.group(1)} bad arguments {self.tool_retries + 1} times "
            f"in a row (tool_retries = {self.tool_retries}: raise it in SHOAL_HOME/config.toml "
            "to let it go on)"
        )

    def _waited(self, since: float | None) -> None:
        """A request went out at `since` (None: none is out): the summary says how long the
        model has been waited for, and once it answered, the latest the agent said or did."""
        self._asked_at = since
        if since is None:
            self.progress.summary = self._work_summary
            return
        wait = f"waiting for the model for {time.monotonic() - since:.0f} s"
        self.progress.summary = f"{self._work_summary} ({wait})" if self._work_summary else wait

    async def _tick_waits(self) -> None:
        """While a request is out, renew its wait in the progress every WAIT_TICK_S, and
        count the messages it took as it went (pydantic-ai puts them in the run's history
        before it sends the request) every DRAIN_CHECK_S."""
        ticks = 0
        every = max(1, round(WAIT_TICK_S / DRAIN_CHECK_S))
        while True:
            await asyncio.sleep(DRAIN_CHECK_S)
            ticks += 1
            if self._asked_at is None or self.on_progress is None:
                continue
            drained = self.progress.drained
            if self._run is not None:
                self._count_run_drained(list(self._run.all_messages()))
            if ticks % every == 0:
                self._waited(self._asked_at)
            if ticks % every == 0 or self.progress.drained != drained:
                self.on_progress(self.progress)

    def _after(self, node: Any, run: Any) -> None:
        """Record a node: transcript, readable output, progress."""
        from pydantic_ai import Agent
        from pydantic_ai.messages import (
            ModelRequest,
            RetryPromptPart,
            TextPart,
            ToolCallPart,
            ToolReturnPart,
        )

        # (a request node is yielded just before it is sent; the next node comes with the answer)
        self._waited(time.monotonic() if Agent.is_model_request_node(node) else None)
        self.history = list(run.all_messages())
        if Agent.is_model_request_node(node) and not any(m is node.request for m in self.history):
            # The next request, not yet sent, holds the results of the tools that just ran:
            # on disk now, so a runner killed while the request is out keeps the round it
            # finished (its resume sends that request again and never reruns the tools).
            self._record([*self.history, node.request])
        else:
            self._record()
        if Agent.is_call_tools_node(node):
            self._count(node.model_response.usage)
            # (the request it answers, as sent: with the messages drained into it)
            asked = next((m for m in reversed(self.history) if isinstance(m, ModelRequest)), None)
            for text in prompt_texts([asked] if asked is not None else []):
                self.progress.said("user", text)
            said: str | None = None
            for part in node.model_response.parts:
                if isinstance(part, TextPart) and part.content.strip():
                    self.output.write(f"{part.content.strip()}\n")
                    self.progress.said("assistant", part.content)
                    said = summary_of(part.content) or said
                    if self.journal is not None:
                        Output(self.journal).write(f"{part.content.strip()}\n\n")
                elif isinstance(part, ToolCallPart):
                    line = describe_call(part.tool_name, part.args_as_dict())
                    self.progress.tool_use_count += 1
                    self.progress.note(line)
                    self.progress.said("assistant", line, "tool_use")
                    self.output.write(f"● {line}\n")
            # (the summary: what it said this round, else the call it made last)
            self._work_summary = said or self.progress.last_activity or self._work_summary
            if self._asked_at is None:
                self.progress.summary = self._work_summary
        elif Agent.is_model_request_node(node):
            for req_part in node.request.parts:
                if isinstance(req_part, ToolReturnPart):
                    self.output.write(short_result(req_part.model_response_str()) + "\n")
                elif isinstance(req_part, RetryPromptPart):
                    self.output.write(short_result(f"error: {req_part.model_response()}") + "\n")
        self._count_run_drained()
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def _count(self, usage: Any) -> None:
        """Count a response; past max_tokens the run ends before its tool calls run."""
        from pydantic_ai.exceptions import UsageLimitExceeded

        self.progress.count(usage)
        cap, spent = self.limits.max_tokens, self.progress.token_count
        if cap is not None and spent > cap:
            raise UsageLimitExceeded(f"Exceeded the total_tokens_limit of {cap} (tokens={spent})")

    def _record(self, messages: list[Any] | None = None) -> None:
        if self.transcript is not None:
            self.transcript.append(self.history if messages is None else messages)
        self._fire_acks()


def _limit_name(message: str, limits: Limits) -> str:
    """The limit a UsageLimitExceeded message is about, in shoal's flag words."""
    lowered = message.lower()
    if "request" in lowered:
        return f"max turns ({limits.max_turns}): {message}"
    if "tool" in lowered:
        return f"max tool uses ({limits.max_tool_uses}): {message}"
    if "token" in lowered:
        return f"max tokens ({limits.max_tokens}): {message}"
    return message
