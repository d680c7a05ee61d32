"""The coordinator's system prompt (package data): its continue-or-spawn rules hold every row
of the original's table."""

from __future__ import annotations

import re

from shoal.workers.agent.coordinator.mode import system_prompt


def _rules() -> list[str]:
    section = system_prompt().split("## Continue or spawn", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n\d+\. ", "\n" + section.split("\n\n", 2)[2])
    return [" ".join(item.split()) for item in items if item.strip()]


def test_broad_research_for_a_narrow_implementation_spawns_fresh() -> None:
    rules = _rules()
    (row,) = [r for r in rules if "research was broad" in r.lower()]
    assert "implementation is narrow" in row and "spawn a fresh one" in row
    assert "noise of the exploration" in row


def test_every_row_of_the_originals_table_is_a_rule() -> None:
    rules = " | ".join(_rules())
    for situation, answer in (
        ("builds on exactly what the worker just explored", "continue it"),
        ("research was broad but the implementation is narrow", "spawn a fresh one"),
        ("failed on something a short correction fixes", "continue it"),
        ("verification of the worker's own change", "spawn a fresh one"),
        ("dead ends or of a wrong approach", "spawn a fresh one"),
    ):
        (rule,) = [r for r in rules.split(" | ") if situation in r]
        assert answer in rule, rule
