"""Tunable limits, from the environment (SHOAL_*) with the defaults of DESIGN.md, and the
settings of `SHOAL_HOME/config.toml` (`model`, `fork`, ...)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.core.errors import UsageError
from shoal.core.tasks import MAX_TASK_OUTPUT_BYTES


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"${name} must be a number, not {raw!r}") from None
    if value < 0:
        raise UsageError(f"${name} must not be negative")
    return value


@dataclass(frozen=True)
class Limits:
    """Intervals and caps of the leader and its shell tasks."""

    poll_interval: float = field(default_factory=lambda: _env_float("SHOAL_POLL_INTERVAL", 1.0))
    stall_check_interval: float = field(
        default_factory=lambda: _env_float("SHOAL_STALL_CHECK_INTERVAL", 5.0)
    )
    stall_after: float = field(default_factory=lambda: _env_float("SHOAL_STALL_AFTER", 45.0))
    kill_grace: float = field(default_factory=lambda: _env_float("SHOAL_KILL_GRACE", 5.0))
    output_cap: int = field(
        default_factory=lambda: int(_env_float("SHOAL_OUTPUT_CAP", MAX_TASK_OUTPUT_BYTES))
    )


def config_file(home: Path) -> dict[str, Any]:
    """The table of `SHOAL_HOME/config.toml` ({} when there is none); a file that does not
    parse is a usage error naming it."""
    path = home / "config.toml"
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: {exc}") from None


def config_value(home: Path, key: str, kind: type | tuple[type, ...], example: str) -> Any:
    """`key` of config.toml, None when unset; a value of another type is a usage error that
    names the file, the key and an `example` of a good value."""
    value = config_file(home).get(key)
    if value is not None and not isinstance(value, kind):
        raise UsageError(f"{home / 'config.toml'}: {key} must be {example}, not {value!r}")
    return value


def worker_stall_s(home: Path) -> float:
    """After how long without a model response or tool activity a coordinator's worker
    "appears stalled": $SHOAL_WORKER_STALL_S, else `stall_s` in config.toml, else 300."""
    if os.environ.get("SHOAL_WORKER_STALL_S"):
        return _env_float("SHOAL_WORKER_STALL_S", WORKER_STALL_S)
    value = config_value(home, "stall_s", (int, float), "a number of seconds")
    if value is None:
        return WORKER_STALL_S
    if isinstance(value, bool) or value <= 0:
        raise UsageError(f"{home / 'config.toml'}: stall_s must be a positive number of seconds")
    return float(value)


WORKER_STALL_S = 300.0
PR_POLL_S = 60.0
MODEL_IDLE_S = 120.0
TOOL_RETRIES = 25


def pr_poll_s(home: Path) -> float:
    """Seconds between two polls of a PR a coordinator subscribed to: $SHOAL_PR_POLL_S, else
    `pr_poll_s` in config.toml, else 60 (most polls are 304s, which cost no rate limit)."""
    if os.environ.get("SHOAL_PR_POLL_S"):
        return _env_float("SHOAL_PR_POLL_S", PR_POLL_S)
    value = config_value(home, "pr_poll_s", (int, float), "a number of seconds")
    if value is None:
        return PR_POLL_S
    if isinstance(value, bool) or value <= 0:
        raise UsageError(f"{home / 'config.toml'}: pr_poll_s must be a positive number of seconds")
    return float(value)


def github_api(home: Path) -> str | None:
    """`github_api` of config.toml (GitHub Enterprise's API address), None when unset."""
    value = config_value(home, "github_api", str, 'an address, e.g. "https://ghe.example/api/v3"')
    return str(value) if value is not None else None


def model_idle_s(home: Path, given: float | None = None) -> float:
    """Seconds a model server may send no bytes before the attempt fails: `given` (a
    `--model-idle` flag), else `model_idle_s` in config.toml, else 120."""
    if given is not None:
        return given
    value = config_value(home, "model_idle_s", (int, float), "a number of seconds")
    if value is None:
        return MODEL_IDLE_S
    if isinstance(value, bool) or value <= 0:
        raise UsageError(
            f"{home / 'config.toml'}: model_idle_s must be a positive number of seconds"
        )
    return float(value)


def tool_retries(home: Path) -> int:
    """How many calls in a row with bad arguments one tool takes before the run fails:
    `tool_retries` in config.toml, else 25 (a model that recovers at all does so long before)."""
    value = config_value(home, "tool_retries", int, "a whole number")
    if value is None:
        return TOOL_RETRIES
    if isinstance(value, bool) or value < 1:
        raise UsageError(f"{home / 'config.toml'}: tool_retries must be a whole number, 1 or more")
    return int(value)


def sandbox_settings(home: Path) -> tuple[bool, tuple[str, ...]]:
    """(enabled, extra writable paths) of the `[sandbox]` table of config.toml: the user's
    own switch and the caches a build needs (never read from a project's files)."""
    table = config_file(home).get("sandbox", {})
    where = home / "config.toml"
    if not isinstance(table, dict):
        raise UsageError(f"{where}: [sandbox] must be a table (enabled = true, writable = [...])")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise UsageError(f"{where}: sandbox.enabled must be true or false, not {enabled!r}")
    writable = table.get("writable", [])
    if not isinstance(writable, list) or not all(isinstance(p, str) and p for p in writable):
        raise UsageError(
            f'{where}: sandbox.writable must be a list of paths (e.g. ["~/.cache/pip"]), '
            f"not {writable!r}"
        )
    return enabled, tuple(os.path.expanduser(p) for p in writable)


def sandbox_unix_sockets(home: Path) -> bool:
    """`unix_sockets` of the `[sandbox]` table: whether confined commands may make unix
    sockets (off by default: a socket of your tmux server, D-Bus or ssh-agent reaches out of
    the box; on, say, for a build that talks to a local database through one)."""
    table = config_file(home).get("sandbox", {})
    value = table.get("unix_sockets", False) if isinstance(table, dict) else False
    if not isinstance(value, bool):
        raise UsageError(
            f"{home / 'config.toml'}: sandbox.unix_sockets must be true or false, not {value!r}"
        )
    return value
