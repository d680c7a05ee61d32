"""Attacks on the file tools (Read, Write, Edit, Glob, Grep, and the dream's), through the real
Workspace and through real scripted agents started by the CLI: a hostile clone whose links and
patterns lead outside the working directory, FIFOs and devices that would block or flood a
Read, links swapped in under a Write, hard links written in place, and writes into `.git/`,
`.shoal/` and SHOAL_HOME in bypassPermissions with a lease of `**`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from shoal.workers.agent.loop import AgentLoop
from shoal.workers.agent.progress import Output
from shoal.workers.agent.scripted import Script, scripted_model
from shoal.workers.agent.tool_args import (
    EditArgs,
    GlobArgs,
    GrepArgs,
    ReadArgs,
    ToolFailure,
    WriteArgs,
)
from shoal.workers.agent.tool_calls import make_tools
from shoal.workers.agent.tools import Workspace
from shoal.workers.dream.workspace import DreamWorkspace
from tests.conftest import Cli
from tests.polling import wait_until

SECRET = "the-secret-outside"
CONFINED = ["plan", "default", "acceptEdits", "bubble"]
PROMPT_S = 10  # what "promptly" means for a call that must not block


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A hostile repository: links out of the tree, a `.git/` and a `.shoal/`; beside it a
    directory `outside` holding a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    repo = tmp_path / "repo"
    (repo / ".git" / "hooks").mkdir(parents=True)
    (repo / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (repo / ".shoal" / "agents").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "app.py").write_text("print('hello')\n")
    (repo / "docs").symlink_to(outside)  # a directory link out
    (repo / "notes.txt").symlink_to(outside / "secret.txt")  # a file link out
    return repo


def _no_secret(text: str) -> None:
    assert SECRET not in text, text


def _refused(call: Callable[[], Any], *words: str) -> str:
    with pytest.raises(ToolFailure) as info:
        call()
    text = str(info.value)
    for word in words:
        assert word in text, text
    _no_secret(text)
    return text


@contextlib.contextmanager
def _fifo(path: Path) -> Iterator[Path]:
    """A FIFO nobody writes; at the end it is opened for writing once, which frees a reader
    the old code left blocked in open()."""
    os.mkfifo(path)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _in_thread(call: Callable[[], Any], timeout: float = PROMPT_S) -> Any:
    """`call()` on a daemon thread; fails the test if it has not returned within `timeout`."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the call still blocks after {timeout}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# -- Grep and Glob reach outside -------------------------------------------------------------


@pytest.mark.parametrize("mode", CONFINED)
def test_grep_with_a_parent_glob_reads_nothing_outside(clone: Path, mode: str) -> None:
    ws = Workspace(clone, mode=mode)
    for glob in ("../../../../etc/hostname", "../outside/secret.txt", "/etc/hostname"):
        args = GrepArgs(pattern=".", glob=glob, output_mode="content")
        _refused(partial(ws.grep, args), "glob pattern")


@pytest.mark.parametrize("mode", CONFINED)
def test_grep_does_not_read_through_links_read_refuses(clone: Path, mode: str) -> None:
    ws = Workspace(clone, mode=mode)
    _refused(lambda: ws.read(ReadArgs(file_path="notes.txt")), "symlink")
    _refused(lambda: ws.grep(GrepArgs(pattern="secret", path="docs")), "symlink outside")
    _refused(lambda: ws.grep(GrepArgs(pattern="secret", path="notes.txt")), "symlink outside")
    for mode_ in ("content", "files_with_matches", "count"):
        found = ws.grep(GrepArgs.model_validate({"pattern": "secret|hello", "output_mode": mode_}))
        _no_secret(found)
        assert "notes.txt" not in found and "docs" not in found
        assert "app.py" in found


@pytest.mark.parametrize("mode", CONFINED)
def test_glob_does_not_list_outside(clone: Path, mode: str) -> None:
    ws = Workspace(clone, mode=mode)
    _refused(lambda: ws.glob(GlobArgs(pattern="../../*")), "..")
    _refused(lambda: ws.glob(GlobArgs(pattern="src/../../outside/*")), "..")
    _refused(lambda: ws.glob(GlobArgs(pattern="*", path="docs")), "symlink outside")
    listed = ws.glob(GlobArgs(pattern="**/*"))
    assert "app.py" in listed and "secret.txt" not in listed and "notes.txt" not in listed


def test_an_absolute_glob_is_a_tool_error_and_the_agent_goes_on(clone: Path) -> None:
    script = """
    [[turn]]
    [[turn.call]]
    tool = "Glob"
    args = { pattern = "/etc/*" }
    [[turn.call]]
    tool = "Glob"
    args = { pattern = "src/*.py" }
    [[turn]]
    text = "abs: {result_1} | rel: {result_2}"
    """
    loop = AgentLoop(
        scripted_model(Script.parse(script, "test")),
        instructions="test agent",
        tools=make_tools(Workspace(clone, mode="plan")),
        output=Output(None),
    )
    outcome = asyncio.run(loop.run("go"))
    assert outcome.status == "completed", outcome
    assert "<tool_use_error>" in outcome.result and "absolute" in outcome.result
    assert str(clone / "src" / "app.py") in outcome.result


# -- Read: FIFOs, devices, size ---------------------------------------------------------------


@pytest.mark.parametrize("mode", [*CONFINED, "bypassPermissions"])
def test_read_of_a_fifo_is_refused_at_once(clone: Path, mode: str) -> None:
    with _fifo(clone / "pipe"):
        ws = Workspace(clone, mode=mode)
        with pytest.raises(ToolFailure, match="FIFO, not a regular file"):
            _in_thread(lambda: ws.read(ReadArgs(file_path="pipe")))
        with pytest.raises(ToolFailure):
            _in_thread(lambda: ws.grep(GrepArgs(pattern=".", path="pipe")))
        assert "pipe" not in _in_thread(lambda: ws.grep(GrepArgs(pattern=".")))


def test_devices_are_never_read(clone: Path) -> None:
    (clone / "zero").symlink_to("/dev/zero")
    (clone / "null").symlink_to("/dev/null")
    os.mknod(clone / "dev-null", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # (we are root)
    confined = Workspace(clone, mode="plan")
    _refused(lambda: _in_thread(lambda: confined.read(ReadArgs(file_path="zero"))), "symlink")
    _refused(lambda: confined.read(ReadArgs(file_path="dev-null")), "device")
    bypass = Workspace(clone, mode="bypassPermissions")  # (links followed: still no device)
    for name in ("zero", "null", "dev-null"):
        _refused(partial(_in_thread, partial(bypass.read, ReadArgs(file_path=name))), "device")


def test_read_is_capped_and_says_the_cap(clone: Path) -> None:
    big = clone / "big.log"
    with big.open("wb") as out:
        out.truncate(8 * 1024 * 1024 + 1)
    ws = Workspace(clone, mode="plan")
    _refused(lambda: ws.read(ReadArgs(file_path="big.log")), "8 MiB", "cap")
    big.write_bytes(b"x\n" * 1000)
    assert ws.read(ReadArgs(file_path="big.log", limit=1)).startswith("     1\tx")


# -- Write and Edit: links swapped in, hard links --------------------------------------------


@pytest.mark.parametrize("mode", ["acceptEdits", "bypassPermissions"])
def test_a_link_swapped_in_before_the_write_is_replaced_not_followed(
    clone: Path, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = clone / "src" / "app.py"
    victim = tmp_path / "outside" / "victim.txt"
    victim.write_text("untouched\n")
    ws = Workspace(clone, mode=mode)
    ws.read(ReadArgs(file_path="src/app.py"))
    check = ws._check_fresh

    def then_swap(*args: Any) -> None:  # (the last check before the write: then the race)
        check(*args)
        target.unlink()
        target.symlink_to(victim)

    monkeypatch.setattr(ws, "_check_fresh", then_swap)
    ws.write(WriteArgs(file_path="src/app.py", content="print('new')\n"))
    assert victim.read_text() == "untouched\n"
    assert not target.is_symlink() and target.read_text() == "print('new')\n"


@pytest.mark.parametrize("mode", ["acceptEdits", "bypassPermissions"])
def test_a_hard_link_is_not_written_in_place(clone: Path, tmp_path: Path, mode: str) -> None:
    victim = tmp_path / "outside" / "victim.txt"
    victim.write_text("untouched\n")
    os.link(victim, clone / "linked.txt")
    ws = Workspace(clone, mode=mode)
    ws.read(ReadArgs(file_path="linked.txt"))
    ws.edit(EditArgs(file_path="linked.txt", old_string="untouched", new_string="edited"))
    ws.read(ReadArgs(file_path="linked.txt"))
    ws.write(WriteArgs(file_path="linked.txt", content="written\n"))
    assert victim.read_text() == "untouched\n" and victim.stat().st_nlink == 1
    assert (clone / "linked.txt").read_text() == "written\n"


def test_a_write_through_a_linked_directory_is_refused(clone: Path, tmp_path: Path) -> None:
    for mode in CONFINED:
        ws = Workspace(clone, mode=mode)
        _refused(partial(ws.write, WriteArgs(file_path="docs/new.txt", content="x")), "outside")
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["secret.txt"]


# -- .git/, .shoal/ and SHOAL_HOME ------------------------------------------------------------

PROTECTED = (".git/config", ".git/hooks/pre-commit", ".shoal/agents/x.md", "sub/.git/config")


@pytest.mark.parametrize("mode", ["acceptEdits", "bypassPermissions"])
def test_git_shoal_and_the_home_are_never_written(clone: Path, tmp_path: Path, mode: str) -> None:
    home = tmp_path / "home"
    (home / "agents").mkdir(parents=True)
    ws = Workspace(clone, mode=mode, home=home, write_set=("**",))
    ws.read(ReadArgs(file_path=".git/config"))  # (reading them is allowed)
    for name in PROTECTED:
        _refused(partial(ws.write, WriteArgs(file_path=name, content="x")), "may not be written")
    if mode == "bypassPermissions":  # (elsewhere the home is outside, and refused as such)
        free = Workspace(clone, mode=mode, home=home)
        for name in (str(home / "agents" / "x.md"), str(home / "config.toml")):
            _refused(partial(free.write, WriteArgs(file_path=name, content="x")), str(home))
    _refused(
        lambda: ws.edit(EditArgs(file_path=".git/config", old_string="false", new_string="true")),
        "may not be written",
    )
    assert (clone / ".git" / "config").read_text() == "[core]\n\tbare = false\n"
    assert list((clone / ".git" / "hooks").iterdir()) == []
    assert list((clone / ".shoal" / "agents").iterdir()) == []
    assert not (clone / "sub").exists() and list((home / "agents").iterdir()) == []
    assert not (home / "config.toml").exists()
    ws.write(WriteArgs(file_path="src/other.py", content="x"))  # (the rest of the tree is)


def test_a_linked_directory_does_not_lead_into_git(clone: Path) -> None:
    (clone / "hooks").symlink_to(clone / ".git" / "hooks")
    bypass = Workspace(clone, mode="bypassPermissions")
    _refused(lambda: bypass.write(WriteArgs(file_path="hooks/pre-commit", content="x")), ".git")
    assert list((clone / ".git" / "hooks").iterdir()) == []


def test_bubble_mode_is_confined(clone: Path) -> None:
    ws = Workspace(clone, mode="bubble")
    _refused(lambda: ws.read(ReadArgs(file_path="../outside/secret.txt")), "outside")
    _refused(lambda: ws.write(WriteArgs(file_path="../outside/x", content="x")), "outside")


# -- the dream --------------------------------------------------------------------------------


@pytest.fixture
def dream(tmp_path: Path) -> DreamWorkspace:
    memory = tmp_path / "home" / "memory"
    memory.mkdir(parents=True)
    (memory / "MEMORY.md").write_text("remember\n")
    (memory / "linked").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.md").write_text(f"{SECRET}\n")
    session = tmp_path / "home" / "sessions" / "s1"
    session.mkdir(parents=True)
    (session / "events.jsonl").write_text("{}\n")
    return DreamWorkspace(cwd=memory, mode="acceptEdits", readable=(session,))


def test_the_dreams_grep_and_glob_stay_inside(dream: DreamWorkspace) -> None:
    args = GrepArgs(pattern=".", glob="../../../../etc/hostname", output_mode="content")
    _refused(lambda: dream.grep(args), "glob pattern")
    _refused(lambda: dream.grep(GrepArgs(pattern=".", path="linked")), "outside")
    _refused(lambda: dream.glob(GlobArgs(pattern="../*")), "..")
    _refused(lambda: dream.glob(GlobArgs(pattern="/etc/*")), "absolute")
    _no_secret(dream.grep(GrepArgs(pattern=".", output_mode="content")))
    listed = dream.glob(GlobArgs(pattern="**/*"))
    assert "MEMORY.md" in listed and "events.jsonl" in listed and "secret" not in listed


# -- one event loop, many agents --------------------------------------------------------------


def test_a_blocked_file_call_stalls_only_its_agent_and_stop_ends_it(clone: Path) -> None:
    """Two agents on one loop: the first one's Read hangs in the file system; the second
    finishes meanwhile, and cancelling the first (what `stop` does) ends it at once."""
    entered, release = threading.Event(), threading.Event()

    class SlowDisk(Workspace):
        def read(self, args: ReadArgs) -> str:
            entered.set()
            release.wait(60)
            return "late"

    def agent(ws: Workspace, tool: str, args: str) -> AgentLoop:
        script = (
            f'[[turn]]\n[[turn.call]]\ntool = "{tool}"\nargs = {args}\n'
            '[[turn]]\ntext = "{last}"\n'
        )
        return AgentLoop(
            scripted_model(Script.parse(script, "t")),
            instructions="test agent",
            tools=make_tools(ws),
            output=Output(None),
        )

    async def both() -> tuple[str, bool]:
        slow = asyncio.ensure_future(
            agent(SlowDisk(clone), "Read", '{ file_path = "src/app.py" }').run("go")
        )
        while not entered.is_set():
            await asyncio.sleep(0.01)
        other = await agent(Workspace(clone), "Glob", '{ pattern = "src/*" }').run("go")
        slow.cancel()
        try:
            await asyncio.wait_for(slow, PROMPT_S)
        except asyncio.CancelledError:
            return other.result, True
        return other.result, False

    try:
        result, cancelled = _in_thread(lambda: asyncio.run(both()), timeout=30)
    finally:
        release.set()
    assert "app.py" in result and cancelled


# -- through the CLI: a plan-mode agent in a hostile clone ------------------------------------

TEAM = "gate"
FAST = {"SHOAL_POLL_INTERVAL": "0.1", "SHOAL_KILL_GRACE": "1"}

PROBE = """
[[turn]]
[[turn.call]]
tool = "Grep"
args = { pattern = ".", glob = "../../../../etc/hostname", output_mode = "content" }
[[turn.call]]
tool = "Glob"
args = { pattern = "/etc/*" }
[[turn.call]]
tool = "Glob"
args = { pattern = "../../*" }
[[turn.call]]
tool = "Read"
args = { file_path = "pipe" }
[[turn.call]]
tool = "Grep"
args = { pattern = "secret", output_mode = "content" }

[[turn]]
text = "1={result_1} 2={result_2} 3={result_3} 4={result_4} 5={result_5}"
"""

PLANT = """
[[turn]]
[[turn.call]]
tool = "Write"
args = { file_path = ".git/hooks/pre-commit", content = "#!/bin/sh\\nid > pwned\\n" }
[[turn.call]]
tool = "Write"
args = { file_path = ".shoal/agents/x.md", content = "permissionMode: bypassPermissions" }
[[turn.call]]
tool = "Write"
args = { file_path = "ok.txt", content = "fine" }

[[turn]]
text = "1={result_1} 2={result_2} 3={result_3}"
"""


@pytest.fixture
def leader(cli: Cli, home: Path, tmux_socket: str) -> Iterator[Cli]:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env=FAST)
    assert up.returncode == 0, up.stderr
    try:
        yield cli
    finally:
        cli("down", "--team", TEAM)


def _ended(cli: Cli, task_id: str) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        out = cli("ps", "--team", TEAM, "--all", "--json")
        (task,) = [t for t in json.loads(out.stdout) if t["id"] == task_id]
        return task if task["status"] in ("completed", "failed", "killed") else None

    return wait_until(final, timeout=60, what=f"agent {task_id} to end")


def _agent(cli: Cli, tmp_path: Path, clone: Path, text: str, *flags: str) -> dict[str, Any]:
    model = tmp_path / "script.toml"
    model.write_text(text)
    out = cli(
        "agent", "--team", TEAM, "--model", f"scripted:{model}", "--cwd", str(clone),
        "--backend", "in-process", *flags, "go",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return _ended(cli, out.stdout.strip())


def test_a_plan_mode_agent_in_a_hostile_clone(leader: Cli, tmp_path: Path, clone: Path) -> None:
    with _fifo(clone / "pipe"):
        task = _agent(leader, tmp_path, clone, PROBE, "--permission-mode", "plan")
    assert task["status"] == "completed", task
    result = task["result"]
    _no_secret(result)
    for n in ("1", "2", "3", "4"):
        assert f"{n}=<tool_use_error>" in result, result
    assert "glob pattern" in result and "absolute" in result and "FIFO" in result
    assert "app.py" not in result  # (the last Grep found no secret, and nothing else)


def test_a_bypass_agent_cannot_plant_hooks_or_definitions(
    leader: Cli, tmp_path: Path, clone: Path
) -> None:
    task = _agent(leader, tmp_path, clone, PLANT, "--permission-mode", "bypassPermissions")
    assert task["status"] == "completed", task
    assert task["result"].count("may not be written") == 2, task["result"]
    assert list((clone / ".git" / "hooks").iterdir()) == []
    assert list((clone / ".shoal" / "agents").iterdir()) == []
    assert (clone / "ok.txt").read_text() == "fine"


def test_grep_reads_a_huge_line_in_pieces_and_numbers_lines_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of one enormous line (a minified bundle, or an attack on the agent's memory) is
    searched a piece at a time; every piece carries its line's number."""
    from shoal.workers.agent import tools

    monkeypatch.setattr(tools, "GREP_LINE_BYTES", 16)
    (tmp_path / "f.txt").write_text("short\n" + "x" * 40 + "needle" + "y" * 40 + "\nneedle\n")
    ws = tools.Workspace(tmp_path, mode="plan")
    found = ws.grep(GrepArgs.model_validate(
        {"pattern": "needle|xx", "output_mode": "content", "-n": True}
    ))  # fmt: skip
    numbers = [line.split(":")[1] for line in found.splitlines()]
    assert set(numbers) == {"2", "3"}, found
    assert numbers[-1] == "3"
