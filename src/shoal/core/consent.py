"""How a request for consent is shown to whoever answers it: whole, or with a count.

A request's fields (a command, a file's new content, a plan) reach the lead whole; a prompt
shows each one wrapped, with control and format characters made visible (an escape sequence
or a bidi override must not redraw what the approver reads), and a field too long for one
screen says how many characters follow and that `shoal approve --show ID` prints them all.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from typing import Any, Final

PROMPT_CHARS: Final = 20_000
"""The most of one field a prompt prints; past it, the count of what follows and how to see it."""
COMPACT_CHARS: Final = 200
"""A request whose fields fit in this many characters, on one line, is shown as `Tool(k='v')`."""
# The field that says what a tool would do, in the order looked for.
MAIN_FIELDS: Final = ("command", "file_path", "plan", "content", "new_string")
# Fields of a request that are not what the tool does (who asks).
HIDDEN_FIELDS: Final = frozenset({"agent"})


def visible(text: str) -> str:
    """`text` with every character that would not print as itself (control characters,
    escape sequences, bidi and zero-width format characters, odd spaces) written as its
    escape (`\\x1b`, `\\u202e`); newlines and tabs are kept."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch in "\n\t":
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1] if ord(ch) > 0x7F else f"\\x{ord(ch):02x}")
    return "".join(out)


def show_command(request_id: str) -> str:
    """The command that prints request `request_id` whole."""
    return f"shoal approve --show {request_id}"


def fields(shown: Mapping[str, Any]) -> dict[str, str]:
    """The fields of a request that say what it would do, as text."""
    return {k: str(v) for k, v in shown.items() if k not in HIDDEN_FIELDS and v is not None}


def compact(tool: str, shown: Mapping[str, Any]) -> str | None:
    """`Tool(command='echo hi')` when the whole request fits on one short line, else None."""
    parts = ", ".join(f"{k}={v!r}" for k, v in fields(shown).items())
    if len(parts) > COMPACT_CHARS or "\n" in "".join(fields(shown).values()):
        return None
    return f"{tool}({parts})"


def block(
    tool: str,
    shown: Mapping[str, Any],
    request_id: str | None = None,
    *,
    limit: int | None = PROMPT_CHARS,
    width: int | None = None,
) -> str:
    """The request as lines: the tool, then each field with its length, wrapped under it.

    With `limit`, a field longer than that is cut there and the line after it says how many
    characters follow and (with `request_id`) the command that prints them all."""
    width = width or max(40, min(120, shutil.get_terminal_size((100, 24)).columns))
    lines = [f"{tool}:"]
    for key, value in fields(shown).items():
        count = len(value)
        more = 0
        if limit is not None and count > limit:
            more = count - limit
            value = value[:limit]
        size = f" ({count:,} characters)" if count > 80 or "\n" in value else ""
        lines.append(f"  {key}{size}:")
        for raw in visible(value).split("\n"):
            wrapped = textwrap.wrap(
                raw,
                width - 4,
                expand_tabs=False,
                replace_whitespace=False,
                drop_whitespace=False,
                break_on_hyphens=False,
            )
            lines += [f"    {part}" for part in wrapped or [""]]
        if more:
            how = f": `{show_command(request_id)}` prints them all" if request_id else ""
            lines.append(f"    [… {more:,} more characters not shown{how}]")
    return "\n".join(lines)


def brief(shown: Mapping[str, Any], request_id: str, limit: int = 60) -> str:
    """One line for a listing: the start of the main field, and, when it is longer, its
    length and the command that prints it whole (`echo harmless… (5,012 characters in all:
    shoal approve --show a1.1)`)."""
    values = fields(shown)
    main = next((values[k] for k in MAIN_FIELDS if k in values), None)
    if main is None:
        return ""
    flat = " ".join(visible(main).split())
    if len(main) <= limit and flat == main:
        return main
    return f"{flat[: limit - 1]}… ({len(main):,} characters in all: {show_command(request_id)})"
