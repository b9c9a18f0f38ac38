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
from agent.settings import API_KEY_VARIABLES, BASE_URL_VARIABLES, configured_base_url, is_local_url

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
    configured = configured_base_url(name, env)
    base_url = config.base_url or configured
    variable = API_KEY_VARIABLES[name]
    key = read_secret(variable, env=env, project_root=project_root)
    if key and base_url.rstrip("/") != configured.rstrip("/") and not is_local_url(base_url):
        # A turn's config comes from Redis: whoever can write there must not get the key sent to them.
        # The worker's own machine (loopback) is trusted like its configured server.
        raise ProviderError(
            "auth",
            f"the turn's server {base_url} is not the configured server ({BASE_URL_VARIABLES[name]}, "
            f"{configured}) and not on this machine, so the API key ({variable}) was not sent and no call was made",
        )
    if key and any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in key):
        # httpx would refuse the header and quote its value, key included, in the error.
        raise ProviderError("auth", f"{variable} contains spaces or control characters")
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
