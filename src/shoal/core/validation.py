"""One wording for a pydantic validation error: where (the dotted location) and what, of the
first error only (a user fixes one thing at a time; the rest follow), or of each error where
a caller lists them all (a model's tool arguments)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError
    from pydantic_core import ErrorDetails


def error_text(
    error: ErrorDetails, root: str = "(root)", *, drop: int = 0, within: str | None = None
) -> str:
    """`loc: msg` of one error; `root` names the location of an error at the top. `drop`: how
    many leading parts of the location to leave out (a tagged union's tag); `within`: the part
    the location must begin with, put in front when it does not (the member of a union, as
    the union reports it)."""
    loc = [str(p) for p in error["loc"][drop:]]
    if within is not None and loc[:1] != [within]:
        loc.insert(0, within)
    return f"{'.'.join(loc) or root}: {error['msg']}"


def first_error(
    exc: ValidationError,
    root: str = "(root)",
    *,
    drop: int = 0,
    within: str | None = None,
    count: bool = False,
) -> str:
    """`error_text` of `exc`'s first error; `count`: how many errors there were too."""
    said = error_text(exc.errors()[0], root, drop=drop, within=within)
    return f"{said} ({exc.error_count()} error(s))" if count else said
