"""The worker entry point's logic: build a teammate runner from its options and run it.

`shoal worker` (a process or a tmux/iTerm2 pane) and the in-process backend build the runner
here from the very same options, so every backend runs the same teammate.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from shoal.core.config import Limits
from shoal.core.errors import UsageError
from shoal.core.paths import Layout
from shoal.core.procs import is_alive
from shoal.core.sandbox import Policy
from shoal.workers.teammate.brains import Brain, make_brain
from shoal.workers.teammate.console import Console
from shoal.workers.teammate.runner import RunnerConfig, TeammateRunner


@dataclass(frozen=True)
class WorkerOptions:
    """The options of `shoal worker`."""

    team: str
    name: str
    agent: str = "scripted"
    script: str | None = None
    cmd: str | None = None
    model: str | None = None  # the llm brain's
    plan_mode: bool = False
    sandbox: bool = False  # its commands run in a kernel sandbox (see core/sandbox.py)
    task_id: str | None = None
    output: str | None = None
    cwd: str | None = None
    backend: str = "process"
    joined: bool = False
    output_cap: int | None = None  # bytes; None: the cap of this process's limits

    def argv(self, executable: str, home: Path) -> list[str]:
        """The `shoal worker` command line that runs a teammate with these options."""
        argv = [executable, "-m", "shoal", "--home", str(home), "worker", "--team", self.team]
        argv += ["--name", self.name, "--agent", self.agent, "--backend", self.backend]
        for flag, value in (
            ("--task-id", self.task_id),
            ("--output", self.output),
            ("--cwd", self.cwd),
            ("--script", self.script),
            ("--cmd", self.cmd),
            ("--model", self.model),
        ):
            if value is not None:
                argv += [flag, value]
        if self.plan_mode:
            argv.append("--plan-mode")
        if self.sandbox:
            argv.append("--sandbox")
        if self.joined:
            argv.append("--joined")
        if self.output_cap is not None:
            argv += ["--output-cap", str(self.output_cap)]
        return argv


def teammate_sandbox(layout: Layout, opts: WorkerOptions, cwd: str) -> Policy | None:
    """The sandbox of a `--sandbox` teammate's commands: its working tree, a tmp of its own
    (the team's `tmp/NAME/`, its TMPDIR), the paths of `[sandbox] writable` in config.toml,
    network on. None when sandboxes are off or the kernel has none: said once, here, on
    stderr (its commands then run unconfined)."""
    from shoal.core import leasepolicy, sandbox
    from shoal.core.config import sandbox_settings, sandbox_unix_sockets

    enabled, writable = sandbox_settings(layout.home)
    if not enabled or sandbox.abi() < 1:
        why = "enabled = false in SHOAL_HOME/config.toml" if not enabled else "no Landlock here"
        print(f"shoal: --sandbox: {why}; this teammate's commands run unconfined", file=sys.stderr)
        return None
    tmp = layout.ensure(layout.team_dir(opts.team) / "tmp" / opts.name)
    return leasepolicy.agent_policy(
        Path(cwd),
        "acceptEdits",
        None,
        tmp=tmp,
        network=True,
        extra=writable,
        unix=sandbox_unix_sockets(layout.home),
        home=layout.home,
    )


def build_runner(layout: Layout, opts: WorkerOptions) -> TeammateRunner:
    """A runner for `opts` (the brain and files checked here, before joining the team)."""
    brain: Brain
    if opts.agent in ("claude", "codex"):
        from shoal.workers.teammate.presets import CliAgentBrain

        if opts.script or opts.model:
            raise UsageError(
                f"--agent {opts.agent} takes --cmd (the {opts.agent} command), not --script/--model"
            )
        brain = CliAgentBrain(opts.agent, opts.cmd)
    elif opts.agent == "llm":
        if opts.cmd or opts.script:
            raise UsageError("--agent llm takes --model, not --cmd or --script")
        from shoal.workers.agent.llm_brain import make_llm_brain  # (only its teammates pay)

        brain = make_llm_brain(opts.model)
    else:
        brain = make_brain(
            opts.agent,
            script=Path(opts.script) if opts.script else None,
            cmd=opts.cmd,
            model=opts.model,
        )
    cwd = opts.cwd or os.getcwd()
    if not os.path.isdir(cwd):
        raise UsageError(f"working directory {cwd!r} does not exist")
    if opts.output:
        output = Path(opts.output)
    else:
        logs = layout.ensure(layout.team_dir(opts.team) / "logs")
        output = logs / f"{opts.name}.output"
    policy = teammate_sandbox(layout, opts, cwd) if opts.sandbox else None
    tmp = layout.team_dir(opts.team) / "tmp" / opts.name
    config = RunnerConfig(
        team=opts.team,
        name=opts.name,
        brain=brain,
        output_file=output,
        cwd=cwd,
        task_id=opts.task_id,
        plan_mode=opts.plan_mode,
        sandbox=policy,
        env={"TMPDIR": str(tmp)} if policy is not None else {},
        backend=opts.backend,
        pane_id=os.environ.get("TMUX_PANE") if opts.backend == "tmux" else None,
        member_pid=_pane_stub_pid() if opts.backend == "tmux" else None,
        agent_type=opts.agent,
        joined=opts.joined,
        output_cap=opts.output_cap if opts.output_cap is not None else Limits().output_cap,
        # A pane shows the worker's stdout; the process backend logs it. In-process teammates
        # share the leader's stdout: their console stays off.
        console=Console.off() if opts.backend == "in-process" else Console.for_stdout(),
    )
    return TeammateRunner(layout, config)


def _pane_stub_pid() -> int | None:
    """The pid of the pane stub this worker was forked for (`SHOAL_PANE_PID`, taken out of
    the environment so that its commands do not inherit it), when it still runs."""
    raw = os.environ.pop("SHOAL_PANE_PID", None)
    try:
        pid = int(raw) if raw is not None else None
    except ValueError:
        return None
    return pid if pid is not None and is_alive(pid, None) else None


def run_worker(layout: Layout, opts: WorkerOptions) -> int:
    """Run a teammate in this process until it shuts down; returns its exit code.

    SIGTERM aborts the whole teammate; SIGINT aborts only its current turn.
    """
    runner = build_runner(layout, opts)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, runner.abort)
        loop.add_signal_handler(signal.SIGHUP, runner.abort)
        loop.add_signal_handler(signal.SIGINT, runner.abort_turn)
        return await runner.run()

    return asyncio.run(main())
