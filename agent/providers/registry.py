"""Every provider AGENT_PROVIDER can name, in the order the sidebar offers them.

A new provider is its module, which declares a ProviderSpec, and one `register` line below.
This module must not import agent.settings: settings reads it.
"""

from __future__ import annotations

from agent.providers import anthropic, demo, openai
from agent.providers.spec import ProviderSpec

PROVIDERS: dict[str, ProviderSpec] = {}  # name -> spec, in registration order


def register(spec: ProviderSpec) -> ProviderSpec:
    PROVIDERS[spec.name] = spec
    return spec


def find(name: str) -> ProviderSpec | None:
    return PROVIDERS.get(name)


def names() -> tuple[str, ...]:
    return tuple(PROVIDERS)


DEFAULT = register(demo.SPEC)  # AGENT_PROVIDER's default: offline, it needs no key and no network
register(openai.SPEC)
register(anthropic.SPEC)
