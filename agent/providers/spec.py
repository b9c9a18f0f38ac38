"""What a provider module declares about itself, and the one rule about when a provider needs its key.

Settings, the factory and the sidebar read these declarations through agent.providers.registry, so
none of them names a provider.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.hosts import is_local_url
from agent.providers.base import Provider
from agent.secrets import read_secret


@dataclass(frozen=True)
class ProviderSpec:
    """One provider: `client(base_url, model, api_key)` builds it; the rest says where its server and key come from."""

    name: str  # the value of AGENT_PROVIDER that chooses it
    client: Callable[[str, str, str | None], Provider]
    default_model: str
    url_variable: str  # the environment variable that names its server
    default_url: str | None = None  # the official server; None: the variable names it or nothing does
    key_variable: str | None = None  # None: it takes no key
    label: str = ""  # how the sidebar names it, when not by `name`
    # The worker pool runs this provider's server and hands its workers the URL in `url_variable`,
    # so a turn never names a server for it.
    served_by_pool: bool = False

    def configured_url(self, env: Mapping[str, str] | None = None) -> str | None:
        """The server this process is configured for: its `url_variable`, else the official default."""
        env = os.environ if env is None else env
        return env.get(self.url_variable, "").strip() or self.default_url

    def key(self, env: Mapping[str, str] | None = None, project_root: Path | None = None) -> str | None:
        """Its API key (environment or secrets.toml); None when it takes none or none is set."""
        if self.key_variable is None:
            return None
        return read_secret(self.key_variable, env=env, project_root=project_root)

    def key_missing(self, base_url: str | None, env: Mapping[str, str] | None = None) -> bool:
        """A provider that takes a key needs it, unless its server is on this machine (loopback):
        Ollama, llama.cpp and vLLM there usually take none."""
        return self.key_variable is not None and not is_local_url(base_url or "") and self.key(env) is None
