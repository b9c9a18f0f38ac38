"""MCP servers as tool sources, through the official `mcp` SDK (stdio and streamable HTTP).

A worker process starts the servers named in its own config file once, at start-up, each within
a bounded time, on one event loop in a background thread that holds the sessions for the life of
the process. Each server's tools are registered as `<server>__<tool>` with the server's own input
schema. A call runs on that loop under min(tool cap, time left) (run_tool's timeout_s) and is
cancelled when that runs out or the user stops the turn; an error result, a crash, a hang or a
result too big for the model ends as a ToolError that says which server and why. A tool annotated
destructive (and not read-only) asks a person before it runs, unless its server's entry says
`"approve": false` (never ask) or `"approve": true` (ask before every one of its tools).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent import bounded_json
from agent.tools.registry import Tool, ToolError
from agent.tools.running import ERROR_PREFIX, MAX_OUTPUT_CHARS

if TYPE_CHECKING:
    from mcp import Client

# The SDK (with anyio and its HTTP stack, about 30 MiB) is imported by the first server a process
# starts, not by every worker: a worker with no MCP servers configured never loads it.

WITH_PARENT = Path(__file__).resolve().parents[1] / "runtime" / "with_parent.py"  # stdlib only: run as a script
TOOL_NAME_SEPARATOR = "__"  # server and tool: "time__get_current_time"
MAX_TOOL_NAME_CHARS = 64  # the providers' limit: ^[a-zA-Z0-9_-]{1,64}$
_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")  # no "__", which separates server from tool
MAX_SERVER_NAME_CHARS = 24  # leaves 38 characters of a 64-character name for the tool's own name
MAX_LISTED_PAGES = 20  # pages of tools/list read from one server; a paginator that never ends cannot hang start-up
CALL_SLICE_S = 0.05  # seconds between stop checks while a call runs
# A tools/call request's `_meta` key for the call's idempotency key (turn and call: the same on every
# attempt, across resumes), for a server that dedupes side effects by key.
IDEMPOTENCY_META_KEY = "idempotencyKey"
CLOSE_TIMEOUT_S = 5.0  # seconds the servers get to shut down when the worker exits
CLOSE_WAIT_S = CLOSE_TIMEOUT_S + 1.0  # seconds close() waits for that, with room for the loop to answer
THREAD_JOIN_S = 2.0  # seconds the session thread gets to end once its loop is told to stop
# What a server may put in front of the model: its text is untrusted and costs tokens on every call.
MAX_DESCRIPTION_CHARS = 1000  # a tool's description past this is cut: enough for any honest tool
MAX_SCHEMA_BYTES = 16_384  # a tool whose input schema's JSON is bigger is refused: no sane tool needs more
MAX_TOOLS_PER_SERVER = 64  # tools offered from one server; the rest are left out (and reported)


class McpConfigError(ValueError):
    """The config file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ServerConfig:
    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets: never published or logged
    url: str | None = None
    # Whether its tools ask a person first: None (unset) for those annotated destructive, True for all, False never.
    approve: bool | None = None

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable HTTP"


@dataclass
class ServerReport:
    """What a server's start-up gave: its tools, or why it has none. Holds no command, env or URL."""

    name: str
    transport: str
    tools: list[Tool] = field(default_factory=list)
    error: str | None = None


def read_config(path: Path) -> list[ServerConfig]:
    """The servers of an `mcpServers` config file; McpConfigError says what is wrong with it."""
    try:
        data = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise McpConfigError(f"{path}: cannot be read as JSON ({type(exc).__name__}: {exc})") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f"{path}: must be an object with an \"mcpServers\" object")
    return [_server_config(path, name, entry) for name, entry in servers.items()]


def _server_config(path: Path, name: str, entry: object) -> ServerConfig:
    where = f"{path}: server {name!r}"
    if len(name) > MAX_SERVER_NAME_CHARS or not _SERVER_NAME.match(name):
        raise McpConfigError(f"{where}: a name is 1 to {MAX_SERVER_NAME_CHARS} letters, digits, '-' or single '_'")
    if not isinstance(entry, dict) or ("command" in entry) == ("url" in entry):
        raise McpConfigError(f"{where}: needs either \"command\" (stdio) or \"url\" (streamable HTTP)")
    args, env = entry.get("args", []), entry.get("env", {})
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}: \"args\" must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise McpConfigError(f"{where}: \"env\" must map names to strings")
    command, url = entry.get("command"), entry.get("url")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise McpConfigError(f"{where}: \"command\" must be a program name or path")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise McpConfigError(f"{where}: \"url\" must start with http:// or https://")
    approve = entry.get("approve")
    if "approve" in entry and not isinstance(approve, bool):
        raise McpConfigError(f"{where}: \"approve\" must be true (ask before every tool) or false (never ask)")
    return ServerConfig(name, command, tuple(args), dict(env), url, approve)


def resolve_command(command: str) -> str:
    """A bare program name is looked for beside this Python first (the venv's bin), then on PATH,
    so `make run` finds the venv's `mcp-server-time` without an activated venv or uvx."""
    beside = Path(sys.executable).parent / command
    found = shutil.which(command) if os.sep in command or not beside.is_file() else shutil.which(str(beside))
    if found is None:
        raise FileNotFoundError(f"{command!r} is not a program (looked beside {sys.executable} and on PATH)")
    return found


def public_name(server: str, tool: str) -> str:
    """`<server>__<tool>` within ^[a-zA-Z0-9_-]{1,64}$; a tool name that had to change gets a short hash,
    so two different names never end up the same."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", tool) or "tool"
    name = f"{server}{TOOL_NAME_SEPARATOR}{cleaned}"
    if cleaned == tool and len(name) <= MAX_TOOL_NAME_CHARS:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
    return f"{name[: MAX_TOOL_NAME_CHARS - 9]}_{digest}"


def offered_schema(schema: object) -> dict:
    """The server's input schema as is, when it describes an object (the only kind a tool call sends)."""
    if isinstance(schema, dict) and schema.get("type") == "object":
        return {"properties": {}, **schema}
    return {"type": "object", "properties": {}}


class McpHub:
    """This process's MCP sessions, held by one event loop in a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.clients: dict[str, Client] = {}
        self.ended: dict[str, str] = {}  # server -> why its session ended (a crash, a closed connection)
        self.closing = asyncio.Event()  # set by close(): every running session ends
        self.sessions: list[tuple[asyncio.Task, asyncio.Future]] = []  # each server's task, and its tools once listed
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp-sessions", daemon=True)
        self.thread.start()

    def start(self, servers: list[ServerConfig], timeout_s: float) -> list[ServerReport]:
        """Start every server at once; each gets timeout_s to start and list its tools."""
        future = asyncio.run_coroutine_threadsafe(self._start_all(servers, timeout_s), self.loop)
        return future.result()

    async def _start_all(self, servers: list[ServerConfig], timeout_s: float) -> list[ServerReport]:
        return list(await asyncio.gather(*(self._start(server, timeout_s) for server in servers)))

    async def _start(self, server: ServerConfig, timeout_s: float) -> ServerReport:
        report = ServerReport(server.name, server.transport)
        listed: asyncio.Future = self.loop.create_future()
        task = self.loop.create_task(self._session(server, listed), name=f"mcp-{server.name}")
        self.sessions.append((task, listed))  # close() ends it, started or not
        try:
            async with asyncio.timeout(timeout_s):
                listing = await asyncio.shield(listed)
        except TimeoutError:
            listed.cancel()  # nobody waits for it any more
            task.cancel()  # ends the session: a stdio server's process is stopped
            report.error = f"did not start and list its tools within {timeout_s:g} s"
            return report
        except Exception as exc:  # noqa: BLE001 - any start-up failure is this server's report, not the worker's
            report.error = f"did not start: {_reason(exc)}"
            return report
        report.tools, problems = offered_tools(server.name, _unique(listing), self.call, approve=server.approve)
        report.error = "; ".join(problems) or None
        return report

    async def _session(self, server: ServerConfig, listed: asyncio.Future) -> None:
        """One server's whole session, in one task (the SDK's contexts must open and close in the same task)."""
        try:
            from mcp import Client

            async with Client(_target(server)) as client:
                tools, cursor = [], None
                for _ in range(MAX_LISTED_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    if (cursor := page.next_cursor) is None:
                        break
                self.clients[server.name] = client
                listed.set_result(tools)
                await self.closing.wait()
        except BaseException as exc:
            if not listed.done():
                listed.set_exception(exc if isinstance(exc, Exception) else RuntimeError("start-up was cancelled"))
            self.ended[server.name] = _reason(exc)
            self.clients.pop(server.name, None)
            if not isinstance(exc, Exception):
                raise

    def call(self, server: str, tool: str, arguments: dict, timeout_s: float, stop: threading.Event | None,
             idempotency_key: str = "") -> str:
        """Call a tool on this process's session; a ToolError says what went wrong, in words. The call's
        idempotency key goes in the request's `_meta` (IDEMPOTENCY_META_KEY)."""
        if os.getpid() != self.pid:
            raise ToolError("MCP servers run in the worker process, not in a forked work horse: use the simple "
                            "worker class")
        future = asyncio.run_coroutine_threadsafe(self._call(server, tool, arguments, timeout_s, idempotency_key),
                                                  self.loop)
        while True:
            try:
                return future.result(CALL_SLICE_S)
            except TimeoutError:
                if stop is not None and stop.is_set():
                    future.cancel()
                    raise ToolError(f"stopped at your request while {tool} on the {server} MCP server ran") from None

    async def _call(self, server: str, tool: str, arguments: dict, timeout_s: float, idempotency_key: str) -> str:
        client = self.clients.get(server)
        if client is None:
            raise ToolError(f"the {server} MCP server is not running ({self.ended.get(server, 'it never started')})")
        import anyio

        try:
            with anyio.fail_after(timeout_s):
                meta = {IDEMPOTENCY_META_KEY: idempotency_key} if idempotency_key else None
                result = await client.call_tool(tool, arguments, meta=meta)
        except TimeoutError:
            raise ToolError(f"{tool} on the {server} MCP server did not answer within {timeout_s:.1f} s (the tool "
                            "timeout: min(AGENT_TOOL_TIMEOUT_CAP, time left)) and was cancelled") from None
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - the transport's and the protocol's errors, in words
            ended = self.ended.get(server)
            reason = f"the server stopped ({ended})" if ended else _reason(exc)
            raise ToolError(f"{tool} on the {server} MCP server failed: {reason}") from None
        return checked_text(server, tool, result)

    def close(self) -> None:
        """Stop every session (and the stdio servers' processes), waiting at most CLOSE_TIMEOUT_S, then
        the loop and its thread; a forked child, which has neither, leaves them to its parent."""
        if os.getpid() != self.pid or self.loop.is_closed():
            return
        ended = asyncio.run_coroutine_threadsafe(self._end_sessions(), self.loop)
        try:
            ended.result(CLOSE_WAIT_S)
        except TimeoutError:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(THREAD_JOIN_S)
        if not self.thread.is_alive():
            self.loop.close()

    async def _end_sessions(self) -> None:
        """Ask the running sessions to close, cancel those still starting, and wait for them all."""
        self.closing.set()
        for task, listed in self.sessions:
            if not listed.done():
                task.cancel()
        tasks = [task for task, _ in self.sessions]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)


# The hub's call(server, tool, arguments, timeout_s, stop, idempotency_key): what an offered tool's function runs.
HubCall = Callable[[str, str, dict, float, threading.Event | None, str], str]


def offered_tools(server: str, listing: list, call: HubCall, *,
                  approve: bool | None = None) -> tuple[list[Tool], list[str]]:
    """The tools a server may offer the model, within the caps, and what was left out and why."""
    problems = []
    if len(listing) > MAX_TOOLS_PER_SERVER:
        problems.append(f"lists {len(listing)} tools; only the first {MAX_TOOLS_PER_SERVER} are offered")
    tools = []
    for listed_tool in listing[:MAX_TOOLS_PER_SERVER]:
        size = len(json.dumps(listed_tool.input_schema, default=str).encode())
        if size > MAX_SCHEMA_BYTES:
            problems.append(f"tool {listed_tool.name[:80]!r} left out: its input schema is {size:,} bytes, "
                            f"more than {MAX_SCHEMA_BYTES:,}")
        else:
            tools.append(offered_tool(server, listed_tool, call, approve=approve))
    return tools, problems


def offered_tool(server: str, listed, call: HubCall, *, approve: bool | None = None) -> Tool:
    """A listed tool as the registry holds it: its public name, a bounded description, its schema; whether
    it asks first is the server's "approve" when its entry has one, else its own annotations."""
    def run(arguments: dict, *, timeout_s: float, stop: threading.Event | None = None,
            idempotency_key: str = "") -> str:
        return call(server, listed.name, arguments, timeout_s, stop, idempotency_key)

    name = public_name(server, listed.name)
    run.__qualname__ = name  # registry.add tells tools apart by their origin
    description = (listed.description or "").strip()[:MAX_DESCRIPTION_CHARS]
    description = description or f"The {listed.name} tool of the {server} MCP server."
    hints = getattr(listed, "annotations", None)  # readOnlyHint, idempotentHint: read_only_hint, ... in the SDK
    repeatable = hints is not None and (getattr(hints, "read_only_hint", None) is True
                                        or getattr(hints, "idempotent_hint", None) is True)
    asks = says_destructive(hints) if approve is None else approve
    return Tool(name=name, description=description, parameters=offered_schema(listed.input_schema), func=run,
                arguments=None, takes_timeout=True, takes_stop=True, takes_idempotency_key=True, source=server,
                repeatable=repeatable,
                needs_approval=asks)


def says_destructive(hints) -> bool:
    """A tool annotated destructiveHint: true and not readOnlyHint: true (the SDK's destructive_hint and
    read_only_hint). Only a hint said outright counts: a tool without annotations does not ask first,
    or every tool of a server that annotates nothing would ask."""
    return (hints is not None and getattr(hints, "destructive_hint", None) is True
            and getattr(hints, "read_only_hint", None) is not True)


def checked_text(server: str, tool: str, result) -> str:
    """A call's result as the model's text; a ToolError for an error result, or one too deep or too big."""
    try:
        text = result_text(result)
    except bounded_json.TooDeep as exc:
        raise ToolError(f"{tool} on the {server} MCP server returned a result {exc}") from None
    if result.is_error:
        raise ToolError(f"{tool} on the {server} MCP server reported an error: {text}")
    if len(text) > MAX_OUTPUT_CHARS:
        raise ToolError(too_big(f"{tool} on the {server} MCP server", text))
    return text


def too_big(what: str, text: str) -> str:
    """A ToolError's text for a result past MAX_OUTPUT_CHARS: how big it was, and as much of its start as fits."""
    reason = (f"{what} returned {len(text):,} characters, more than the {MAX_OUTPUT_CHARS:,} a tool result may "
              "send to the model; it begins: ")
    return reason + text[: MAX_OUTPUT_CHARS - len(ERROR_PREFIX) - len(reason)]


def result_text(result) -> str:
    """A tool result's content as text for the model (untrusted: the page renders it inert)."""
    parts = []
    for item in result.content or []:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'other')} content left out]")
    if not parts and result.structured_content is not None:
        # Checked first: json.dumps recurses; a value nested too deeply is TooDeep, said in words by the caller.
        parts.append(json.dumps(bounded_json.check(result.structured_content), ensure_ascii=False, default=str))
    return "\n".join(parts)


def _target(server: ServerConfig):
    """A streamable HTTP server's URL, or a stdio server's transport (bounded reads, its own process group)."""
    if server.url:
        return server.url
    # Through with_parent: the server and what it starts end with the session thread that started
    # it, even if this process is killed before it can stop its servers.
    launcher = ["-I", str(WITH_PARENT), resolve_command(server.command)]
    from agent.tools.mcp_stdio import bounded_stdio

    return bounded_stdio(server.name, sys.executable, [*launcher, *server.args], server.env)


def _unique(listing: list) -> list:
    """The listed tools, once each by name (a server that lists a name twice keeps the first)."""
    seen: set[str] = set()
    return [t for t in listing if not (t.name in seen or seen.add(t.name))]


def _reason(exc: BaseException) -> str:
    """An exception in one line; a task group's wrapper is unwrapped to what actually failed."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
