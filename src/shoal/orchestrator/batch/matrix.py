"""A task's matrix: its axes, include/exclude rules and per-combination settings, expanded into
one task table per combination (placeholders substituted, ids named by their values)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shoal.orchestrator.batch.checker import SpecChecker, suggest
from shoal.orchestrator.batch.spec import (
    _kind,
)

# A task's matrix: at most this many combinations (each one is a task of the run).
MAX_MATRIX_COMBINATIONS: Final = 1000
# Keys of a matrix that are rules, not axes; and the settings an include may give.
MATRIX_RULES: Final = ("include", "exclude")
_COMBO_SETTINGS: Final = ("timeout", "retries")
_MATRIX_KEY: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
# A matrix value becomes part of a task id (`unit[py=3.12]`): no spaces, brackets, braces,
# commas, equals signs, quotes or backslashes.
_MATRIX_VALUE: Final = re.compile(r"""^[^\s\[\]{},="'\\]{1,64}$""")
# `{{name}}` is a literal `{name}`; `${name}` is left to the shell; `{name}` is a placeholder.
_PLACEHOLDER: Final = re.compile(
    r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}"
)
# The fields of a matrix task in which placeholders are replaced.
_MATRIX_FIELDS: Final = ("run", "prompt", "assign", "description", "cwd", "env", "junit", "after")

# --------------------------------------------------------------------------- matrix


def matrix_combinations(
    checker: SpecChecker, table: Mapping[str, Any], section: tuple[str, int], where: str
) -> list[tuple[dict[str, str], dict[str, Any]]] | None:
    """The combinations of a task's `matrix` (in the order its keys and values are written,
    less those `exclude` removes, then those `include` adds), each with the settings an
    `include` gives it (timeout, retries); None when the task has none, [] when the matrix
    is bad (the problems are reported)."""
    if "matrix" not in table:
        return None
    value = table["matrix"]
    example = 'e.g. matrix = { py = ["3.11", "3.12"], shard = [1, 2] }'
    if not isinstance(value, dict) or not [k for k in value if k not in MATRIX_RULES]:
        shown = "an empty table" if isinstance(value, dict) else _kind(value)
        checker.add(
            section,
            "matrix",
            f"{where}: matrix must be a table of KEY = [values], {example}; not {shown}",
        )
        return []
    axes: list[tuple[str, list[str]]] = []
    ok = True
    for key, items in value.items():
        if key in MATRIX_RULES:
            continue
        if not _MATRIX_KEY.fullmatch(key):
            checker.add(
                section,
                "matrix",
                f'{where}: matrix key "{key}" is not a name (letters, digits and _, '
                "not starting with a digit, at most 32)",
            )
            ok = False
            continue
        if not isinstance(items, list) or not items:
            shown = "an empty array" if isinstance(items, list) else _kind(items)
            checker.add(
                section,
                "matrix",
                f"{where}: matrix key {key} must be a non-empty array of values, not {shown}",
            )
            ok = False
            continue
        values: list[str] = []
        for item in items:
            text = _matrix_value(checker, item, key, section, where)
            if text is None:
                ok = False
            elif text in values:
                checker.add(section, "matrix", f'{where}: matrix key {key} lists "{text}" twice')
                ok = False
            else:
                values.append(text)
        axes.append((key, values))
    if not ok:
        return []
    count = math.prod(len(values) for _, values in axes)
    if count > MAX_MATRIX_COMBINATIONS:
        checker.add(
            section,
            "matrix",
            f"{where}: matrix has {count} combinations; at most {MAX_MATRIX_COMBINATIONS}",
        )
        return []
    keys = [key for key, _ in axes]
    product = itertools.product(*(values for _, values in axes))
    combos: list[tuple[dict[str, str], dict[str, Any]]] = [
        (dict(zip(keys, combo, strict=True)), {}) for combo in product
    ]
    combos = _matrix_rules(checker, value, dict(axes), combos, section, where)
    if len(combos) > MAX_MATRIX_COMBINATIONS:
        checker.add(
            section,
            "matrix",
            f"{where}: matrix has {len(combos)} combinations; at most {MAX_MATRIX_COMBINATIONS}",
        )
        return []
    return combos


def _matrix_rules(
    checker: SpecChecker,
    matrix: Mapping[str, Any],
    axes: Mapping[str, list[str]],
    combos: list[tuple[dict[str, str], dict[str, Any]]],
    section: tuple[str, int],
    where: str,
) -> list[tuple[dict[str, str], dict[str, Any]]]:
    """A matrix's `exclude` (tables of KEY = value: every combination they match goes) and
    `include` (a table naming every key adds that combination, or gives an existing one its
    settings; one naming some keys gives the settings to every combination it matches).
    The settings an include may give: timeout and retries. A rule that matches nothing, or
    names an unknown key, is an error: a typo must not pass as a rule that never applies."""
    for rule in ("exclude", "include"):
        items = matrix.get(rule, [])
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            checker.add(
                section,
                "matrix",
                f"{where}: matrix.{rule} must be an array of tables, e.g. "
                f'{rule} = [{{ py = "3.11", shard = 2 }}]',
            )
            return []
    for entry in matrix.get("exclude", []):
        wanted = _rule_values(checker, entry, axes, (), "exclude", section, where)
        if wanted is None:
            continue
        kept = [c for c in combos if any(c[0][k] != v for k, v in wanted.items())]
        if len(kept) == len(combos):
            checker.add(
                section, "matrix", f"{where}: matrix.exclude {_shown(entry)} matches no combination"
            )
        combos = kept
    for entry in matrix.get("include", []):
        wanted = _rule_values(checker, entry, axes, _COMBO_SETTINGS, "include", section, where)
        if wanted is None:
            continue
        extra: dict[str, Any] = {k: entry[k] for k in _COMBO_SETTINGS if k in entry}
        matched = [c for c in combos if all(c[0][k] == v for k, v in wanted.items())]
        for _, settings in matched:
            settings.update(extra)
        if matched:
            continue
        if set(wanted) == set(axes):
            combos.append(({k: wanted[k] for k in axes}, dict(extra)))
        else:
            checker.add(
                section,
                "matrix",
                f"{where}: matrix.include {_shown(entry)} matches no combination (to add one, "
                f"give every key: {', '.join(axes)})",
            )
    return combos


def _rule_values(
    checker: SpecChecker,
    entry: Mapping[str, Any],
    axes: Mapping[str, list[str]],
    settings: Sequence[str],
    rule: str,
    section: tuple[str, int],
    where: str,
) -> dict[str, str] | None:
    """The KEY = value pairs of one include or exclude entry, checked (None: it is bad)."""
    wanted: dict[str, str] = {}
    ok = True
    for key, item in entry.items():
        if key in settings:
            continue
        if key not in axes:
            allowed = [*axes, *settings]
            checker.add(
                section,
                "matrix",
                f'{where}: matrix.{rule}: unknown key "{key}"{suggest(key, allowed)}; '
                f"allowed: {', '.join(allowed)}",
            )
            ok = False
            continue
        text = _matrix_value(checker, item, key, section, where)
        if text is None:
            ok = False
        elif rule == "exclude" and text not in axes[key]:
            checker.add(
                section,
                "matrix",
                f'{where}: matrix.exclude: {key} = "{text}" is not one of its values '
                f"({', '.join(axes[key])})",
            )
            ok = False
        else:
            wanted[key] = text
    if ok and not wanted:
        checker.add(section, "matrix", f"{where}: matrix.{rule} entry names no matrix key")
        ok = False
    return wanted if ok else None


def _shown(entry: Mapping[str, Any]) -> str:
    """An include or exclude entry as it reads in a spec: `{ py = "3.11", shard = 2 }`."""
    return "{ " + ", ".join(f"{k} = {v!r}".replace("'", '"') for k, v in entry.items()) + " }"


def _matrix_value(
    checker: SpecChecker, item: object, key: str, section: tuple[str, int], where: str
) -> str | None:
    """A matrix value as text: a string or an integer (a float would lose digits: 3.10 is 3.1)."""
    if isinstance(item, float):
        checker.add(
            section,
            "matrix",
            f"{where}: matrix key {key}: {item!r} is a number with a fraction; write such "
            'values as strings ("3.10", not 3.10, which TOML reads as the number 3.1)',
        )
        return None
    if isinstance(item, bool) or not isinstance(item, str | int):
        checker.add(
            section,
            "matrix",
            f"{where}: matrix key {key}: values are strings or integers, not {_kind(item)}",
        )
        return None
    text = str(item)
    if not _MATRIX_VALUE.fullmatch(text):
        checker.add(
            section,
            "matrix",
            f"{where}: matrix key {key}: bad value {text!r}: at most 64 characters, without "
            "spaces, brackets, braces, commas, equals signs, quotes or backslashes",
        )
        return None
    return text


def matrix_id(base: str, combo: Mapping[str, str]) -> str:
    """`unit[py=3.12,shard=1]`: the id of one combination of task `unit`."""
    return f"{base}[{','.join(f'{k}={v}' for k, v in combo.items())}]"


def _strings(value: object) -> list[str]:
    """Every string in a field's value (a string, an array of strings, a table's values)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, str)]
    return []


def check_placeholders(
    checker: SpecChecker,
    table: Mapping[str, Any],
    keys: Sequence[str],
    section: tuple[str, int],
    where: str,
) -> None:
    """Every `{name}` in a matrix task's fields must be a key of its matrix."""
    for field in _MATRIX_FIELDS:
        for text in _strings(table.get(field)):
            for match in _PLACEHOLDER.finditer(text):
                name = match.group(2)
                if name is None or name in keys:
                    continue
                checker.add(
                    section,
                    field,
                    f'{where}: {field}: unknown placeholder "{{{name}}}"'
                    f"{suggest(name, keys)}; the matrix keys are {', '.join(keys) or 'none'} "
                    f'(write {{{{{name}}}}} for a literal "{{{name}}}")',
                )


def _substitute(text: str, combo: Mapping[str, str]) -> str:
    """`text` with each `{key}` of `combo` replaced by its value, and `{{name}}` by `{name}`."""

    def one(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return "{" + match.group(1) + "}"
        return combo.get(match.group(2), match.group(0))

    return _PLACEHOLDER.sub(one, text)


def expand(table: Mapping[str, Any], combo: Mapping[str, str]) -> dict[str, Any]:
    """A copy of a matrix task's table for one combination, its placeholders replaced."""
    out = dict(table)
    for field in _MATRIX_FIELDS:
        value = out.get(field)
        if isinstance(value, str):
            out[field] = _substitute(value, combo)
        elif isinstance(value, list):
            out[field] = [_substitute(v, combo) if isinstance(v, str) else v for v in value]
        elif isinstance(value, dict):
            out[field] = {
                k: _substitute(v, combo) if isinstance(v, str) else v for k, v in value.items()
            }
    return out
