"""A stdio transport for MCP servers that reads the server's stdout in bounded pieces.

The SDK's own stdio reader rebuilds a long line with `buffer + chunk`: a 100 MB answer costs
minutes of CPU (the square of its length) and blocks every later call on that server. This one
keeps at most MAX_LINE_BYTES of a line. A longer line is read to its end and thrown away as it
comes; the request it answers (its id, read from the line's start, or the only one pending) gets
a "too big" error at once, and the server goes on serving. A line that is not JSON-RPC is dropped
and logged at most once per LOG_EVERY_S per server, with the count of those left out, never with
a traceback.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncGenerator, Iterable
from contextlib import asynccontextmanager, suppress

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client._transport import TransportStreams
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from agent import bounded_json

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 8 * 1024 * 1024  # one message from a server; a longer line is dropped (a result is cut at 4,000 chars)
READ_CHUNK_BYTES = 64 * 1024  # bytes asked of the pipe per read
ID_PREFIX_BYTES = 4096  # the start of a dropped line kept to find which request it answers
LOG_EVERY_S = 10.0  # seconds between two log lines about a server's bad output
TOO_BIG_CODE = -32000  # JSON-RPC's implementation-defined range
STOP_GRACE_S = 2.0  # seconds a server gets to exit once its stdin is closed
KILL_GRACE_S = 2.0  # seconds between SIGTERM and SIGKILL of the server's process group
EXIT_POLL_S = 0.01  # seconds between checks that the server exited


class LineTooBig(Exception):
    """A server's line passed MAX_LINE_BYTES."""


class RateLimitedLog:
    """At most one log line per `every_s` for one kind of problem, saying how many were left out."""

    def __init__(self, logger: logging.Logger, every_s: float | None = None, clock=time.monotonic):
        self.logger, self.clock = logger, clock
        self.every_s = LOG_EVERY_S if every_s is None else every_s
        self.last_at: float | None = None
        self.suppressed = 0
        self.last: tuple[str, tuple] | None = None  # the last problem seen, to sum up what was left out

    def warning(self, message: str, *args) -> None:
        now = self.clock()
        self.last = (message, args)
        if self.last_at is not None and now - self.last_at < self.every_s:
            self.suppressed += 1
            return
        self.logger.warning(message + self._left_out(now), *args)
        self.last_at, self.suppressed = now, 0

    def flush(self) -> None:
        """Say how many were left out since the last line (called when the server's session ends)."""
        if self.suppressed and self.last is not None:
            message, args = self.last
            self.logger.warning("at the session's end: " + message + self._left_out(self.clock()), *args)
            self.suppressed = 0

    def _left_out(self, now: float) -> str:
        if not self.suppressed:
            return ""
        return f" ({self.suppressed:,} more like it in the last {now - self.last_at:.1f} s not logged)"


def leading_fields(prefix: bytes) -> dict:
    """The top-level fields of a JSON object whose start is `prefix`, up to the first one cut off."""
    text = bounded_json.shallow_prefix(prefix.decode("utf-8", errors="ignore"))  # raw_decode recurses
    decoder = json.JSONDecoder()
    fields: dict = {}
    index = _skip_space(text, 0)
    if not text.startswith("{", index):
        return fields
    index += 1
    try:
        while True:
            key, index = decoder.raw_decode(text, _skip_space(text, index))
            index = _skip_space(text, index)
            if not isinstance(key, str) or not text.startswith(":", index):
                return fields
            fields[key], index = decoder.raw_decode(text, _skip_space(text, index + 1))
            index = _skip_space(text, index)
            if not text.startswith(",", index):
                return fields
            index += 1
    except ValueError:  # the line is cut here (or is not JSON)
        return fields


def answered_id(prefix: bytes, pending: Iterable[types.RequestId]) -> types.RequestId | None:
    """Which pending request a dropped line answers: its top-level "id" when that comes before the cut,
    else the only request pending; none for a line that is a request or notification of the server's."""
    fields, pending = leading_fields(prefix), list(pending)
    if "method" in fields:
        return None
    request_id = fields.get("id")
    if isinstance(request_id, (int, str)) and not isinstance(request_id, bool) and request_id in pending:
        return request_id
    return pending[0] if len(pending) == 1 and "id" not in fields else None


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


class LineReader:
    """Splits a byte stream into lines of at most MAX_LINE_BYTES, in time linear in its length."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES):
        self.max_line_bytes = max_line_bytes
        self.line = bytearray()
        self.dropped_bytes = 0  # > 0 while the rest of a too-long line is being thrown away
        self.dropped_prefix = b""

    def feed(self, chunk: bytes) -> list[bytes | LineTooBig]:
        """The lines `chunk` completes: bytes, or a LineTooBig holding a dropped line's start and size."""
        done: list[bytes | LineTooBig] = []
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start: len(chunk) if end < 0 else end]
            self._add(piece)
            if end < 0:
                break
            if self.dropped_bytes:
                done.append(LineTooBig(self.dropped_prefix, self.dropped_bytes))
                self.dropped_bytes, self.dropped_prefix = 0, b""
            else:
                done.append(bytes(self.line))
            self.line.clear()
            start = end + 1
        return done

    def _add(self, piece: bytes) -> None:
        if self.dropped_bytes:
            self.dropped_bytes += len(piece)
        elif len(self.line) + len(piece) > self.max_line_bytes:
            self.dropped_prefix = bytes(self.line[:ID_PREFIX_BYTES]) + piece[: max(0, ID_PREFIX_BYTES - len(self.line))]
            self.dropped_bytes = len(self.line) + len(piece)
            self.line.clear()
        else:
            self.line += piece


def too_big_text(size_bytes: int) -> str:
    return (f"the server's answer is too big: {size_bytes:,} bytes, more than the {MAX_LINE_BYTES:,} bytes "
            "one message may have; it was read and dropped")


@asynccontextmanager
async def bounded_stdio(name: str, command: str, args: list[str],
                        env: dict[str, str] | None = None) -> AsyncGenerator[TransportStreams, None]:
    """Start a stdio server in its own process group and talk to it; on exit, stop the whole group."""
    process = await anyio.open_process([command, *args], env=get_default_environment() | (env or {}),
                                       stderr=sys.stderr, start_new_session=True)
    pipes = ServerPipes(name, process)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(pipes.read_stdout)
        tasks.start_soon(pipes.write_stdin)
        try:
            yield pipes.read_stream, pipes.write_stream
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled caller must not leave the server running
                await pipes.close()
            tasks.cancel_scope.cancel()


class ServerPipes:
    """A stdio server's stdout and stdin, relayed to and from the SDK's session: the session's
    requests are tracked until answered, so that a line too big to deliver still answers its own."""

    def __init__(self, name: str, process: Process) -> None:
        self.name, self.process = name, process
        self.to_session, self.read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        self.write_stream, self.from_session = anyio.create_memory_object_stream[SessionMessage](0)
        self.pending: dict[types.RequestId, None] = {}  # ids of requests sent and not answered, oldest first
        self.bad_output = RateLimitedLog(log)
        self.oversized = RateLimitedLog(log)

    async def refuse(self, prefix: bytes, why: str) -> None:
        """Answer the request a refused line answers with an error that says `why` (else log it)."""
        request_id = answered_id(prefix, self.pending)
        if request_id is None:
            self.oversized.warning("MCP server %s: dropped a line that answers no known request: %s", self.name, why)
            return
        self.pending.pop(request_id, None)
        error = types.ErrorData(code=TOO_BIG_CODE, message=why)
        await self.to_session.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))

    async def deliver(self, item: bytes | LineTooBig) -> None:
        if isinstance(item, LineTooBig):
            await self.refuse(item.args[0], too_big_text(item.args[1]))
            return
        if not item.strip():
            return
        if bounded_json.exceeds(item):  # before the SDK's parser, which would drop it and leave the call waiting
            await self.refuse(item[:ID_PREFIX_BYTES], f"the server's answer is {bounded_json.TooDeep()}")
            return
        try:
            message = types.jsonrpc_message_adapter.validate_json(item, by_name=False)
        except ValueError as exc:
            self.bad_output.warning("MCP server %s: dropped a line of stdout that is not a JSON-RPC message (%s)",
                                    self.name, type(exc).__name__)
            return
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            self.pending.pop(message.id, None)
        await self.to_session.send(SessionMessage(message))

    async def read_stdout(self) -> None:
        lines = LineReader()
        delivering = True  # until the session is gone; then stdout is only drained, so the server never blocks
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with self.to_session:
                while True:
                    chunk = await self.process.stdout.receive(READ_CHUNK_BYTES)
                    for item in lines.feed(chunk) if delivering else ():
                        try:
                            await self.deliver(item)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            delivering = False
                            break

    async def write_stdin(self) -> None:
        try:
            async with self.from_session:
                async for session_message in self.from_session:
                    message = session_message.message
                    if isinstance(message, types.JSONRPCRequest):
                        self.pending[message.id] = None
                    elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                        self.pending.pop((message.params or {}).get("requestId"), None)
                    data = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await self.process.stdin.send(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await self.to_session.aclose()  # the session sees the connection end instead of waiting for ever

    async def close(self) -> None:
        """End the session's streams and the server's whole process group; say what the logs left out."""
        self.read_stream.close()
        self.write_stream.close()
        await stop_group(self.process)
        for stream in (self.to_session, self.from_session):
            await stream.aclose()
        self.bad_output.flush()
        self.oversized.flush()


async def stop_group(process: Process) -> None:
    """Close the server's stdin, give it STOP_GRACE_S to exit, then end its whole process group
    (SIGTERM, SIGKILL): what its tools started goes with it, even once the server has exited."""
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    deadline = time.monotonic() + STOP_GRACE_S
    while process.returncode is None and time.monotonic() < deadline:
        await anyio.sleep(EXIT_POLL_S)
    if process.returncode is None:
        await terminate_posix_process_tree(process, KILL_GRACE_S)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the group outlives its leader: children it left behind
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    if transport is not None:  # else the asyncio transport warns at GC while a pipe end is held elsewhere
        with suppress(PermissionError):
            transport.close()
