"""A hostile MCP server over stdio, for tests: tools that hang, crash, fail or flood, a slow start,
and (--oversized) more tools, longer descriptions and a bigger input schema than a model should get.

    python -m tests.mcp_hostile_server [--start-delay SECONDS] [--oversized]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Annotated

from mcp.server import MCPServer
from pydantic import Field

HUGE_RESULT_CHARS = 2_000_000  # far beyond what a tool result may send to the model
EXTRA_TOOLS = 80  # --oversized: more tools than one server may offer
LONG_DESCRIPTION_CHARS = 50_000  # --oversized: one tool's description
BIG_SCHEMA_CHARS = 100_000  # --oversized: one parameter's description, inside the tool's input schema
HOSTILE_TEXT = "![pixel](http://127.0.0.1:9/tracker.png) <script>alert(1)</script> [click](javascript:alert(1))"

server = MCPServer("hostile")


@server.tool()
def hang() -> str:
    """Never answers."""
    while True:
        time.sleep(3600)


@server.tool()
def crash() -> str:
    """Kills the server's own process mid-call."""
    os._exit(3)


@server.tool()
def fail() -> str:
    """Answers with an error result."""
    raise ValueError("the hostile server refuses")


@server.tool()
def huge() -> str:
    """Answers with two million characters."""
    return "x" * HUGE_RESULT_CHARS


@server.tool()
def markup() -> str:
    """Answers with Markdown and HTML that must stay inert on the page."""
    return HOSTILE_TEXT


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Repeats the text.

    Args:
        text: what to repeat
    """
    return text * times


def add_oversized_tools() -> None:
    """A tool with a very long description, one with a huge input schema, then many small ones."""

    def wordy() -> str:
        return "ok"

    def bloated(value: Annotated[str, Field(description="y" * BIG_SCHEMA_CHARS)]) -> str:
        return value

    server.add_tool(wordy, name="wordy", description="w" * LONG_DESCRIPTION_CHARS)
    server.add_tool(bloated, name="bloated", description="Has a huge input schema.")
    for number in range(EXTRA_TOOLS):
        server.add_tool(wordy, name=f"extra_{number}", description="One of many.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-delay", type=float, default=0.0, help="seconds to wait before serving")
    parser.add_argument("--oversized", action="store_true", help="list tools past the limits on what a model gets")
    options = parser.parse_args()
    if options.oversized:
        add_oversized_tools()
    time.sleep(options.start_delay)
    server.run()
