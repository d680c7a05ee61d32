"""The one wording of a pydantic validation error: where and what of its first error (or of
each), its location cut, put under a union member, or at the top named, and its count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import pytest
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from shoal.core.validation import error_text, first_error


class Inner(BaseModel):
    n: int


class Outer(BaseModel):
    kind: Literal["outer"] = "outer"
    inner: Inner
    name: str


def caught(call: Callable[[], object]) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        call()
    return info.value


def test_the_first_error_says_where_and_what() -> None:
    exc = caught(lambda: Outer.model_validate({"inner": {"n": "x"}}))
    assert first_error(exc) == (
        "inner.n: Input should be a valid integer, unable to parse string as an integer"
    )
    assert first_error(exc, count=True).endswith("(2 error(s))")


def test_an_error_at_the_top_is_named_by_root() -> None:
    exc = caught(lambda: Inner.model_validate(5))
    assert first_error(exc) == "(root): Input should be a valid dictionary or instance of Inner"
    assert first_error(exc, "spec").startswith("spec: ")


def test_a_union_tag_is_dropped_and_a_member_put_in_front() -> None:
    tagged: TypeAdapter[Outer | Inner] = TypeAdapter(Outer | Inner)
    exc = caught(lambda: Outer.model_validate({"inner": {"n": 1}}))
    assert first_error(exc, within="outer") == "outer.name: Field required"
    assert first_error(exc, within="name") == "name: Field required"  # (begins with it already)
    exc = caught(lambda: tagged.validate_python({"inner": {"n": 1}}))
    assert first_error(exc, drop=1) == "name: Field required"


def test_each_error_reads_alike() -> None:
    exc = caught(lambda: Outer.model_validate({}))
    assert [error_text(e, "arguments") for e in exc.errors()] == [
        "inner: Field required",
        "name: Field required",
    ]


def test_a_constraint_reads_as_pydantic_says_it() -> None:
    class Counted(BaseModel):
        n: int = Field(ge=1)

    exc = caught(lambda: Counted.model_validate({"n": 0}))
    assert first_error(exc) == "n: Input should be greater than or equal to 1"
