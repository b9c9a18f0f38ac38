"""Server-sent events, parsed as the bytes arrive (the WHATWG event-stream format).

Bytes are decoded with an incremental UTF-8 decoder, so a character split across network reads
comes out whole; lines may end in LF, CRLF or CR, and a CR at the end of one read may meet its LF
in the next. Pure logic: no I/O, no httpx.

Two departures from the format, so that a server's error is not dropped: an `error:` line (llama.cpp
sends its errors so) is read as the data of an event named `error`, and lines that are no field of
the format at all (a JSON error body sent as an event stream) are kept, up to STRAY_LIMIT_CHARS,
and handed on as one `stray` event when the stream ends.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from agent.providers.base import ProviderError, ProviderErrorKind

DEFAULT_EVENT = "message"  # an event with no `event:` field
ERROR_EVENT = "error"
STRAY_LIMIT_CHARS = 8192  # characters of lines that are not the format's kept (an error body is short)
_FIELDS = ("event", "data", "id", "retry", ERROR_EVENT)


@dataclass(frozen=True)
class Event:
    name: str
    data: str
    stray: bool = False  # not an event: the stream's lines that were no field of the format


class EventStreamParser:
    """feed(bytes) -> the events those bytes complete; close() -> raises on invalid UTF-8 left over."""

    def __init__(self) -> None:
        # utf-8-sig drops the byte order mark the format allows at the start of the stream.
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="strict")
        self._pending: list[str] = []  # text after the last complete line
        self._after_cr = False  # the last line ended in CR: an LF starting the next text belongs to it
        self._name = ""
        self._data: list[str] = []
        self._stray: list[str] = []
        self._stray_chars = 0

    def feed(self, chunk: bytes) -> list[Event]:
        try:
            text = self._decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            raise _not_utf8() from exc
        return self._lines(text)

    def close(self) -> list[Event]:
        """The end of the stream: an unfinished character is an error; an undispatched event is dropped,
        as the format says (an event ends with a blank line); the stray lines, if any, come as one event."""
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            raise _not_utf8() from exc
        last = "".join(self._pending)  # a last line without its line end: never an event, maybe a stray line
        self._pending = []
        if last and not last.startswith(":") and last.partition(":")[0] not in _FIELDS:
            self._keep_stray(last)
        return [Event(DEFAULT_EVENT, "\n".join(self._stray), stray=True)] if self._stray else []

    def _lines(self, text: str) -> list[Event]:
        # Only the new text is searched for line ends: a long line arriving in many small reads
        # costs time in proportion to its length, not its square.
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        if text:
            self._after_cr = False
        events: list[Event] = []
        start = 0
        length = len(text)
        while start < length:
            cr = text.find("\r", start)
            lf = text.find("\n", start)
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 or 0 <= lf < cr else cr
            line = text[start:end]
            if self._pending:
                line = "".join(self._pending) + line
                self._pending = []
            if text[end] == "\r" and end + 1 < length and text[end + 1] == "\n":
                start = end + 2
            else:
                start = end + 1
                self._after_cr = text[end] == "\r" and start == length  # its LF may come with the next read
            event = self._line(line)
            if event is not None:
                events.append(event)
        if start < length:
            self._pending.append(text[start:])
        return events

    def _line(self, line: str) -> Event | None:
        if not line:
            if not self._data:  # no data lines: nothing to dispatch, as the format says
                self._name = ""
                return None
            event = Event(self._name or DEFAULT_EVENT, "\n".join(self._data))
            self._name, self._data = "", []
            return event
        if line.startswith(":"):
            return None  # a comment: servers send them to keep the connection alive
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        elif field == ERROR_EVENT:
            self._name = ERROR_EVENT
            self._data.append(value)
        elif field not in _FIELDS:
            self._keep_stray(line)
        # `id` and `retry` serve reconnection, which a model call never does.
        return None

    def _keep_stray(self, line: str) -> None:
        room = STRAY_LIMIT_CHARS - self._stray_chars
        if room > 0:
            self._stray.append(line[:room])
            self._stray_chars += min(len(line), room) + 1


def _not_utf8() -> ProviderError:
    return ProviderError(
        ProviderErrorKind.MALFORMED, "the provider sent a malformed response: the event stream is not UTF-8"
    )
