"""One module runs tmux: `shoal.teams.backends.tmux` alone imports libtmux, and no other module of
shoal starts a process whose command is tmux. Read from the sources (no processes)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import shoal

SRC = Path(shoal.__file__).parent
BACKEND = SRC / "teams" / "backends" / "tmux.py"
# A pane's first process when it has secrets: it execs the pane's own command (never tmux),
# so that the pane's pid stays the teammate's.
PANE_SECRETS = SRC / "teams" / "backends" / "pane_secrets.py"
SANDBOX_WRAPPER = SRC / "core" / "sandbox.py"  # (execs the command it confined)
# Calls that start a program: subprocess's, os.exec*/spawn*/posix_spawn*, asyncio's.
_RUNNERS = frozenset({"run", "Popen", "call", "check_call", "check_output", "getoutput"})
_ASYNC_RUNNERS = frozenset({"create_subprocess_exec", "create_subprocess_shell"})


def modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def _starts_a_program(call: ast.Call) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
        return False
    owner, name = func.value.id, func.attr
    return (
        (owner == "subprocess" and name in _RUNNERS)
        or (owner == "os" and name.startswith(("exec", "spawn", "posix_spawn", "system")))
        or (owner == "asyncio" and name in _ASYNC_RUNNERS)
    )


def _names_tmux(node: ast.AST) -> bool:
    """The command is tmux: a literal argv starting with "tmux", or a "tmux ..." string."""
    if isinstance(node, ast.List | ast.Tuple) and node.elts:
        first = node.elts[0]
        return isinstance(first, ast.Constant) and first.value == "tmux"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value == "tmux" or node.value.startswith("tmux ")
    return False


def test_only_the_tmux_backend_imports_libtmux() -> None:
    importers = set()
    for path, tree in modules():
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "libtmux" or n.startswith("libtmux.") for n in names):
                importers.add(path)
    assert importers == {BACKEND}


def _is_exec(call: ast.Call) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "os"
        and func.attr.startswith("exec")
    )


def test_no_other_module_runs_tmux() -> None:
    """No literal tmux command elsewhere, and no exec at all: the one exec shoal does hands the
    terminal to tmux (`shoal attach`), through the backend's `exec_tmux` (and a pane with
    secrets execs its own command, and the sandbox's exec wrapper the command it confined,
    never tmux)."""
    offenders = []
    for path, tree in modules():
        if path == BACKEND:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if (_is_exec(node) and path not in (PANE_SECRETS, SANDBOX_WRAPPER)) or (
                _starts_a_program(node) and any(_names_tmux(arg) for arg in node.args)
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offenders == []


def test_the_status_line_module_runs_no_process_itself() -> None:
    tree = ast.parse((SRC / "ui" / "tmux.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    }
    assert "subprocess" not in imported
    assert not any(isinstance(n, ast.Call) and _starts_a_program(n) for n in ast.walk(tree))
