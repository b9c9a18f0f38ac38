"""Where a worker's tools come from, and the catalogue it publishes for the page.

A worker registers, once at start: the built-ins (always), the typed functions an AGENT_TOOLS
module lists in its `TOOLS`, and the tools of the MCP servers in AGENT_MCP_CONFIG (default
`mcp.json` at the project root; `off` for none). Only this file on the worker's machine decides
what runs: the catalogue in Redis is for display, and a turn's chosen subset names tools only.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from agent.tools.mcp import McpConfigError, McpHub, ServerReport, read_config
from agent.tools.registry import BUILT_IN, REGISTRY, Tool, add, make_tool

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MCP_CONFIG_VARIABLE = "AGENT_MCP_CONFIG"
MCP_OFF = "off"  # AGENT_MCP_CONFIG=off: no MCP servers (the test suite's default)
TOOLS_VARIABLE = "AGENT_TOOLS"
START_TIMEOUT_VARIABLE = "AGENT_MCP_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 20.0  # seconds a server gets to start and list its tools (mcp-server-time takes ~2 s)
CATALOGUE_KEY = "agent:tools:catalogue"  # one JSON document: the sources the workers have, for the page

_hubs: list[McpHub] = []  # this process's MCP sessions: started once, by `load`


def load(env: Mapping[str, str] | None = None) -> list[dict]:
    """Register this process's extra tools and start its MCP servers; the sources, as published.

    Called once per worker process, before it takes jobs."""
    env = os.environ if env is None else env
    sources = [_source(BUILT_IN, "built-in", [t for t in REGISTRY.values() if t.source == BUILT_IN])]
    if module := env.get(TOOLS_VARIABLE, "").strip():
        sources.append(_python_source(module))
    reports, hub = _start_mcp(env)
    _hubs.extend([hub] if hub else [])
    for report in reports:
        try:
            for found in report.tools:
                add(found)
        except ValueError as exc:  # an AGENT_TOOLS function took the name first
            report.error = str(exc)
        sources.append(_source(report.name, f"MCP, {report.transport}", report.tools, report.error))
    for source in sources:
        if source["error"]:
            log.warning("tool source %s: %s", source["name"], source["error"])
    return sources


def close() -> None:
    """Stop this process's MCP servers."""
    while _hubs:
        _hubs.pop().close()


def _python_source(module_path: str) -> dict:
    """The typed functions an AGENT_TOOLS module lists in `TOOLS`, registered as its tools."""
    try:
        functions = importlib.import_module(module_path).TOOLS
        tools = [make_tool(func, source=module_path) for func in functions]
        for found in tools:
            add(found)
    except Exception as exc:  # noqa: BLE001 - a bad module is reported; the other tools still work
        return _source(module_path, "Python module", [], f"{TOOLS_VARIABLE}={module_path}: {type(exc).__name__}: {exc}")
    return _source(module_path, "Python module", tools)


def _start_mcp(env: Mapping[str, str]) -> tuple[list[ServerReport], McpHub | None]:
    raw = env.get(MCP_CONFIG_VARIABLE, "").strip()
    if raw.lower() == MCP_OFF:
        return [], None
    path = Path(raw) if raw else PROJECT_ROOT / "mcp.json"
    if not raw and not path.exists():
        return [], None  # no config file, no MCP servers; a file named in the variable must exist
    try:
        servers = read_config(path)
        timeout_s = start_timeout_s(env)
    except McpConfigError as exc:
        return [ServerReport(MCP_CONFIG_VARIABLE, "config", error=str(exc))], None
    if not servers:
        return [], None
    hub = McpHub()
    return hub.start(servers, timeout_s), hub


def start_timeout_s(env: Mapping[str, str]) -> float:
    raw = env.get(START_TIMEOUT_VARIABLE, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_START_TIMEOUT_S
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise McpConfigError(f"{START_TIMEOUT_VARIABLE}: must be a number of seconds more than 0, not {raw!r}")
    return value


def _source(name: str, kind: str, tools: list[Tool], error: str | None = None) -> dict:
    """A source as the page shows it: names and descriptions only, never a command, env value or URL."""
    listed = [{"name": t.name, "description": t.description[:300]} for t in tools]
    return {"name": name, "kind": kind, "tools": listed, "error": error}


def publish(client: redis.Redis, sources: list[dict]) -> None:
    """Write this worker's catalogue for the page (every worker of one deployment reads the same config)."""
    client.set(CATALOGUE_KEY, json.dumps({"sources": sources, "updated_at": time.time()}))


def read_catalogue(client: redis.Redis) -> list[dict]:
    """The tool sources the workers published; empty until a worker has started."""
    raw = client.get(CATALOGUE_KEY)
    try:
        sources = json.loads(raw)["sources"] if raw else []
    except (ValueError, KeyError, TypeError):
        return []
    return sources if isinstance(sources, list) else []
