"""Coordinator mode through the real CLI and a real leader, on scripted models (one script for
the coordinator and, in its `[[worker]]` tables, its workers): background workers whose ends
arrive once each, write-set leases (read-only workers, waiting on an overlap, writes outside
the lease refused, Bash changes outside it recorded), budgets, and the bad inputs."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core.sandbox import PRETEND_ABSENT_VAR
from tests.conftest import Cli
from tests.integration.test_agent_tasks import BYPASS, FAST, script
from tests.polling import wait_until

TEAM = "co"
TERMINAL = ("completed", "failed", "killed")


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


@pytest.fixture
def unboxed(cli: Cli, home: Path) -> Iterator[Cli]:
    """A leader whose agents' commands run as on a kernel without Landlock: for the tests of
    the after-the-fact lease check, the second line behind the sandbox."""
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env={**FAST, PRETEND_ABSENT_VAR: "1"})
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def tasks(cli: Cli) -> list[dict[str, Any]]:
    out = cli("ps", "--team", TEAM, "--all", "--json")
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def record(cli: Cli, task_id: str) -> dict[str, Any]:
    (task,) = [t for t in tasks(cli) if t["id"] == task_id]
    return task


def ended(cli: Cli, task_id: str, timeout: float = 60) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        task = record(cli, task_id)
        return task if task["status"] in TERMINAL else None

    return wait_until(final, timeout=timeout, what=f"agent {task_id} to end")


def coordinate(cli: Cli, model: str, cwd: Path, *extra: str, prompt: str = "go") -> str:
    out = cli(
        "agent", "--team", TEAM, "--coordinator", "--model", model, "--cwd", str(cwd),
        *extra, prompt,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def notified_ids(transcript: Path) -> list[str]:
    """The task ids of the notifications in a transcript's conversation (as `load` reads it:
    truncate records applied), as often as each appears."""
    import re

    from shoal.workers.agent.progress import prompt_texts
    from shoal.workers.agent.transcript import Transcript

    seen: list[str] = []
    for text in prompt_texts(Transcript.load(transcript).messages):
        seen += re.findall(r"<task-notification>\s*<task-id>([^<]+)<", text)
    return seen


RESEARCH = """
final = "noted {turn}"

[[turn]]
text = "Research in parallel."
[[turn.call]]
tool = "Agent"
args = { description = "one", prompt = "Research one" }
[[turn.call]]
tool = "Agent"
args = { description = "two", prompt = "Research two" }
[[turn.call]]
tool = "Agent"
args = { description = "three", prompt = "Research three" }

[[turn]]
text = "Waiting."

[[worker]]
match = "^Research"
final = "found: {prompt}"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "echo looking" }
"""


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_workers_run_in_the_background_and_each_end_arrives_once(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    model = script(tmp_path, RESEARCH)
    coord = coordinate(leader, model, tmp_path, "--backend", backend, *BYPASS)
    waited = leader("wait", "--team", TEAM, coord, "--timeout", "90")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    task = record(leader, coord)
    assert task["status"] == "completed" and task["coordinator"], task
    assert task["agent_type"] == "coordinator" and task["result"].startswith("noted")
    workers = [t for t in tasks(leader) if t.get("worker_of") == task["agent_id"]]
    assert len(workers) == 3 and all(w["status"] == "completed" for w in workers), workers
    assert all(w["write_set"] is None and "Write" not in w["tools"] for w in workers)
    assert {w["result"] for w in workers} == {f"found: Research {n}" for n in
                                              ("one", "two", "three")}  # fmt: skip
    ids = notified_ids(Path(task["transcript"]))
    assert sorted(ids) == sorted(w["id"] for w in workers), ids  # each exactly once
    inbox = next(Path(task["output_file"]).parent.parent.glob("agents/*.coordinator.inbox"))
    assert not list((inbox / "new").iterdir()) and not list((inbox / "cur").iterdir())
    first = Path(task["output_file"]).read_text()
    assert "<coordinator-context>" in first and "scratchpad" in first


LEASED = """
final = "all done"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "first", prompt = "Implement first", write_set = ["src/*.py"] }
[[turn.call]]
tool = "Agent"
args = { description = "docs", prompt = "Implement docs", write_set = ["docs/**"] }

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "second", prompt = "Implement second", write_set = ["src/calc.py"] }

[[turn]]
text = "Waiting for the implementers."

[[worker]]
match = "^Implement first"
final = "first: {result_1} | {result_2} | {result_3}"
[[worker.turn]]
[[worker.turn.call]]
tool = "Write"
args = { file_path = "src/calc.py", content = "x = 1\\n" }
[[worker.turn]]
[[worker.turn.call]]
tool = "Write"
args = { file_path = "docs/notes.md", content = "not mine\\n" }
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 1; echo sneaky > outside.txt" }

[[worker]]
match = "^Implement second"
final = "second wrote"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "echo second > src/calc.py" }

[[worker]]
match = "^Implement docs"
final = "docs: {result_1}"
[[worker.turn]]
[[worker.turn.call]]
tool = "Write"
args = { file_path = "docs/guide.md", content = "guide\\n" }
"""


def test_leases_hold_one_writer_per_file_set(unboxed: Cli, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    model = script(tmp_path, LEASED)
    coord = coordinate(unboxed, model, tmp_path, "--backend", "in-process", *BYPASS)

    def second() -> dict[str, Any] | None:
        found = [t for t in tasks(unboxed) if t.get("description") == "second"]
        return found[0] if found else None

    waiting = wait_until(second, what="the second worker")
    first = next(t for t in tasks(unboxed) if t.get("description") == "first")
    if waiting["status"] == "pending":  # (the first may be done already on a fast machine)
        assert waiting["waiting_for"]["lease"] == first["id"], waiting
        shown = unboxed("ps", "--team", TEAM, "--all").stdout
        assert (
            f"[waiting for the lease of {first['id']}]" in shown
            or record(unboxed, waiting["id"])["status"] != "pending"
        )
    task = ended(unboxed, coord, timeout=90)
    assert task["status"] == "completed", task
    rows = {t["description"]: t for t in tasks(unboxed) if t.get("worker_of")}
    one, two, docs = rows["first"], rows["second"], rows["docs"]
    assert one["status"] == two["status"] == docs["status"] == "completed"
    assert one["lease"]["fence"] != two["lease"]["fence"]
    # The second started only once the first had ended: it never held the lease with it.
    assert two["start_time"] >= one["end_time"], (one, two)
    assert "created" in one["result"].split(" | ")[0]
    assert "outside this worker's lease" in one["result"].split(" | ")[1]
    assert "lease violation" in one["result"].split(" | ")[2]
    (violation,) = one["violations"]
    assert violation["paths"] == ["outside.txt"] and "sneaky" in violation["command"]
    assert docs["result"].startswith("docs: created")
    assert (tmp_path / "src" / "calc.py").read_text() == "second\n"
    assert not (tmp_path / "docs" / "notes.md").exists()
    leases = json.loads(next(Path(task["output_file"]).parent.parent.glob("leases.json"))
                        .read_text())  # fmt: skip
    assert leases["leases"] == {}  # every lease released when its holder ended


# A real MCP server (the mcp SDK over stdio) whose `scribble` tool writes a file in its cwd.
SCRIBBLER = """
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("scribbler")


@server.tool()
def scribble(name: str) -> str:
    Path(name).write_text("scribbled\\n")
    return f"wrote {name}"


server.run()
"""

MCP_WORKER = """
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "mcp", prompt = "Scribble", write_set = ["mine/*"] }
[[turn]]
text = "waiting"

[[worker]]
final = "{result_1}"
[[worker.turn]]
[[worker.turn.call]]
tool = "mcp__scribbler__scribble"
args = { name = "theirs.txt" }
"""


def test_an_mcp_tool_that_writes_outside_the_lease_is_a_violation(
    unboxed: Cli, tmp_path: Path
) -> None:
    server = tmp_path / "scribbler.py"
    server.write_text(SCRIBBLER)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"scribbler": {  # (it runs in the agent's cwd)
        "command": sys.executable, "args": [str(server)]}}}))  # fmt: skip
    model = script(tmp_path, MCP_WORKER)
    coord = coordinate(unboxed, model, tmp_path, "--backend", "in-process", *BYPASS,
                       "--mcp-config", str(config))  # fmt: skip
    task = ended(unboxed, coord, timeout=90)
    assert task["status"] == "completed", task
    (worker,) = [t for t in tasks(unboxed) if t.get("worker_of") == task["agent_id"]]
    assert "wrote theirs.txt" in worker["result"], worker
    assert "lease violation" in worker["result"], worker
    (violation,) = worker["violations"]
    assert violation["paths"] == ["theirs.txt"], violation
    assert "scribble" in violation["command"], violation


BAD_CALLS = """
final = "bad: {result_1} || {result_2} || {result_3} || {result_4} || {result_5}"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "abs", prompt = "x", write_set = ["/etc/passwd"] }
[[turn.call]]
tool = "Agent"
args = { description = "escape", prompt = "x", write_set = ["../elsewhere/*"] }
[[turn.call]]
tool = "Agent"
args = { description = "notalist", prompt = "x", write_set = "src/*.py" }
[[turn.call]]
tool = "Agent"
args = { description = "greedy", prompt = "x", budget = { tokens = 999999 } }
[[turn.call]]
tool = "TaskStop"
args = { task_id = "a00000000" }
"""


def test_bad_worker_requests_are_tool_errors(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, BAD_CALLS)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process",
                       "--budget-tokens", "5000")  # fmt: skip
    task = ended(leader, coord)
    assert task["status"] == "completed", task
    results = task["result"].removeprefix("bad: ").split(" || ")
    assert "'/etc/passwd' is absolute" in results[0], results[0]
    assert "leads outside the working directory" in results[1], results[1]
    assert "must be a non-empty list of globs" in results[2], results[2]
    assert "budget tokens=999999 is more than the run has left" in results[3], results[3]
    assert "a00000000" in results[4], results[4]
    assert not [t for t in tasks(leader) if t.get("worker_of")]  # nothing was started


PERMS = """
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "w", prompt = "Work", write_set = ["*.txt"] }
[[turn]]
text = "waiting"

[[worker]]
final = "worker done"
"""


def test_workers_take_the_run_model_and_never_a_wider_mode(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, PERMS)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process",
                       "--budget-tokens", "50000", "--budget-tool-uses", "30")  # fmt: skip
    task = ended(leader, coord)
    assert task["status"] == "completed", task
    (worker,) = [t for t in tasks(leader) if t.get("worker_of") == task["agent_id"]]
    # (a coordinator in default gives its workers default: a lease says where, not unasked)
    assert worker["permission_mode"] == "default" and worker["model"] == task["model"]
    assert not worker["fork"] and not task["fork"]
    assert worker["budget"]["tokens"] <= 50000 and worker["limits"]["max_tool_uses"] <= 30
    shown = leader("ps", "--team", TEAM, "--all").stdout
    assert "/50,000 tokens" in shown and "/30 tool uses]" in shown, shown


SHARED_BUDGET = """
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "one", prompt = "Count one" }
[[turn.call]]
tool = "Agent"
args = { description = "two", prompt = "Count two" }
[[turn]]
text = "waiting"

[[worker]]
final = "counted"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 0.2" }
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 0.2" }
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 0.2" }
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 0.2" }
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 0.2" }
"""


def test_parallel_workers_share_what_the_run_has_and_are_stopped_when_it_is_spent(
    leader: Cli, tmp_path: Path
) -> None:
    # Neither worker asked for a share: both start (the run holds nothing for them), each
    # limited to what the run had left; together (2 + 5 + 5 tool uses) they pass the run's
    # 10, and the run stops what still runs, `failed`, naming its limit.
    model = script(tmp_path, SHARED_BUDGET)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process", *BYPASS,
                       "--budget-tool-uses", "10")  # fmt: skip
    task = ended(leader, coord)
    assert task["status"] == "completed", task
    workers = [t for t in tasks(leader) if t.get("worker_of") == task["agent_id"]]
    assert sorted(w["description"] for w in workers) == ["one", "two"], workers
    assert not [w for w in workers if "nothing left" in (w.get("error") or "")], workers
    stopped = [w for w in workers if w["status"] == "failed"]
    assert stopped, workers
    for worker in stopped:
        assert "the run's tool uses budget (10) is spent" in worker["error"], worker
    shown = leader("ps", "--team", TEAM, "--all").stdout
    assert "/10 tool uses]" in shown, shown


SLOW_WORKER = """
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "slow", prompt = "Sleep" }
[[turn]]
text = "waiting"

[[worker]]
final = "slept"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 60" }
"""


def test_the_seconds_budget_bounds_the_coordinators_own_time(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, SLOW_WORKER)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process", *BYPASS,
                       "--budget-seconds", "4")  # fmt: skip
    task = ended(leader, coord, timeout=40)
    # The coordinator's own wall time is capped too (a backstop for the time it spends
    # thinking or waiting, which no worker's share counts); the worker, holding all the run
    # had left, is stopped at its share: which of the two fires first is a race of instants.
    assert task["limits"]["timeout"] == 4.0, task["limits"]
    (worker,) = [t for t in tasks(leader) if t.get("description") == "slow"]
    worker = ended(leader, worker["id"], timeout=30)
    assert worker["status"] in ("failed", "killed"), worker
    assert worker["limits"]["timeout"] <= 4.0, worker["limits"]


def test_budget_flags_need_coordinator_mode(leader: Cli, tmp_path: Path) -> None:
    out = leader("agent", "--team", TEAM, "--budget-tokens", "10", "hi")
    assert out.returncode == 2 and "add --coordinator" in out.stderr


def test_the_mode_comes_from_the_environment_and_a_resume_keeps_it(
    leader: Cli, tmp_path: Path
) -> None:
    model = script(tmp_path, 'final = "plain answer"\n')
    out = leader(
        "agent", "--team", TEAM, "--model", model, "--backend", "in-process", "hello",
        env={"SHOAL_COORDINATOR_MODE": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    task = ended(leader, out.stdout.strip())
    assert task["coordinator"] and task["status"] == "completed", task
    resumed = leader("agent", "--team", TEAM, "--no-coordinator", "--resume", task["id"], "more")
    assert resumed.returncode == 0, resumed.stderr
    assert "entered coordinator mode to match the resumed session" in resumed.stderr
    again = ended(leader, resumed.stdout.strip())
    assert again["coordinator"] and again["resumed_from"] == task["id"]


SLOW = """
final = "resumed: {turn}"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "a", prompt = "Slow a" }
[[turn.call]]
tool = "Agent"
args = { description = "b", prompt = "Slow b" }
[[turn.call]]
tool = "Agent"
args = { description = "c", prompt = "Slow c" }
[[turn]]
text = "waiting"

[[worker]]
final = "slept"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "while [ ! -e go ]; do sleep 0.05; done" }
"""


def test_a_coordinator_killed_while_workers_end_sees_each_end_once_after_resume(
    leader: Cli, tmp_path: Path
) -> None:
    model = script(tmp_path, SLOW)
    coord = coordinate(leader, model, tmp_path, "--backend", "process",
                       "--permission-mode", "bypassPermissions")  # fmt: skip

    def three() -> list[dict[str, Any]] | None:
        found = [t for t in tasks(leader) if t.get("worker_of")]
        return found if len(found) == 3 and all(t["status"] == "running" for t in found) else None

    wait_until(three, timeout=60, what="three running workers")
    pid = wait_until(lambda: record(leader, coord).get("pid"), what="the coordinator's pid")
    os.kill(pid, signal.SIGSTOP)  # (it cannot take the notifications while they land)
    try:
        (tmp_path / "go").touch()  # all three end at once
        wait_until(
            lambda: all(t["status"] in TERMINAL for t in tasks(leader) if t.get("worker_of")),
            timeout=30, what="the workers to end",
        )  # fmt: skip
    finally:
        os.kill(pid, signal.SIGKILL)
    dead = ended(leader, coord)
    assert dead["status"] in ("failed", "killed"), dead
    resumed = leader("agent", "--team", TEAM, "--resume", coord, "go on")
    assert resumed.returncode == 0, resumed.stderr
    final = ended(leader, resumed.stdout.strip(), timeout=60)
    assert final["status"] == "completed", final
    workers = [t for t in tasks(leader) if t.get("worker_of") == final["agent_id"]]
    ids = notified_ids(Path(final["transcript"]))
    assert sorted(ids) == sorted(w["id"] for w in workers), ids


CONTINUED = """
final = "heard {turn}"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "quick", prompt = "Quick one" }
[[turn.call]]
tool = "Agent"
args = { description = "slow", prompt = "Slow one", write_set = ["bg.pid"] }
[[turn.call]]
tool = "SendMessage"
args = { to = "a00000000", message = "anyone?" }
[[turn]]
text = "waiting: {result_3}"

[[worker]]
match = "^Slow"
final = "slow done"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 300 >/dev/null 2>&1 & echo $! >bg.pid;until [ -e go ]; do sleep 1; done" }

[[worker]]
final = "quick: {prompt}"
"""


def test_a_finished_worker_continued_by_a_message_reports_to_its_coordinator(
    leader: Cli, tmp_path: Path
) -> None:
    model = script(tmp_path, CONTINUED)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process", *BYPASS)

    def worker(name: str) -> dict[str, Any] | None:
        found = [t for t in tasks(leader) if t.get("description") == name and t.get("worker_of")]
        return found[0] if found else None

    def quick_done() -> dict[str, Any] | None:
        found = worker("quick")
        return found if found is not None and found["status"] == "completed" else None

    quick = wait_until(quick_done, what="the quick worker")
    sent = leader("send", "--team", TEAM, quick["id"], "once more")
    assert sent.returncode == 0, sent.stderr
    again = sent.stdout.strip()
    assert again != quick["id"]
    continued = ended(leader, again)
    assert continued["worker_of"] == quick["worker_of"] and continued["parent_agent"] == coord
    transcript = Path(record(leader, coord)["transcript"])
    wait_until(lambda: again in notified_ids(transcript), what="the continued worker's end")
    out = Path(record(leader, coord)["output_file"]).read_text()
    assert "no task a00000000" in out or "a00000000" in out.split("waiting:")[1]
    (tmp_path / "go").touch()
    task = ended(leader, coord)
    assert task["status"] == "completed", task
    ids = notified_ids(transcript)
    slow = worker("slow")
    assert slow is not None and sorted(ids) == sorted({quick["id"], again, slow["id"]}), ids


def test_stopping_a_worker_stops_its_shells_and_tells_its_coordinator(
    leader: Cli, tmp_path: Path
) -> None:
    model = script(tmp_path, CONTINUED)
    pid_file = tmp_path / "bg.pid"
    pid_file.touch()  # (its lease: a command may rewrite a leased file, not create one)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process", *BYPASS)
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the shell")
    bg = int(pid_file.read_text())
    slow = next(t for t in tasks(leader) if t.get("description") == "slow")
    stopped = leader("stop", "--team", TEAM, slow["id"])
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: not _alive(bg), timeout=20, what="the worker's background sleep to die")
    task = ended(leader, coord)
    assert task["status"] == "completed", task
    assert slow["id"] in notified_ids(Path(task["transcript"]))
    assert record(leader, slow["id"])["status"] == "killed"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


STALLING = """
final = "after: {prompt}"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "reader", prompt = "Read the note" }
[[turn]]
text = "waiting"

[[worker]]
final = "read: {last}"
[[worker.turn]]
wait_for = "go"
[[worker.turn.call]]
tool = "Read"
args = { file_path = "note.txt" }
"""


def test_a_silent_worker_is_reported_stalled_once(cli: Cli, tmp_path: Path) -> None:
    # The worker's model holds its first answer until `go` exists: no model response, no
    # tool output.
    up = cli("up", "--team", "st", "--detach", "--quiet",
             env={**FAST, "SHOAL_WORKER_STALL_S": "1"})  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        (tmp_path / "note.txt").write_text("unblocked\n")
        model = script(tmp_path, STALLING.replace('"go"', json.dumps(str(tmp_path / "go"))))
        out = cli("agent", "--team", "st", "--coordinator", "--model", model, "--cwd",
                  str(tmp_path), "--backend", "process", *BYPASS, "go")  # fmt: skip
        assert out.returncode == 0, out.stderr
        coord = out.stdout.strip()
        rows = json.loads(cli("ps", "--team", "st", "--all", "--json").stdout)
        output = Path(next(t for t in rows if t["id"] == coord)["output_file"])
        wait_until(lambda: output.exists() and "appears stalled" in output.read_text(),
                   timeout=60, what="the stall notice")  # fmt: skip
        (tmp_path / "go").touch()

        def done() -> dict[str, Any] | None:
            rows = json.loads(cli("ps", "--team", "st", "--all", "--json").stdout)
            task = next(t for t in rows if t["id"] == coord)
            return task if task["status"] in TERMINAL else None

        task = wait_until(done, timeout=60, what="the coordinator to end")
        assert task["status"] == "completed", task
        from shoal.workers.agent.transcript import Transcript

        prompts = [p.content for m in Transcript.load(Path(task["transcript"])).messages
                   for p in m.parts if p.part_kind == "user-prompt"]  # fmt: skip
        assert sum("appears stalled" in str(text) for text in prompts) == 1, prompts
        (worker,) = [t for t in json.loads(cli("ps", "--team", "st", "--all", "--json").stdout)
                     if t.get("worker_of")]  # fmt: skip
        assert "unblocked" in worker["result"]
        assert notified_ids(Path(task["transcript"])).count(worker["id"]) == 2  # notice + end
    finally:
        cli("down", "--team", "st")


def test_twenty_workers_ending_at_once_each_arrive_once(leader: Cli, tmp_path: Path) -> None:
    n = 20
    calls = "".join(
        f'[[turn.call]]\ntool = "Agent"\nargs = {{ description = "w{i}", prompt = "Work {i}" }}\n'
        for i in range(n)
    )
    text = (
        f'final = "noted"\n\n[[turn]]\n{calls}\n[[turn]]\ntext = "waiting"\n\n'
        '[[worker]]\nfinal = "done"\n[[worker.turn]]\n[[worker.turn.call]]\ntool = "Bash"\n'
        'args = { command = "until [ -e go ]; do sleep 0.05; done" }\n'
    )
    model = script(tmp_path, text)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process", *BYPASS)
    output = Path(record(leader, coord)["output_file"])
    wait_until(lambda: output.exists() and f"waiting for {n} worker(s)" in output.read_text(),
               timeout=60, what="all the workers to run")  # fmt: skip
    (tmp_path / "go").touch()
    task = ended(leader, coord, timeout=90)
    assert task["status"] == "completed", task
    ids = notified_ids(Path(task["transcript"]))
    assert len(ids) == n == len(set(ids)), ids


READER = """
final = "waiting"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "reader", prompt = "Read the data" }

# (keyed to the end's arrival, not to the request's number: a worker that ends during the
# Agent call's round has its end in the second request already)
[[after]]
notifications = 1
text = "report: {notified}"

[[worker]]
final = "data says {last}"
[[worker.turn]]
[[worker.turn.call]]
tool = "Read"
args = { file_path = "data.txt" }
"""


def test_a_replayed_run_makes_no_model_calls_and_reports_a_divergence(
    leader: Cli, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.txt").write_text("forty-two\n")
    model = script(tmp_path, READER)
    original = ended(leader, coordinate(leader, model, work, "--backend", "in-process"))
    assert original["status"] == "completed" and "forty-two" in original["result"], original
    out = leader("agent", "--team", TEAM, "--coordinator", "--replay", original["id"],
                 "--backend", "in-process")  # fmt: skip
    assert out.returncode == 0, out.stderr
    replayed = ended(leader, out.stdout.strip())
    assert replayed["status"] == "completed", replayed
    assert replayed["model"] == f"replay:{original['transcript']}"
    assert replayed["result"] == original["result"]
    (worker,) = [t for t in tasks(leader) if t.get("worker_of") == replayed["agent_id"]]
    assert worker["model"].startswith("replay:"), worker
    assert worker["status"] == "completed", worker["error"]
    # The file the worker reads changed: its replay stops at the turn where it diverged.
    (work / "data.txt").write_text("something else\n")
    out = leader("agent", "--team", TEAM, "--coordinator", "--replay", original["id"],
                 "--backend", "in-process")  # fmt: skip
    diverged = ended(leader, out.stdout.strip())
    (worker,) = [t for t in tasks(leader) if t.get("worker_of") == diverged["agent_id"]]
    assert worker["status"] == "failed" and "diverged at turn 2" in worker["error"], worker
    assert "something else" in worker["error"] and "forty-two" in worker["error"]


def test_replay_needs_a_coordinator_run(leader: Cli, tmp_path: Path) -> None:
    out = leader("agent", "--team", TEAM, "--replay", "a00000000")
    assert out.returncode == 2 and "add --coordinator" in out.stderr
    out = leader("agent", "--team", TEAM, "--coordinator", "--replay", "a00000000")
    assert out.returncode == 2 and "no coordinator run 'a00000000'" in out.stderr


HOLDING = """
final = "done"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "first", prompt = "Hold it", write_set = ["src/**"] }

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "second", prompt = "After it", write_set = ["src/a.py"] }

[[turn]]
text = "waiting"

[[worker]]
match = "^Hold"
final = "started a shell"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "sleep 30", run_in_background = true }

[[worker]]
final = "second ran"
"""


def test_a_lease_is_held_until_the_holders_shells_are_gone(leader: Cli, tmp_path: Path) -> None:
    model = script(tmp_path, HOLDING)
    coord = coordinate(leader, model, tmp_path, "--backend", "in-process", *BYPASS)
    task = ended(leader, coord, timeout=90)
    assert task["status"] == "completed", task
    rows = tasks(leader)
    first = next(t for t in rows if t.get("description") == "first")
    second = next(t for t in rows if t.get("description") == "second")
    (shell,) = [t for t in rows if t["type"] == "local_bash" and t.get("owner") == first["id"]]
    assert shell["status"] in TERMINAL and first["end_time"] <= shell["end_time"]
    assert second["start_time"] >= shell["end_time"], (shell, second)


BACKGROUND_WRITER = """
final = "done"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "bg", prompt = "Write in the background", write_set = ["src/*"] }

[[turn]]
text = "waiting"

[[worker]]
final = "told: {prompt}"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "echo x > outside.txt", run_in_background = true }
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "until [ -e outside.txt ]; do sleep 0.05; done; sleep 2" }
"""


def test_a_workers_background_command_is_lease_checked_when_it_ends(
    unboxed: Cli, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    model = script(tmp_path, BACKGROUND_WRITER)
    coord = coordinate(unboxed, model, tmp_path, "--backend", "in-process", *BYPASS)
    task = ended(unboxed, coord, timeout=90)
    assert task["status"] == "completed", task
    (worker,) = [t for t in tasks(unboxed) if t.get("description") == "bg"]
    (violation,) = worker["violations"]
    assert violation["paths"] == ["outside.txt"] and "(background b" in violation["command"]


def test_the_leaders_environment_does_not_make_subagents_coordinators(
    cli: Cli, tmp_path: Path
) -> None:
    up = cli("up", "--team", "envmode", "--detach", "--quiet",
             env={**FAST, "SHOAL_COORDINATOR_MODE": "1"})  # fmt: skip
    assert up.returncode == 0, up.stderr
    try:
        model = script(tmp_path, SUBAGENT_CALL)
        out = cli("agent", "--team", "envmode", "--no-coordinator", "--backend", "in-process",
                  "--model", model, *BYPASS, "top")  # fmt: skip
        assert out.returncode == 0, out.stderr

        def done() -> list[dict[str, Any]] | None:
            rows = json.loads(cli("ps", "--team", "envmode", "--all", "--json").stdout)
            return rows if rows and all(r["status"] in TERMINAL for r in rows) else None

        rows = wait_until(done, timeout=60, what="the agent and its subagent")
        assert len(rows) == 2 and not any(r["coordinator"] for r in rows), rows
    finally:
        cli("down", "--team", "envmode")


SUBAGENT_CALL = """
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "helper", prompt = "say hi", subagent_type = "general-purpose" }

[[turn]]
text = "parent saw: {last}"
"""


# A real MCP server (the mcp SDK over stdio) with a tool that writes a file: a worker's MCP
# calls are lease-checked as its Bash commands are.
WRITING_SERVER = """
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("writer")


@server.tool()
def write(path: str, text: str) -> str:
    Path(path).write_text(text)
    return "wrote " + path


server.run()
"""

MCP_LEASED = """
final = "done"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "mcp", prompt = "Implement via mcp", write_set = ["src/**"] }

[[turn]]
text = "Waiting."

[[worker]]
match = "^Implement via mcp"
final = "mcp: {result_1} || {result_2}"
[[worker.turn]]
[[worker.turn.call]]
tool = "mcp__writer__write"
args = { path = "src/ok.py", text = "x = 1" }
[[worker.turn]]
[[worker.turn.call]]
tool = "mcp__writer__write"
args = { path = "elsewhere.txt", text = "not mine" }
"""


def test_a_workers_mcp_calls_are_lease_checked(unboxed: Cli, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    server = tmp_path / "writer_server.py"
    server.write_text(WRITING_SERVER)
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps({"mcpServers": {"writer": {"command": sys.executable, "args": [str(server)]}}})
    )
    model = script(tmp_path, MCP_LEASED)
    coord = coordinate(
        unboxed, model, tmp_path, "--backend", "in-process", "--mcp-config", str(config), *BYPASS
    )
    assert ended(unboxed, coord, timeout=90)["status"] == "completed"
    (worker,) = [t for t in tasks(unboxed) if t.get("description") == "mcp"]
    first, second = worker["result"].split(" || ")
    assert first.endswith("wrote src/ok.py"), worker["result"]
    assert "lease violation" not in first
    assert "lease violation" in second and "elsewhere.txt" in second, worker["result"]
    (violation,) = worker["violations"]
    assert violation["paths"] == ["elsewhere.txt"]
    assert violation["command"] == "mcp__writer__write"


WORKER_TYPED = """
final = "done: {notified}"

[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "typed", prompt = "Typed work", subagent_type = "worker" }

[[turn]]
text = "Waiting."

[[worker]]
final = "typed worker done"
"""


def test_the_originals_worker_type_names_the_built_in_worker(leader: Cli, tmp_path: Path) -> None:
    # (a model that knows the original names its worker type "worker")
    coord = coordinate(leader, script(tmp_path, WORKER_TYPED), tmp_path, "--backend", "in-process")
    task = ended(leader, coord)
    assert task["status"] == "completed", task
    assert task["result"] == "done: typed worker done", task["result"]
    (worker,) = [t for t in tasks(leader) if t.get("worker_of") == task["agent_id"]]
    assert worker["status"] == "completed" and worker["agent_type"] == "general-purpose"
