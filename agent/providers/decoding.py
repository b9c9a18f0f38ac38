"""A response body's Content-Encoding undone in bounded slices, with a cap on what it may produce.

httpx 0.28 decodes each network chunk whole: a 6.8 KB body sent as `gzip, gzip` inflated to 8 GiB
inside one call, before any size check could run. Here every zlib step is asked for at most
`SLICE_BYTES` (`max_length`), every stage of a stack counts what it produced, and the first stage
to pass the limit (the raw body, each decoding, the final output) raises `BodyTooLarge`. A caller
that iterates `feed` gets control back after every step, so it can yield to its event loop and its
clocks keep running. Memory stays near the limit: a slice and a zlib window per stage.

Supported: identity, gzip (and its alias x-gzip, several members allowed), deflate (zlib-wrapped or
raw, told apart by the zlib header, as httpx accepts both), stacked up to `MAX_STACKED_ENCODINGS`.
Anything else (br, zstd, compress, unknown names) is refused before the body is read: the project
asks for `ACCEPT_ENCODING` only. Pure: no httpx, no asyncio.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

SLICE_BYTES = 64 * 1024  # bytes a single decoding step may produce
MAX_STACKED_ENCODINGS = 5  # content codings in one header, as the MCP SDK's HTTP client allows
ACCEPT_ENCODING = "gzip, deflate"  # what we ask servers for (never br or zstd)
# Named in an error as themselves; any other refused name is not quoted (it could carry a secret).
KNOWN_UNSUPPORTED = frozenset({"br", "zstd", "compress", "x-compress", "exi", "pack200-gzip", "aes128gcm",
                               "dcb", "dcz", "x-bzip2", "bzip2", "lzma", "xz"})
_GZIP_WBITS = zlib.MAX_WBITS | 16
_ZLIB_WBITS = zlib.MAX_WBITS
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS


class DecodingError(Exception):
    """The body cannot be decoded within the rules above; `str()` is for a person."""


class UnsupportedEncoding(DecodingError):
    pass


class MalformedEncoding(DecodingError):
    pass


class BodyTooLarge(DecodingError):
    pass


def codings(content_encoding: str) -> list[str]:
    """The codings a Content-Encoding value names, in the order they were applied (lowercased, list
    syntax as RFC 9110 has it: commas, optional whitespace, empty elements ignored)."""
    return [name.strip(" \t").lower() for name in content_encoding.split(",") if name.strip(" \t")]


class _Inflater:
    """One gzip or deflate stage: takes input only when it asked for it, gives at most a slice a step."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._pending = b""
        self._engine: zlib._Decompress | None = zlib.decompressobj(_GZIP_WBITS) if coding == "gzip" else None
        self.seen_input = False
        self.produced_bytes = 0

    def give(self, data: bytes) -> None:
        self.seen_input = self.seen_input or bool(data)
        self._pending += data  # only called once step() ran dry, so _pending is small or empty

    def step(self) -> bytes:
        """Up to SLICE_BYTES of output; b"" when all input so far is used up."""
        while True:
            if self._engine is None:
                if len(self._pending) < 2:
                    return b""  # deflate: the first two bytes tell a zlib header from a raw stream
                wbits = _ZLIB_WBITS if _zlib_header(self._pending) else _RAW_DEFLATE_WBITS
                self._engine = zlib.decompressobj(wbits)
            engine = self._engine
            if engine.eof:
                leftover, self._pending = engine.unused_data + self._pending, b""
                if not leftover:
                    return b""
                if self.coding != "gzip":
                    raise MalformedEncoding("data after the end of a deflate stream")
                engine = self._engine = zlib.decompressobj(_GZIP_WBITS)  # the next member of a multi-member gzip
                self._pending = leftover
            try:
                out = engine.decompress(self._pending, SLICE_BYTES)
            except zlib.error as exc:
                raise MalformedEncoding(f"undecodable {self.coding} data") from exc
            self._pending = engine.unconsumed_tail
            if out or not (engine.eof and engine.unused_data):
                self.produced_bytes += len(out)
                return out
            # An empty gzip member ended with more input behind it: on to the next member (each
            # member takes at least 18 bytes of input, so this loop is bounded by what we were given).

    def check_complete(self) -> None:
        if not self.seen_input:
            return  # an empty body is empty whatever its declared encoding (as httpx reads it)
        if self._engine is None or not self._engine.eof:
            raise MalformedEncoding(f"truncated {self.coding} data")


def _zlib_header(data: bytes) -> bool:
    """RFC 1950: compression method 8, a window of at most 32 KiB, and a header checksum."""
    cmf, flg = data[0], data[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0


class BoundedDecoder:
    """Undoes `content_encoding` on raw body bytes; no stage may produce more than `limit_bytes`.

    `feed(raw)` and then `flush()` are generators: each item is at most SLICE_BYTES of decoded body,
    or b"" after a step that produced nothing for the caller (a chance to yield to an event loop).
    Raises UnsupportedEncoding at construction, MalformedEncoding or BodyTooLarge while decoding."""

    def __init__(self, content_encoding: str, limit_bytes: int) -> None:
        names = codings(content_encoding)
        if len(names) > MAX_STACKED_ENCODINGS:
            raise UnsupportedEncoding(f"more than {MAX_STACKED_ENCODINGS} stacked content encodings")
        for name in names:
            if name not in ("identity", "gzip", "x-gzip", "deflate"):
                shown = f" {name}" if name in KNOWN_UNSUPPORTED else ""
                raise UnsupportedEncoding(f"unsupported content encoding{shown}")
        applied = ["gzip" if name == "x-gzip" else name for name in names if name != "identity"]
        self._stages = [_Inflater(name) for name in reversed(applied)]  # the last applied is undone first
        self.limit_bytes = limit_bytes
        self.raw_bytes = 0
        self.decoded_bytes = 0

    def feed(self, raw: bytes) -> Iterator[bytes]:
        self.raw_bytes += len(raw)
        self._check(self.raw_bytes, "body")
        if not self._stages:
            for start in range(0, len(raw), SLICE_BYTES):
                yield self._out(raw[start:start + SLICE_BYTES])
            return
        self._stages[0].give(raw)
        yield from self._pump()

    def flush(self) -> Iterator[bytes]:
        """The end of the body: what is left, then a check that every stream ended where it should."""
        if self._stages:
            yield from self._pump()
            for stage in self._stages:
                stage.check_complete()

    def _pump(self) -> Iterator[bytes]:
        # Invariant: every stage above `index` has used all its input, so a stage is only given
        # more after it ran dry, and no stage holds more than a slice (the first: one network chunk).
        last = len(self._stages) - 1
        index = last
        while True:
            stage = self._stages[index]
            out = stage.step()
            if out:
                self._check(stage.produced_bytes, f"{stage.coding} stage")
                if index == last:
                    yield self._out(out)
                else:
                    self._stages[index + 1].give(out)
                    index += 1
                    yield b""
                continue
            if index == 0:
                return
            index -= 1
            yield b""

    def _out(self, piece: bytes) -> bytes:
        self.decoded_bytes += len(piece)
        self._check(self.decoded_bytes, "decoded body")
        return piece

    def _check(self, size_bytes: int, what: str) -> None:
        if size_bytes > self.limit_bytes:
            raise BodyTooLarge(f"the {what} passed {self.limit_bytes} bytes")
