"""The fourth clock: a turn's budget in tokens and US dollars, never exceeded, with a reserve for its answer.

Unit tests of the arithmetic (agent/spend.py, agent/prices.py), then turns on the session's real workers
against a model on loopback that counts tokens as a tokenizer does and honours max_tokens
(harness/token_model.py), in OpenAI's and Anthropic's shapes, streamed and plain.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid

import pytest

from agent.contract import Outcome, Status
from agent.conversation import daily
from agent.conversation.errors import DailyBudgetSpent
from agent.conversation.keys import person_day_spend
from agent.conversation.person_store import PersonStore
from agent.demo import tokens
from agent.prices import Price, load_prices, per_token_pusd, price_for, usd_to_pusd
from agent.queue import new_id, submit_turn
from agent.settings import Settings, SettingsError
from agent.spend import MIN_USEFUL_TOKENS, Spend, full_bound, input_bound
from agent.turn import approvals
from agent.turn.approvals import BY_PAGE
from harness.token_model import TokenModel
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, ask, wait_done
from tests.test_cli import cli, cli_env  # noqa: F401 (a fixture)
from tests.test_resume import (  # noqa: F401 (a fixture)
    OBSERVE_S,
    TURN_S,
    read_when,
    start_turn,
    workers,
)

PRICE = Price(2.0, 0.2, 8.0, 4096, "2026-12-05", "a test price")
ANSWER = {"role": "assistant", "content": "Here is what I found: 17 times 23 is 391."}


def call(n: int, expression: str = "17*23") -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{n}", "type": "function",
         "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}]}


def config_for(model: TokenModel, **changes):
    provider = "anthropic" if model.shape == "anthropic" else "openai"
    base_url = model.url if provider == "anthropic" else model.url + "/v1"
    return FAST.with_changes(provider=provider, model="counted", base_url=base_url,
                             price=PRICE.to_dict(), **{"job_timeout_s": 10, **changes})


def model_steps(state: dict) -> list[dict]:
    return [s for s in state["steps"] if s["kind"] == "model" and s["turn_id"] == state["turn_id"]]


def assert_bounds_held(state: dict, model: TokenModel) -> None:
    """Each call's input bound is at least what the model counted, and it wrote no more than its max_tokens."""
    steps = model_steps(state)
    assert len(steps) == len(model.counted), (steps, model.counted)
    for step, counted in zip(steps, model.counted, strict=True):
        assert step["input_bound"] >= counted.input_tokens, (step, counted)
        assert counted.max_tokens == step.get("max_tokens")
        if counted.max_tokens is not None:
            assert counted.output_tokens <= counted.max_tokens


def assert_within_budget(state: dict, model: TokenModel) -> None:
    spend = state["spend"]
    billed = sum(c.input_tokens + c.output_tokens for c in model.counted)
    assert spend["tokens"] >= billed, "charged less than the model counted"
    if spend["budget_tokens"] is not None:
        assert spend["tokens"] <= spend["budget_tokens"], spend
    if spend["budget_usd"] is not None:
        assert spend["pusd"] <= usd_to_pusd(spend["budget_usd"]), spend


# -- the arithmetic ------------------------------------------------------------------------------------


def test_prices_are_exact_in_picodollars_and_a_dated_model_name_has_its_familys_price():
    assert per_token_pusd(0.15) == 150_000 and per_token_pusd(0.075) == 75_000 and per_token_pusd(15) == 15_000_000
    assert usd_to_pusd(0.03) == 30_000_000_000
    assert price_for("claude-sonnet-4-5-20250929") == price_for("claude-sonnet-4-5") is not None
    assert price_for("demo:verbose@0.05~0") == price_for("demo") is not None
    assert price_for("llama3.2") is None


def test_a_prices_file_overrides_and_adds_and_a_bad_one_is_one_line(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"llama3.2": {"input": 0.1, "output": 0.2}, "gpt-4o-mini": {"input": 1, "output": 2}}))
    prices = load_prices(str(path))
    assert price_for("llama3.2", prices).cached_input == 0.1  # no cached price: the input's
    assert price_for("gpt-4o-mini", prices).input == 1
    env = {"AGENT_PRICES": str(path), "AGENT_PROVIDER": "openai", "AGENT_MODEL": "llama3.2",
           "OPENAI_BASE_URL": "http://localhost:11434/v1", "AGENT_TURN_BUDGET_USD": "0.05"}
    assert Settings.from_env(env).turn.budget_usd == 0.05
    path.write_text(json.dumps({"x": {"input": -1, "output": 1}}))
    with pytest.raises(SettingsError, match="AGENT_PRICES: .*input must be US dollars"):
        Settings.from_env({**env, "AGENT_MODEL": "x"})


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("AGENT_TURN_BUDGET_TOKENS", "12", "must be at least 1000"),
    ("AGENT_TURN_BUDGET_TOKENS", "lots", "must be a whole number"),
    ("AGENT_TURN_BUDGET_USD", "-1", "must be more than 0"),
    ("AGENT_TURN_BUDGET_USD", "nan", "must be more than 0"),
    ("AGENT_USER_DAILY_BUDGET_USD", "a dollar", "must be an amount of US dollars"),
])
def test_a_bad_budget_is_refused_naming_its_variable(variable, value, words):
    with pytest.raises(SettingsError, match=f"{variable}: {words}"):
        Settings.from_env({variable: value})


def test_a_dollar_budget_for_a_model_without_a_price_is_refused_but_a_token_budget_is_not():
    env = {"AGENT_PROVIDER": "openai", "AGENT_MODEL": "llama3.2", "OPENAI_BASE_URL": "http://localhost:11434/v1"}
    with pytest.raises(SettingsError, match="AGENT_TURN_BUDGET_USD: the model 'llama3.2' has no price"):
        Settings.from_env({**env, "AGENT_TURN_BUDGET_USD": "0.05"})
    with pytest.raises(SettingsError, match="AGENT_USER_DAILY_BUDGET_USD: the model 'llama3.2' has no price"):
        Settings.from_env({**env, "AGENT_USER_DAILY_BUDGET_USD": "1"})
    assert Settings.from_env({**env, "AGENT_TURN_BUDGET_TOKENS": "20000"}).turn.budget_tokens == 20_000
    assert Settings.from_env({}).turn.price is not None  # the demo model has a price


def test_the_cli_refuses_a_dollar_budget_for_a_model_without_a_price_in_one_line(base_env):
    env = {**base_env, "AGENT_PROVIDER": "openai", "AGENT_MODEL": "llama3.2",
           "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "AGENT_TURN_BUDGET_USD": "0.05"}
    result = subprocess.run([sys.executable, "-m", "agent", "ask", "hi"], env=env, cwd=ROOT, capture_output=True,
                            timeout=60)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "AGENT_TURN_BUDGET_USD" in lines[0] and "no price" in lines[0], lines
    assert result.stdout == b""


def test_a_useful_call_keeps_the_answers_reserve_and_the_last_call_may_spend_it():
    spend = Spend(budget_tokens=10_000)
    plan = spend.plan(2000, last_call=False)
    assert plan is not None and plan.max_tokens >= MIN_USEFUL_TOKENS
    # The call's worst case and the answer after it (its input grown by the call's output) fit the budget.
    assert plan.worst_tokens + plan.reserve_tokens <= 10_000
    assert spend.plan(4800, last_call=False) is None, "no room for the call and the answer after it"
    last = spend.plan(4800, last_call=True)
    assert last is not None and last.max_tokens == 4096, "at most the model's output cap"
    spend.charge(last)  # not reported: its worst case
    assert spend.spent_tokens == 4800 + 4096 and not spend.over()
    assert spend.spent_tokens + spend.plan(1000, last_call=True).worst_tokens == 10_000, "the rest, to the token"


def test_a_call_that_did_not_report_is_charged_its_worst_case_and_one_in_flight_when_its_worker_is_lost():
    spend = Spend(budget_pusd=usd_to_pusd(0.05), price=PRICE)
    plan = spend.plan(1500, last_call=False)
    charge = spend.charge(plan, input_tokens=1000, output_tokens=None)
    assert charge.worst and charge.tokens == 1000 + plan.max_tokens
    assert charge.pusd == 1000 * PRICE.input_pusd + plan.max_tokens * PRICE.output_pusd
    second = spend.plan(1200, last_call=False)
    spend.start(second)
    resumed = Spend.for_turn(FAST.with_changes(budget_usd=0.05), spend.to_doc())  # as a resumed job reads it
    assert resumed.spent_pusd == charge.pusd + second.worst_pusd


def test_the_input_bound_holds_for_any_text_a_tokenizer_splits():
    import random

    rng = random.Random(7)
    alphabet = "abc xyz 123 ,.;!? é ß 漢字 🙂\n\t\"\\"
    for _ in range(200):
        messages = [{"role": rng.choice(["user", "assistant", "tool"]),
                     "content": "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))}
                    for _ in range(rng.randint(1, 6))]
        assert full_bound(messages, []) >= tokens.request_tokens(messages)
    # The bound from the last call's count grows by the bytes added since, no more.
    history = [{"role": "user", "content": "what is 17*23?"}]
    first = full_bound(history, [])
    reply = call(1)
    grown = history + [reply, {"role": "tool", "tool_call_id": "call_1", "content": "391"}]
    from agent.spend import Sent

    sent = Sent(first=history[0], count=1, last=history[0], had_tools=False,
                tokens=tokens.request_tokens(history) + tokens.reply_tokens(reply))
    bound = input_bound(grown, [], 3, sent)
    assert tokens.request_tokens(grown) <= bound < first + full_bound(grown[1:], [])


# -- turns on real workers -------------------------------------------------------------------------------


pytestmark_pool = pytest.mark.usefixtures("pool")


@pytestmark_pool
@pytest.mark.parametrize(("shape", "usage", "plain"), [
    ("openai", "asked", False), ("openai", "always", True), ("openai", "never", False),
    ("anthropic", "always", False), ("anthropic", "always", True), ("anthropic", "never", False)])
def test_the_bounds_hold_against_a_model_that_counts_as_a_tokenizer(store, queue, shape, usage, plain):
    with TokenModel([call(1), call(2, "2+2"), ANSWER], shape=shape, usage=usage, plain=plain) as model:
        cid = ask(store, queue, "What is 17*23, and 2+2?", config_for(model, budget_tokens=60_000))
        state = wait_done(store, cid)
    assert state["status"] == Status.DONE, state["error"]
    assert state["history"][-1]["content"] == ANSWER["content"]
    assert_bounds_held(state, model)
    assert_within_budget(state, model)
    steps = model_steps(state)
    assert all(s.get("cost_worst") is (True if usage == "never" else None) for s in steps), steps
    if usage != "never":  # reported: charged exactly what was counted, in tokens and dollars
        assert state["spend"]["tokens"] == sum(c.input_tokens + c.output_tokens for c in model.counted)
        assert all(s["cost_usd"] == pytest.approx((s["usage"]["input_tokens"] * 2 + s["usage"]["output_tokens"] * 8)
                                                  / 1e6) for s in steps)
        # Past the first call, the bound comes from the last call's count: tight, not the bytes' 3-4x.
        assert steps[1]["input_bound"] < 1.5 * steps[1]["usage"]["input_tokens"]


@pytestmark_pool
def test_a_budget_that_fits_no_useful_call_ends_the_turn_at_its_first_call_with_an_answer(store, queue):
    with TokenModel([call(1), ANSWER]) as model:
        cid = ask(store, queue, "What is 17*23?", config_for(model, budget_tokens=3000))
        state = wait_done(store, cid)
    assert len(model.bodies) == 1, [(s.get("input_bound"), s.get("max_tokens"), s.get("usage")) for s in state["steps"]]
    [body] = model.bodies
    assert "tools" not in body, "the last call goes without tools"
    assert state["status"] == Status.DONE
    answer, sentence = state["history"][-2:]
    assert answer["content"] == ANSWER["content"]
    assert sentence["content"].startswith("The budget for this turn is spent, so I answered with what I had")
    assert "tokens was kept for the answer" in sentence["content"]
    assert_bounds_held(state, model)
    assert_within_budget(state, model)
    assert model_steps(state)[0]["last_call"] is True


@pytestmark_pool
def test_a_budget_no_answer_fits_ends_the_turn_with_a_sentence_and_no_call(store, queue):
    with TokenModel([ANSWER]) as model:
        cid = ask(store, queue, "Tell me about this. " * 250, config_for(model, budget_tokens=1000))
        state = wait_done(store, cid)
    assert model.counted == []
    assert state["status"] == Status.FAILED and state["error"]["kind"] == "budget"
    assert "The budget for this turn is spent" in state["history"][-1]["content"]
    [skip] = [s for s in state["steps"] if s["kind"] == "skip"]
    assert skip["outcome"] == Outcome.SKIPPED and skip["detail"].startswith("budget:")
    assert state["spend"]["tokens"] == 0


@pytestmark_pool
@pytest.mark.parametrize("shape", ["openai", "anthropic"])
def test_a_budget_ends_a_turn_mid_tools_with_an_answer_inside_the_reserve(store, queue, shape):
    loop = [call(n, f"{n}+{n}") for n in range(1, 40)]
    with TokenModel([*loop, ANSWER], shape=shape) as model:  # it would call tools for ever: the budget ends it
        cid = ask(store, queue, "Add things up", config_for(model, budget_tokens=14_000, max_steps=40,
                                                         job_timeout_s=20, call_timeout_cap_s=5.0))
        state = wait_done(store, cid, timeout_s=40)
    tools = [s for s in state["steps"] if s["kind"] == "tool" and s["turn_id"] == state["turn_id"]]
    assert len(tools) >= 2, "some tools ran before the budget ended it"
    assert "tools" not in model.bodies[-1], "the last call goes without tools"
    assert state["status"] == Status.DONE, state["error"]
    assert state["history"][-1]["content"].startswith("The budget for this turn is spent")
    assert_bounds_held(state, model)
    assert_within_budget(state, model)
    assert state["spend"]["tokens"] > 14_000 * 0.5, "the budget was used, not left idle"


@pytestmark_pool
@pytest.mark.parametrize("safeguards", [True, False])
def test_a_long_answer_is_cut_at_its_last_call_with_the_clamp_and_overshoots_without_it(store, queue, safeguards):
    verbose = {"role": "assistant", "content": "Point. " * 3000}  # ~6,000 tokens
    with TokenModel([call(1), verbose]) as model:
        config = config_for(model, budget_usd=0.03, safeguards=safeguards, job_timeout_s=10)
        cid = ask(store, queue, "What is 17*23?", config)
        state = wait_done(store, cid, timeout_s=30)
    spend = state["spend"]
    assert spend["budget_usd"] == 0.03
    if safeguards:
        assert_within_budget(state, model)
        assert_bounds_held(state, model)
        assert model.counted[-1].output_tokens > model.counted[-1].max_tokens - 4, "the answer was cut at max_tokens"
        assert state["status"] == Status.DONE
    else:
        assert all(c.max_tokens is None for c in model.counted), "no clamp: checked only after each call"
        assert spend["pusd"] > usd_to_pusd(0.03), "the same turn overshoots"
        assert spend["checked"] == "after each call"
        assert "overshot it" in state["history"][-1]["content"]


@pytestmark_pool
def test_an_approvals_continuation_keeps_the_spend_so_far(store, queue):
    with TokenModel([call(1), ANSWER]) as model:
        config = config_for(model, budget_tokens=60_000, approve_tools=("calculator",))
        cid = ask(store, queue, "What is 17*23?", config)
        parked = read_when(store, cid, lambda s: s["status"] == Status.AWAITING_APPROVAL, OBSERVE_S, "parked")
        first_spend = parked["spend"]["tokens"]
        assert first_spend == model.counted[0].input_tokens + model.counted[0].output_tokens
        assert approvals.answer(store, queue, cid, Outcome.APPROVED, BY_PAGE).taken
        state = wait_done(store, cid)
    assert state["status"] == Status.DONE, state["error"]
    assert len(model.counted) == 2
    assert state["spend"]["tokens"] == first_spend + model.counted[1].input_tokens + model.counted[1].output_tokens
    [summary] = [t for t in state["turns"] if t["turn_id"] == state["turn_id"]]
    assert summary["spend"] == state["spend"]


def test_a_resume_after_a_lost_worker_keeps_the_spend_and_charges_the_lost_call_at_its_worst(
        private_redis, workers):  # noqa: F811
    workers(2)
    with TokenModel([call(1), ANSWER], delay_s=2.0) as model:
        config = config_for(model, budget_tokens=60_000, job_timeout_s=20, deadline_margin_s=3.0,
                            call_timeout_cap_s=10.0)
        cid, _, pid, _ = start_turn(private_redis, "What is 17*23?", config)
        flying = read_when(private_redis.store, cid, lambda s: (s["spend"] or {}).get("in_flight_tokens"), OBSERVE_S,
                           "the first call in flight")
        lost_worst = flying["spend"]["in_flight_tokens"]
        wait_for(lambda: model.counted, OBSERVE_S, "the first call's request at the model")
        import os
        import signal

        os.kill(pid, signal.SIGKILL)
        state = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert state["status"] == Status.DONE, state["error"]
    assert state["attempt"] == 1
    after = model.counted[1:]  # the lost call's request reached the model too: billed, perhaps
    assert state["spend"]["tokens"] == lost_worst + sum(c.input_tokens + c.output_tokens for c in after)
    assert state["spend"]["tokens"] >= sum(c.input_tokens + c.output_tokens for c in model.counted)
    assert state["spend"]["tokens"] <= 60_000


def test_no_call_starts_uncharged_while_redis_is_away(private_redis, workers):  # noqa: F811
    """A call under a budget waits for its charge to be saved: made while Redis was away, a worker lost after
    it would leave it charged nowhere. Redis stops while a tool runs, and is back 3 s after the tool ends."""
    workers(2)
    wait_call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "wait", "arguments": json.dumps({"seconds": 2})}}]}
    with TokenModel([wait_call, ANSWER]) as model:
        config = config_for(model, budget_tokens=60_000, job_timeout_s=30, deadline_margin_s=3.0,
                            call_timeout_cap_s=10.0, tool_timeout_cap_s=10.0)
        cid, _, _, _ = start_turn(private_redis, "wait 2 s, then answer", config)
        read_when(private_redis.store, cid, lambda s: (s.get("current_step") or {}).get("kind") == "tool", OBSERVE_S,
                  "the wait tool runs")
        private_redis.server.stop()
        try:
            time.sleep(5.0)  # the tool ends 2 s in; the next call would start at once
            calls_while_away = len(model.counted)
        finally:
            private_redis.server.acquire()
        state = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert calls_while_away == 1, "a model call started while its charge could not be saved"
    assert state["status"] == Status.DONE, state["error"]
    assert len(model.counted) == 2
    assert state["spend"]["tokens"] >= sum(c.input_tokens + c.output_tokens for c in model.counted)


def test_the_jobs_own_ending_charges_a_call_that_never_came_back(store):
    """The queue's alarm or a cold stop cuts a call inside the provider's client, not as a provider error: the
    ending the job writes then charges it at its worst case, as an ending written from outside does."""
    from agent.conversation.endings import Ending
    from agent.turn.writer import StateWriter

    cid, turn_id = new_id(), new_id()
    store.begin_turn(cid, turn_id, {"role": "user", "content": "hi"},
                     {"status": "queued", "error": None, "config": FAST.to_dict(), "job_id": "a-test-job",
                      "enqueued_at": time.time(), "deadline_at": None, "job_timeout_at": None, "started_at": None,
                      "current_step": None})
    spend = Spend(budget_tokens=10_000)
    spend.charge(spend.plan(1_000, last_call=False), 900, 40)
    spend.start(spend.plan(1_500, last_call=False))
    worst = spend.in_flight.worst_tokens
    writer = StateWriter(store, cid, turn_id, {"status": "running", "spend": spend.to_doc()}, persisted_len=1,
                         clock=time.time)
    assert writer.write_ending(Ending.app_stopped("its worker stopped with it"), time.time() + 30)
    state = store.read(cid)
    assert state["spend"]["tokens"] == 940 + worst and state["spend"]["in_flight_tokens"] == 0
    [summary] = [t for t in state["turns"] if t["turn_id"] == turn_id]
    assert summary["spend"]["tokens"] == 940 + worst


@pytestmark_pool
def test_a_persons_daily_budget_holds_across_two_tabs_sending_at_once(store, queue):
    person = f"p{uuid.uuid4().hex[:20]}"
    door = PersonStore(store, person)
    config = FAST.with_changes(budget_usd=0.04)  # the demo model: priced
    daily_usd = 0.045  # one turn's budget fits; what is left after it ($0.005) is less than a turn needs
    results: list = [None, None]

    def send(index: int) -> None:
        try:
            cid = new_id()
            submit_turn(door, queue, cid, "What is 17*23?", config, daily_budget_usd=daily_usd)
            results[index] = cid
        except DailyBudgetSpent as exc:
            results[index] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    sent = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, DailyBudgetSpent)]
    assert len(sent) == 1 and len(refused) == 1, results
    assert "renews at 00:00 UTC" in str(refused[0]) and "of your $0.0450 for today" in str(refused[0])
    state = wait_done(store, sent[0])
    assert state["config"]["budget_usd"] == 0.04 and state["config"]["daily"]["pusd"] == usd_to_pusd(0.04)
    day = person_day_spend(person, daily.today(state["updated_at"]))
    spent, reserved = wait_for(lambda: (lambda v: v if v[1] == b"0" else None)(
        store.redis.hmget(day, "spent", "reserved")), 10, "the turn's spend settled against the day")
    assert int(spent) == state["spend"]["pusd"] <= usd_to_pusd(0.04)
    # What is left of the day now pays for a smaller turn: its budget is what is left.
    left = usd_to_pusd(daily_usd) - int(spent)
    cid = new_id()
    submit_turn(door, queue, cid, "hi", config, daily_budget_usd=daily_usd)
    assert wait_done(store, cid)["config"]["daily"]["pusd"] == min(left, usd_to_pusd(0.04))


# -- the command line, the export, the trace ------------------------------------------------------------


def test_ask_prints_each_calls_cost_and_the_turns_on_stderr_and_json_carries_them(cli_env):  # noqa: F811
    env = {**cli_env, "AGENT_TURN_BUDGET_USD": "0.03"}
    text = cli(env, "ask", "What is 17*23?")
    assert text.returncode == 0, text.stderr
    err = text.stderr.decode()
    assert "[model call 1: " in err and ", max_tokens " in err and "$0.0" in err
    assert "[cost of this turn: $0.0" in err and "of a $0.0300 budget]" in err
    lines = cli(env, "ask", "--json", "What is 17*23?").stdout.decode().strip().splitlines()
    final = json.loads(lines[-1])
    assert final["spend"]["budget_usd"] == 0.03 and 0 < final["spend"]["pusd"] <= usd_to_pusd(0.03)
    assert all("cost_usd" in s and "max_tokens" in s for s in model_steps(final))


def test_the_markdown_export_says_each_turns_cost_and_the_conversations():
    from agent.conversation.export import to_markdown

    spend = {"tokens": 2000, "usd": 0.005, "pusd": 5_000_000_000, "budget_tokens": None, "budget_usd": 0.02}
    state = {"conversation_id": "c1", "history": [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "hello"}],
             "steps": [], "turns": [{"turn_id": "t1", "status": "done", "error": None, "spend": spend}],
             "turn_id": "t1", "done": True, "status": "done", "spend": spend}
    markdown = to_markdown(state, "a chat")
    assert "Cost of the conversation: $0.0050 (2,000 tokens)." in markdown
    assert "Cost: $0.0050 (2,000 tokens) of a $0.0200 budget." in markdown


@pytestmark_pool
def test_the_trace_carries_each_calls_cost_and_max_tokens_and_the_turns_spend(store, queue):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        cid = ask(store, queue, "What is 17*23?", FAST.with_changes(budget_usd=0.03))
        state = wait_done(store, cid)
        tracing.export_turn(tracing._tracer, state, state["turn_id"])
        spans = exporter.get_finished_spans()
    finally:
        tracing.use_provider(None)
        provider.shutdown()
    [turn] = [s for s in spans if s.name == tracing.TURN_SPAN]
    assert turn.attributes["agent.cost.usd"] == state["spend"]["usd"] and turn.attributes["agent.budget.usd"] == 0.03
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert calls and all(c.attributes["gen_ai.request.max_tokens"] > 0 and c.attributes["agent.call.cost_usd"] > 0
                         and c.attributes["gen_ai.usage.input_tokens"] > 0 for c in calls)
