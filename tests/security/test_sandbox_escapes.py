"""Ways around the command sandbox that Landlock's write rules alone leave open, each tried for
real: a root command's capabilities (a device node made for a loop device and written through),
a unix socket to an unconfined server (a tmux server of the user's runs what it is told), the
exec wrapper importing a project's own `shoal/` package before it confines anything, a leased
symlink into `.git/config` (made before the policy, or swapped in after), a filter driver whose
name hides a `=` from `git -c`, a smudge filter run by `git worktree add`, and a SHOAL_HOME that
lies inside the working tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.core import git, sandbox
from shoal.core.leasepolicy import agent_policy
from shoal.core.sandbox import Policy
from shoal.workers.agent.coordinator import leasecheck
from tests.polling import wait_until

pytestmark = pytest.mark.skipif(sandbox.abi() < 1, reason="the kernel offers no Landlock")
GIT_ID = ("-c", "user.email=t@example.com", "-c", "user.name=t")


def confined(policy: Policy, command: str, cwd: Path | None = None) -> tuple[int, str]:
    proc = sandbox.popen_confined(
        policy, ["/bin/sh", "-c", command], cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out.decode(errors="replace")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *GIT_ID, *args], check=True, capture_output=True)


def test_a_confined_command_keeps_no_capability_and_makes_no_device(tmp_path: Path) -> None:
    """As root a command could mknod a block device (a loop device over a file outside, or the
    disk itself) in its writable tree and write through it; it has no capability left."""
    tree = tmp_path / "tree"
    tree.mkdir()
    code, out = confined(Policy(dirs=(str(tree),)), "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status")
    assert code == 0, out
    assert all(line.split()[1] == "0000000000000000" for line in out.splitlines()), out
    code, out = confined(Policy(dirs=(str(tree),)), f"mknod {tree}/blk b 7 0")
    assert code != 0 and not (tree / "blk").exists(), out


def test_no_unix_socket_reaches_an_unconfined_tmux_server(tmp_path: Path) -> None:
    """A tmux server of the user's (outside the box) runs whatever a client asks; a confined
    command cannot make the socket that would ask it."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    sock = tmp_path / "tmux.sock"
    out_dir = tmp_path / "outside"
    out_dir.mkdir()
    subprocess.run(["tmux", "-S", str(sock), "new-session", "-d", "sleep 600"], check=True)
    try:
        tree = tmp_path / "tree"
        tree.mkdir()
        code, out = confined(
            Policy(dirs=(str(tree),)),
            f"tmux -S {sock} run-shell 'touch {out_dir}/escaped'",
        )
        assert code != 0, out
        assert not (out_dir / "escaped").exists()
        # The same command outside the box does run (the test shows a real server answering).
        subprocess.run(["tmux", "-S", str(sock), "run-shell", f"touch {out_dir}/outside"],
                       check=True)  # fmt: skip
        wait_until(lambda: (out_dir / "outside").exists(), what="the server to run it")
    finally:
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], check=False)


def test_the_exec_wrapper_never_imports_the_projects_own_shoal(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "shoal" / "core").mkdir(parents=True)
    marker = tmp_path / "UNCONFINED"
    (repo / "shoal" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (repo / "shoal" / "core" / "__init__.py").write_text("")
    (repo / "shoal" / "core" / "sandbox.py").write_text(
        "import os, sys\nos.execvp(sys.argv[3], sys.argv[3:])\n"
    )
    outside = tmp_path / "server_write"
    argv = sandbox.wrapper_argv(Policy(dirs=(str(repo),)), ["sh", "-c", f"echo hi > {outside}"])
    subprocess.run(argv, cwd=repo, capture_output=True, timeout=60, check=False)
    assert not marker.exists(), "the project's shoal/__init__.py ran"
    assert not outside.exists(), "the command ran unconfined"


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "a.md").write_text("a\n")
    (repo / "README.md").write_text("r\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    return repo


def test_a_leased_symlink_into_git_config_grants_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    (repo / "cfg").symlink_to(".git/config")
    before = (repo / ".git" / "config").read_bytes()
    for lease in (["**"], ["cfg"]):
        policy = agent_policy(repo, "bypassPermissions", lease)
        code, out = confined(policy, "printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> cfg", repo)
        assert code != 0, (lease, out)
    assert (repo / ".git" / "config").read_bytes() == before


def test_a_symlink_swapped_in_after_the_policy_grants_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    policy = agent_policy(repo, "bypassPermissions", ["**/*.md"])
    before = (repo / ".git" / "config").read_bytes()
    (repo / "docs" / "a.md").unlink()
    (repo / "docs" / "a.md").symlink_to("../.git/config")  # (after the policy was made)
    code, out = confined(policy, "echo '[core] fsmonitor = touch pwned' >> docs/a.md", repo)
    assert code != 0, out
    assert (repo / ".git" / "config").read_bytes() == before


def test_a_filter_whose_name_holds_an_equals_sign_is_never_run(tmp_path: Path) -> None:
    """`-c filter.a=b.clean=` would read as key `filter.a`, value `b.clean=`: the driver would
    stay. The lease check's `git status` runs no driver, however it is named, nor any of a
    submodule's."""
    repo = make_repo(tmp_path)
    ran = tmp_path / "filter-ran"
    (repo / ".gitattributes").write_text("*.md filter=a=b\n")
    _git(repo, "config", "filter.a=b.clean", f"sh -c 'touch {ran}; cat'")
    _git(repo, "add", ".gitattributes")
    _git(repo, "commit", "-qm", "attrs")
    (repo / "docs" / "a.md").write_text("changed, same size?\n")  # (stat dirty: clean runs)
    ran.unlink(missing_ok=True)  # (the test's own git may have run it, on racily clean files)
    leasecheck.snapshot(repo)
    assert not ran.exists(), "the lease check ran the repository's filter driver"


def test_worktree_add_runs_no_smudge_filter_of_the_repository(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    smudged = tmp_path / "smudged"
    (repo / ".gitattributes").write_text("* filter=x\n")
    _git(repo, "add", ".gitattributes")
    _git(repo, "commit", "-qm", "attrs")
    _git(repo, "config", "filter.x.smudge", f"sh -c 'touch {smudged}; cat'")
    git.worktree_add(repo, tmp_path / "wt")
    assert (tmp_path / "wt" / "README.md").read_text() == "r\n"
    assert not smudged.exists(), "git worktree add ran the repository's smudge filter"


def test_a_shoal_home_inside_the_working_tree_is_not_writable(tmp_path: Path) -> None:
    """`shoal agent` started in ~ with the default ~/.shoal: the agent's tree holds the
    control channel, which its commands must not write (they could start an agent above their
    own mode, or answer their own permission requests)."""
    tree = tmp_path / "user"
    home = tree / ".shoal"
    (home / "teams").mkdir(parents=True)
    (tree / "project").mkdir()
    policy = agent_policy(tree, "bypassPermissions", None, home=home)
    code, out = confined(policy, f"touch {home}/teams/x", tree)
    assert code != 0 and not (home / "teams" / "x").exists(), out
    code, out = confined(policy, f"touch {tree}/project/ok", tree)
    assert code == 0 and (tree / "project" / "ok").exists(), out
    assert any("SHOAL_HOME" in note for note in policy.notes), policy.notes


def test_unix_sockets_can_be_allowed_by_the_user(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    make = f"{sys.executable} -c 'import socket; socket.socket(socket.AF_UNIX).close()'"
    assert confined(Policy(dirs=(str(tree),)), make)[0] != 0
    assert confined(Policy(dirs=(str(tree),), unix=True), make)[0] == 0
    assert os.environ.get("SHOAL_SANDBOX_PRETEND_ABSENT") in (None, "", "0")


def test_shoal_run_inside_the_sandbox_says_it_cannot_write_its_home(tmp_path: Path) -> None:
    """An agent's command that runs `shoal task add` (a write under SHOAL_HOME) gets one line
    naming the file, not an internal error."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    made = subprocess.run(
        [sys.executable, "-m", "shoal", "--home", str(home), "team", "create", "t"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    tree = tmp_path / "tree"
    tree.mkdir()
    code, out = confined(
        Policy(dirs=(str(tree),)),
        f"{sys.executable} -m shoal --home {home} task add --team t x",
        tree,
    )
    assert code == 1, out
    assert out.startswith(f"shoal: error: cannot write {home}/"), out
    assert "may not write SHOAL_HOME" in out and "internal error" not in out
