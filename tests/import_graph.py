"""The import graph of src/shoal: cycles between modules and imports that run up the layers.

Run it as `python3 tests/import_graph.py [--ignore PACKAGE ...]` (exit 1 when it finds
something), or import it (`build`, `cycles`, `upward`). Standard library only.

Every import counts, wherever it is: module level, inside a function, under
`if TYPE_CHECKING:` (reported as such, still an edge: such an import says the lower layer knows
the higher one's types, and it becomes a real import as soon as someone needs the name at run
time), and `importlib.import_module("literal")`. An import names one module: `import a.b.c`
and `from a.b import c` (when c is a submodule) are edges to `a.b.c`, a package to its
`__init__.py`; the parent packages Python imports on the way are not counted (every
submodule would otherwise form a cycle with an `__init__` that re-exports it).

Layers, lowest first (DESIGN.md, with two more named): core <- mailbox <- teams <- channel <-
workers <- orchestrator <- demo <- ui <- cli. channel (the control channel's protocol and
client) sits where both the CLI and the kinds' runners reach it; demo runs a leader. ui and cli
are the top: ui may import orchestrator, cli may import ui (not the reverse).
`shoal/__init__.py` and `shoal/__main__.py` are outside the layers.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
ROOT = "shoal"
LAYERS = ("core", "mailbox", "teams", "channel", "workers", "orchestrator", "demo", "ui", "cli")


@dataclass(frozen=True)
class Edge:
    """`source` imports `target`, at `line`; `kind` is "module", "function", "type_checking"
    or "dynamic" (importlib.import_module with a literal name)."""

    source: str
    target: str
    line: int
    kind: str

    def __str__(self) -> str:
        how = "" if self.kind == "module" else f" ({self.kind.replace('_', ' ')})"
        return f"{self.source} -> {self.target}  [line {self.line}{how}]"


@dataclass
class Graph:
    """The modules of the tree and every import between them."""

    modules: dict[str, Path] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    #: `importlib.import_module(...)` calls whose name is not a literal: not edges, listed.
    unresolved: list[str] = field(default_factory=list)

    def targets(self, source: str) -> set[str]:
        return {e.target for e in self.edges if e.source == source and e.target != source}


def module_name(path: Path, src: Path) -> str:
    """`src/shoal/x/y.py` -> `shoal.x.y`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def build(src: Path = SRC, root: str = ROOT) -> Graph:
    """Parse every module under `src/root` and collect its imports of modules in the tree."""
    graph = Graph()
    for path in sorted((src / root).rglob("*.py")):
        graph.modules[module_name(path, src)] = path
    for name, path in graph.modules.items():
        is_package = path.name == "__init__.py"
        collector = _Collector(name, is_package, graph)
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
    return graph


class _Collector(ast.NodeVisitor):
    """Walks one module, knowing whether it is inside a function or under TYPE_CHECKING."""

    def __init__(self, module: str, is_package: bool, graph: Graph) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.graph = graph
        self.in_function = 0
        self.type_checking = 0

    def _kind(self) -> str:
        if self.type_checking:
            return "type_checking"
        return "function" if self.in_function else "module"

    def _add(self, target: str | None, line: int, kind: str | None = None) -> None:
        if target is not None:
            self.graph.edges.append(Edge(self.module, target, line, kind or self._kind()))

    def _resolve(self, dotted: str) -> str | None:
        """The module of the tree that `dotted` names (the longest prefix that is one)."""
        parts = dotted.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in self.graph.modules:
                return candidate
            parts.pop()
        return None

    def _function(self, node: ast.AST) -> None:
        self.in_function += 1
        self.generic_visit(node)
        self.in_function -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.visit(node.test)
            self.type_checking += 1
            for child in node.body:
                self.visit(child)
            self.type_checking -= 1
            for child in node.orelse:  # the `else:` of TYPE_CHECKING runs
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(self._resolve(alias.name), node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base_parts = self.package.split(".")
            if node.level > 1:
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join([*base_parts, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in self.graph.modules:
                self._add(submodule, node.lineno)
            else:
                self._add(self._resolve(base), node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in ("import_module", "__import__") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                self._add(self._resolve(arg.value), node.lineno, "dynamic")
            else:
                self.graph.unresolved.append(
                    f"{self.module} line {node.lineno}: {ast.unparse(node)}"
                )
        self.generic_visit(node)


def _is_type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `typing.TYPE_CHECKING` (any module's attribute of that name)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def layer(module: str) -> int | None:
    """The rank of `module`'s layer (core is 0), or None outside the layers."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return LAYERS.index(parts[1])


def in_packages(module: str, packages: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def cycles(graph: Graph, ignore: Iterable[str] = ()) -> list[list[str]]:
    """Strongly connected components of more than one module (self-imports are not cycles),
    among the modules outside the `ignore`d packages; each sorted, the list sorted."""
    ignored = tuple(ignore)
    nodes = sorted(m for m in graph.modules if not in_packages(m, ignored))
    keep = set(nodes)
    succ = {m: sorted(t for t in graph.targets(m) if t in keep) for m in nodes}
    return sorted(sorted(c) for c in _tarjan(nodes, succ) if len(c) > 1)


def _tarjan(nodes: list[str], succ: dict[str, list[str]]) -> Iterator[list[str]]:
    """Tarjan's strongly connected components, iterative (no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, int]] = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if i < len(succ[node]):
                work.append((node, i + 1))
                nxt = succ[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:  # back in the caller: pass the low-link up
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                yield component


def cycle_edges(graph: Graph, component: list[str]) -> list[Edge]:
    """The imports that hold a cycle together (both ends in `component`)."""
    members = set(component)
    inside = [e for e in graph.edges if e.source in members and e.target in members]
    return sorted((e for e in inside if e.source != e.target), key=lambda e: (e.source, e.line))


def upward(graph: Graph, ignore: Iterable[str] = ()) -> list[Edge]:
    """Imports from a lower layer into a higher one, by modules outside the `ignore`d packages."""
    ignored = tuple(ignore)
    found = []
    for edge in graph.edges:
        if in_packages(edge.source, ignored):
            continue
        low, high = layer(edge.source), layer(edge.target)
        if low is not None and high is not None and high > low:
            found.append(edge)
    return sorted(found, key=lambda e: (e.source, e.line))


def report(graph: Graph, ignore: Iterable[str] = ()) -> str:
    """What `cycles` and `upward` found, readably; empty when nothing."""
    ignored = tuple(ignore)
    lines: list[str] = []
    found_cycles = cycles(graph, ignored)
    if found_cycles:
        lines.append(f"{len(found_cycles)} import cycle(s):")
        for component in found_cycles:
            lines.append("  cycle: " + ", ".join(component))
            lines += [f"    {e}" for e in cycle_edges(graph, component)]
    found_upward = upward(graph, ignored)
    if found_upward:
        lines.append(f"{len(found_upward)} upward import(s) (layers: {' <- '.join(LAYERS)}):")
        lines += [f"  {e}" for e in found_upward]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="leave out the modules of this package (e.g. shoal.orchestrator); repeatable",
    )
    parser.add_argument("--src", type=Path, default=SRC, help="the directory holding shoal/")
    args = parser.parse_args(argv)
    graph = build(args.src)
    typed = [e for e in graph.edges if e.kind == "type_checking"]
    print(f"{len(graph.modules)} modules, {len(graph.edges)} imports of shoal modules")
    if typed:
        print(f"{len(typed)} under TYPE_CHECKING (counted as edges):")
        print("\n".join(f"  {e}" for e in typed))
    if graph.unresolved:
        print("dynamic imports of a computed name (not edges):")
        print("\n".join(f"  {u}" for u in graph.unresolved))
    found = report(graph, args.ignore)
    print(found or "no import cycles, no upward imports")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
