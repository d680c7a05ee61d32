"""Models by spec string: `anthropic:NAME`, `openai:NAME`, `scripted:FILE`, `replay:TRANSCRIPT`.

Which spec an agent runs on is decided once, in `choose_model` (`--model`, then the agent
definition's, then `$SHOAL_MODEL`, then `model` in `SHOAL_HOME/config.toml`, then the embedded
scripted default), and checked before a task is created (`check_model`): a missing API key
names its variable, a missing script or transcript names its path. `build_model` turns a
checked spec into a pydantic-ai model; the providers' SDKs retry 429s and 5xxs with backoff,
and a network model is asked by streaming with an idle timeout (see streamed.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from shoal.core.config import MODEL_IDLE_S, config_value
from shoal.core.errors import NotFoundError, ShoalError, UsageError

if TYPE_CHECKING:
    from pydantic_ai.models import Model

PROVIDERS: Final = ("anthropic", "openai", "scripted", "replay")
# Variables each network provider reads: (the API key, the base URL).
PROVIDER_ENV: Final[Mapping[str, tuple[str, str]]] = {
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
}
DEFAULT_SPEC: Final = "scripted:"  # the embedded default script (no file: see scripted.py)


class MissingKeyError(ShoalError):
    """A provider's API key is not in the agent's environment."""


@dataclass(frozen=True)
class ModelSpec:
    """A parsed `provider:name` (for scripted and replay, `name` is a file path)."""

    provider: str
    name: str

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """`anthropic:claude-sonnet-4-5` -> ModelSpec; an unknown prefix is a UsageError
        listing the known ones."""
        provider, sep, name = text.strip().partition(":")
        if not sep or provider not in PROVIDERS:
            known = ", ".join(f"{p}:" for p in PROVIDERS)
            raise UsageError(
                f"unknown model {text!r}: a model is one of {known} followed by a name"
            )
        if not name and provider in PROVIDER_ENV:
            raise UsageError(f"model {text!r} names no model (e.g. {provider}:MODEL-NAME)")
        if not name and provider == "replay":
            raise UsageError("model 'replay:' needs a transcript file (replay:PATH.jsonl)")
        return cls(provider, name)

    def __str__(self) -> str:
        return f"{self.provider}:{self.name}"


def config_model(home: Path) -> str | None:
    """`model` from `SHOAL_HOME/config.toml`, if the file sets it."""
    return config_value(home, "model", str, "a string like 'anthropic:NAME'") or None


def choose_model(
    cli: str | None,
    definition: str | None,
    env: Mapping[str, str],
    home: Path,
) -> ModelSpec:
    """The spec an agent runs on, by precedence: `--model`, the definition's, $SHOAL_MODEL,
    config.toml, the scripted default. A definition's `inherit` defers to the next source."""
    for source in (cli, definition if definition != "inherit" else None, env.get("SHOAL_MODEL")):
        if source:
            return ModelSpec.parse(source)
    return ModelSpec.parse(config_model(home) or DEFAULT_SPEC)


def check_model(spec: ModelSpec, env: Mapping[str, str], cwd: Path | None = None) -> None:
    """Refuse, before anything is created, a spec that cannot run: a missing API key (named),
    a script or transcript that is not there."""
    if spec.provider in PROVIDER_ENV:
        key, _ = PROVIDER_ENV[spec.provider]
        if not env.get(key):
            raise MissingKeyError(
                f"model {spec} needs ${key}: set it in the environment or pass --env {key}=..."
            )
        return
    if spec.name:
        path = resolve_file(spec.name, cwd)
        if not path.is_file():
            what = "script" if spec.provider == "scripted" else "transcript"
            raise NotFoundError(f"model {spec}: {what} {path} not found")


def resolve_file(name: str, cwd: Path | None) -> Path:
    """A scripted/replay file name, relative to `cwd` when not absolute."""
    path = Path(os.path.expanduser(name))
    return path if path.is_absolute() or cwd is None else cwd / path


def build_model(
    spec: ModelSpec,
    env: Mapping[str, str],
    cwd: Path | None = None,
    *,
    idle_s: float = MODEL_IDLE_S,
) -> Model:
    """A pydantic-ai model for a checked spec (imports the provider's SDK only when used); a
    network model's attempt fails once its server has sent no bytes for `idle_s`."""
    check_model(spec, env, cwd)
    if spec.provider in PROVIDER_ENV:
        from shoal.workers.agent.streamed import Streamed

        return Streamed(_network_model(spec, env), spec=str(spec), idle_s=idle_s)
    if spec.provider == "scripted":
        from shoal.workers.agent.scripted import Script, scripted_model

        script = Script.load(resolve_file(spec.name, cwd)) if spec.name else Script.default()
        return scripted_model(script)
    from shoal.workers.agent.replay import replay_model

    return replay_model(resolve_file(spec.name, cwd))


def _network_model(spec: ModelSpec, env: Mapping[str, str]) -> Model:
    """The provider's own pydantic-ai model for an `anthropic:` or `openai:` spec."""
    key, base = PROVIDER_ENV[spec.provider]
    if spec.provider == "anthropic":
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        provider = AnthropicProvider(api_key=env[key], base_url=env.get(base) or None)
        return AnthropicModel(spec.name, provider=provider)
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    oprovider = OpenAIProvider(base_url=env.get(base) or None, api_key=env[key])
    return OpenAIChatModel(spec.name, provider=oprovider)
