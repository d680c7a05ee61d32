"""Reading a spec's TOML with every problem collected, each with its line: the line locator and
the checker the parser and the matrix share."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shoal.orchestrator.batch.spec import (
    SpecIssue,
    _kind,
    parse_delay,
    parse_duration,
)

# --------------------------------------------------------------------------- line locator


class SpecLocator:
    """Lines of table headers and keys in TOML source, found by scanning the text.

    `line(("task", 2), "after")` is the line of `after =` in the third `[[task]]`; a key not
    found falls back to its table's header line. Sub-tables such as `[task.env]` count as the
    key `env` of the enclosing array item.
    """

    _ARRAY = re.compile(r"^\[\[\s*([^\[\]]+?)\s*\]\]")
    _TABLE = re.compile(r"^\[\s*([^\[\]]+?)\s*\]")
    _KEY = re.compile(r"""^([A-Za-z0-9_-]+|"[^"]*"|'[^']*')\s*[.=]""")

    def __init__(self, text: str) -> None:
        self.headers: dict[tuple[str, int], int] = {}
        self.keys: dict[tuple[str, int, str], int] = {}
        counts: dict[str, int] = {}
        section: tuple[str, int] = ("", 0)
        open_quote: str | None = None
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if open_quote is not None:
                if raw.count(open_quote) % 2 == 1:
                    open_quote = None
                continue
            if not line or line.startswith("#"):
                continue
            if match := self._ARRAY.match(line):
                name = _key_path(match.group(1))
                self.keys.setdefault(("", 0, name.split(".")[0]), number)
                index = counts.get(name, 0)
                counts[name] = index + 1
                section = (name, index)
                self.headers.setdefault(section, number)
                continue
            if match := self._TABLE.match(line):
                name = _key_path(match.group(1))
                parent, _, sub = name.partition(".")
                self.keys.setdefault(("", 0, parent), number)  # a table is a top-level key
                if sub and parent in counts:
                    section = (parent, counts[parent] - 1)
                    self.keys.setdefault((*section, sub.split(".")[0]), number)
                    section = (name, counts[parent] - 1)
                else:
                    section = (name, 0)
                    self.headers.setdefault(section, number)
                    if sub:
                        self.keys.setdefault((parent, 0, sub.split(".")[0]), number)
                continue
            if match := self._KEY.match(line):
                self.keys.setdefault((*section, match.group(1).strip("\"'")), number)
            for quote in ('"""', "'''"):
                if line.count(quote) % 2 == 1:
                    open_quote = quote
                    break

    def line(self, section: tuple[str, int], key: str | None = None) -> int | None:
        """The line of `key` in `section` (or of the section's header), if found."""
        if key is not None:
            found = self.keys.get((*section, key))
            if found is not None:
                return found
        return self.headers.get(section)


def _key_path(raw: str) -> str:
    return ".".join(p.strip().strip("\"'") for p in raw.split("."))


def suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


class SpecChecker:
    """Collects issues while reading one spec."""

    def __init__(self, locator: SpecLocator) -> None:
        self.locator = locator
        self.issues: list[SpecIssue] = []

    def add(self, section: tuple[str, int], key: str | None, message: str) -> None:
        """Record a problem (once: a matrix task is checked once per combination)."""
        issue = SpecIssue(self.locator.line(section, key), message)
        if issue not in self.issues:
            self.issues.append(issue)

    def unknown_keys(
        self, table: Mapping[str, Any], allowed: Sequence[str], section: tuple[str, int], where: str
    ) -> None:
        for key in table:
            if key not in allowed:
                self.add(
                    section,
                    key,
                    f'{where}: unknown key "{key}"{suggest(key, allowed)}; '
                    f"allowed: {', '.join(allowed)}",
                )

    def string(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> str | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            shown = "an empty string" if isinstance(value, str) else _kind(value)
            self.add(section, key, f"{where}: {key} must be a non-empty string, not {shown}")
            return None
        return value

    def boolean(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> bool:
        value = table.get(key, False)
        if not isinstance(value, bool):
            self.add(section, key, f"{where}: {key} must be true or false, not {_kind(value)}")
            return False
        return value

    def count(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str, default: int
    ) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.add(section, key, f"{where}: {key} must be a whole number >= 0, not {value!r}")
            return default
        return value

    def amount(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> float | None:
        """A resource amount (a number >= 0), None when absent or bad (bad is reported)."""
        if key not in table:
            return None
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            self.add(section, key, f"{where}: {key} must be a number >= 0, not {value!r}")
            return None
        return float(value)

    def resources(
        self, table: Mapping[str, Any], section: tuple[str, int], where: str
    ) -> dict[str, float]:
        """`resources = { NAME = AMOUNT }`: custom Ray resources (CPU and GPU have their
        own keys, num_cpus and num_gpus)."""
        value = table.get("resources", {})
        if not isinstance(value, dict):
            self.add(section, "resources", f"{where}: resources must be a table of NAME = AMOUNT")
            return {}
        out: dict[str, float] = {}
        for name, item in value.items():
            if name in ("CPU", "GPU"):
                key = f"num_{name.lower()}s"
                self.add(section, "resources", f"{where}: resources: use {key} for {name}")
            elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:/-]*", name):
                self.add(section, "resources", f'{where}: resources: "{name}" is not a name')
            elif isinstance(item, bool) or not isinstance(item, int | float) or not item >= 0:
                self.add(
                    section,
                    "resources",
                    f"{where}: resources: {name} must be a number >= 0, not {item!r}",
                )
            else:
                out[name] = float(item)
        return out

    def duration(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> tuple[float | None, str | None]:
        if key not in table:
            return None, None
        value = table[key]
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.add(section, key, f"{where}: {key}: {exc}")
            return None, None
        return seconds, value if isinstance(value, str) else None

    def delay(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str
    ) -> float | None:
        """A delay in seconds (zero allowed), None when absent or bad (bad is reported)."""
        if key not in table:
            return None
        try:
            return parse_delay(table[key])
        except ValueError as exc:
            self.add(section, key, f"{where}: {key}: {exc}")
            return None

    def env(self, table: Mapping[str, Any], section: tuple[str, int], where: str) -> dict[str, str]:
        value = table.get("env", {})
        if not isinstance(value, dict):
            self.add(section, "env", f'{where}: env must be a table of NAME = "value"')
            return {}
        out: dict[str, str] = {}
        for name, item in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                self.add(section, "env", f'{where}: env: "{name}" is not a variable name')
            elif isinstance(item, bool) or not isinstance(item, str | int | float):
                self.add(
                    section,
                    "env",
                    f"{where}: env: {name} must be a string or a number, not {_kind(item)}",
                )
            else:
                out[name] = str(item)
        return out

    def path(
        self, table: Mapping[str, Any], key: str, section: tuple[str, int], where: str, base: Path
    ) -> str | None:
        value = self.string(table, key, section, where)
        if value is None:
            return None
        return os.path.normpath(base / os.path.expanduser(value))
