"""Agent definitions: Markdown files with YAML frontmatter, the format Claude Code users have.

    ---
    name: code-reviewer
    description: Reviews a change for bugs
    tools: Read, Grep, Glob          # or a YAML list; omitted: every tool the layers allow
    model: anthropic:claude-sonnet-4-5   # or inherit (the default)
    permissionMode: default
    ---
    You review code. (The body is the system prompt.)

They are read from `SHOAL_HOME/agents/`, then a project's `.claude/agents/`, then its
`.shoal/agents/` (a later one of the same name wins), beside the built-ins `general-purpose`
and `fork`. A project's are used only when the project is trusted (core/trust.py): else
they are left out, and `Catalog.note` says so. A malformed file is reported with file:line
and skipped, never half loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from shoal.core import trust
from shoal.core.errors import UsageError
from shoal.core.trust import DEFINITION_DIRS, ProjectView
from shoal.workers.agent.models import ModelSpec

BUILT_IN: Final = "built-in"
PERMISSION_MODES: Final = ("default", "acceptEdits", "plan", "bypassPermissions", "bubble")
FIELDS: Final = frozenset({"name", "description", "tools", "model", "permissionMode", "color"})


@dataclass(frozen=True)
class AgentDefinition:
    """One agent type: its system prompt, tools, model and permission mode."""

    name: str
    description: str
    prompt: str = ""
    tools: tuple[str, ...] | None = None  # None: every tool the filter layers allow
    model: str | None = None  # None: inherit
    permission_mode: str | None = None
    source: str = BUILT_IN

    @property
    def custom(self) -> bool:
        return self.source != BUILT_IN

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "tools": list(self.tools) if self.tools is not None else None,
            "model": self.model,
            "permission_mode": self.permission_mode,
            "source": self.source,
        }


BUILT_INS: Final = (
    AgentDefinition(
        "general-purpose",
        "A general agent for research and multi-step tasks: files, shell, the team's list.",
    ),
    AgentDefinition(
        "fork",
        "A copy of the calling agent: its tools, model and history; asks its parent.",
        permission_mode="bubble",
    ),
)


@dataclass
class Catalog:
    """The definitions found, by name, and what was wrong with the files skipped."""

    agents: dict[str, AgentDefinition] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    note: str | None = None  # the project's definitions left out (untrusted), and the fix

    def get(self, name: str) -> AgentDefinition:
        found = self.agents.get(name)
        if found is None:
            known = ", ".join(sorted(self.agents))
            why = f"; {self.note}" if self.note else ""
            raise UsageError(
                f"unknown agent type {name!r} (known: {known}; see `shoal agents`){why}"
            )
        return found


def directories(home: Path, project: Path) -> list[Path]:
    """Where definitions are read from, lowest precedence first."""
    return [home / "agents", *(project / d for d in DEFINITION_DIRS)]


def load_catalog(home: Path, project: Path, granted: str | None = None) -> Catalog:
    """The definitions for an agent in `project` (its own only when it is trusted, or its
    files are those of `granted`, a digest trusted for this run)."""
    return catalog_of(home, trust.view(home, project, granted))


def catalog_of(home: Path, project: ProjectView) -> Catalog:
    """The built-ins, SHOAL_HOME's definitions (the user's own: always), then the project's
    that `project` lets this run use, parsed from the bytes its trust was decided on."""
    catalog = Catalog({d.name: d for d in BUILT_INS})
    try:
        own = sorted((home / "agents").glob("*.md"))
    except OSError:
        own = []
    found: list[tuple[str, bytes | None]] = []
    for path in own:
        try:
            found.append((str(path), path.read_bytes()))
        except OSError as exc:
            catalog.problems.append(f"{path}: cannot read ({exc.strerror}); skipped")
    for directory in trust.DEFINITION_SOURCES:
        for f in project.usable(directory):
            if f.path.endswith(".md"):
                found.append((str(project.directory / f.path), f.data))
    for source, data in found:
        try:
            text = (data or b"").decode("utf-8")
            definition = parse_definition(text, source)
        except UnicodeDecodeError:
            catalog.problems.append(f"{source}:1: not UTF-8 text; skipped")
            continue
        except UsageError as exc:
            catalog.problems.append(f"{exc}; skipped")
            continue
        catalog.agents[definition.name] = definition
    catalog.note = trust.left_out_note(project, trust.DEFINITION_SOURCES)
    return catalog


def parse_definition(text: str, source: str) -> AgentDefinition:
    """One definition file; a UsageError naming `source:line` when it is malformed."""
    import yaml

    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise UsageError(f"{source}:1: no frontmatter (the file must start with a --- line)")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise UsageError(f"{source}:1: the frontmatter has no closing --- line") from None
    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 2 if mark is not None else 2
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{source}:{line}: bad YAML: {problem}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{source}:2: the frontmatter must be a mapping of fields")

    def line_of(key: str) -> int:
        for i in range(1, end):
            if lines[i].lstrip().startswith(f"{key}:"):
                return i + 1
        return 2

    def bad(key: str, why: str) -> UsageError:
        return UsageError(f"{source}:{line_of(key)}: {key}: {why}")

    unknown = sorted(set(meta) - FIELDS)
    if unknown:
        raise bad(unknown[0], f"unknown field (known: {', '.join(sorted(FIELDS))})")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not name.strip():
        raise bad("name", "missing or not text")
    if not isinstance(description, str) or not description.strip():
        raise bad("description", "missing or not text")
    tools = meta.get("tools")
    if isinstance(tools, str):
        tools = [t.strip() for t in tools.split(",") if t.strip()]
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)
    ):
        raise bad("tools", "a comma-separated list or a YAML list of tool names")
    if tools is not None and "*" in tools:
        tools = None
    model = meta.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise bad("model", "not text")
        if model == "inherit":
            model = None
        else:
            try:
                ModelSpec.parse(model)
            except UsageError as exc:
                raise bad("model", str(exc)) from None
    mode = meta.get("permissionMode")
    if mode is not None and mode not in PERMISSION_MODES:
        raise bad("permissionMode", f"one of {', '.join(PERMISSION_MODES)}, not {mode!r}")
    return AgentDefinition(
        name=name.strip(),
        description=description.strip(),
        prompt="\n".join(lines[end + 1 :]).strip(),
        tools=tuple(tools) if tools is not None else None,
        model=model,
        permission_mode=mode,
        source=source,
    )
