"""Team and member names: the pattern, its errors, and the slug suffix."""

from __future__ import annotations

import pytest

from shoal.core.errors import InvalidNameError
from shoal.core.names import MAX_NAME_LENGTH, NAME_PATTERN, validate_name, with_slug


@pytest.mark.parametrize("name", ["a", "team-1", "x_y", "a" * 48, "research-team"])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../x", "start with a lowercase letter"),
        ("Team", "start with a lowercase letter"),
        ("a b", "only lowercase letters"),
        ("", "empty"),
        ("a" * 49, "49 characters"),
        ("1abc", "start with a lowercase letter"),
        ("a/b", "only lowercase letters"),
        ("a.b", "only lowercase letters"),
        ("é", "start with a lowercase letter"),
    ],
)
def test_invalid_names_are_refused_with_the_reason(name: str, why: str) -> None:
    with pytest.raises(InvalidNameError) as err:
        validate_name(name, "team name")
    assert why in str(err.value)
    assert "team name" in str(err.value)


def test_slug_suffix_stays_valid_even_for_long_bases() -> None:
    for base in ("t", "a" * 48, "team-"):
        name = with_slug(base)
        assert NAME_PATTERN.fullmatch(name)
        assert len(name) <= MAX_NAME_LENGTH
        assert name.startswith(base[:5].rstrip("-"))
