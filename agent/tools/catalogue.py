"""The tool catalogue in Redis: what the workers' tool sources are, and which tools ask a person
first, for the page and `python -m agent tools` to list.

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


def listed_tools(sources: list[dict], approve_tools: tuple[str, ...] | frozenset = ()) -> list[dict]:
    """Every published tool as one row, {name, source, description, needs_approval}, for a list of them:
    it asks first when its source says so, or when the turn's AGENT_APPROVE_TOOLS name it. What a worker
    wrote is read defensively (an older worker's tools have no needs_approval: they do not ask)."""
    rows = []
    for source in sources:
        tools = source.get("tools") if isinstance(source, dict) else None
        for tool in tools if isinstance(tools, list) else []:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                continue
            rows.append({"name": name, "source": str(source.get("name", "?")),
                         "description": str(tool.get("description") or ""),
                         "needs_approval": tool.get("needs_approval") is True or name in approve_tools})
    return rows
