"""What both streamed formats share: handing text on as it arrives, usage counts, and the fallback
to a plain call for a server that refuses to stream.

A streamed call asks for an event stream; a server that answers plain JSON instead is read as a
plain reply; one that refuses the request because of streaming (an error status whose text mentions
"stream") gets the same request without streaming, from what is left of the same call timeout
(when the retry policy, agent.providers.retry, says enough is left).
A plain reply that carries an error instead of an answer is that error (agent.providers.server_errors).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from agent.conversation import well_formed
from agent.deadline import CallTimeout
from agent.providers import call_clock, server_errors
from agent.providers.base import Completion, ProviderError, ProviderErrorKind, RemoteModel, TextListener, Usage
from agent.providers.http import HTTPReply, decode_json, error_text, post_json, post_stream
from agent.providers.retry import RETRY_POLICY
from agent.providers.sse import Event
from agent.text.streamed_redaction import StreamRedactor


class Assembler(Protocol):
    """Builds one Completion from a format's events."""

    def take(self, events: list[Event]) -> bool:
        """Take the events of one network read; True once the stream's end marker was seen."""

    def result(self) -> Completion:
        """The completion; a CONNECTION ProviderError if the stream never reached its end marker."""


class StreamedModel(RemoteModel):
    """A client over HTTP that asks for a stream (unless told not to), and asks plainly from the first
    refusal on."""

    _plain_only = False  # set once a server refuses to stream: later calls of this client ask it plainly
    # A plain reply nested too deeply is read with its deep parts cut (bounded_json.Cut) rather than
    # refused: set by a format whose tool inputs are JSON inside the reply, so the tool layer refuses them.
    cuts_deep_replies = False

    def _call(self, path: str, *, headers: dict, body: dict, stream_fields: dict, timeout: CallTimeout,
              stop: threading.Event | None, on_text: TextListener | None, stream: bool,
              assembler: Callable[[TextListener | None, str | None], Assembler],
              parse: Callable[[Any], Completion]) -> Completion:
        """One call: `assembler(on_text, secret)` reads the stream, `parse` a plain reply's decoded JSON.
        Its clock spans the decoding after the exchange as well (agent.providers.call_clock)."""
        with call_clock.bounding(timeout, stop):
            completion, refused = complete(
                f"{self.base_url}{path}", headers=headers, body=body, stream_fields=stream_fields,
                timeout=timeout, stop=stop, secret=self._api_key,
                assembler=assembler(on_text, self._api_key) if stream and not self._plain_only else None,
                parse=parse, on_text=on_text, cut=self.cuts_deep_replies,
            )
        if refused:
            self._plain_only = True
        return completion


def complete(
    url: str,
    *,
    headers: dict,
    body: dict,
    stream_fields: dict,
    timeout: CallTimeout,
    stop: threading.Event | None,
    secret: str | None,
    assembler: Assembler | None,
    parse: Callable[[Any], Completion],
    on_text: TextListener | None,
    cut: bool = False,
) -> tuple[Completion, bool]:
    """One call, streamed when `assembler` is given. Returns the completion and whether the server
    refused to stream (the caller then need not ask again)."""
    if assembler is not None:
        started = time.monotonic()
        reply = post_stream(url, headers=headers, body={**body, **stream_fields}, timeout=timeout,
                            on_events=assembler.take, stop=stop, secret=secret)
        if reply.streamed:
            return assembler.result(), False
        if not refuses_streaming(reply, secret):
            return _plain(reply, parse, on_text, secret, cut), False
        left_s = timeout.total_s - (time.monotonic() - started)
        if not RETRY_POLICY.unstreamed_fits(left_s):
            server_errors.check(reply, secret=secret)  # the refusal, since no time is left to ask again
        timeout = CallTimeout(total_s=left_s, connect_s=min(timeout.connect_s, left_s))
        reply = post_json(url, headers=headers, body=body, timeout=timeout, stop=stop, secret=secret)
        return _plain(reply, parse, on_text, secret, cut), True
    reply = post_json(url, headers=headers, body=body, timeout=timeout, stop=stop, secret=secret)
    return _plain(reply, parse, on_text, secret, cut), False


def refuses_streaming(reply: HTTPReply, secret: str | None) -> bool:
    """An error status that names streaming: the request would have worked without it."""
    return RETRY_POLICY.refuses_streaming(reply.status) and "stream" in error_text(reply.body, secret=secret).lower()


def _plain(reply: HTTPReply, parse: Callable[[Any], Completion], on_text: TextListener | None,
           secret: str | None, cut: bool) -> Completion:
    """A plain reply's completion; with `cut`, parts nested too deeply are kept as text (bounded_json.Cut)."""
    server_errors.check(reply, secret=secret)
    data = decode_json(reply.body, secret=secret, cut=cut)
    if server_errors.error_of(data) is not None:  # a 2xx that carries an error, not an answer
        server_errors.raise_reported(data, secret=secret, where=f"in its HTTP {reply.status} reply")
    completion = parse(data)
    if on_text is not None and completion.content:
        on_text(completion.content)  # all at once: the listener still sees the whole answer
    return completion


class TextRelay:
    """Collects an answer's text and hands it on, batched per network read, with the API key
    redacted even when a server splits it across deltas, in any form the redaction reads (see
    agent.text.streamed_redaction): what could still turn out to be part of the key is held back."""

    def __init__(self, on_text: TextListener | None, secret: str | None):
        self._on_text = on_text
        self._redactor = StreamRedactor(secret)
        self._parts: list[str] = []  # what has been handed on (redacted)
        self._pending: list[str] = []  # what arrived since the last network read
        self.arrived = False  # any text but white space

    def add(self, text: str) -> None:
        self._pending.append(text)
        self.arrived = self.arrived or (bool(text) and not text.isspace())

    def flush(self) -> None:
        """Hand on what has arrived, except a tail that might still be part of the key."""
        if self._pending:
            text, self._pending = "".join(self._pending), []
            self._emit(self._redactor.feed(text))

    def finish(self) -> str:
        """Hand on the rest; the whole text."""
        self.flush()
        self._emit(self._redactor.close())
        return "".join(self._parts)

    def _emit(self, text: str) -> None:
        if text:
            self._parts.append(text)
            if self._on_text is not None:
                self._on_text(text)


def token_count(value: Any) -> int | None:
    """A token count as reported, or None when it is not a whole number from 0 to a bound past any
    real count (usage is for display: an odd count is dropped, the answer is kept)."""
    return well_formed.token_count(value)


def usage_of(raw: Any, input_name: str, output_name: str) -> Usage | None:
    """Usage from a reply's `usage` object, named the provider's way; None when it has none. Cached input:
    OpenAI's `prompt_tokens_details.cached_tokens` (inside its input count); Anthropic's cache reads and
    writes, which its `input_tokens` leaves out, are added to the input."""
    if not isinstance(raw, dict):
        return None
    input_tokens, cached = token_count(raw.get(input_name)), None
    details = raw.get("prompt_tokens_details")
    if isinstance(details, dict):
        cached = token_count(details.get("cached_tokens"))
    read, written = token_count(raw.get("cache_read_input_tokens")), token_count(raw.get("cache_creation_input_tokens"))
    if input_tokens is not None and (read or written):
        input_tokens, cached = input_tokens + (read or 0) + (written or 0), read
    usage = Usage(input_tokens=input_tokens, output_tokens=token_count(raw.get(output_name)),
                  cached_input_tokens=cached)
    return None if usage == Usage() else usage


def raise_if_reported(stray: str, secret: str | None) -> None:
    """Lines of a stream that were not events: raise the error they carry if they are a JSON error body
    (a server that answered a stream request with its error as plain JSON); anything else is left."""
    try:
        data = decode_json(stray, secret=secret)
    except ProviderError:
        return  # not JSON: nothing a person could be shown
    if server_errors.error_of(data) is not None:
        server_errors.raise_reported(data, secret=secret, where="in its stream")


def cut_off(marker: str, *, nothing_arrived: bool) -> ProviderError:
    """A stream that ended before its end marker: the answer is incomplete, so no answer at all.
    `nothing_arrived`: no text and no tool call had come (the turn asks again without streaming)."""
    what = "with nothing in it" if nothing_arrived else "the answer was cut off"
    return ProviderError(ProviderErrorKind.CONNECTION, f"the provider's stream ended before {marker}: {what}",
                         nothing_streamed=nothing_arrived)
