"""A hostile MCP server over stdio, for tests: tools that hang, crash, fail, flood stdout (huge lines,
junk, noise) or leave a child behind, a slow start,
and (--oversized) more tools, longer descriptions and a bigger input schema than a model should get;
(--annotated) tools that say they destroy, or only read, for the tools that ask a person first.

    python -m tests.mcp_hostile_server [--start-delay SECONDS] [--oversized] [--annotated] [--sleeper KIND]
        [--noise LINES] [--stderr-bytes BYTES]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Annotated

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import Field

HUGE_RESULT_CHARS = 2_000_000  # far beyond what a tool result may send to the model
EXTRA_TOOLS = 80  # --oversized: more tools than one server may offer
LONG_DESCRIPTION_CHARS = 50_000  # --oversized: one tool's description
BIG_SCHEMA_CHARS = 100_000  # --oversized: one parameter's description, inside the tool's input schema
NOISE_LINE = b"this is not JSON-RPC, just a chatty server\n"
HOSTILE_TEXT = "![pixel](http://127.0.0.1:9/tracker.png) <script>alert(1)</script> [click](javascript:alert(1))"

server = MCPServer("hostile")
WIRE_FD = os.dup(1)  # the real stdout: the SDK's server points fd 1 at stderr while it serves


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
def huge(chars: int = HUGE_RESULT_CHARS) -> str:
    """Answers with that many characters (two million unless told)."""
    return "x" * chars


@server.tool()
def flood(size_bytes: int, shape: str, ctx: Context) -> str:
    """Writes one line of about size_bytes to stdout itself, then answers "after".

    Shapes: "id_first" and "id_last" (a JSON-RPC response to this call, its id before or after
    the result), "junk" (bytes that are not JSON), "id_in_text" (a response whose result's text
    holds a fake "id" before the real one)."""
    request_id = '"id":' + json.dumps(ctx.request_context.request_id)
    filler = "y" * max(0, size_bytes)
    if shape == "id_in_text":
        filler = '\\"id\\":999 ' + filler
    result = '"result":{"content":[{"type":"text","text":"' + filler + '"}]}'
    if shape == "id_first":
        line = '{"jsonrpc":"2.0",' + request_id + "," + result + "}"
    elif shape in ("id_last", "id_in_text"):
        line = '{"jsonrpc":"2.0",' + result + "," + request_id + "}"
    else:
        line = "\x00\xff{" + filler
    write_stdout((line + "\n").encode("utf-8", errors="surrogateescape"))
    return "after"


def nested_text(depth: int, shape: str) -> str:
    """A JSON object nested `depth` deep (as tests/deep_json.py builds it: the server runs as a script)."""
    inner = depth - 1
    opens = {"objects": ['{"a":'] * inner, "arrays": ["["] * inner,
             "mixed": ["[" if level % 2 else '{"a":' for level in range(inner)]}[shape]
    closes = "".join("]" if part == "[" else "}" for part in reversed(opens))
    return '{"a":' + "".join(opens) + "1" + closes + "}"


@server.tool(structured_output=False)
def deep(depth: int, shape: str, ctx: Context) -> str:
    """Answers with structured content nested `depth` deep ("objects", "arrays" or "mixed"), written to
    stdout itself (the SDK's own writer recurses), then answers "after"."""
    request_id = '"id":' + json.dumps(ctx.request_context.request_id)
    result = '"result":{"resultType":"complete","content":[],"structuredContent":' + nested_text(depth, shape) + "}"
    write_stdout(('{"jsonrpc":"2.0",' + request_id + "," + result + "}\n").encode())
    return "after"


@server.tool()
def meta(ctx: Context) -> str:
    """Answers with the `_meta` its request carried, as JSON (an idempotency key goes there)."""
    return json.dumps(dict(ctx.request_context.meta or {}))


@server.tool()
def noise(lines: int) -> str:
    """Prints that many lines of non-JSON to stdout, then answers "quiet"."""
    write_stdout(NOISE_LINE * lines)
    return "quiet"


SLEEPER_KINDS = ("child", "own_session", "orphan", "orphan_own_session", "under_a_waiting_parent", "ignores_term")


@server.tool()
def sleeper(kind: str = "child") -> int:
    """Starts `sleep 600` (a grandchild of the worker) and answers the pid of what it started.

    Kinds: a plain child; one in its own session (out of the server's group); an orphan (its
    parent exits at once), also in its own session; one in its own session whose parent, in the
    group, waits for it (it is orphaned only when the group is ended); one that ignores SIGTERM."""
    return start_sleeper(kind)


def start_sleeper(kind: str) -> int:
    detach = "import subprocess; subprocess.Popen(['sleep', '600'], start_new_session=%s)"
    if kind == "orphan":
        command = [sys.executable, "-c", detach % False]
    elif kind == "orphan_own_session":
        command = [sys.executable, "-c", detach % True]
    elif kind == "under_a_waiting_parent":
        command = [sys.executable, "-c", (detach % True) + ".wait()"]
    elif kind == "ignores_term":
        command = ["sh", "-c", "trap '' TERM; sleep 600 & wait"]
    else:
        command = ["sleep", "600"]
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             start_new_session=kind == "own_session")
    if kind.startswith("orphan"):
        child.wait()
    return child.pid


def write_stdout(data: bytes) -> None:
    """Bytes straight onto the wire, past the server's own writer (no message is in flight during a call)."""
    write_all(WIRE_FD, data)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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


def add_annotated_tools() -> None:
    """erase says it destroys (so it asks first); peek says it destroys and only reads (so it does not);
    tidy says it is not destructive."""

    def done() -> str:
        return "done"

    server.add_tool(done, name="erase", description="Erases.", annotations=ToolAnnotations(destructiveHint=True))
    server.add_tool(done, name="peek", description="Looks.",
                    annotations=ToolAnnotations(destructiveHint=True, readOnlyHint=True))
    server.add_tool(done, name="tidy", description="Tidies.", annotations=ToolAnnotations(destructiveHint=False))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-delay", type=float, default=0.0, help="seconds to wait before serving")
    parser.add_argument("--oversized", action="store_true", help="list tools past the limits on what a model gets")
    parser.add_argument("--annotated", action="store_true", help="list tools annotated destructive or read-only")
    parser.add_argument("--sleeper", choices=SLEEPER_KINDS, action="append", default=[],
                        help="start `sleep 600` this way before serving (repeat for more)")
    parser.add_argument("--noise", type=int, default=0, help="lines of non-JSON to print to stdout before serving")
    parser.add_argument("--stderr-bytes", type=int, default=0, help="bytes of chatter to print to stderr first")
    options = parser.parse_args()
    if options.oversized:
        add_oversized_tools()
    if options.annotated:
        add_annotated_tools()
    for kind in options.sleeper:
        start_sleeper(kind)
    write_stdout(NOISE_LINE * options.noise)
    line = b"the hostile server chatters on stderr\n"
    write_all(2, line * (options.stderr_bytes // len(line)))
    time.sleep(options.start_delay)
    server.run()
