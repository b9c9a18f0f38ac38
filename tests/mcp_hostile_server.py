"""A hostile MCP server over stdio, for tests: tools that hang, crash, fail or flood, and a slow start.

    python -m tests.mcp_hostile_server [--start-delay SECONDS]
"""

from __future__ import annotations

import argparse
import os
import time

from mcp.server import MCPServer

HUGE_RESULT_CHARS = 2_000_000  # far beyond what a tool result may send to the model
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-delay", type=float, default=0.0, help="seconds to wait before serving")
    delay_s = parser.parse_args().start_delay
    time.sleep(delay_s)
    server.run()
