"""One wording for a pydantic validation error: where (the dotted location) and what, of the
first error only (a user fixes one thing at a time; the rest follow)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


def first_error(exc: ValidationError, root: str = "(root)") -> str:
    """`loc: msg` of `exc`'s first error; `root` names the location of an error at the top."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or root
    return f"{where}: {first['msg']}"
