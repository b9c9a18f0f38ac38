"""Where a worker's tools come from: the built-ins, an AGENT_TOOLS module and MCP servers.

A worker registers, once at start: the built-ins (always), the typed functions an AGENT_TOOLS
module lists in its `TOOLS`, and the tools of the MCP servers in AGENT_MCP_CONFIG (default
`mcp.json` at the project root; `off` for none). Only this file on the worker's machine decides
what runs: the catalogue in Redis (agent/tools/catalogue.py) is for display, and a turn's chosen
subset names tools only.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from agent import PROJECT_ROOT
from agent.settings import SettingsError, mcp_start_timeout_s
from agent.tools.mcp import McpConfigError, McpHub, ServerReport, read_config
from agent.tools.registry import BUILT_IN, REGISTRY, Tool, add_all, make_tool

log = logging.getLogger(__name__)

MCP_CONFIG_VARIABLE = "AGENT_MCP_CONFIG"
MCP_OFF = "off"  # AGENT_MCP_CONFIG=off: no MCP servers (the test suite's default)
TOOLS_VARIABLE = "AGENT_TOOLS"

_hubs: list[McpHub] = []  # this process's MCP sessions: started once, by `load`


def load(env: Mapping[str, str] | None = None, *, jobs_in_process: bool = True) -> list[dict]:
    """Register this process's extra tools and start its MCP servers; the sources, as published.

    Called once per worker process, before it takes jobs. MCP sessions live in this process, so
    they are started only when its jobs run here too (`jobs_in_process`: RQ's simple worker)."""
    env = os.environ if env is None else env
    sources = [built_in_source()]
    if module := env.get(TOOLS_VARIABLE, "").strip():
        sources.append(_python_source(module))
    for report in _start_mcp(env, jobs_in_process):
        try:
            add_all(report.tools)
        except ValueError as exc:  # an AGENT_TOOLS function took a name first
            report.error, report.tools = str(exc), []
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
        add_all(tools)
    except Exception as exc:  # noqa: BLE001 - a bad module is reported; the other tools still work
        return _source(module_path, "Python module", [], f"{TOOLS_VARIABLE}={module_path}: {type(exc).__name__}: {exc}")
    return _source(module_path, "Python module", tools)


def _start_mcp(env: Mapping[str, str], jobs_in_process: bool) -> list[ServerReport]:
    raw = env.get(MCP_CONFIG_VARIABLE, "").strip()
    if raw.lower() == MCP_OFF:
        return []
    path = Path(raw) if raw else PROJECT_ROOT / "mcp.json"
    if not raw and not path.exists():
        return []  # no config file, no MCP servers; a file named in the variable must exist
    if not jobs_in_process:
        return [ServerReport(MCP_CONFIG_VARIABLE, "config", error=(
            f"{path}: MCP servers not started: this worker class runs each job in another process, which "
            "cannot reach this process's MCP sessions (use the simple worker class)"))]
    try:
        servers = read_config(path)
        timeout_s = mcp_start_timeout_s(env)
    except (McpConfigError, SettingsError) as exc:
        return [ServerReport(MCP_CONFIG_VARIABLE, "config", error=str(exc))]
    if not servers:
        return []
    hub = McpHub()
    _hubs.append(hub)  # before it starts: a start-up cut short (SIGTERM, Ctrl-C) still has its servers stopped
    return hub.start(servers, timeout_s)


def built_in_source() -> dict:
    """The built-ins as a published source: what every process has, worker or not."""
    return _source(BUILT_IN, "built-in", [t for t in REGISTRY.values() if t.source == BUILT_IN])


def _source(name: str, kind: str, tools: list[Tool], error: str | None = None) -> dict:
    """A source as the page shows it: names, descriptions and whether each asks a person first; never a
    command, env value or URL."""
    listed = [{"name": t.name, "description": t.description[:300], "needs_approval": t.needs_approval}
              for t in tools]
    return {"name": name, "kind": kind, "tools": listed, "error": error}
