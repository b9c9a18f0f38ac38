"""Provider clients. `make_provider` builds one from a turn's config plus secrets read at call time.

API keys come from the worker's own environment, else `.streamlit/secrets.toml` at the project
root; they never enter a TurnConfig, a job payload or Redis.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from agent.providers.anthropic import AnthropicProvider
from agent.providers.base import Completion, Provider, ProviderError, ToolCall
from agent.providers.openai import OpenAIProvider
from agent.settings import API_KEY_VARIABLES, BASE_URL_VARIABLES, DEFAULT_BASE_URLS

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SECRETS_FILE = Path(".streamlit") / "secrets.toml"
DEMO_URL_VARIABLE = "AGENT_DEMO_URL"

__all__ = [
    "AnthropicProvider",
    "Completion",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ToolCall",
    "make_provider",
    "read_secret",
]


def make_provider(
    config,
    *,
    env: Mapping[str, str] | None = None,
    demo_url: str | None = None,
    project_root: Path | None = None,
) -> Provider:
    """The provider a TurnConfig names (fields provider, model, base_url), with its key from env or secrets."""
    env = os.environ if env is None else env
    name = config.provider
    if name == "demo":
        url = demo_url or env.get(DEMO_URL_VARIABLE, "").strip()
        if not url:
            raise ProviderError("connection", "the demo provider is not running")
        return OpenAIProvider(url, config.model, None)
    if name not in API_KEY_VARIABLES:
        raise ProviderError("bad_request", f"unknown provider {name!r}")
    base_url = config.base_url or env.get(BASE_URL_VARIABLES[name], "").strip() or DEFAULT_BASE_URLS[name]
    key = read_secret(API_KEY_VARIABLES[name], env=env, project_root=project_root)
    if name == "anthropic":
        return AnthropicProvider(base_url, config.model, key)
    return OpenAIProvider(base_url, config.model, key)


def read_secret(variable: str, *, env: Mapping[str, str] | None = None, project_root: Path | None = None) -> str | None:
    """A secret from the environment, else a top-level key of .streamlit/secrets.toml; None if neither has it."""
    env = os.environ if env is None else env
    value = env.get(variable, "").strip()
    if value:
        return value
    path = (PROJECT_ROOT if project_root is None else Path(project_root)) / SECRETS_FILE
    try:
        with path.open("rb") as file:
            secrets = tomllib.load(file)
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        # Name the file, not its contents: the contents are secrets.
        log.warning("could not read %s (%s); ignoring it", path, type(exc).__name__)
        return None
    value = secrets.get(variable)
    return value.strip() or None if isinstance(value, str) else None
