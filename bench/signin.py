"""Sign-in and fair share: what a shared demo's sign-in buys and costs (agent/conversation/people.py,
PersonStore, agent/queue.py's share).

Three figures. Fairness: one person's backlog of turns does not hold back another's first turn (with the
share, the backlog waits outside the queue; without it, one FIFO queue puts the newcomer behind all of it).
A person's list costs the same Redis commands with 10,000 conversations across 100 owners as with 20. And
what sign-in adds to a page's first draw (AppTest, the server's run of app.py, not the browser).

`python -m bench.signin [--quick]` runs this section alone on a lab of its own and prints its figures.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import redis

from agent.conversation.keys import INDEX_KEY, Keys, person_conversations
from agent.conversation.listing import list_conversations
from agent.conversation.people import person_id
from agent.conversation.person_store import PersonStore
from agent.conversation.store import Store
from agent.hosting.worker_process import DEFAULT_WORKER_CLASS
from agent.queue import job_status, new_id, submit_turn
from agent.settings import TurnConfig
from bench.conversations import LIST_PAGE, write_turn
from bench.lab import Lab
from bench.plans import Plan, run_alone
from harness.stats import summary
from harness.waiting import wait_for

WORKERS = 2
SHARE = WORKERS  # the page's share: one turn per worker (agent/ui/state.py)
ISSUER = "https://bench.invalid/oidc"  # never reached: the people are made from claims, as a sign-in would
A_MESSAGE = "What is 1+2, and what time is it?"  # the demo model calls two tools: three model calls a turn
B_MESSAGE = "What is 3*3?"
CALLS_PER_TURN = 3  # A_MESSAGE's model calls
# B arrives this many of A's model calls after A's first turns start: half a turn in, the mean of an arrival
# at a random moment. (Arriving as they start, B waits the whole turn with the share, plus the handoff.)
B_ARRIVES_AFTER_CALLS = 1.5
OBSERVE_S = 60.0  # seconds to wait for any one event other than the turns' ends
PAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(PAGE_DIR, "app.py")
PAGE_RUN_TIMEOUT_S = 30  # one AppTest run, on a loaded machine
# A sign-in configuration for the page; its provider is never asked: AppTest seeds the signed-in identity.
AUTH = {"redirect_uri": "http://localhost:8501/oauth2callback", "cookie_secret": "x" * 32, "client_id": "bench",
        "client_secret": "bench", "server_metadata_url": "http://127.0.0.1:9/.well-known/openid-configuration"}
PAGE_ENV = {"AGENT_WORKERS": "0", "AGENT_PROVIDER": "demo", "AGENT_MODEL": "demo@0~0"}


def slow(call_s: float) -> TurnConfig:
    """The demo model at `call_s` a call, with clocks loose enough for a loaded machine."""
    return TurnConfig(model=f"demo@{call_s:g}~0", job_timeout_s=60, deadline_margin_s=5.0, call_timeout_cap_s=20.0)


# -- 1. fairness ---------------------------------------------------------------------------------


def _ended(lab: Lab, cid: str, timeout_s: float, what: str) -> dict:
    """The conversation's state once its turn has ended. The figures are the state's own stamps, so a slow
    look (every 0.2 s) loses nothing, and takes less of the CPU the turns share."""
    return wait_for(lambda: (s := lab.store.read(cid)) is not None and s["done"] and s, timeout_s, what, poll_s=0.2)


def warm_up(lab: Lab) -> None:
    """One instant turn per worker, at once: the first turn of a freshly started worker is slower."""
    config = TurnConfig(model="demo@0~0")
    ids = [new_id() for _ in range(WORKERS)]
    for cid in ids:
        submit_turn(lab.store, lab.queue, cid, A_MESSAGE, config)
    for cid in ids:
        _ended(lab, cid, OBSERVE_S, "a warm-up turn ends")


def backlog_then_one(lab: Lab, turns: int, call_s: float, share: int) -> dict:
    """Person A submits `turns` turns; once WORKERS of them run, and B_ARRIVES_AFTER_CALLS of their model calls
    later, person B submits one; every turn is followed to its end. B's wait: its turn's enqueued_at to its
    started_at (the turn summary's), against one turn's duration (the median of A's turns' started_at to
    ended_at)."""
    tag = f"share-{share}-{new_id()}"
    as_a = PersonStore(lab.store, person_id(ISSUER, f"a-{tag}"), max_turns=turns)
    as_b = PersonStore(lab.store, person_id(ISSUER, f"b-{tag}"), max_turns=turns)
    config = slow(call_s)
    backlog = [new_id() for _ in range(turns)]
    for cid in backlog:
        submit_turn(as_a, lab.queue, cid, A_MESSAGE, config, share=share)
    running = min(WORKERS, turns)
    wait_for(lambda: sum(lab.store.read_meta(cid)["status"] == "running" for cid in backlog) >= running,
             OBSERVE_S, f"{running} of A's turns running", poll_s=0.05)
    time.sleep(B_ARRIVES_AFTER_CALLS * call_s)
    statuses = [job_status(lab.queue_connection, lab.store.read_meta(cid)["job_id"]) for cid in backlog]
    queued_before_b = lab.queue.count
    newcomer = new_id()
    submit_turn(as_b, lab.queue, newcomer, B_MESSAGE, config, share=share)
    budget = OBSERVE_S + turns * 4 * CALLS_PER_TURN * call_s  # generous for a loaded machine
    b_state = _ended(lab, newcomer, budget, "B's turn ends")
    a_states = [_ended(lab, cid, budget, "A's turn ends") for cid in backlog]
    b_turn = b_state["turns"][-1]
    a_turns = [s["turns"][-1] for s in a_states]
    b_wait = b_turn["started_at"] - b_turn["enqueued_at"]
    one_turn = statistics.median(t["ended_at"] - t["started_at"] for t in a_turns)
    # What B waited for with the share: a worker, i.e. the first end among A's turns that were running.
    ahead = [t for t in a_turns if t["started_at"] < b_turn["enqueued_at"]]
    first_end = min((t["ended_at"] for t in ahead), default=None)
    return {
        "share": share, "a_turns": turns, "workers": WORKERS,
        "a_turns_done": sum(s["status"] == "done" for s in a_states), "b_done": b_state["status"] == "done",
        "a_held_outside_queue_at_b_submit": statuses.count("rate_limited"),
        "queue_length_at_b_submit": queued_before_b,
        "a_started_before_b": sum(t["started_at"] < b_turn["started_at"] for t in a_turns),
        "b_wait_s": round(b_wait, 3), "one_turn_s": round(one_turn, 3), "b_wait_turns": round(b_wait / one_turn, 2),
        "a_running_at_b_submit": len(ahead),
        "b_arrived_after_a_start_s": round(b_turn["enqueued_at"] - max(t["started_at"] for t in ahead), 3),
        "b_start_after_first_end_ms": None if first_end is None else round((b_turn["started_at"] - first_end) * 1000,
                                                                             1),
        "a_turn_s": summary([t["ended_at"] - t["started_at"] for t in a_turns], 1, 2),
        "a_running_turn_s": summary([t["ended_at"] - t["started_at"] for t in ahead], 1, 2),
        "queue_left": lab.queue.count,
    }


def fairness(lab: Lab, turns: int, call_s: float) -> dict:
    """Figure 1: the same backlog with a person's share, then without it (share 0: one FIFO queue)."""
    warm_up(lab)
    return {"with_share": backlog_then_one(lab, turns, call_s, SHARE),
            "without_share": backlog_then_one(lab, turns, call_s, 0),
            "call_s": call_s, "message": A_MESSAGE, "b_arrives_after_calls": B_ARRIVES_AFTER_CALLS}


# -- 2. a person's list --------------------------------------------------------------------------


def fill_others(client: redis.Redis, owners: list[str], per_owner: int, ttl_s: int) -> None:
    """`per_owner` ended conversations for each of `owners`, written by hand as the scripts leave them: the
    meta hash's list fields and owner, an entry in the owner's index and in the global one (1,000 a round-trip)."""
    now = time.time()
    rows = [(owner, new_id(), i) for owner in owners for i in range(per_owner)]
    for start in range(0, len(rows), 1000):
        with client.pipeline(transaction=False) as pipe:
            for owner, cid, i in rows[start:start + 1000]:
                meta = Keys.of(cid).meta
                pipe.hset(meta, mapping={"title": f"What is {i}*17, and why?", "turns": 1, "done": "1",
                                         "version": 4, "owned_by": owner, "turn_id": new_id()})
                pipe.expire(meta, ttl_s)
                pipe.zadd(person_conversations(owner), {cid: now - i})
                pipe.zadd(INDEX_KEY, {cid: now - i})
            pipe.execute()


def _commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far, INFO itself left out."""
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()
            if k != "cmdstat_info"}


def commands_of(store: Store) -> dict[str, int]:
    """The Redis commands one listing of a page sends: INFO commandstats before and after (nothing else runs)."""
    before = _commands(store.redis)
    list_conversations(store, limit=LIST_PAGE)
    after = _commands(store.redis)
    return {k: n - before.get(k, 0) for k, n in sorted(after.items()) if n - before.get(k, 0)}


def list_per_owner(lab: Lab, owners: int, conversations: int, repeats: int) -> dict:
    """Figure 2: one person's list at 20 conversations in all, and at `conversations` across `owners` owners
    (theirs among them), each in a database of its own on the same Redis, so that the two are listed in turns."""
    per_owner = conversations // owners
    pool = lab.client.connection_pool  # the same client settings as the lab's own, on database 1
    small_client = redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class,
                                                          **{**pool.connection_kwargs, "db": 1}))
    try:
        small = Store(small_client, ttl_s=lab.store.ttl_s)
        alone = person_id(ISSUER, "lists-alone")
        small_store = PersonStore(small, alone)
        for i in range(LIST_PAGE):
            write_turn(small_store, new_id(), i)
        measured = person_id(ISSUER, "lists-0")
        big_store = PersonStore(lab.store, measured)
        for i in range(per_owner):  # the measured person's own, through the store's scripts
            write_turn(big_store, new_id(), i)
        fill_others(lab.client, [person_id(ISSUER, f"lists-{n}") for n in range(1, owners)], per_owner,
                    lab.store.ttl_s)
        stored = {"small": small_client.zcard(INDEX_KEY), "big": lab.client.zcard(INDEX_KEY)}
        assert stored == {"small": LIST_PAGE, "big": owners * per_owner}, stored
        shown = {"small": len(list_conversations(small_store, limit=LIST_PAGE).conversations),
                 "big": len(list_conversations(big_store, limit=LIST_PAGE).conversations)}
        assert shown == {"small": LIST_PAGE, "big": min(LIST_PAGE, per_owner)}, shown
        counted = {"small": commands_of(small_store), "big": commands_of(big_store)}
        times: dict[str, list[float]] = {"small": [], "big": []}
        for i in range(repeats):
            for name in (("small", "big") if i % 2 == 0 else ("big", "small")):
                store = small_store if name == "small" else big_store
                started = time.perf_counter()
                list_conversations(store, limit=LIST_PAGE)
                times[name].append(time.perf_counter() - started)
    finally:
        with contextlib.suppress(redis.RedisError):
            small_client.flushdb()
        small_client.close()
    ratios = [b / s for s, b in zip(times["small"], times["big"], strict=True)]
    row = lambda name, total, theirs: {  # noqa: E731
        "conversations": total, "owners": 1 if name == "small" else owners, "theirs": theirs,
        "redis_commands": sum(counted[name].values()), "by_command": counted[name],
        "list_ms_p50": round(statistics.median(times[name]) * 1000, 3)}
    return {"page_rows": LIST_PAGE, "repeats": repeats,
            "rows": [row("small", stored["small"], LIST_PAGE), row("big", stored["big"], per_owner)],
            "time_ratio_big_vs_small": round(statistics.median(ratios), 3)}


# -- 3. the page's first draw ----------------------------------------------------------------------


@contextlib.contextmanager
def page_environment(redis_url: str) -> Iterator[None]:
    """The app reads its settings from the environment; its services are process-wide, so they are stopped
    (and Streamlit's resource cache cleared) when the figure is done."""
    env = {"REDIS_URL": redis_url, **PAGE_ENV}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        import streamlit as st

        from agent.hosting import services

        with contextlib.suppress(Exception):
            services.shutdown()
        st.cache_resource.clear()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def draw(signed: bool) -> float:
    """Seconds of one AppTest run of app.py for a new session on an empty chat: signed in, or local."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=PAGE_RUN_TIMEOUT_S)
    if signed:
        at.secrets["auth"] = AUTH
        at.user = {"is_logged_in": True, "iss": ISSUER, "sub": "page-person", "email": "page@example.org"}
    started = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - started
    assert not at.exception, [e.value for e in at.exception]
    assert at.chat_input and not at.chat_input[0].disabled, "the chat input is not drawn"
    captions = " ".join(str(c.value) for c in at.sidebar.caption)
    assert ("Signed in as" in captions) is signed, captions
    return elapsed


def first_draw(redis_url: str, pairs: int, warmup: int = 2) -> dict:
    """Figure 3: AppTest runs of the page, signed in and local, in turns (A B, B A, ...), after `warmup` of
    each; ratio = signed in / local per pair, median."""
    runs: dict[str, list[float]] = {"signed_in": [], "local": []}
    with page_environment(redis_url):
        for _ in range(warmup):
            draw(False)
            draw(True)
        for i in range(pairs):
            for signed in ((False, True) if i % 2 == 0 else (True, False)):
                runs["signed_in" if signed else "local"].append(draw(signed))
    ratios = [s / plain for s, plain in zip(runs["signed_in"], runs["local"], strict=True)]
    return {"pairs": pairs, "warmup": warmup,
            "signed_in_ms": summary(runs["signed_in"], 1000, 1), "local_ms": summary(runs["local"], 1000, 1),
            "ratio": round(statistics.median(ratios), 3), "ratio_p95": summary(ratios, 1, 3)["p95"]}


def signin_figures(lab: Lab, plan: Plan, say: Callable[[str], None] = lambda _: None) -> dict:
    out = {}
    pool = lab.pool(WORKERS, DEFAULT_WORKER_CLASS)
    try:
        say(f"sign-in: one person's {plan.signin_turns} turns, then another's one, with a share of {SHARE} and "
            f"without ({WORKERS} workers)")
        out["fairness"] = fairness(lab, plan.signin_turns, plan.signin_call_s)
    finally:
        lab.stop_pool(pool)  # flushes the database too
    say(f"sign-in: a person's list at {LIST_PAGE} conversations and at {plan.signin_list_conversations:,} across "
        f"{plan.signin_list_owners} owners")
    out["list_per_owner"] = list_per_owner(lab, plan.signin_list_owners, plan.signin_list_conversations,
                                           plan.signin_list_repeats)
    lab.client.flushdb()
    say(f"sign-in: the page's first draw (AppTest), signed in against local, {plan.signin_page_pairs} pairs")
    out["first_draw"] = first_draw(lab.url, plan.signin_page_pairs)
    lab.client.flushdb()
    return out


def goals(section: dict) -> dict:
    fair, rows = section["fairness"]["with_share"], section["list_per_owner"]["rows"]
    return {"signin_fair_share": fair["b_wait_s"] <= fair["one_turn_s"],
            "signin_list_flat": rows[0]["redis_commands"] == rows[-1]["redis_commands"]}


def main(argv: list[str] | None = None) -> int:
    return run_alone("python -m bench.signin", __doc__, lambda lab, plan, args, say: signin_figures(lab, plan, say=say),
                     goals, argv)


if __name__ == "__main__":
    sys.exit(main())
