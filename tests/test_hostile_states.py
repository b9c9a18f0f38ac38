"""Hostile states written straight into Redis (tests/hostile_states.py, seeded): every reader (the store,
the lost-worker check, the page under AppTest, its in-flight fragment alone, the CLI) shows them as
text or says the state cannot be read, never raises or shows a traceback, and the next turn works."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import random
import re
import subprocess
import sys
import time

import pytest
import redis
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData
from streamlit.testing.v1 import AppTest

from agent.cli.output import JsonLines, TextLines
from agent.contract import CARRIED_FIELDS
from agent.conversation.keys import Keys
from agent.conversation.well_formed import UnreadableState
from agent.hosting.lost_worker import lost_worker_check
from agent.queue import new_id, submit_turn
from agent.runtime.loopback_server import delayed
from harness.pools import stop_pool
from harness.private_redis import PrivateRedis
from harness.waiting import wait_for
from tests.apptest_page import app as page
from tests.apptest_page import page_environment, texts, walk
from tests.conftest import FAST, ROOT, start_pool, wait_done
from tests.hostile_states import (
    NOT_JSON,
    NOT_UTF8,
    WRONG_VALUES,
    Case,
    assert_well_formed,
    base_state,
    cases,
    damage,
    make_case,
    overwrite,
    stored_items,
)
from tests.scripted_server import chat_reply, tool_call

SEED = 20261202
STORE_CASES = 400  # read by the store, the lost-worker check and the CLI's printing
PAGE_CASES = 40  # drawn by the page, a full run and a tick each, then the next message sent
CLI_CASES = 6  # `python -m agent ask --conversation ID` as a process
TURN_TIMEOUT_S = 30
CLI_TIMEOUT_S = 60
# What a traceback leaves on a page or a terminal: its heading, or a frame's file line.
TRACEBACK_RE = re.compile(r'Traceback|File "[^"]*", line \d+|\.py", line \d+')
ENV = {"AGENT_PROVIDER": "demo", "AGENT_MODEL": "demo", "AGENT_WORKERS": "0", "AGENT_POLL_INTERVAL_MS": "250",
       "AGENT_JOB_TIMEOUT": "6", "AGENT_DEADLINE_MARGIN": "2", "AGENT_CALL_TIMEOUT_CAP": "3",
       "AGENT_MIN_CALL_SECONDS": "0.5", "AGENT_MCP_CONFIG": "off"}


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    """A Redis of this module's own: the hostile states and the turns sent after them touch no other test."""
    with PrivateRedis(tmp_path_factory.mktemp("hostile-redis")) as server:
        yield server


@pytest.fixture(scope="module")
def app_env(private):
    with page_environment(private.url, ENV):
        yield


# -- the page, and one tick of its in-flight fragment -------------------------------------------------


def polling(at: AppTest) -> bool:
    return any(getattr(node, "type", "") == "component_instance" or "autorefresh" in repr(getattr(node, "proto", ""))
               for node in walk(at._tree))


def _fragment_id(at: AppTest, function_name: str) -> str | None:
    """The id under which the last run registered the fragment `function_name` (its wrapper holds the function)."""
    for fragment_id, fragment in at._fragment_storage._fragments.items():
        cells = [cell.cell_contents for cell in fragment.__closure__ or ()]
        if any(getattr(cell, "__name__", "") == function_name for cell in cells):
            return fragment_id
    return None


def in_flight(at: AppTest) -> bool:
    """The page shows a turn in flight (its input is off for it)."""
    return "The input is off while this reply is being written" in texts(at)


def tick(at: AppTest) -> AppTest:
    """One tick as a browser asks for it: a rerun of the follower fragment alone, not of the whole page.
    AppTest has no call for that, so its script runner is handed the fragment's id as the browser's would be.
    Its run draws the state it reads; the hold that follows in a browser (following the event stream,
    then asking for another run) is left out, so the tick ends once drawn."""
    fragment_id = _fragment_id(at, "follow")
    assert fragment_id, "no follower on the page"
    fragment_rerun = functools.partial(RerunData, fragment_id_queue=[fragment_id])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("streamlit.testing.v1.local_script_runner.RerunData", fragment_rerun)
        mp.setattr("agent.ui.follower._hold", lambda *args, **kwargs: None)
        return at.run()


def assert_no_traceback(at: AppTest, case: object) -> None:
    assert not at.exception, (case, [e.value for e in at.exception])
    shown = texts(at)
    assert not TRACEBACK_RE.search(shown), (case, TRACEBACK_RE.search(shown))
    assert "Something went wrong" not in shown, (case, shown[-500:])


# -- the store, the lost-worker check and the CLI's printing -------------------------------------------


def test_every_hostile_state_reads_as_a_well_formed_state_or_as_unreadable(private):
    store = private.store
    started = time.process_time()
    for case in cases(store, SEED, STORE_CASES):
        try:
            state = store.read(case.cid)
        except UnreadableState as exc:
            assert case.unreadable, (str(case), str(exc))
            assert exc.reason and case.cid in str(exc)
            for reader in (store.read_meta, store.version):
                with contextlib.suppress(UnreadableState):
                    reader(case.cid)  # another reader may find the part it reads fine, but never raises otherwise
            continue
        assert not case.unreadable, str(case)
        assert_well_formed(state, case)
        assert_well_formed(store.read_meta(case.cid), case)
        assert store.version(case.cid) == state["version"]
        assert isinstance(lost_worker_check(store, private.queue_connection, case.cid), bool)
        _print_as_the_cli_does(store, private, case, state)
    assert time.process_time() - started < STORE_CASES * 0.05, "a hostile state must read in milliseconds"


def _print_as_the_cli_does(store, private, case: Case, state: dict) -> None:
    for printer in (TextLines(state["turn_id"]), JsonLines(state["turn_id"])):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            printer.print(state, final=True)
        assert not TRACEBACK_RE.search(out.getvalue()), case


def test_a_state_the_store_wrote_reads_back_exactly_as_written(private):
    store = private.store
    for status in ("queued", "running", "done", "failed"):
        cid, _ = base_state(store, status)
        state, keys = store.read(cid), Keys.of(cid)
        for name, family in (("history", "history"), ("steps", "step"), ("turns", "turn")):
            fields = stored_items(store, cid, family)
            stored = [json.loads(item) for item in store.redis.hmget(keys.tree, fields)] if fields else []
            if name == "turns":  # each with its place in the tree
                state[name] = [{k: v for k, v in t.items() if k not in ("parent_turn_id", "siblings")}
                               for t in state[name]]
            assert state[name] == stored, (status, name)
        doc = json.loads(store.redis.hget(keys.meta, "doc"))
        assert {k: state[k] for k in CARRIED_FIELDS} == {k: doc.get(k) for k in CARRIED_FIELDS}, status


def test_a_history_item_that_is_not_a_message_is_shown_as_its_text_and_the_others_as_they_are(private):
    store = private.store
    for raw in [*WRONG_VALUES, *NOT_JSON, NOT_UTF8[0]]:
        cid, _ = base_state(store, "done")
        before = store.read(cid)["history"]
        overwrite(store, cid, stored_items(store, cid, "history")[1], raw)
        history = store.read(cid)["history"]
        assert history[:1] + history[2:] == before[:1] + before[2:], raw[:80]
        shown = history[1]
        assert shown["role"] == "assistant" and "could not be read" in shown["content"], raw[:80]
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        assert text[:100] in shown["content"], (raw[:80], shown["content"][:300])


# -- the page --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("app_env")
def test_the_page_draws_every_hostile_state_or_says_it_cannot_be_read_and_the_next_message_is_sent(private):
    store = private.store
    ticked = sent = 0
    for case in cases(store, SEED + 1, PAGE_CASES, private.queue):
        at = page(case.cid)
        at.run()
        assert_no_traceback(at, case)
        shown = texts(at)
        if case.unreadable:
            assert "cannot be read" in shown, (str(case), shown[-800:])
            assert at.query_params.get("c") != case.cid  # a new chat: the unreadable one is not followed
        else:
            assert "cannot be read" not in shown, (str(case), shown[-800:])
        if in_flight(at):
            assert polling(at), case
            tick(at)
            assert_no_traceback(at, case)
            assert polling(at), f"the polling stopped: {case}"
            ticked += 1
            continue
        # Not in flight: the input is on, and the next message is sent (to a new chat if unreadable).
        assert not at.chat_input[0].disabled, case
        at.chat_input[0].set_value("And 18*23?").run()
        assert_no_traceback(at, case)
        sent_to = at.query_params["c"]
        assert (sent_to != case.cid) if case.unreadable else (sent_to == case.cid), case
        after = store.read(sent_to)
        assert after["history"][-1] == {"role": "user", "content": "And 18*23?"}, case
        assert not after["done"] and after["job_id"], case
        sent += 1
        private.queue.empty()  # no worker here: the turns sent are checked as queued, then dropped
    assert ticked >= PAGE_CASES // 5 and sent >= PAGE_CASES // 5, (ticked, sent)  # both paths were taken


@pytest.mark.usefixtures("app_env")
def test_a_state_that_turns_unreadable_during_a_turn_is_said_on_the_next_tick_and_a_new_chat_works(private):
    store = private.store
    rng = random.Random(SEED + 2)
    for kind in ("meta_version", "meta_done", "meta_doc", "wrong_key_type") * 3:
        cid = new_id()
        submit_turn(store, private.queue, cid, "What is 17*23?", FAST)  # queued, with no worker: in flight
        at = page(cid)
        at.run()
        assert_no_traceback(at, kind)
        assert in_flight(at), kind
        raw = damage(store, rng, cid, kind)
        case = f"{kind}: {raw!r:.200}"
        with contextlib.suppress(redis.ResponseError):  # a version that is no number, or no hash, stays
            store.redis.hincrby(f"agent:conv:{cid}:meta", "version", 1)  # the version moves, as on a write
        store.redis.xadd(f"agent:conv:{cid}:events", {"v": "x"})  # wakes the tick's blocking read
        tick(at)  # the tick finds it unreadable and asks for a full run, which says so
        assert_no_traceback(at, case)
        assert "cannot be read" in texts(at), (case, texts(at)[-800:])
        at.chat_input[0].set_value("Start again").run()
        assert at.query_params["c"] != cid
        assert store.read(at.query_params["c"])["history"][-1]["content"] == "Start again"
        private.queue.empty()


@pytest.mark.usefixtures("app_env")
def test_after_hostile_states_a_real_turn_runs_to_its_answer_on_the_page(private, tmp_path):
    store = private.store
    rng = random.Random(SEED + 3)
    private.queue.empty()
    handle = start_pool(private.url, 1, tmp_path / "pool.log")
    try:
        for number, kind in enumerate(("history_item", "step_field", "turn_item", "doc_field", "meta_version")):
            case = make_case(store, rng, number, kind)
            store.redis.hset(f"agent:conv:{case.cid}:meta", "done", "1") if not case.unreadable else None
            at = page(case.cid)
            at.run()
            at.chat_input[0].set_value("What is 17*23?").run()
            cid = at.query_params["c"]
            final = wait_done(store, cid, timeout_s=TURN_TIMEOUT_S)
            assert final["status"] == "done", (str(case), final["history"][-1])
            at.run()
            assert_no_traceback(at, case)
            assert "17*23 = 391" in texts(at), case
    finally:
        stop_pool(handle, private.url)


@pytest.mark.usefixtures("app_env")
def test_a_part_of_the_page_that_fails_to_draw_is_said_in_a_sentence_and_the_polling_goes_on(private, monkeypatch):
    """Past the repaired state, a drawing bug: the guards say which part failed, never with a traceback,
    in a full run and in a tick of the in-flight fragment alone (which main() does not guard)."""
    store = private.store
    cid, _ = base_state(store, "done")
    submit_turn(store, private.queue, cid, "And 18*23?", FAST)  # the next turn waits: in flight

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a drawing bug")

    monkeypatch.setattr("agent.ui.render.tools_line", broken)  # an earlier turn's tool steps
    at = page(cid)
    at.run()
    assert_no_traceback(at, "full run")
    assert "Turn 1 could not be drawn (ZeroDivisionError)" in texts(at) and polling(at)
    monkeypatch.setattr("agent.ui.follower._in_flight", broken)  # the live part of the turn in flight
    tick(at)
    assert_no_traceback(at, "tick")
    assert "The reply being written could not be drawn (ZeroDivisionError)" in texts(at)
    assert polling(at), "the polling stopped"
    monkeypatch.setattr("agent.ui.state.poll", broken)  # the tick's own poll
    tick(at)
    assert_no_traceback(at, "tick with a failing poll")
    assert "could not be drawn (ZeroDivisionError)" in texts(at) and polling(at)
    private.queue.empty()


# -- the CLI as a process --------------------------------------------------------------------------------


def _cli(env: dict, *args: str) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "agent", *args], env=env, cwd=ROOT, capture_output=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


def test_the_cli_says_a_hostile_state_cannot_be_read_or_continues_it_and_never_shows_a_traceback(
        private, base_env, tmp_path):
    store = private.store
    rng = random.Random(SEED + 4)
    env = {**base_env, **ENV, "REDIS_URL": private.url}
    private.queue.empty()
    handle = start_pool(private.url, 1, tmp_path / "pool.log")
    try:
        for number in range(CLI_CASES):
            kind = ("meta_version", "meta_doc", "wrong_key_type", "meta_done")[number % 4] if number % 2 else (
                "history_item", "step_field", "turn_field", "tool_call_field")[number // 2 % 4]
            case = make_case(store, rng, number, kind)
            if not case.unreadable:
                store.redis.hset(f"agent:conv:{case.cid}:meta", "done", "1")  # ended: a next turn may start
            as_json = ("--json",) if number % 3 == 0 else ()
            code, out, err = _cli(env, "ask", *as_json, "--conversation", case.cid, "What is 17*23?")
            assert not TRACEBACK_RE.search(out + err), (str(case), err)
            if case.unreadable:
                assert code == 2 and "cannot be read" in err and "nothing was sent" in err, (str(case), err)
                assert len(err.strip().splitlines()) == 1, err
            else:
                assert code == 0 and "17*23 = 391" in out, (str(case), code, err[-500:])
        code, out, err = _cli(env, "ask", "What is 17*23?")  # and the next conversation works
        assert code == 0 and "17*23 = 391" in out, err
    finally:
        stop_pool(handle, private.url)


# -- the finding itself: nested brackets from the model, through a real turn ---------------------------------

BRACKETS = "[" * 1000 + "]" * 1000  # within the 2,000 characters a step keeps of a tool call's arguments
REPLY_DELAY_S = 10.0  # seconds the model takes over its answer: the page draws the turn in flight meanwhile


@pytest.mark.usefixtures("app_env")
def test_a_model_sending_a_thousand_nested_brackets_as_arguments_is_drawn_during_and_after_the_turn(
        private, scripted, tmp_path):
    store = private.store
    scripted.add(chat_reply(None, [tool_call("calculator", BRACKETS)]),
                 delayed(REPLY_DELAY_S, chat_reply("Those brackets were not arithmetic.")))  # drawn meanwhile
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1",
                               job_timeout_s=30, deadline_margin_s=5.0, call_timeout_cap_s=REPLY_DELAY_S + 5)
    private.queue.empty()
    handle = start_pool(private.url, 1, tmp_path / "pool.log")
    try:
        cid = new_id()
        submit_turn(store, private.queue, cid, "Add these up", config)
        wait_for(lambda: any(s.get("arguments") == BRACKETS for s in store.read(cid)["steps"]), TURN_TIMEOUT_S,
                 "the tool step with the brackets is written")
        at = page(cid)
        at.run()  # a full run draws the turn in flight
        assert_no_traceback(at, "full run during the turn")
        assert BRACKETS in texts(at) and polling(at)
        tick(at)  # a poll redraws it alone
        assert_no_traceback(at, "tick during the turn")
        assert BRACKETS in texts(at) and polling(at)
        assert not store.read(cid)["done"], "the page was to be drawn while the turn ran"
        final = wait_done(store, cid, timeout_s=TURN_TIMEOUT_S)
        assert final["status"] == "done", final["history"][-1]
        at.run()
        assert_no_traceback(at, "after the turn")
        shown = texts(at)
        assert BRACKETS in shown and "Those brackets were not arithmetic." in shown
        assert not at.chat_input[0].disabled  # ended: the input is back (an idle page still follows)
        at.chat_input[0].set_value("Thanks").run()  # and the next turn starts (the worker may answer it at once)
        assert [m["content"] for m in store.read(cid)["history"] if m["role"] == "user"][-1] == "Thanks"
    finally:
        stop_pool(handle, private.url)
