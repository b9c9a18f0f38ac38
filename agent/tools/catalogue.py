"""The tool catalogue in Redis: what the workers' tool sources are, for the page to list.

Kept apart from sources.py, which starts MCP servers: the page reads one key, and must not pay
for importing the `mcp` SDK (and its web stack) to do so.
"""

from __future__ import annotations

import json
import time

import redis

from agent import bounded_json
from agent.conversation.keys import CATALOGUE_KEY  # listed with every key the project writes


def publish(client: redis.Redis, sources: list[dict]) -> None:
    """Write this worker's catalogue for the page (every worker of one deployment reads the same config)."""
    client.set(CATALOGUE_KEY, json.dumps({"sources": sources, "updated_at": time.time()}))


def read_catalogue(client: redis.Redis) -> list[dict]:
    """The tool sources the workers published; empty until a worker has started."""
    raw = client.get(CATALOGUE_KEY)
    try:
        sources = bounded_json.loads(raw)["sources"] if raw else []  # ValueError: also TooDeep
    except (ValueError, KeyError, TypeError):
        return []
    return sources if isinstance(sources, list) else []
