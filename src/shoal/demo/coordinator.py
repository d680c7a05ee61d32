"""`shoal demo --coordinator`: one coordinator dispatches six workers through the four phases.

Offline: scripted models (the package data file `demo_coordinator.toml`) for the coordinator
and every worker, on a small project the demo writes into a temporary directory (a Python
package whose test fails). Two read-only research workers run in parallel; the coordinator's
synthesis goes to the scratchpad; two implementers whose write sets overlap (the second waits
for the first's lease) and one with a disjoint set; a fresh worker runs the tests and they
pass. It prints the phase timeline, the leases, tokens and tool uses per worker, and leaves no
process, pane or team behind.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Final

from shoal.core.errors import ShoalError
from shoal.core.paths import Layout
from shoal.core.tasks import LocalAgentTaskState
from shoal.demo.swarm import demo_leader
from shoal.orchestrator.leader import Leader
from shoal.teams.store import Teams
from shoal.workers.agent.coordinator.mode import scratchpad_dir
from shoal.workers.agent.coordinator.turns import COORDINATOR_JOURNAL
from shoal.workers.agent.spec import AgentSpec

DEMO_TIMEOUT_S: Final = 55.0
SCRIPT: Final = "demo_coordinator.toml"
LEASE_WAIT: Final = re.compile(r"worker (?P<worker>\S+) waits for the lease of (?P<holder>\S+)")
PROJECT: Final = {
    "calc/__init__.py": '"""calc: a tiny calculator."""\n',
    "calc/ops.py": (
        "def add(a, b):\n    return a + b\n\n\n"
        "def divide(a, b):\n"
        "    if b == 0:\n"
        '        raise ZeroDivisionError("divide by zero")\n'
        "    return a // b\n"
    ),
    "tests/__init__.py": "",
    "tests/test_ops.py": (
        "import unittest\n\nfrom calc.ops import add, divide\n\n\n"
        "class OpsTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_divide(self):\n        self.assertEqual(divide(5, 2), 2.5)\n"
    ),
}


@dataclass
class WorkerRow:
    """One worker, for the summary."""

    id: str
    description: str
    status: str
    start: float
    end: float
    write_set: tuple[str, ...] | None
    fence: int | None
    tokens: int
    tool_uses: int


@dataclass
class CoordinatorDemoResult:
    """What the coordinator demo did."""

    team: str
    backend: str
    project: str
    seconds: float = 0.0
    result: str = ""
    workers: list[WorkerRow] = field(default_factory=list)
    synthesis: str = ""


def write_project(root: Path) -> None:
    """The demo's small project: a package whose divide floors, and a test that wants 2.5."""
    for rel, text in PROJECT.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_coordinator_demo(
    layout: Layout,
    *,
    backend: str,
    say: Callable[[str], None] = print,
    timeout: float = DEMO_TIMEOUT_S,
) -> CoordinatorDemoResult:
    """Run the demo; raises ShoalError if it goes `timeout` seconds without progress (a worker
    starting or ending, a tool call of the coordinator): a slow machine is no failure."""
    started = time.monotonic()
    teams = Teams(layout)
    team = teams.create("demo-coordinator", "shoal demo --coordinator", unique=True).name
    project = Path(tempfile.mkdtemp(prefix="shoal-demo-project-"))
    write_project(project)
    script = project.parent / f"{project.name}.toml"
    script.write_text(resources.files("shoal.demo").joinpath(SCRIPT).read_text())
    result = CoordinatorDemoResult(team=team, backend=backend, project=str(project))
    seen: set[str] = set()  # workers told as started
    waited: set[str] = set()  # workers told as waiting for a lease
    try:
        with demo_leader(layout, team) as leader:
            say(f"project {project}: calc/ops.py, whose test fails")
            coordinator = leader.start_agent(
                AgentSpec(
                    prompt="tests/test_ops.py fails. Find out why, fix it, document it, verify it.",
                    model=f"scripted:{script}",
                    coordinator=True,
                    permission_mode="bypassPermissions",  # (the demo's own temporary project)
                    backend=backend,
                    cwd=str(project),
                    description="coordinator: fix the failing test",
                )
            )
            say(f"coordinator {coordinator.id} ({backend}) dispatches; workers as they start:")
            if backend == "tmux":
                say(f"  watch them: shoal attach --team {team}")
            deadline = time.monotonic() + timeout
            final: LocalAgentTaskState | None = None
            last: tuple[object, ...] = ()
            while time.monotonic() < deadline:
                # A lease wait can be shorter than one look at the workers: the leader's note,
                # written when the wait begins, is what says it happened.
                waits = _lease_waits(leader)
                workers = _workers(leader, coordinator.agent_id)
                for worker in workers:
                    if worker.id in waits and worker.id not in waited:
                        waited.add(worker.id)
                        say(
                            f"  … {worker.id} {worker.description} waits for the lease of "
                            f"{waits[worker.id]}"
                        )
                    if worker.id not in seen and worker.status.value != "pending":
                        seen.add(worker.id)
                        lease = ", ".join(worker.write_set) if worker.write_set else "read-only"
                        say(f"  + {worker.id} {worker.description} [{lease}]")
                task = leader.call(lambda: leader.find_agent(coordinator.id)).result(10)
                if task.is_terminal:
                    final = task
                    break
                now = (
                    task.progress.tool_use_count if task.progress else 0,
                    *((w.id, w.status.value) for w in workers),
                )
                if now != last:
                    last, deadline = now, time.monotonic() + timeout
                time.sleep(0.05)
            if final is None:
                raise ShoalError(
                    f"the coordinator demo made no progress for {timeout:g}s; see "
                    f"`shoal ps --team {team} --all`"
                )
            if final.status.value != "completed":
                raise ShoalError(f"the coordinator {final.status.value}: {final.error}")
            result.result = final.result or ""
            result.workers = _rows(leader, final.agent_id, final.start_time)
            session_dir = Path(final.output_file).parent.parent
            pad = scratchpad_dir(session_dir) / COORDINATOR_JOURNAL
            with contextlib.suppress(OSError):
                result.synthesis = pad.read_text()
    finally:
        shutil.rmtree(project, ignore_errors=True)
        script.unlink(missing_ok=True)
        result.seconds = time.monotonic() - started
    return result


def _lease_waits(leader: Leader) -> dict[str, str]:
    """Worker id -> the holder it waited for, from the leader's notes (leases.py writes them)."""
    notes = leader.call(lambda: list(leader.notes)).result(10)
    return {m["worker"]: m["holder"] for n in notes if (m := LEASE_WAIT.fullmatch(n))}


def _workers(leader: Leader, agent_id: str) -> list[LocalAgentTaskState]:
    found = leader.call(lambda: leader.workers_of(agent_id)).result(10)
    return sorted(found, key=lambda t: t.start_time)


def _rows(leader: Leader, agent_id: str, t0: float) -> list[WorkerRow]:
    rows: list[WorkerRow] = []
    for w in _workers(leader, agent_id):
        usage = w.usage
        rows.append(
            WorkerRow(
                id=w.id,
                description=w.description,
                status=w.status.value,
                start=w.start_time - t0,
                end=(w.end_time or w.start_time) - t0,
                write_set=w.write_set,
                fence=(w.lease or {}).get("fence"),
                tokens=usage.total_tokens if usage else 0,
                tool_uses=usage.tool_uses if usage else 0,
            )
        )
    return rows


def summary(result: CoordinatorDemoResult) -> list[str]:
    """The lines the CLI prints after the demo."""
    lines = ["", f"done in {result.seconds:.1f}s with backend {result.backend}", ""]
    lines.append("phase timeline (seconds from the coordinator's start):")
    width = max((len(w.description) for w in result.workers), default=10)
    for w in result.workers:
        lease = f"lease #{w.fence} {', '.join(w.write_set)}" if w.write_set else "read-only"
        bar_start, bar_end = int(w.start * 4), max(int(w.end * 4), int(w.start * 4) + 1)
        bar = " " * min(bar_start, 60) + "█" * min(bar_end - bar_start, 60)
        lines.append(
            f"  {w.id} {w.description:<{width}} {w.start:5.1f}–{w.end:5.1f}  {w.status:<9} "
            f"{w.tokens:>5} tokens {w.tool_uses:>2} tools  {lease}"
        )
        lines.append(f"  {'':<{9 + width}} |{bar}")
    if result.synthesis:
        lines += ["", "what the coordinator said (its journal in the scratchpad, coordinator.md):"]
        lines += [f"  {line}" for line in result.synthesis.strip().splitlines() if line]
    lines += ["", f"result: {result.result}", ""]
    lines.append(f"team {result.team} deleted; no worker process or pane is left")
    return lines
