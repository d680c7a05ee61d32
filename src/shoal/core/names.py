"""Validation of team and member names: refused with an error, never rewritten."""

from __future__ import annotations

import re
import secrets

from shoal.core.errors import InvalidNameError

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,47}$")
MAX_NAME_LENGTH = 48
LEAD_NAME = "team-lead"
"""The member name of a team's leader."""
DEFAULT_TEAM = "default"
"""The team of a command given neither --team nor $SHOAL_TEAM."""


def validate_name(name: str, what: str = "name") -> str:
    """Return `name` if it is a valid team or member name, else raise InvalidNameError."""
    if NAME_PATTERN.fullmatch(name):
        return name
    if not name:
        why = "it is empty"
    elif len(name) > MAX_NAME_LENGTH:
        why = f"it is {len(name)} characters long (at most {MAX_NAME_LENGTH})"
    elif not name[0].isascii() or not name[0].islower():
        why = "it must start with a lowercase letter a-z"
    else:
        why = "only lowercase letters, digits, '-' and '_' are allowed"
    raise InvalidNameError(f"invalid {what} {name!r}: {why}; names match ^[a-z][a-z0-9_-]{{0,47}}$")


_ADJECTIVES = (
    "amber",
    "brave",
    "calm",
    "deft",
    "eager",
    "fleet",
    "gentle",
    "hardy",
    "keen",
    "lively",
    "merry",
    "nimble",
    "proud",
    "quick",
    "quiet",
    "rapid",
    "sharp",
    "silver",
    "steady",
    "swift",
    "tidy",
    "vivid",
    "warm",
    "wise",
    "bold",
    "bright",
    "clear",
    "crisp",
    "fresh",
    "golden",
)
_NOUNS = (
    "anchovy",
    "barracuda",
    "carp",
    "dory",
    "eel",
    "flounder",
    "grouper",
    "herring",
    "koi",
    "mackerel",
    "marlin",
    "minnow",
    "perch",
    "pike",
    "salmon",
    "sardine",
    "shad",
    "smelt",
    "snapper",
    "sole",
    "sprat",
    "trout",
    "tuna",
    "wahoo",
    "bass",
    "bream",
    "char",
    "cod",
    "dace",
    "gar",
)


def word_slug() -> str:
    """A short random `adjective-noun` slug used to make a taken name unique."""
    return f"{secrets.choice(_ADJECTIVES)}-{secrets.choice(_NOUNS)}"


def with_slug(base: str) -> str:
    """`base` plus a word-slug suffix, trimmed so the result is still a valid name."""
    slug = word_slug()
    room = MAX_NAME_LENGTH - len(slug) - 1
    return validate_name(f"{base[:room].rstrip('-_')}-{slug}")
