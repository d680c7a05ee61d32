"""The `llm` teammate brain: each turn continues the teammate's own conversation on a real
model (or the scripted one), with the file and shell tools and the team tools — SendMessage
(sent as the teammate), TaskCreate, TaskGet, TaskList, TaskUpdate.

The conversation lives as long as the teammate (in memory); its readable text goes to the
teammate's output file like any brain's. A teammate started with `--plan-mode` works in plan
mode: Write, Edit, Bash, a task's `metadata.run` are refused until ExitPlanMode's plan is
approved by the lead (the teammate's plan-approval request); then it goes on as a teammate
started without it does (nothing asks).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from shoal.core.config import model_idle_s, tool_retries
from shoal.core.errors import ShoalError, UsageError
from shoal.core.paths import resolve_home
from shoal.workers.agent.loop import AgentLoop
from shoal.workers.agent.models import ModelSpec, build_model, check_model, choose_model
from shoal.workers.agent.permissions import Gate
from shoal.workers.agent.progress import Output
from shoal.workers.agent.team_tools import TeamTools
from shoal.workers.agent.tool_args import ToolFailure
from shoal.workers.agent.tool_calls import make_tools
from shoal.workers.agent.tools import Workspace
from shoal.workers.teammate.brains import TurnContext, TurnResult

# What a teammate's model may use (its shells and files, the team's list and messages).
LLM_TEAMMATE_TOOLS = (
    "Read", "Write", "Edit", "Glob", "Grep", "Bash",
    "SendMessage", "TaskCreate", "TaskGet", "TaskList", "TaskUpdate",
)  # fmt: skip
# A teammate's mode without --plan-mode (it was started by the user), and after its plan.
TEAMMATE_MODE = "bypassPermissions"


class _NoLeader:
    """A teammate reaches the leader only through messages: these tools are not its."""

    def call(self, op: str, args: dict[str, Any]) -> Any:
        raise ToolFailure(f"{op!r} is not available to a teammate; send the lead a message")

    def task_records(self) -> dict[str, dict[str, Any]]:
        return {}


class _TeammateTools(TeamTools):
    """The team tools, with SendMessage going out as the teammate itself."""

    ctx: TurnContext | None = None

    async def sendmessage(self, args: Any) -> str:
        if self.ctx is None:
            raise ToolFailure("SendMessage is only available during a turn")
        await self.ctx.send(args.to, args.message)
        return f"sent to {args.to}"


class LlmBrain:
    """A teammate whose turns are model runs continuing one conversation."""

    def __init__(self, model: str | None) -> None:
        env = dict(os.environ)
        self.spec = choose_model(model, None, env, resolve_home())
        check_model(self.spec, env)  # a missing key or script: refused before it joins
        self.loop: AgentLoop | None = None
        self.tools: _TeammateTools | None = None
        self.gate: Gate | None = None

    async def _ask(self, tool: str, shown: dict[str, Any]) -> tuple[bool, str | None]:
        """The gate's question: only a plan is ever asked (a teammate's plan approval)."""
        assert self.tools is not None
        ctx = self.tools.ctx
        if tool != "ExitPlanMode" or ctx is None:
            return False, f"a teammate cannot ask the lead to run {tool}"
        return await ctx.approve_plan(str(shown.get("plan") or ""))

    def _loop_for(self, ctx: TurnContext) -> AgentLoop:
        if self.loop is None:
            cwd = Path(ctx.cwd)
            env = {**os.environ, **ctx.env}
            self.tools = _TeammateTools(
                resolve_home(), ctx.team, ctx.name, _NoLeader(), cwd=ctx.cwd
            )
            mode = "plan" if ctx.plan_mode else TEAMMATE_MODE
            self.gate = Gate(mode, self._ask, approved=TEAMMATE_MODE)
            allowed = (*LLM_TEAMMATE_TOOLS, "ExitPlanMode") if ctx.plan_mode else LLM_TEAMMATE_TOOLS
            home = resolve_home()
            self.loop = AgentLoop(
                build_model(self.spec, env, cwd, idle_s=model_idle_s(home)),
                instructions=(
                    f"You are {ctx.name}, a teammate of team {ctx.team}. Work on what you are "
                    "given, keep the team's task list up to date, and message the lead "
                    "(team-lead) when it helps."
                ),
                tools=make_tools(
                    Workspace(cwd=cwd, mode=mode, env=dict(ctx.env)),
                    allowed,
                    self.tools,
                    self.gate,
                ),
                # (its readable transcript is also what its pane shows, as it is written)
                output=Output(
                    ctx.output_file, echo=ctx.console.transcript if ctx.console.enabled else False
                ),
                tool_retries=tool_retries(home),
            )
        return self.loop

    async def turn(self, ctx: TurnContext) -> TurnResult:
        try:
            loop = self._loop_for(ctx)
        except (ShoalError, OSError, ValueError) as exc:
            return TurnResult(False, f"the model cannot run: {exc}")
        assert self.tools is not None
        self.tools.ctx = ctx
        task = ctx.task or {}
        prompt = ctx.prompt
        if task:
            prompt += f"\n\nTask #{task.get('id')}: {task.get('subject', '')}"
            if task.get("description"):
                prompt += f"\n{task['description']}"
        before = loop.progress.tool_use_count
        ctx.activity("thinking")
        outcome = await loop.run(prompt)
        steps = loop.progress.tool_use_count - before
        tokens = loop.progress.token_count  # (the conversation's: it goes on over turns)
        if outcome.status != "completed":
            return TurnResult(False, outcome.error or "the model run failed", steps, tokens=tokens)
        return TurnResult(True, outcome.result, steps, tokens=tokens)


def make_llm_brain(model: str | None) -> LlmBrain:
    """The `llm` brain for `--model` (a UsageError for a bad spec, named)."""
    if model is not None:
        ModelSpec.parse(model)
    try:
        return LlmBrain(model)
    except ShoalError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None
