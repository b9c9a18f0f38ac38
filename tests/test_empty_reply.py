"""A reply with no text and no tool call is not an answer: a streamed one is asked again once without
streaming (as llama-cpp-python with Gemma 3 270M streamed nothing where a plain request got text), and
one that stays empty is said on the page, in the CLI and in the export. Real Redis, real servers on
loopback; the turn runs in this process, the CLI against the session's workers."""

from __future__ import annotations

import pytest

from agent.contract import ErrorKind, Kind, Outcome
from agent.conversation.endings import EMPTY_REPLY
from agent.runtime.loopback_server import delayed, reply, stream
from agent.text.markdown import inert
from agent.turn.model_calls import EMPTY_STREAMED, NO_TEXT_NO_CALL, NO_TEXT_ONLY_CALLS
from tests.apptest_page import app, page_environment, texts
from tests.conftest import FAST
from tests.scripted_server import ScriptedServer, chat_reply, tool_call
from tests.sse_server import DONE, chunk, message_end, message_start, text_block
from tests.test_cli import cli
from tests.test_turn_unit import make_turn

SAID = "the model sent an empty reply"  # what a person reads, wherever the turn is shown
SLOW_CLOCKS = {"job_timeout_s": 10, "deadline_margin_s": 2.0, "call_timeout_cap_s": 7.0}  # an 8 s deadline


def empty_stream(provider: str):
    """An empty reply as each format streams it: what llama-cpp-python sent (a role, an empty content, a
    stop, then [DONE]), and an Anthropic message whose one text block never got any text."""
    if provider == "openai":
        return stream([chunk({"role": "assistant"}), chunk({"content": ""}), chunk(finish_reason="stop"), DONE])
    return stream([message_start(), *text_block(0), *message_end()])


def plain(provider: str, text: str):
    if provider == "openai":
        return chat_reply(text)
    return reply(200, {"id": "msg_p", "type": "message", "role": "assistant",
                       "content": [{"type": "text", "text": text}] if text else [], "stop_reason": "end_turn"})


def run_turn(store, server: ScriptedServer, provider: str, **clocks) -> dict:
    base_url = server.url + ("/v1" if provider == "openai" else "")
    turn = make_turn(store, FAST.with_changes(provider=provider, model="scripted", base_url=base_url, **clocks))
    turn.run()
    return store.read(turn.context.writer.conversation_id)


def model_steps(state: dict) -> list[dict]:
    return [s for s in state["steps"] if s["kind"] == Kind.MODEL]


@pytest.fixture
def server():
    with ScriptedServer() as scripted:
        yield scripted


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_empty_streamed_reply_is_asked_again_without_streaming_and_its_text_is_the_answer(store, server, provider):
    server.add(empty_stream(provider), plain(provider, "Four."))
    state = run_turn(store, server, provider)

    assert (state["status"], state["error"]) == ("done", None)
    assert state["history"][-1] == {"role": "assistant", "content": "Four."}
    first, second = server.requests
    assert first.json["stream"] is True and "stream" not in second.json
    empty, asked = model_steps(state)
    assert (empty["outcome"], empty["detail"]) == (Outcome.ERROR, f"{SAID} ({NO_TEXT_NO_CALL})")
    assert (asked["outcome"], asked["attempt"], asked["unstreamed"]) == (Outcome.OK, 2, EMPTY_STREAMED)
    assert not [s for s in state["steps"] if s["kind"] == Kind.RETRY]  # asked again at once: nothing failed


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_empty_reply_streamed_and_plain_ends_the_turn_saying_so(store, server, provider):
    server.add(empty_stream(provider), plain(provider, ""))
    state = run_turn(store, server, provider)

    assert state["status"] == "failed"
    assert state["error"]["kind"] == ErrorKind.EMPTY_REPLY
    assert state["error"]["message"].startswith(f"{EMPTY_REPLY}, streamed and again without streaming")
    assert state["history"][-1]["content"] == state["error"]["message"]  # the ending's words are in the chat
    assert len(server.requests) == 2  # asked once more, never retried after that


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_empty_plain_reply_is_not_asked_again(store, server, provider):
    server.add(plain(provider, ""))  # a server that answers a stream request with plain JSON
    state = run_turn(store, server, provider)

    assert (state["status"], state["error"]["kind"]) == ("failed", ErrorKind.EMPTY_REPLY)
    assert state["error"]["message"].lower().startswith(SAID + ":")
    assert len(server.requests) == 1


def test_an_empty_streamed_reply_with_no_time_left_to_ask_again_ends_saying_both(store, server):
    # An 8 s deadline: the empty stream comes 4 s in, leaving about 4 s, below the 5 s a call needs.
    server.add(delayed(4.0, empty_stream("openai")))
    state = run_turn(store, server, "openai", **SLOW_CLOCKS, min_call_s=5.0)

    assert (state["status"], state["error"]["kind"]) == ("failed", ErrorKind.EMPTY_REPLY)
    assert state["error"]["message"].lower().startswith(SAID)
    assert "no time was left to ask again without streaming" in state["error"]["message"]
    [skip] = [s for s in state["steps"] if s["kind"] == Kind.SKIP]
    assert skip["detail"].startswith("not asked again without streaming")
    assert len(server.requests) == 1


def test_a_last_call_that_answers_with_tool_calls_alone_is_an_empty_reply(store, server):
    # The last call goes out without tools, and a reply's tool calls are then dropped unrun: without
    # text, nothing would be left to show. 4.5 s into an 8 s deadline, one 2.5 s call fits, not two.
    calls = chat_reply(None, [tool_call("calculator", {"expression": "6*7"})])
    server.add(delayed(4.5, calls), calls)
    state = run_turn(store, server, "openai", **SLOW_CLOCKS, min_call_s=2.5)

    assert (state["status"], state["error"]["kind"]) == ("failed", ErrorKind.EMPTY_REPLY)
    assert state["error"]["message"] == f"{EMPTY_REPLY}: {NO_TEXT_ONLY_CALLS}, so there is no answer to show."
    assert model_steps(state)[-1]["last_call"] is True


def test_a_reply_of_white_space_is_empty_too(store, server):
    server.add(stream([chunk({"role": "assistant", "content": "\n"}), chunk({"content": "  "}),
                       chunk(finish_reason="stop"), DONE]), chat_reply("Four."))
    state = run_turn(store, server, "openai")
    assert state["history"][-1]["content"] == "Four."
    assert len(server.requests) == 2


def test_the_page_says_an_empty_reply_and_the_plain_retry(store, server, redis_url):
    server.add(empty_stream("openai"), chat_reply(""))
    failed = run_turn(store, server, "openai")
    server.add(empty_stream("openai"), chat_reply("Four."))
    answered = run_turn(store, server, "openai")

    with page_environment(redis_url, {"AGENT_WORKERS": "0"}):
        pages = {}
        for name, state in (("failed", failed), ("answered", answered)):
            at = app(state["conversation_id"])
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            pages[name] = at
    assert any(SAID in str(box.value).lower() for box in pages["failed"].error)  # the ending's box
    shown = texts(pages["answered"])
    assert not pages["answered"].error and "Four." in shown
    assert f"asked without streaming ({EMPTY_STREAMED})" in shown  # the plain try's step
    assert SAID in shown.lower()  # the empty try's step


@pytest.mark.usefixtures("pool")
def test_the_cli_and_the_export_say_an_empty_reply(base_env, redis_url):
    with ScriptedServer([empty_stream("openai"), chat_reply("")]) as server:
        env = {**base_env, "REDIS_URL": redis_url, "AGENT_WORKERS": "0", "AGENT_PROVIDER": "openai",
               "AGENT_MODEL": "scripted", "OPENAI_BASE_URL": server.url + "/v1", "AGENT_JOB_TIMEOUT": "10",
               "AGENT_DEADLINE_MARGIN": "2", "AGENT_CALL_TIMEOUT_CAP": "5"}
        asked = cli(env, "ask", "What is 2+2?")
    assert asked.returncode == 1, asked.stderr
    assert SAID in asked.stdout.decode().lower()
    assert "[failed]" in asked.stderr.decode()
    [started] = [line for line in asked.stderr.decode().splitlines() if line.startswith("conversation ")]
    conversation_id = started.split()[1].rstrip(",")

    exported = cli(env, "export", conversation_id, "--format", "md")
    assert exported.returncode == 0, exported.stderr
    markdown = exported.stdout.decode()
    # The ending's kind as the export writes every word it does not own: Markdown characters escaped.
    assert SAID in markdown.lower() and f"({inert(ErrorKind.EMPTY_REPLY)})" in markdown
