"""No import cycles and no imports up the layers (tests/import_graph.py), and the checker itself
on a small tree made to break every rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests import import_graph
from tests.import_graph import Edge, build, cycles, layer, report, upward

SCRIPT = Path(import_graph.__file__)


def test_no_cycles_and_no_upward_imports_in_the_whole_tree() -> None:
    graph = build()
    assert {"shoal.core.paths", "shoal.mailbox.router", "shoal.teams.store"} <= set(graph.modules)
    assert any(e.target == "shoal.core.paths" for e in graph.edges)  # it sees imports at all
    found = report(graph)
    assert not found, f"\n{found}"


def test_every_package_is_in_a_layer() -> None:
    """A new top-level package outside LAYERS would escape the upward check unnoticed."""
    graph = build()
    outside = sorted(
        m for m in graph.modules if m not in ("shoal", "shoal.__main__") and layer(m) is None
    )
    assert not outside, outside


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (path under src/ -> source) and return the src directory."""
    src = root / "src"
    for name, text in files.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return src


BROKEN = {
    "shoal/__init__.py": "",
    "shoal/__main__.py": "from shoal.cli.c import main\n",
    "shoal/core/__init__.py": "",
    "shoal/core/a.py": """\
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from shoal.mailbox import box
        else:
            from shoal import __version__
        """,
    "shoal/core/b.py": """\
        def late():
            import shoal.teams.t
        """,
    "shoal/mailbox/__init__.py": "",
    "shoal/mailbox/box.py": "from . import other\nfrom ..core import b\n",
    "shoal/mailbox/other.py": "import shoal.mailbox.other\nfrom shoal.mailbox.box import x\n",
    "shoal/teams/__init__.py": "",
    "shoal/teams/t.py": "import importlib\nimportlib.import_module('shoal.mailbox')\n",
    "shoal/orchestrator/__init__.py": "",
    "shoal/orchestrator/o.py": "import shoal.teams\n",
    "shoal/ui/__init__.py": "",
    "shoal/ui/v.py": "from shoal.orchestrator import o\nfrom shoal.cli import c\n",
    "shoal/cli/__init__.py": "",
    "shoal/cli/c.py": "from shoal.orchestrator.o import run\n",
    "shoal/cli/d.py": "from shoal.ui.v import show\n",
}


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    graph = build(write_tree(tmp_path, BROKEN))
    edges = {(e.source, e.target, e.kind) for e in graph.edges}
    assert edges >= {
        ("shoal.core.a", "shoal.mailbox.box", "type_checking"),
        ("shoal.core.a", "shoal", "module"),  # the else branch of TYPE_CHECKING runs
        ("shoal.core.b", "shoal.teams.t", "function"),
        ("shoal.mailbox.box", "shoal.mailbox.other", "module"),  # from . import other
        ("shoal.mailbox.box", "shoal.core.b", "module"),  # from ..core import b
        ("shoal.teams.t", "shoal.mailbox", "dynamic"),  # the package's __init__.py
        ("shoal.orchestrator.o", "shoal.teams", "module"),
    }


def test_the_checker_finds_cycles_and_upward_imports(tmp_path: Path) -> None:
    graph = build(write_tree(tmp_path, BROKEN))
    # other -> other is a self-import, not a cycle.
    assert cycles(graph) == [["shoal.mailbox.box", "shoal.mailbox.other"]]
    assert [(e.source, e.target) for e in upward(graph)] == [
        ("shoal.core.a", "shoal.mailbox.box"),
        ("shoal.core.b", "shoal.teams.t"),
        ("shoal.ui.v", "shoal.cli.c"),  # cli may import ui, not the reverse
    ]
    assert cycles(graph, ignore=["shoal.mailbox"]) == []
    assert [e.source for e in upward(graph, ignore=["shoal.core"])] == ["shoal.ui.v"]
    found = report(graph)
    assert "cycle: shoal.mailbox.box, shoal.mailbox.other" in found
    assert str(Edge("shoal.core.b", "shoal.teams.t", 2, "function")) in found


def test_the_script_exits_1_naming_what_it_found(tmp_path: Path) -> None:
    src = write_tree(tmp_path, BROKEN)
    out = run_script("--src", str(src))
    assert out.returncode == 1, out.stderr
    assert "1 import cycle(s)" in out.stdout and "3 upward import(s)" in out.stdout
    assert "shoal.core.a -> shoal.mailbox.box  [line 4 (type checking)]" in out.stdout
    clean = run_script()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no import cycles, no upward imports" in clean.stdout


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    """`python3 tests/import_graph.py ARGS` as a process, the way it is run by hand."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )
