"""The kernel sandbox of an agent's commands, tried as an attack: a coordinator's worker whose
lease is `src/**` tries every way around it that the after-the-fact check missed (a commit,
`update-index --skip-worktree`, a gitignored path, `.git/hooks`, a file outside the working
directory, a writer that waits until the check is over, a same-size rewrite, `node_modules`,
a TCP connection), through real agents on the scripted model, in-process and in a process of
their own; a hostile `.git/config` that shoal's own `git status` must never run; and the
announced fallback where the kernel has no Landlock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.core import leasepolicy, sandbox
from shoal.core.sandbox import PRETEND_ABSENT_VAR, Policy
from shoal.workers.agent.coordinator import leasecheck
from tests.conftest import Cli
from tests.integration.test_agent_tasks import BYPASS, FAST, script
from tests.integration.test_coordinator import SCRIBBLER
from tests.polling import wait_until
from tests.security.support import TERMINAL, Records, running_leader

TEAM = "box"
RECORDS = Records(TEAM)
tasks = RECORDS.all
GIT_ID = ("-c", "user.email=t@example.com", "-c", "user.name=t")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], check=True, capture_output=True)


def make_repo(root: Path) -> Path:
    """A committed repository with an ignored build/, a node_modules/ and a src/ to lease."""
    repo = root / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "build").mkdir()
    (repo / "node_modules").mkdir()
    (repo / "README").write_text("A")
    (repo / "src" / "keep.py").write_text("keep\n")
    (repo / ".gitignore").write_text("build/\nnode_modules/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    return repo


@pytest.fixture
def leader(cli: Cli, home: Path) -> Iterator[Cli]:
    with running_leader(cli, TEAM):
        yield cli


@pytest.fixture
def listener() -> Iterator[int]:
    """A loopback TCP port something listens on (a connect succeeds unless it is boxed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def ended(cli: Cli, task_id: str, timeout: float = 90) -> dict[str, Any]:
    return RECORDS.ended(cli, task_id, timeout)


# -- the machine -----------------------------------------------------------------------------


def test_the_sandbox_is_really_active_on_this_machine(tmp_path: Path) -> None:
    """CI runs on a kernel with Landlock: a sandbox that silently is not there fails here."""
    assert os.environ.get(PRETEND_ABSENT_VAR, "") in ("", "0")
    assert sandbox.abi() >= 1, "this kernel offers no Landlock: the sandbox tests mean nothing"
    (tmp_path / "in").mkdir()
    with sandbox.prepare(Policy(dirs=(str(tmp_path / "in"),), network=False)) as ready:
        done = subprocess.run(
            ["sh", "-c", f"touch {tmp_path}/in/ok; touch {tmp_path}/out"],
            preexec_fn=ready.preexec,
            capture_output=True,
            text=True,
        )
    assert (tmp_path / "in" / "ok").exists()
    assert not (tmp_path / "out").exists() and "Permission denied" in done.stderr


def test_the_exec_wrapper_confines_what_it_runs(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    policy = Policy(dirs=(str(tmp_path / "in"),))
    argv = sandbox.wrapper_argv(policy, ["sh", "-c", "touch in/ok; touch out"])
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 1 and "Permission denied" in done.stderr
    assert (tmp_path / "in" / "ok").exists() and not (tmp_path / "out").exists()
    bad = subprocess.run(
        [*argv[: argv.index("shoal.core.sandbox") + 1], "{not json", "--", "true"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "bad policy" in bad.stderr


# -- from a lease to what Landlock grants -------------------------------------------------------


def test_a_lease_maps_to_paths_that_never_include_git_or_shoal(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    (repo / ".shoal").mkdir()
    (repo / "src" / "a.py").write_text("")
    (repo / "docs").mkdir()
    (repo / "docs" / "x.md").write_text("")

    dirs, files, _ = leasepolicy.lease_paths(repo, ["src/**"])
    assert (dirs, files) == ([str(repo / "src")], [])
    dirs, files, _ = leasepolicy.lease_paths(repo, ["README", "docs/*.md"])
    assert dirs == [str(repo / "docs")] and files == [str(repo / "README")]
    dirs, files, _ = leasepolicy.lease_paths(repo, ["**/*.py"])  # (its literal dir is the root)
    assert dirs == [] and sorted(files) == [str(repo / "src" / "a.py"), str(repo / "src/keep.py")]
    dirs, files, notes = leasepolicy.lease_paths(repo, ["**"])
    granted = {Path(p).name for p in (*dirs, *files)}
    assert ".git" not in granted and ".shoal" not in granted and {"src", "README"} <= granted
    assert any("top of the tree" in n for n in notes)
    dirs, files, notes = leasepolicy.lease_paths(repo, [".git/config", "new.py"])
    assert dirs == files == [] and len(notes) == 2
    (repo / "escape").symlink_to(tmp_path)  # (a hostile tree's link out of itself)
    (repo / "src" / "out.py").symlink_to(tmp_path / "elsewhere.py")
    (tmp_path / "elsewhere.py").write_text("")
    dirs, files, notes = leasepolicy.lease_paths(repo, ["escape/**", "escape", "src/*.py", "**"])
    every = [*dirs, *files]
    assert all(Path(p).is_relative_to(repo) for p in every), every
    assert sum("leads outside the tree" in n for n in notes) >= 3, notes


# -- shoal's own git runs nothing of the tree's config ------------------------------------------


def test_the_lease_checks_git_status_runs_nothing_from_the_repositorys_config(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path)
    (repo / ".gitattributes").write_text("* filter=evil\n")
    _git(repo, "config", "core.fsmonitor", f"sh -c 'touch {tmp_path}/pwned-fsmonitor'")
    _git(repo, "config", "filter.evil.clean", f"sh -c 'touch {tmp_path}/pwned-filter; cat'")
    _git(repo, "config", "filter.evil.required", "true")
    hook = repo / ".git" / "hooks" / "post-index-change"
    hook.write_text(f"#!/bin/sh\ntouch {tmp_path}/pwned-hook\n")
    hook.chmod(0o755)
    os.utime(repo / "README", (1, 1))  # (stat-dirty: git must look at its content)
    (repo / "src" / "keep.py").write_text("changed\n")

    snap = leasecheck.snapshot(repo)
    assert "src/keep.py" in snap and ".gitattributes" in snap
    from shoal.core.git import listed_files, toplevel

    assert toplevel(repo) == repo and "README" in listed_files(repo)
    assert sorted(p.name for p in tmp_path.glob("pwned*")) == []


# -- a worker's attack, through real agents -----------------------------------------------------

ATTACK = r"""
try() {
  name=$1; shift
  if ( "$@" ) >/dev/null 2>&1; then echo "$name: ok"; else echo "$name: denied"; fi
}
try outside sh -c 'touch outside.txt'
try commit git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x
try skip-worktree git update-index --skip-worktree README
try ignored sh -c 'echo x > build/out.txt'
try hook sh -c 'echo "#!/bin/sh" > .git/hooks/pre-commit'
try beyond sh -c 'echo x > ../beyond.txt'
try same-size sh -c 'printf B > README && touch -r src/keep.py README'
try node-modules sh -c 'echo x > node_modules/x.js'
try lease sh -c 'echo x > src/new.py'
try tmp sh -c 'echo x > "$TMPDIR/t"'
try tcp python3 -c 'import socket; socket.create_connection(("127.0.0.1", PORT), 5)'
"""

LATE = (
    "(until [ -e src/gate ]; do sleep 0.02; done; "
    "if echo x > late.txt; then echo ok; else echo denied; fi > src/late.rc) >/dev/null 2>&1 &"
)
WAIT_LATE = "touch src/gate; until [ -s src/late.rc ]; do sleep 0.02; done; cat src/late.rc"
BACKGROUND = (
    "echo $$ > src/bg.pid; until [ -e src/gate2 ]; do sleep 0.02; done; "
    "if echo x > bg.txt; then echo ok; else echo denied; fi > src/bg.rc; exit 7"
)
# (the background task's wrapper is gone, or a zombie: its exit code is on disk)
WAIT_BACKGROUND = (
    "touch src/gate2; until [ -s src/bg.rc ]; do sleep 0.02; done; p=$(cat src/bg.pid); "
    "while [ -e /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status 2>/dev/null; "
    "do sleep 0.02; done; cat src/bg.rc"
)


def attack_script(tmp_path: Path, port: int) -> str:
    attack = tmp_path / "attack.sh"
    attack.write_text(ATTACK.replace("PORT", str(port)))
    calls = [
        f"sh {attack}",
        "touch outside-raw.txt",
        LATE,
        WAIT_LATE,
    ]
    turn = '[[worker.turn]]\n[[worker.turn.call]]\ntool = "Bash"\nargs = {{ command = {} }}\n'
    turns = "".join(turn.format(json.dumps(c)) for c in calls)
    turns += (
        '[[worker.turn]]\n[[worker.turn.call]]\ntool = "Bash"\n'
        f"args = {{ command = {json.dumps(BACKGROUND)}, run_in_background = true }}\n"
        '[[worker.turn]]\n[[worker.turn.call]]\ntool = "Bash"\n'
        f"args = {{ command = {json.dumps(WAIT_BACKGROUND)} }}\n"
    )
    return script(
        tmp_path,
        f"""
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = {{ description = "attacker", prompt = "Attack", write_set = ["src/**"] }}
[[turn]]
text = "waiting"

[[worker]]
match = "^Attack"
final = "{{result_1}} || {{result_2}} || {{result_4}} || {{result_6}}"
{turns}""",
    )


@pytest.mark.parametrize("backend", ["in-process", "process"])
def test_a_worker_cannot_write_outside_its_lease_by_any_route(
    leader: Cli, tmp_path: Path, backend: str, listener: int
) -> None:
    repo = make_repo(tmp_path)
    _git(repo, "config", "core.fsmonitor", f"sh -c 'touch {tmp_path}/pwned'")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    model = attack_script(tmp_path, listener)
    out = leader("agent", "--team", TEAM, "--coordinator", "--model", model, "--cwd", str(repo),
                 "--backend", backend, *BYPASS, "go")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert ended(leader, out.stdout.strip())["status"] == "completed"
    (worker,) = [t for t in tasks(leader) if t.get("description") == "attacker"]
    attack, raw, late, background = worker["result"].split(" || ")
    seen = dict(line.split(": ", 1) for line in attack.splitlines() if ": " in line)
    assert seen == {
        "outside": "denied",
        "commit": "denied",
        "skip-worktree": "denied",
        "ignored": "denied",
        "hook": "denied",
        "beyond": "denied",
        "same-size": "denied",
        "node-modules": "denied",
        "lease": "ok",
        "tmp": "ok",
        "tcp": "denied",
    }, attack
    assert "Permission denied" in raw and "[exit code" in raw  # (what the model sees)
    assert late.strip() == "denied" and background.strip() == "denied"
    for gone in ("outside.txt", "outside-raw.txt", "late.txt", "bg.txt", "build/out.txt",
                 "node_modules/x.js", ".git/hooks/pre-commit"):  # fmt: skip
        assert not (repo / gone).exists(), gone
    assert not (tmp_path / "beyond.txt").exists() and not (tmp_path / "pwned").exists()
    assert (repo / "README").read_text() == "A" and (repo / "src" / "new.py").exists()
    assert subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout == head  # fmt: skip
    (shell,) = [t for t in tasks(leader) if t["type"] == "local_bash"]

    def shell_ended() -> dict[str, Any] | None:
        found = [t for t in tasks(leader) if t["id"] == shell["id"]]
        return found[0] if found and found[0]["status"] in TERMINAL else None

    shell = wait_until(shell_ended, what="the background task to end")
    assert shell["result"]["code"] == 7, shell  # (its wrapper wrote its exit file, confined)
    assert worker["violations"] == []


NETWORK = """
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = {{ description = "granted", prompt = "Net", write_set = ["src/**"], network = true }}
[[turn]]
text = "waiting"

[[worker]]
final = "{{result_1}}"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = {{ command = "{command}" }}
"""


@pytest.mark.parametrize("how", ["lease", "flag"])
def test_a_worker_granted_the_network_can_connect(
    leader: Cli, tmp_path: Path, listener: int, how: str
) -> None:
    repo = make_repo(tmp_path)
    command = (
        'python3 -c \'import socket; socket.create_connection((\\"127.0.0.1\\", '
        f'{listener}), 5); print(\\"connected\\")\''
    )
    text = NETWORK.format(command=command)
    extra: tuple[str, ...] = ()
    if how == "flag":  # (the user's --allow-network, for every worker of the run)
        text = text.replace(", network = true", "")
        extra = ("--allow-network",)
    out = leader("agent", "--team", TEAM, "--coordinator", "--model", script(tmp_path, text),
                 "--cwd", str(repo), "--backend", "in-process", *BYPASS, *extra, "go")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert ended(leader, out.stdout.strip())["status"] == "completed"
    (worker,) = [t for t in tasks(leader) if t.get("description") == "granted"]
    assert worker["result"].strip() == "connected", worker


MCP = """
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "mcp", prompt = "Scribble", write_set = ["src/**"] }
[[turn]]
text = "waiting"

[[worker]]
final = "{result_1} || {result_2}"
[[worker.turn]]
[[worker.turn.call]]
tool = "mcp__scribbler__scribble"
args = { name = "theirs.txt" }
[[worker.turn]]
[[worker.turn.call]]
tool = "mcp__scribbler__scribble"
args = { name = "src/mine.txt" }
"""


def test_a_workers_mcp_server_is_confined_to_its_lease(leader: Cli, tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    server = tmp_path / "scribbler.py"
    server.write_text(SCRIBBLER)
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"scribbler": {
        "command": sys.executable, "args": [str(server)]}}}))  # fmt: skip
    out = leader("agent", "--team", TEAM, "--coordinator", "--model", script(tmp_path, MCP),
                 "--cwd", str(repo), "--backend", "in-process", *BYPASS,
                 "--mcp-config", str(config), "go")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert ended(leader, out.stdout.strip())["status"] == "completed"
    (worker,) = [t for t in tasks(leader) if t.get("description") == "mcp"]
    theirs, mine = worker["result"].split(" || ")
    assert "tool_use_error" in theirs and "wrote src/mine.txt" in mine, worker
    assert not (repo / "theirs.txt").exists() and (repo / "src" / "mine.txt").exists()


# -- other agents, and where there is no sandbox --------------------------------------------------

AGENT = """
[[turn]]
[[turn.call]]
tool = "Bash"
args = { command = "touch inside.txt .git/mine && echo inside ok; touch ../beyond.txt" }
[[turn]]
text = "{result_1}"
"""


def run_agent(cli: Cli, tmp_path: Path, repo: Path, backend: str = "in-process") -> str:
    out = cli("agent", "--team", TEAM, "--model", script(tmp_path, AGENT), "--cwd", str(repo),
              "--backend", backend, *BYPASS, "go")  # fmt: skip
    assert out.returncode == 0, out.stderr
    task = ended(cli, out.stdout.strip())
    assert task["status"] == "completed", task
    return Path(task["output_file"]).read_text()


@pytest.mark.parametrize("backend", ["in-process", "process"])
def test_an_agent_that_is_no_worker_writes_its_tree_and_nothing_beyond(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    repo = make_repo(tmp_path)
    output = run_agent(leader, tmp_path, repo, backend)
    assert "inside ok" in output and "Permission denied" in output, output
    assert (repo / "inside.txt").exists() and (repo / ".git" / "mine").exists()
    assert not (tmp_path / "beyond.txt").exists()


def test_without_landlock_shoal_says_so_once_and_runs_unconfined(
    cli: Cli, home: Path, tmp_path: Path
) -> None:
    up = cli("up", "--team", TEAM, "--detach", "--quiet", env={**FAST, PRETEND_ABSENT_VAR: "1"})
    assert up.returncode == 0, up.stderr
    try:
        repo = make_repo(tmp_path)
        output = run_agent(cli, tmp_path, repo)
    finally:
        cli("down", "--team", TEAM)
    assert output.count("this kernel offers no Landlock") == 1, output
    assert (tmp_path / "beyond.txt").exists()


def test_the_user_can_turn_the_sandbox_off_and_is_told(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    (home / "config.toml").write_text("[sandbox]\nenabled = false\n")
    repo = make_repo(tmp_path)
    output = run_agent(leader, tmp_path, repo)
    assert output.count("sandbox: off (enabled = false") == 1, output
    assert (tmp_path / "beyond.txt").exists()


def test_config_writable_paths_are_writable_and_bad_ones_are_named(
    leader: Cli, home: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (home / "config.toml").write_text(f'[sandbox]\nwritable = ["{cache}"]\n')
    repo = make_repo(tmp_path)
    model = script(tmp_path, AGENT.replace("../beyond.txt", f"{cache}/c && echo cached"))
    out = leader("agent", "--team", TEAM, "--model", model, "--cwd", str(repo),
                 "--backend", "in-process", *BYPASS, "go")  # fmt: skip
    task = ended(leader, out.stdout.strip())
    assert "cached" in Path(task["output_file"]).read_text() and (cache / "c").exists()

    from shoal.core.config import sandbox_settings
    from shoal.core.errors import UsageError

    (home / "config.toml").write_text('[sandbox]\nwritable = "/"\n')
    with pytest.raises(UsageError, match=r"sandbox\.writable must be a list"):
        sandbox_settings(home)


# -- teammates that asked for it ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["process", "in-process"])
def test_a_sandboxed_teammates_commands_write_only_its_tree(
    leader: Cli, tmp_path: Path, backend: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    brain = tmp_path / "brain.toml"
    brain.write_text(
        '[[step]]\nwhen = "task"\nrun = "touch ../beyond.txt; touch inside.txt; '
        'echo $TMPDIR > done.txt"\n'
    )
    spawned = leader("spawn", "ana", "--team", TEAM, "--backend", backend, "--script",
                     str(brain), "--cwd", str(work), "--sandbox", "--json")  # fmt: skip
    assert spawned.returncode == 0, spawned.stderr
    assert leader("task", "add", "--team", TEAM, "first").returncode == 0
    done = work / "done.txt"
    wait_until(lambda: done.exists() and done.read_text().strip(), timeout=60, what="the turn")
    assert (work / "inside.txt").exists() and not (tmp_path / "beyond.txt").exists()
    assert Path(done.read_text().strip()).is_dir()  # (a tmp of its own)


BIG_TREE = """
final = "done"
[[turn]]
[[turn.call]]
tool = "Agent"
args = { description = "big", prompt = "Write", write_set = ["src/**"] }
[[turn]]
text = "waiting"

[[worker]]
final = "{result_1}"
[[worker.turn]]
[[worker.turn.call]]
tool = "Bash"
args = { command = "echo x > zzz-last.txt" }
"""


def test_a_tree_past_the_scan_limit_is_boxed_all_the_same(leader: Cli, tmp_path: Path) -> None:
    """Outside git the after-the-fact check scans at most 10,000 files; the box has no limit."""
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    bulk = tree / "aaa"
    bulk.mkdir()
    for i in range(leasecheck.MAX_SCANNED + 1):
        (bulk / f"{i}.txt").touch()
    out = leader("agent", "--team", TEAM, "--coordinator", "--model", script(tmp_path, BIG_TREE),
                 "--cwd", str(tree), "--backend", "in-process", *BYPASS, "go")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert ended(leader, out.stdout.strip())["status"] == "completed"
    (worker,) = [t for t in tasks(leader) if t.get("description") == "big"]
    assert "Permission denied" in worker["result"] and not (tree / "zzz-last.txt").exists()
