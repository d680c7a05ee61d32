"""Agent definitions: Markdown with YAML frontmatter from SHOAL_HOME/agents/, .claude/agents/
and .shoal/agents/; a malformed one is reported with file:line and skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.core import trust
from shoal.core.errors import UsageError
from shoal.workers.agent.definitions import load_catalog, parse_definition

GOOD = """---
name: reviewer
description: Reviews a change
tools: Read, Grep
model: scripted:review.toml
permissionMode: plan
---
You review code.
"""


def test_a_definition_is_parsed() -> None:
    d = parse_definition(GOOD, "r.md")
    assert (d.name, d.tools, d.model, d.permission_mode) == (
        "reviewer", ("Read", "Grep"), "scripted:review.toml", "plan",
    )  # fmt: skip
    assert d.prompt == "You review code." and d.custom


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("name: x\n", "r.md:1: no frontmatter"),
        ("---\nname: x\n", "r.md:1: the frontmatter has no closing"),
        ("---\nname: x\ndescription: [oops\n---\n", "r.md:3: bad YAML"),
        ("---\ndescription: d\n---\n", "r.md:2: name: missing"),
        ("---\nname: x\ndescription: d\nmodel: gemini:pro\n---\n", "r.md:4: model:"),
        ("---\nname: x\ndescription: d\npermissionMode: yolo\n---\n", "r.md:4: permissionMode"),
        ("---\nname: x\ndescription: d\ncolour: red\n---\n", "r.md:4: colour: unknown field"),
        ("---\nname: x\ndescription: d\ntools: 3\n---\n", "r.md:4: tools:"),
    ],
)
def test_a_malformed_definition_names_file_and_line(text: str, where: str) -> None:
    with pytest.raises(UsageError, match="^" + where):
        parse_definition(text, "r.md")


def test_the_catalog_reads_every_place_and_skips_the_broken(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    for where, body in (
        (home / "agents" / "reviewer.md", GOOD),
        (project / ".claude" / "agents" / "helper.md", "---\nname: helper\ndescription: h\n---\n"),
        (project / ".shoal" / "agents" / "reviewer.md", GOOD.replace("plan", "acceptEdits")),
        (project / ".shoal" / "agents" / "broken.md", "---\nname: [\n---\n"),
    ):
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(body)
    assert sorted(load_catalog(home, project).agents) == ["fork", "general-purpose", "reviewer"]
    trust.record(home, trust.scan(project))  # (a project's own are used once it is trusted)
    catalog = load_catalog(home, project)
    assert sorted(catalog.agents) == ["fork", "general-purpose", "helper", "reviewer"]
    reviewer = catalog.get("reviewer")
    assert reviewer.permission_mode == "acceptEdits"  # the project's .shoal/ wins
    assert reviewer.source == str(project / ".shoal" / "agents" / "reviewer.md")
    assert catalog.get("fork").permission_mode == "bubble" and not catalog.get("fork").custom
    (problem,) = catalog.problems
    assert problem.startswith(f"{project / '.shoal' / 'agents' / 'broken.md'}:2: bad YAML")
    with pytest.raises(UsageError, match="unknown agent type 'nope'"):
        catalog.get("nope")
