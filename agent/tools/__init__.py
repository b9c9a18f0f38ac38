"""Tools the model may call: the built-ins, the typed functions an AGENT_TOOLS module lists, and
the tools of the MCP servers in mcp.json (agent/tools/mcp.py). One registry holds them all.

Layout: registry.py (a function -> a Tool with a msgspec-checked schema), running.py (run_tool,
bounded by time and a stop), built_ins.py (the list of built-in tools, one module each), sources.py
(a worker's extra tools and MCP servers) and catalogue.py (the list of them in Redis, for the page)."""

from __future__ import annotations

from agent.tools.built_ins import BUILT_INS
from agent.tools.registry import REGISTRY, Tool, ToolError, make_tool, needs_approval, safe_to_repeat, schemas, tool
from agent.tools.running import MAX_OUTPUT_CHARS, ToolResult, run_tool

for _built_in in BUILT_INS:
    tool(_built_in)

__all__ = ["MAX_OUTPUT_CHARS", "REGISTRY", "Tool", "ToolError", "ToolResult", "make_tool", "needs_approval",
           "run_tool", "schemas", "safe_to_repeat", "tool"]
