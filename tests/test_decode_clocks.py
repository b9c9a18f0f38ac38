"""Decoding a reply is part of its call: a reply whose decoding outruns the call's timeout ends as
that timeout, and Stop cuts it short. Real HTTP servers on loopback; the turn tests run on the real
queue and workers, whose key (the canary) is redacted from every string of every reply."""

from __future__ import annotations

import json
import threading
import time

import pytest

from agent.deadline import CallTimeout
from agent.providers import AnthropicProvider, OpenAIProvider, ProviderError, sliced_json
from agent.runtime.loopback_server import delayed, hang, reply, stream
from tests.conftest import CANARY_KEY, ask, wait_done
from tests.scripted_server import ScriptedServer
from tests.sse_server import DONE, chunk, message_start, sse
from tests.test_stop import LONG, stop_and_time
from tests.test_turn import scripted_config, steps_of

MESSAGES = [{"role": "user", "content": "hi"}]
CALL_SLACK_S = 1.0  # seconds past a call's timeout a busy machine may take to end it
STOP_SLACK_S = 1.0  # seconds from a stop to the end of the call it cut (the aim is a few tenths)
# The key, fullwidth: read as the key, so every string that holds it is redacted, the costly case.
WIDE_KEY = "".join(chr(ord(char) + 0xFEE0) for char in CANARY_KEY)
ECHO_BYTES = 7 * 2**20  # under the 8 MiB a reply may have


def echo_strings() -> list[str]:
    """A server echoing the key it was sent in every one of 87,000 strings: about 0.8 s of CPU to
    decode here with the redaction in bulk (1.4 s one string at a time), all of it inside the call."""
    return [WIDE_KEY + " x"] * (ECHO_BYTES // (len(WIDE_KEY.encode()) + 6))


def plain_echo() -> bytes:
    message = {"role": "assistant", "content": "ok"}
    body = {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message,
                                                                  "finish_reason": "stop"}], "echo": echo_strings()}
    return json.dumps(body, ensure_ascii=False).encode()


def streamed_echo(provider: str) -> list[bytes]:
    if provider == "openai":
        return [chunk({"role": "assistant", "content": ""}), chunk({"content": "ok"}, echo=echo_strings()), DONE]
    return [message_start(), sse({"type": "ping", "echo": echo_strings()}, "ping")]


@pytest.fixture
def server():
    scripted = ScriptedServer()
    try:
        yield scripted
    finally:
        scripted.stop()


def client(provider: str, server: ScriptedServer):
    if provider == "openai":
        return OpenAIProvider(server.url + "/v1", "m", CANARY_KEY)
    return AnthropicProvider(server.url, "claude-test", CANARY_KEY)


def call_error(provider, timeout: CallTimeout, stop: threading.Event | None = None) -> tuple[ProviderError, float]:
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        provider.complete(MESSAGES, [], timeout, stop=stop)
    return caught.value, time.monotonic() - started


# The reply arrives 1.2 s into a 1.5 s call: its decoding, not the exchange, runs out of time.
LATE = 1.2
TIMEOUT = CallTimeout(total_s=1.5, connect_s=1.0)


def test_a_plain_reply_whose_decoding_outruns_the_calls_timeout_ends_as_that_timeout(server):
    server.add(delayed(LATE, reply(200, body=plain_echo())))
    error, took_s = call_error(client("openai", server), TIMEOUT)
    assert error.kind == "timeout", error.message
    assert took_s < TIMEOUT.total_s + CALL_SLACK_S


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_streamed_event_whose_decoding_outruns_the_calls_timeout_ends_as_that_timeout(server, provider):
    server.add(delayed(LATE, stream(streamed_echo(provider))))
    error, took_s = call_error(client(provider, server), TIMEOUT)
    assert error.kind == "timeout", error.message
    assert took_s < TIMEOUT.total_s + CALL_SLACK_S


@pytest.mark.parametrize("form", ["plain", "streamed"])
def test_stop_during_a_long_decoding_ends_the_call_as_stopped_at_once(server, monkeypatch, form):
    decoding = threading.Event()
    real_decode_steps = sliced_json.decode_steps

    def watched(body, secret):
        if len(body) > 1_000_000:  # the echo, not a small event
            decoding.set()
        return real_decode_steps(body, secret)

    monkeypatch.setattr(sliced_json, "decode_steps", watched)
    server.add(reply(200, body=plain_echo()) if form == "plain" else stream(streamed_echo("openai")))
    stop = threading.Event()
    stopped_at: list[float] = []

    def stop_once_decoding():
        if decoding.wait(30):
            stopped_at.append(time.monotonic())
            stop.set()

    threading.Thread(target=stop_once_decoding, daemon=True).start()
    error, _ = call_error(client("openai", server), CallTimeout(total_s=30.0, connect_s=2.0), stop)
    ended_at = time.monotonic()
    assert error.kind == "stopped", error.message
    assert stopped_at and ended_at - stopped_at[0] < STOP_SLACK_S


@pytest.mark.usefixtures("pool")
def test_a_turn_whose_reply_outruns_its_deadline_in_decoding_ends_before_the_job_timeout(store, queue, scripted):
    # 6 s job timeout, 2 s margin, 3 s calls: the first reply comes 2.5 s into its call, and whatever
    # is tried next gets what remains of the deadline (about 1 s: the retry's reply comes 2.5 s into it too,
    # so that a machine that decodes it in less than what remains cannot make it an answer).
    scripted.add(delayed(2.5, reply(200, body=plain_echo())))
    scripted.add(delayed(2.5, reply(200, body=plain_echo())))
    scripted.add(hang())
    cid = ask(store, queue, "hi", scripted_config(scripted))
    state = wait_done(store, cid, timeout_s=30)
    assert state["status"] == "timed_out", state["history"][-1]
    first = steps_of(state, "model")[0]
    assert first["outcome"] == "timeout"
    assert first["duration_s"] < first["timeout_s"] + CALL_SLACK_S
    assert state["updated_at"] < state["deadline_at"] + CALL_SLACK_S
    assert state["updated_at"] < state["job_timeout_at"]


@pytest.mark.usefixtures("pool")
def test_stop_during_a_long_decoding_ends_the_turn_cancelled_promptly(store, queue, scripted):
    sent = threading.Event()
    scripted.add(reply(200, body=plain_echo(), on_last_byte=sent.set))
    cid = ask(store, queue, "hi", scripted_config(scripted, **LONG))
    assert sent.wait(30), "the reply was never asked for"
    state, took_s = stop_and_time(store, cid, store.read_meta(cid)["turn_id"])
    assert state["status"] == "cancelled", state["history"][-1]
    assert steps_of(state, "model")[-1]["outcome"] == "stopped"
    # The stop watch's poll (0.25 s), a step of decoding, the final write; with a busy machine's slack.
    assert took_s < 1.0 + STOP_SLACK_S
