"""Which environment variables hold secrets: one rule for every place a value could leak.

A secret's value never goes on a command line (visible to every user in `ps`), into a file
that outlives its use, or to a Ray job that did not ask for it by name. The rule is by name,
so that a variable the user adds (`DEPLOY_TOKEN`, `DB_PASSWORD`) is covered without a list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

SECRET_NAMES: Final = frozenset({"SHOAL_RAY_TOKEN", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"})
_SECRET_PATTERN: Final = re.compile(r"(_TOKEN|_KEY|_SECRET)$|PASSWORD", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """True for a variable whose value is a secret: `*_TOKEN`, `*_KEY`, `*_SECRET`,
    `*PASSWORD*` (any case), and the API keys and cluster token shoal knows by name."""
    return name in SECRET_NAMES or _SECRET_PATTERN.search(name) is not None


def split_secrets(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """`env` as (the plain variables, the secret ones)."""
    plain: dict[str, str] = {}
    secret: dict[str, str] = {}
    for name, value in env.items():
        (secret if is_secret(name) else plain)[name] = value
    return plain, secret


def lost_env_error(task_id: str, names: Iterable[str], again: str = "") -> str:
    """Why task `task_id` cannot start: the values of its `--env` `names` were held only by
    the leader that took it, which has restarted since; `again` is the command that gives them
    again (`shoal sh`, `shoal agent --resume ID`; default: just the flags)."""
    listed = list(names)
    flags = " ".join(f"--env {n}=VALUE" for n in listed)
    return (
        f"task {task_id} needs --env {', '.join(listed)}, whose values are never written to "
        f"disk and were lost when the leader restarted: submit it again with "
        f"`{again + ' ' if again else ''}{flags}`"
    )


__all__ = ["SECRET_NAMES", "is_secret", "lost_env_error", "split_secrets"]
