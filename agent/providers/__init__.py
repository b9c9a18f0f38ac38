"""Provider clients. `make_provider` builds one from a turn's config plus the key read at call time.

API keys come from the worker's own environment, else `.streamlit/secrets.toml` (agent.secrets);
they never enter a TurnConfig, a job payload or Redis. Which providers exist is agent.providers.registry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from agent.hosts import is_local_url
from agent.providers import registry
from agent.providers.anthropic import AnthropicProvider
from agent.providers.base import Completion, Provider, ProviderError, ProviderErrorKind, TextListener, ToolCall, Usage
from agent.providers.openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "Completion",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ProviderErrorKind",
    "TextListener",
    "ToolCall",
    "Usage",
    "make_provider",
]


def make_provider(config, *, env: Mapping[str, str] | None = None, project_root: Path | None = None) -> Provider:
    """The provider a TurnConfig names (fields provider, model, base_url), with its key from env or secrets."""
    env = os.environ if env is None else env
    spec = registry.find(config.provider)
    if spec is None:
        raise ProviderError(ProviderErrorKind.BAD_REQUEST, f"unknown provider {config.provider!r}")
    configured = spec.configured_url(env)
    base_url = configured if spec.served_by_pool else config.base_url or configured
    if not base_url:
        raise ProviderError(ProviderErrorKind.CONNECTION, f"the {spec.name} provider is not running")
    key = spec.key(env, project_root)
    if key and base_url.rstrip("/") != (configured or "").rstrip("/") and not is_local_url(base_url):
        # A turn's config comes from Redis: whoever can write there must not get the key sent to them.
        # The worker's own machine (loopback) is trusted like its configured server.
        raise ProviderError(
            ProviderErrorKind.AUTH,
            f"the turn's server {base_url} is not the configured server ({spec.url_variable}, "
            f"{configured}) and not on this machine, so the API key ({spec.key_variable}) was not sent and no call "
            "was made",
        )
    if key and any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in key):
        # httpx would refuse the header and quote its value, key included, in the error.
        raise ProviderError(ProviderErrorKind.AUTH, f"{spec.key_variable} contains spaces or control characters")
    return spec.client(base_url, config.model, key)
