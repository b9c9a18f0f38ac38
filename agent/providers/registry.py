"""Every provider AGENT_PROVIDER can name, in the order the sidebar offers them.

A new provider is its module, which declares a ProviderSpec, and its `register` line below (with its import).
This module must not import agent.settings: settings reads it.
"""

from __future__ import annotations

from agent.providers.anthropic import ANTHROPIC
from agent.providers.demo import DEMO
from agent.providers.openai import OPENAI
from agent.providers.spec import ProviderSpec

PROVIDERS: dict[str, ProviderSpec] = {}  # name -> spec, in registration order


def register(spec: ProviderSpec) -> ProviderSpec:
    PROVIDERS[spec.name] = spec
    return spec


def find(name: str) -> ProviderSpec | None:
    return PROVIDERS.get(name)


def names() -> tuple[str, ...]:
    return tuple(PROVIDERS)


DEFAULT = register(DEMO)  # AGENT_PROVIDER's default: offline, it needs no key and no network
register(OPENAI)
register(ANTHROPIC)
