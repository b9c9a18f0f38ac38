"""Content-Encoding of provider replies: stacked encodings and bombs, fuzzed, decoded within a byte
limit, in bounded memory and within the call's timeout (the pure decoder, real calls in a child
process whose peak memory is read, and a real turn through a worker)."""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass

import pytest

from agent.providers.decoding import (
    MAX_STACKED_ENCODINGS,
    SLICE_BYTES,
    BodyTooLarge,
    BoundedDecoder,
    MalformedEncoding,
    UnsupportedEncoding,
)
from agent.providers.http import MAX_RESPONSE_BYTES
from agent.runtime.loopback_server import raw, reply
from tests.conftest import CANARY_KEY, FAST, ROOT, ask, wait_done
from tests.scripted_server import ScriptedServer, chat_reply

MIB = 2**20
GIB = 2**30
DEADLINE_SLACK_S = 1.5  # seconds past a bound a busy machine may take
FUZZ_SEED = 20261202
FUZZ_CALLS = 70  # real calls in the fuzz
CALL_TOTAL_S = 4.0  # seconds each fuzzed call may take
CHILD_ADDRESS_SPACE_BYTES = 3 * GIB  # a runaway decoder hits this cap in the child, not the machine
CHILD_TIMEOUT_S = 300.0  # seconds the whole child run may take
# Peak RSS a call may add over a warmed-up process: the decoded body (the limit) gathered as slices,
# joined once, plus zlib states and a socket's buffers. Without a bounded decoder it was 8 GiB.
MEMORY_GROWTH_BOUND_BYTES = 3 * MAX_RESPONSE_BYTES + 24 * MIB
SUPPORTED = ["identity", "gzip", "x-gzip", "deflate"]
REFUSED = ["br", "zstd", "compress", "x-compress", "snappy", "gzip2", "deflate-raw", "lzma", CANARY_KEY]
BOMB_BYTES = [9 * MIB, 64 * MIB, GIB, 8 * GIB]  # decoded sizes


# -- encoders ---------------------------------------------------------------------------------


def encode(data: bytes, coding: str, rng: random.Random) -> bytes:
    """`data` under one coding as a server would send it (deflate: zlib-wrapped or raw, at random)."""
    if coding in ("gzip", "x-gzip"):
        return gzip.compress(data, compresslevel=rng.choice([1, 6, 9]), mtime=0)
    if coding in ("deflate", "zlib", "raw"):  # deflate: zlib-wrapped or raw at random
        wbits = {"zlib": zlib.MAX_WBITS, "raw": -zlib.MAX_WBITS}.get(coding) or rng.choice([zlib.MAX_WBITS,
                                                                                          -zlib.MAX_WBITS])
        squeezer = zlib.compressobj(rng.choice([1, 6, 9]), zlib.DEFLATED, wbits)
        return squeezer.compress(data) + squeezer.flush()
    return data


def encode_stack(data: bytes, applied: list[str], rng: random.Random) -> bytes:
    for coding in applied:
        data = encode(data, coding, rng)
    return data


ZEROS_BLOCK_BYTES = 16 * MIB  # a bomb is this many zeros, compressed once and repeated
CRC32_POLYNOMIAL = 0xEDB88320  # reflected, as zlib and gzip use it
ADLER32_MODULUS = 65521
EMPTY_FINAL_DEFLATE_BLOCK = b"\x01\x00\x00\xff\xff"  # a stored block of no bytes, marked last


@functools.cache
def _deflated_zeros_block() -> bytes:
    """ZEROS_BLOCK_BYTES zeros as raw deflate ending on a full flush: byte-aligned, and with no history,
    so the same bytes again are the next block's zeros."""
    squeezer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return squeezer.compress(bytes(ZEROS_BLOCK_BYTES)) + squeezer.flush(zlib.Z_FULL_FLUSH)


def _crc32_of_zeros(length: int) -> int:
    """zlib.crc32(bytes(length)) in log(length) steps: a zero bit is a linear map of the CRC register."""

    def times(matrix: list[int], vector: int) -> int:
        total, row = 0, 0
        while vector:
            if vector & 1:
                total ^= matrix[row]
            vector, row = vector >> 1, row + 1
        return total

    one_bit = [CRC32_POLYNOMIAL] + [1 << row for row in range(31)]
    register, bits = 0xFFFFFFFF, 8 * length
    while bits:
        if bits & 1:
            register = times(one_bit, register)
        one_bit = [times(one_bit, column) for column in one_bit]
        bits >>= 1
    return register ^ 0xFFFFFFFF


def zeros_stream(length: int, container: str) -> bytes:
    """`length` zeros (a multiple of ZEROS_BLOCK_BYTES, or less than one block) as one valid gzip, zlib or
    raw deflate stream, made in milliseconds however large: 8 GiB of zeros is an 8 MB stream."""
    if length < ZEROS_BLOCK_BYTES:
        return encode(bytes(length), container, random.Random(0))
    deflated = _deflated_zeros_block() * (length // ZEROS_BLOCK_BYTES) + EMPTY_FINAL_DEFLATE_BLOCK
    if container == "gzip":
        trailer = _crc32_of_zeros(length).to_bytes(4, "little") + (length % 2**32).to_bytes(4, "little")
        return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + deflated + trailer
    if container == "zlib":
        adler32 = (length % ADLER32_MODULUS) << 16 | 1
        return b"\x78\xda" + deflated + adler32.to_bytes(4, "big")
    return deflated


def bomb(decoded_bytes: int, applied: list[str], rng: random.Random) -> bytes:
    """Zeros of `decoded_bytes` under the stack `applied`; the first real coding makes the bomb."""
    codings = [c for c in applied if c != "identity"]
    if not codings:
        return bytes(min(decoded_bytes, 9 * MIB))  # no compression: just too large
    first = applied.index(codings[0])
    container = "gzip" if codings[0] in ("gzip", "x-gzip") else rng.choice(["zlib", "raw"])
    return encode_stack(zeros_stream(decoded_bytes, container), applied[first + 1:], rng)


def spell(applied: list[str], rng: random.Random) -> list[str]:
    """The header line(s) naming `applied`: random case, whitespace, empty list elements, one line or several."""
    names = ["".join(ch.upper() if rng.random() < 0.5 else ch for ch in name) for name in applied]
    separators = [",", ", ", " ,", ",\t", " , ,", ",,", "\t,  "]
    lines, current = [], [names[0]]
    for name in names[1:]:
        if rng.random() < 0.2:
            lines.append(current)
            current = [name]
        else:
            current.append(name)
    lines.append(current)
    return [rng.choice(["", " "]) + "".join(n + (rng.choice(separators) if i < len(line) - 1 else "")
                                            for i, n in enumerate(line)) for line in lines]


def served(body: bytes, header_lines: list[str]):
    """A 200 reply with these Content-Encoding lines (several lines need a hand-written response)."""
    if len(header_lines) == 1:
        return reply(200, body=body, headers={"Content-Encoding": header_lines[0]})
    head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
    head += "".join(f"Content-Encoding: {line}\r\n" for line in header_lines)
    return raw(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


# -- the pure decoder --------------------------------------------------------------------------


def decode_all(decoder: BoundedDecoder, body: bytes, rng: random.Random) -> list[bytes]:
    pieces, at = [], 0
    while at < len(body):
        size = rng.choice([1, 2, 7, 100, 4096, 65536, 300_000])
        pieces += decoder.feed(body[at:at + size])
        at += size
    pieces += decoder.flush()
    return pieces


def test_any_stack_of_supported_encodings_decodes_back_to_the_body_in_bounded_slices():
    rng = random.Random(FUZZ_SEED)
    for _ in range(300):
        applied = [rng.choice(SUPPORTED) for _ in range(rng.randint(1, MAX_STACKED_ENCODINGS))]
        text = bytes(rng.choice(b"ab{}\" 0123456789") for _ in range(rng.randint(0, 3000)))
        data = text * rng.choice([1, 1, 50, 400]) + rng.randbytes(rng.randint(0, 2000))
        body = encode_stack(data, applied, rng)
        pieces = decode_all(BoundedDecoder(", ".join(spell(applied, rng)), MAX_RESPONSE_BYTES), body, rng)
        assert b"".join(pieces) == data, applied
        assert max(map(len, pieces), default=0) <= SLICE_BYTES


def test_a_bomb_under_any_stack_is_refused_once_a_stage_passes_the_limit_having_produced_little_more():
    rng = random.Random(FUZZ_SEED + 1)
    limit = MIB
    for _ in range(60):
        applied = [rng.choice(SUPPORTED[1:]) for _ in range(rng.randint(1, MAX_STACKED_ENCODINGS))]
        body = bomb(rng.choice(BOMB_BYTES[:2]), applied, rng)
        decoder = BoundedDecoder(", ".join(applied), limit)
        produced = 0
        with pytest.raises(BodyTooLarge):
            for piece in decode_all(decoder, body, rng):
                produced += len(piece)
        assert produced <= limit
        assert decoder.decoded_bytes <= limit + SLICE_BYTES


def test_an_encoding_that_is_not_supported_or_stacked_too_deep_is_refused_without_quoting_unknown_names():
    for header in ["br", "gzip, zstd", "compress", "x-compress", "identity, snappy", f"gzip, {CANARY_KEY}"]:
        with pytest.raises(UnsupportedEncoding) as caught:
            BoundedDecoder(header, MIB)
        assert CANARY_KEY not in str(caught.value)
        assert "snappy" not in str(caught.value)
    assert "br" in str(pytest.raises(UnsupportedEncoding, BoundedDecoder, "br", MIB).value)
    with pytest.raises(UnsupportedEncoding):
        BoundedDecoder(", ".join(["gzip"] * (MAX_STACKED_ENCODINGS + 1)), MIB)
    BoundedDecoder(", ".join(["gzip"] * MAX_STACKED_ENCODINGS) + ", ,", MIB)  # empty elements do not count


@pytest.mark.parametrize("header, body", [
    ("gzip", gzip.compress(b"hello world" * 100, mtime=0)[:-9]),  # truncated
    ("deflate", zlib.compress(b"hello world" * 100)[:-5]),
    ("gzip", b"not gzip at all"),
    ("deflate", b"\xff\xff\xff\xff"),
    ("deflate", zlib.compress(b"hello") + b"trailing"),
    ("gzip", gzip.compress(b"hello", mtime=0) + b"\0\0\0\0"),
    ("gzip, gzip", gzip.compress(b"not gzip inside", mtime=0)),
    ("deflate", b"x"),
])
def test_a_corrupt_truncated_or_padded_stream_is_malformed(header, body):
    with pytest.raises(MalformedEncoding):
        decode_all(BoundedDecoder(header, MIB), body, random.Random(0))


def test_the_bombs_are_valid_streams_of_zeros():
    for container, inflate in [("gzip", gzip.decompress), ("zlib", zlib.decompress),
                               ("raw", lambda data: zlib.decompress(data, -zlib.MAX_WBITS))]:
        assert inflate(zeros_stream(2 * ZEROS_BLOCK_BYTES, container)) == bytes(2 * ZEROS_BLOCK_BYTES)
    assert _crc32_of_zeros(12345) == zlib.crc32(bytes(12345))


def test_gzip_members_one_after_another_decode_as_one_body():
    body = gzip.compress(b"first ") + gzip.compress(b"") * 3 + gzip.compress(b"second") + gzip.compress(b"")
    for seed in range(20):
        assert b"".join(decode_all(BoundedDecoder("gzip", MIB), body, random.Random(seed))) == b"first second"


def test_an_empty_body_is_empty_whatever_its_declared_encoding():
    assert b"".join(decode_all(BoundedDecoder("gzip, deflate", MIB), b"", random.Random(0))) == b""


# -- real calls, in a child process whose memory is measured ------------------------------------


@dataclass(frozen=True)
class Case:
    action: object
    expect: str  # "ok", or the words the ProviderError's message must hold
    content: str | None = None
    limit_bytes: int = MAX_RESPONSE_BYTES
    total_s: float = CALL_TOTAL_S
    header: str = ""


def fuzz_case(rng: random.Random, index: int) -> Case:
    depth = rng.randint(1, 8)
    applied = [rng.choice(SUPPORTED) for _ in range(depth)]
    roll = rng.random()
    if roll < 0.15:
        applied.insert(rng.randrange(depth + 1), rng.choice(REFUSED))
    lines = spell(applied, rng)
    header = " | ".join(lines)
    if len(applied) > MAX_STACKED_ENCODINGS:
        expect = f"more than {MAX_STACKED_ENCODINGS} stacked content encodings"
    elif roll < 0.15:
        expect = "unsupported content encoding"
    elif roll < 0.6:
        return Case(served(bomb(rng.choice(BOMB_BYTES), applied, rng), lines),
                    "larger than 8 MiB", header=header)
    else:
        content = f"answer {index}: " + "".join(rng.choice("abc xyz{}[]\"é") for _ in range(rng.randint(0, 2000)))
        return Case(served(encode_stack(chat_reply(content).body, applied, rng), lines), "ok", content, header=header)
    body = encode_stack(b'{"choices": []}', [c for c in applied if c.lower() in SUPPORTED], rng)
    return Case(served(body, lines), expect, header=header)


def run_child(server: ScriptedServer, cases: list[Case]) -> list[dict]:
    spec = {"url": server.url, "address_space_bytes": CHILD_ADDRESS_SPACE_BYTES,
            "calls": [{"limit_bytes": c.limit_bytes, "total_s": c.total_s} for c in cases]}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run([sys.executable, "-m", "tests.bounded_calls"], input=json.dumps(spec), cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    results = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), child.stderr[-3000:]
    return results


def test_stacked_encodings_and_bombs_fuzzed_through_real_calls_end_in_time_in_bounded_memory(scripted):
    rng = random.Random(FUZZ_SEED + 2)
    warm_up = Case(chat_reply("warm"), "ok", "warm")
    cases = [warm_up] + [fuzz_case(rng, i) for i in range(FUZZ_CALLS)]
    # The 6.8 KB bomb of the review, and one read with a limit so high that only the clock stops it:
    # the decoder must hand control back to the event loop for the call's timeout to fire.
    gzip_gzip = bomb(8 * GIB, ["gzip", "gzip"], rng)
    cases.append(Case(served(gzip_gzip, ["gzip, gzip"]), "larger than 8 MiB", header="gzip, gzip"))
    cases.append(Case(served(gzip_gzip, ["gzip, gzip"]), "did not answer within 0.5 s",
                      limit_bytes=2 * GIB, total_s=0.5, header="gzip, gzip (limit 2 GiB)"))
    scripted.add(*(case.action for case in cases))

    results = run_child(scripted, cases)

    baseline_kib = results[0]["peak_rss_kib"]
    assert scripted.requests[0].headers["accept-encoding"] == "gzip, deflate"
    problems = []  # every case that went wrong, so that one run shows them all
    peak_before_kib = baseline_kib
    for case, result in zip(cases, results, strict=True):
        label = f"{case.header!r} -> {result}"
        if result["elapsed_s"] > case.total_s + DEADLINE_SLACK_S:
            problems.append(f"late: {label}")
        growth_bytes = (result["peak_rss_kib"] - baseline_kib) * 1024
        raised_peak = result["peak_rss_kib"] > peak_before_kib  # a peak is reached once: name the call
        peak_before_kib = result["peak_rss_kib"]
        if case.limit_bytes == MAX_RESPONSE_BYTES and raised_peak and growth_bytes > MEMORY_GROWTH_BOUND_BYTES:
            problems.append(f"memory: {label}")
        if case.expect == "ok" and not (result["ok"] and result["content"] == case.content):
            problems.append(f"not decoded: {label}")
        if case.expect != "ok" and not (not result["ok"] and result["kind"] in ("malformed", "timeout")
                                        and case.expect in result["message"] and CANARY_KEY not in result["message"]):
            problems.append(f"expected {case.expect!r}: {label}")
    assert not problems, f"{len(problems)} of {len(cases)} calls went wrong:\n" + "\n".join(problems)
    outcomes = {case.expect.split()[0] for case in cases}
    assert {"ok", "larger", "unsupported", "more"} <= outcomes  # the fuzz covered every outcome


# -- a real turn through a worker ------------------------------------------------------------------


@pytest.mark.usefixtures("pool")
def test_a_stacked_gzip_bomb_ends_a_real_turn_as_a_provider_error_before_its_deadline(store, queue, scripted):
    body = gzip.compress(zeros_stream(8 * GIB, "gzip"), compresslevel=9, mtime=0)
    assert len(body) < 16 * 1024  # kilobytes on the wire (the review's was 6.8 KB), 8 GiB decoded
    scripted.add(*[served(body, ["gzip, gzip"])] * 4)
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1")
    cid = ask(store, queue, "hi", config)
    state = wait_done(store, cid, timeout_s=60)
    assert state["status"] == "failed", state
    assert "larger than 8 MiB" in json.dumps(state["history"][-1]) + json.dumps(state["error"])
    assert state["updated_at"] <= state["deadline_at"] + DEADLINE_SLACK_S
    assert time.time() >= state["updated_at"]  # a real write, not a forecast
