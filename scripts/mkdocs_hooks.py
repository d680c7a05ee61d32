"""MkDocs hooks: tables of the documentation made from the code, so they cannot drift.

`<!-- exit-codes -->` in a page becomes the CLI's exit-code table (`shoal.core.errors.
EXIT_CODES`); `<!-- run-exit-codes -->` becomes `shoal run`'s (`batch.exitcodes.EXIT_CODES`).
"""

from __future__ import annotations

from typing import Any


def _cli_table() -> str:
    from shoal.core.errors import EXIT_CODES

    rows = [f"| {code} | {meaning} |" for code, meaning in sorted(EXIT_CODES.items())]
    return "\n".join(["| code | meaning |", "|---:|---|", *rows])


def _run_table() -> str:
    from shoal.orchestrator.batch.exitcodes import EXIT_CODES

    rows = [f"| {c.code} | {c.name} | {c.meaning} |" for c in EXIT_CODES]
    return "\n".join(["| code | name | when |", "|---:|---|---|", *rows])


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Put the generated tables where their markers stand."""
    if "<!-- exit-codes -->" in markdown:
        markdown = markdown.replace("<!-- exit-codes -->", _cli_table())
    if "<!-- run-exit-codes -->" in markdown:
        markdown = markdown.replace("<!-- run-exit-codes -->", _run_table())
    return markdown
