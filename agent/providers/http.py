"""One bounded HTTP POST (a JSON reply, or a server-sent event stream), and the mapping of HTTP
statuses to ProviderError.

The only module that touches httpx. `timeout.total_s` bounds the whole call (connect,
send, headers and the full body): httpx's read timeout is per socket read (httpx#1450),
so a server trickling one byte a second would otherwise hold a call for ever. The call
runs as an AsyncClient request under `asyncio.timeout`, whose cancellation closes the
socket, driven from sync code by one private event loop per process (and thread). Every body is
read raw and decoded here by `_decoded_chunks` (agent.providers.decoding), never by httpx: its own
decoding inflates a whole network chunk at once, however large that makes it.

No signals (RQ owns SIGALRM) and no threads (a thread would keep streaming after we gave up).
Decoding a reply's JSON is part of the call: it runs in steps (agent.providers.sliced_json), with
the call's clock (agent.providers.call_clock) checked between them, so a timeout or Stop cuts it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import json
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
from rq.timeouts import JobTimeoutException

from agent import bounded_json, job_alarm
from agent.deadline import CallTimeout
from agent.providers import call_clock, decoding, sliced_json
from agent.providers.base import ProviderError, ProviderErrorKind
from agent.providers.retry import RETRY_POLICY
from agent.providers.sse import Event, EventStreamParser
from agent.text.redaction import redact
from agent.text.surrogates import scrub, scrub_json

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 8 * 1024 * 1024  # bytes; a larger reply is refused as malformed
ERROR_TEXT_LIMIT = 300  # characters of a provider's error message kept in ours
CLEANUP_TIMEOUT_S = 1.0  # seconds allowed for closing a discarded client
CLEANUP_BOUND_S = 3.0  # seconds a discarded session's whole close may take, whatever happens inside its loop
STOP_POLL_S = 0.05  # seconds between checks of a call's stop event


@dataclass(frozen=True)
class HTTPReply:
    status: int
    headers: dict[str, str]  # names lowercased
    body: bytes
    streamed: bool = False  # the body was an event stream, handed to the listener as it came; `body` is empty


# The events one network read completed -> True once the stream's end marker is among them.
EventsListener = Callable[[list[Event]], bool]


class _Session:
    """An event loop and the AsyncClients bound to it, reused across calls for keep-alive: one for
    plain http:// (the demo provider, a local server) and one for https://, made on its first call,
    since its verified TLS context (the CA bundle loaded) costs about 3 MiB a process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.plain = _client(verify=False)  # no TLS is ever negotiated on it: it is used for http:// only
        self.tls: httpx.AsyncClient | None = None

    def client_for(self, url: str) -> httpx.AsyncClient:
        if not url.lower().startswith("https://"):
            return self.plain
        if self.tls is None:
            self.tls = _client(verify=True)
        return self.tls

    def close(self) -> None:
        """Best effort: cancel what the interrupted call left running, close the client and the loop.

        Each step is bounded by CLEANUP_TIMEOUT_S on the loop's own timers; a job timeout that fired
        inside one of those timers (asyncio logs it and drops the callback) would leave a step waiting
        for ever, so a watchdog thread also stops the loop after CLEANUP_BOUND_S, whatever it runs."""
        loop = self.loop
        if loop.is_closed():
            return
        watchdog = threading.Timer(CLEANUP_BOUND_S, _stop_loop, args=(loop,))
        watchdog.daemon = True
        watchdog.start()
        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(_bounded(asyncio.gather(*pending, return_exceptions=True)))
            for client in (self.plain, self.tls):
                if client is not None:
                    loop.run_until_complete(_bounded(client.aclose()))
            loop.run_until_complete(_bounded(loop.shutdown_asyncgens()))  # an aclose that hangs must not hang us
        except BaseException:  # noqa: B036 - cleanup after an interruption must never mask it
            log.debug("closing a discarded HTTP session failed", exc_info=True)
        finally:
            watchdog.cancel()
            try:
                loop.close()
            except BaseException:  # noqa: B036
                log.debug("closing a discarded event loop failed", exc_info=True)


def _stop_loop(loop: asyncio.AbstractEventLoop) -> None:
    """From the watchdog's thread: whatever the loop waits for, its run_until_complete returns now."""
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # closed meanwhile: the close finished in time
        pass


def _client(*, verify: bool) -> httpx.AsyncClient:
    # Only the encodings agent.providers.decoding undoes (httpx would also ask for br and zstd when
    # their packages happen to be installed).
    return httpx.AsyncClient(follow_redirects=False, verify=verify,
                             headers={"accept-encoding": decoding.ACCEPT_ENCODING})


async def _bounded(awaitable) -> None:
    try:
        async with asyncio.timeout(CLEANUP_TIMEOUT_S):
            await awaitable
    except Exception:  # includes the TimeoutError of a close that hung
        pass


# Per thread, because one loop cannot run twice at once; an RQ work horse has one thread,
# so in practice this is one loop and one client per process.
_local = threading.local()


def _session() -> _Session:
    session = getattr(_local, "session", None)
    if session is not None and session.pid != os.getpid():
        # Inherited across fork: its sockets and selector are shared with the parent,
        # so abandon it untouched rather than close what the parent still uses.
        session = None
    if session is None or session.loop.is_closed():
        session = _Session()
        _local.session = session
    return session


def discard_session() -> None:
    """Close this thread's loop and client; the next call starts clean."""
    session = getattr(_local, "session", None)
    _local.session = None
    if session is not None and session.pid == os.getpid():
        session.close()


def post_json(
    url: str,
    *,
    headers: dict,
    body: dict,
    timeout: CallTimeout,
    stop: threading.Event | None = None,
    secret: str | None = None,
) -> HTTPReply:
    """POST `body` as JSON; the whole call is bounded by `timeout.total_s`, and ends as soon as
    `stop` is set (a STOPPED ProviderError). Raises ProviderError, with `secret` (the key sent)
    redacted from its message (by `_quote`): a transport error can quote what the server sent."""
    return _run(_exchange(_session().client_for(url), url, headers, body, timeout, secret, None), timeout,
                stop)


def post_stream(
    url: str,
    *,
    headers: dict,
    body: dict,
    timeout: CallTimeout,
    on_events: EventsListener,
    stop: threading.Event | None = None,
    secret: str | None = None,
) -> HTTPReply:
    """POST `body` as JSON and read a server-sent event stream as it arrives, under the same bounds
    as post_json (the whole stream within `timeout.total_s`; `stop` ends it at once).

    A 2xx `text/event-stream` reply is handed to `on_events`, once per network read with the events
    that read completed, in this thread; when it returns True (the stream's end marker) reading stops.
    The reply then has `streamed` set and no body; whether the stream reached its end marker is the
    listener's to know. Any other reply (an error status, a plain JSON answer from a server that does
    not stream) is read whole, bounded, and returned as post_json would."""
    return _run(_exchange(_session().client_for(url), url, headers, body, timeout, secret, on_events), timeout,
                stop)


def _run(call: Coroutine[Any, Any, HTTPReply], timeout: CallTimeout, stop: threading.Event | None) -> HTTPReply:
    """Run one call on this thread's loop, raced against `stop` and the job timeout; its clock is
    current meanwhile, so decoding a streamed reply's events (in the listener) is bounded too."""
    session = _session()
    try:
        with call_clock.bounding(timeout, stop):
            reply = session.loop.run_until_complete(_unless_stopped(call, stop))
    except ProviderError:
        # A job timeout that fired inside a socket callback reaches here as a failed connection.
        job_alarm.raise_if_fired()
        raise
    except BaseException as exc:  # noqa: B036
        # Anything else interrupted the call from outside (RQ's JobTimeoutException from its
        # SIGALRM handler, KeyboardInterrupt): the loop may hold a half-done request, so drop it.
        discard_session()
        if isinstance(exc, Exception) and not isinstance(exc, JobTimeoutException):
            job_alarm.raise_if_fired()  # fired during a connect, anyio hands it on inside an ExceptionGroup
        raise
    job_alarm.raise_if_fired()
    return reply


async def _unless_stopped(call: Coroutine[Any, Any, HTTPReply], stop: threading.Event | None) -> HTTPReply:
    """The call, raced against `stop` (set from another thread) and against the job timeout (which
    asyncio may have caught on the way, see job_alarm): cancelling it closes its socket."""
    stop = stop if stop is not None else threading.Event()
    if stop.is_set():
        call.close()  # never started
        raise _stopped()
    post = asyncio.ensure_future(call)
    while not post.done():
        if job_alarm.fired():
            post.cancel()
            await asyncio.wait({post}, timeout=CLEANUP_TIMEOUT_S)
            job_alarm.raise_if_fired()
        if stop.is_set():
            post.cancel()
            try:
                await post
            except (asyncio.CancelledError, ProviderError):
                pass  # the call is over either way: it was stopped
            raise _stopped()
        await asyncio.wait({post}, timeout=STOP_POLL_S)
    return post.result()


async def _exchange(
    client: httpx.AsyncClient, url: str, headers: dict, body: dict, timeout: CallTimeout, secret: str | None,
    on_events: EventsListener | None,
) -> HTTPReply:
    try:
        async with asyncio.timeout(timeout.total_s):
            async with client.stream(
                "POST",
                url,
                headers=headers,
                json=body,
                timeout=httpx.Timeout(timeout.total_s, connect=timeout.connect_s),
            ) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
                    raise _too_large()
                reply_headers = {name.lower(): value for name, value in response.headers.items()}
                if on_events is not None and 200 <= response.status_code < 300 and _is_event_stream(reply_headers):
                    await _read_events(response, on_events)
                    return HTTPReply(status=response.status_code, headers=reply_headers, body=b"", streamed=True)
                async with contextlib.aclosing(_decoded_chunks(response, MAX_RESPONSE_BYTES)) as chunks:
                    body_bytes = b"".join([chunk async for chunk in chunks])
                return HTTPReply(status=response.status_code, headers=reply_headers, body=body_bytes)
    except TimeoutError as exc:
        raise _timed_out(timeout) from exc
    except httpx.ConnectTimeout as exc:
        raise ProviderError(ProviderErrorKind.TIMEOUT, f"could not connect to the provider at "
                            f"{_shown_url(url, secret)} within {timeout.connect_s:.1f} s") from exc
    except httpx.TimeoutException as exc:
        raise _timed_out(timeout) from exc
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise ProviderError(
            ProviderErrorKind.CONNECTION, f"the provider URL is not usable: {_quote(exc, secret)}"
        ) from exc
    except httpx.ConnectError as exc:
        raise ProviderError(ProviderErrorKind.CONNECTION, f"could not connect to the provider at "
                            f"{_shown_url(url, secret)}: {_quote(exc, secret)}") from exc
    except httpx.HTTPError as exc:
        # Reset, closed mid-body, protocol errors: the connection failed after it was made.
        reason = _quote(exc, secret) or type(exc).__name__
        raise ProviderError(ProviderErrorKind.CONNECTION, f"the connection to the provider failed: {reason}") from exc


async def _read_events(response: httpx.Response, on_events: EventsListener) -> None:
    """Parse the event stream read by read; stop at the end of the body or when `on_events` says it ended."""
    parser = EventStreamParser()
    async with contextlib.aclosing(_decoded_chunks(response, MAX_RESPONSE_BYTES)) as chunks:
        async for chunk in chunks:
            events = parser.feed(chunk)
            if events and on_events(events):
                return  # its end marker: whatever follows (a server holding the connection) is not waited for
    events = parser.close()
    if events:  # what was not the format (a server's error body): the listener decides
        on_events(events)


async def _decoded_chunks(response: httpx.Response, limit_bytes: int) -> AsyncIterator[bytes]:
    """The body of `response` as it arrives, its Content-Encoding undone by a BoundedDecoder: every
    reader of a body goes through here. Yields to the event loop after every decoding step, so the
    call's clocks (asyncio.timeout, the stop and job-alarm polls) run while a bomb is being read.
    Raises a MALFORMED ProviderError for an unsupported, undecodable or too large body."""
    try:
        decoder = decoding.BoundedDecoder(", ".join(response.headers.get_list("content-encoding")), limit_bytes)
        # Raw: httpx would inflate a whole chunk at once. Closed here, not left to the garbage collector.
        async with contextlib.aclosing(response.aiter_raw()) as raw_chunks:
            async for raw in raw_chunks:
                for piece in decoder.feed(raw):
                    if piece:
                        yield piece
                    await asyncio.sleep(0)
        for piece in decoder.flush():
            if piece:
                yield piece
            await asyncio.sleep(0)
    except decoding.BodyTooLarge as exc:
        raise _too_large() from exc
    except decoding.DecodingError as exc:
        raise ProviderError(ProviderErrorKind.MALFORMED, f"the provider sent a malformed response: {exc}") from exc


def _is_event_stream(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "").split(";", 1)[0].strip().lower() == "text/event-stream"


def _timed_out(timeout: CallTimeout) -> ProviderError:
    return call_clock.timed_out(timeout.total_s)


def _stopped() -> ProviderError:
    return call_clock.stopped()


def _too_large() -> ProviderError:
    limit_mib = MAX_RESPONSE_BYTES // 2**20
    return ProviderError(
        ProviderErrorKind.MALFORMED, f"the provider sent a malformed response: larger than {limit_mib} MiB"
    )


def _quote(exc: Exception, secret: str | None) -> str:
    """A transport error's text (it can quote what the server sent), redacted before it is cut: a
    cut first could leave most of a key that straddles the cut."""
    return _short(redact(str(exc), secret))


def _shown_url(url: str, secret: str | None) -> str:
    """The URL a call went to, for a message: without user info, query or fragment (where credentials
    ride), the key redacted wherever else it is, cut to a readable length."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    rest = rest.split("#", 1)[0].split("?", 1)[0]
    authority, slash, path = rest.partition("/")
    return _short(redact(f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}", secret))


def _short(text: str, limit: int = ERROR_TEXT_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- statuses ---------------------------------------------------------------------------


def check_status(reply: HTTPReply, *, secret: str | None = None) -> None:
    """Raise the ProviderError an unsuccessful status means; return for 2xx.

    `secret` is the API key that was sent (None: none was); it is scrubbed from any provider text we quote.
    """
    status = reply.status
    if 200 <= status < 300:
        return
    retry_after_s = parse_retry_after(reply.headers)
    if status in (401, 403):
        if not secret:
            raise ProviderError(
                ProviderErrorKind.AUTH, f"the provider requires an API key (HTTP {status})", status=status
            )
        raise ProviderError(ProviderErrorKind.AUTH, f"the API key was rejected (HTTP {status})", status=status)
    detail = error_text(reply.body, secret=secret)
    suffix = f": {detail}" if detail else ""
    if status == 404:
        raise ProviderError(
            ProviderErrorKind.NOT_FOUND, f"model or endpoint not found (HTTP 404){suffix}", status=status
        )
    if status == 429:
        raise ProviderError(
            ProviderErrorKind.RATE_LIMITED,
            f"the provider is rate limiting requests (HTTP 429){suffix}",
            status=status,
            retry_after_s=retry_after_s,
        )
    if status == 529:
        message = f"the provider is overloaded (HTTP 529){suffix}"
        raise ProviderError(ProviderErrorKind.SERVER, message, status=status, retry_after_s=retry_after_s)
    if RETRY_POLICY.retries_status(status):  # 408, 409, 5xx: the server failing this once
        message = f"the provider failed (HTTP {status}){suffix}"
        raise ProviderError(ProviderErrorKind.SERVER, message, status=status, retry_after_s=retry_after_s)
    if 400 <= status < 500:
        raise ProviderError(
            ProviderErrorKind.BAD_REQUEST, f"the provider refused the request (HTTP {status}){suffix}", status=status
        )
    raise ProviderError(
        ProviderErrorKind.MALFORMED, f"the provider sent a malformed response: unexpected HTTP {status}", status=status
    )


def error_text(body: bytes, *, secret: str | None = None) -> str:
    """The provider's own error message, if its body carries one, cut to a readable length."""
    text = ""
    try:
        if bounded_json.exceeds(body):
            raise bounded_json.TooDeep()
        data: Any = call_clock.run(sliced_json.parse_steps(body))  # in steps: an error body can be 8 MiB
    except (ValueError, RecursionError):  # not JSON, or nested too deeply (TooDeep)
        data = None
    if isinstance(data, dict):
        # OpenAI and Anthropic: {"error": {"message": ...}}; Ollama: {"error": "..."};
        # FastAPI-style servers: {"detail": ...}; others: {"message": ...}.
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
        elif isinstance(data.get("message"), str):
            text = data["message"]
        elif isinstance(data.get("detail"), str):
            text = data["detail"]
        elif data.get("detail") is not None:
            text = json.dumps(data["detail"])  # cut by _short, after the redaction
    return _short(scrub(redact(text, secret)))


def redact_json(value: Any, secret: str | None) -> Any:
    """Every string in a parsed JSON value (object keys included) redacted, one call per string:
    what decode_json does to a reply, in bulk and in steps (agent.providers.sliced_json)."""
    if not secret:
        return value
    if isinstance(value, str):
        return redact(value, secret)
    if isinstance(value, bounded_json.Cut):
        return bounded_json.Cut(redact(bounded_json.spelled_out(value.raw), secret))  # undecoded text
    if isinstance(value, list):
        return [redact_json(item, secret) for item in value]
    if isinstance(value, dict):
        return {redact(key, secret): redact_json(item, secret) for key, item in value.items()}
    return value


def redact_arguments(arguments: str, secret: str | None) -> str:
    """A tool call's arguments (JSON text, as OpenAI sends them) with the key redacted as whoever parses
    them reads it: `\\u0073k-…` is the key to the page and to the tool, so the escapes are spelled out
    first (the text stays JSON)."""
    return redact(bounded_json.spelled_out(arguments), secret) if secret else arguments


def parse_retry_after(headers: dict[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` (seconds or an HTTP-date); None if absent."""
    raw_ms = headers.get("retry-after-ms", "").strip()
    if raw_ms:
        value = _finite(raw_ms)
        if value is not None:
            return value / 1000.0
    raw = headers.get("retry-after", "").strip()
    if not raw:
        return None
    value = _finite(raw)
    if value is not None:
        return value
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # "-0000" means UTC with no claim about local time
        when = when.replace(tzinfo=datetime.UTC)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def decode_json(body: bytes | str, *, secret: str | None = None, cut: bool = False) -> Any:
    """The parsed body, lone surrogates replaced (see agent.text.surrogates) and the key `secret` redacted
    wherever it appears, or a MALFORMED ProviderError. Decoded in steps, bounded by the clock of the
    call it is part of (agent.providers.call_clock): a TIMEOUT or STOPPED ProviderError when it runs out.
    Nested past bounded_json.MAX_DEPTH (a linear scan first), it is refused, or with `cut` read with
    each too-deep part as a bounded_json.Cut (in one step: only a hostile reply takes that path)."""
    try:
        if bounded_json.exceeds(body):
            if not cut:
                raise bounded_json.TooDeep()
            return redact_json(scrub_json(bounded_json.loads(body, cut=True)), secret)
        return call_clock.run(sliced_json.decode_steps(body, secret))
    except bounded_json.TooDeep as exc:
        raise malformed(f"the body is {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise malformed("the body is not JSON") from exc


def malformed(what: str) -> ProviderError:
    return ProviderError(ProviderErrorKind.MALFORMED, f"the provider sent a malformed response: {what}")
