"""Tools that ask a person first: what parked turns cost the rest of the pool (agent/turn/approvals.py).

Three figures. A turn of another conversation starts as soon with 100 turns parked on a request as with
none (a parked turn holds no worker). A request nobody answers expires within 2 s of its time (the pool's
watch, agent/hosting/turn_watch.py, looks once a second). And what that look costs Redis while requests
wait and none is due.

`python -m bench.approvals [--quick]` runs this section alone on a lab of its own and prints its figures.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from rq import Worker
from rq.serializers import JSONSerializer

from agent.contract import Kind, Outcome, Status
from agent.conversation.keys import APPROVALS_KEY
from agent.hosting.turn_watch import WATCH_S, TurnWatch
from agent.hosting.worker_process import DEFAULT_WORKER_CLASS
from agent.queue import job_status, new_id
from agent.settings import DEFAULT_POLL_INTERVAL_MS, TurnConfig
from agent.turn.approvals import expire_due
from bench.lab import ONE_CALL_MESSAGE, Lab, PoolProcess, submit
from bench.plans import run_alone
from bench.resume import _commands, _read_when
from harness.processes import alive
from harness.stats import summary
from harness.waiting import wait_for

WORKERS = 2
POLL_INTERVAL_S = DEFAULT_POLL_INTERVAL_MS / 1000  # the page's poll: the bound on a start's added delay
EXPIRY_GOAL_S = 2.0  # a request's expiry to the step that records it, at most
ASKING_MESSAGE = "what is 6*7?"  # the demo model calls the calculator: the turn asks first
PLAIN = TurnConfig(model="demo@0~0")  # one instant model call: what is left is the queue's own time
NEVER_S = 3600.0  # seconds: a request that waits the whole benchmark through
EXPIRIES_FROM_S, EXPIRIES_SPREAD_S = 2.0, 4.0  # expiring requests wait 2 to 6 s, evenly spread
LOOKS = 50  # looks of the watch counted for its Redis cost
OBSERVE_S = 60.0  # seconds to wait for any one event


def asking(timeout_s: float) -> TurnConfig:
    """The instant demo model, whose calculator asks first, and nobody answers for `timeout_s`."""
    return TurnConfig(model="demo@0~0", approve_tools=("calculator",), approval_timeout_s=timeout_s)


def _busy_workers(lab: Lab) -> int:
    return sum(1 for w in Worker.all(connection=lab.queue_connection, serializer=JSONSerializer)
               if w.pid and alive(w.pid) and w.get_current_job_id())


def start_delays(lab: Lab, runs: int, warmup: int = 0) -> list[float]:
    """Plain turns one at a time: enqueue (the state's enqueued_at) to the job's start (its started_at,
    RQ's stamp, the turn's first write carries it), each followed to its end."""
    delays = []
    for i in range(warmup + runs):
        cid = new_id()
        submit(lab, cid, ONE_CALL_MESSAGE, PLAIN)
        state = _read_when(lab, cid, lambda s: s["done"], OBSERVE_S, "a plain turn ends")
        if i >= warmup:
            delays.append(state["started_at"] - state["enqueued_at"])
        time.sleep(0.05)  # let the worker go back to waiting, as it would between users
    return delays


def _job_finished(lab: Lab, job_id: str) -> None:
    wait_for(lambda: job_status(lab.queue_connection, job_id) == "finished", OBSERVE_S, "the parking job to finish",
             poll_s=0.02)


def park_many(lab: Lab, count: int) -> list[str]:
    """`count` turns submitted at once, each confirmed parked (awaiting_approval) and its job finished."""
    ids = [new_id() for _ in range(count)]
    for cid in ids:
        submit(lab, cid, ASKING_MESSAGE, asking(NEVER_S))
    for cid in ids:
        state = _read_when(lab, cid, lambda s: s["status"] == Status.AWAITING_APPROVAL or s["done"], OBSERVE_S,
                           "a turn parks")
        assert state["status"] == Status.AWAITING_APPROVAL, f"{cid} ended {state['status']} instead of parking"
        _job_finished(lab, state["job_id"])
    return ids


def busy_while_parked(lab: Lab, samples: int = 10) -> int:
    """The most workers seen holding a job, sampled over a second, while the turns are parked."""
    seen = 0
    for _ in range(samples):
        seen = max(seen, _busy_workers(lab))
        time.sleep(1.0 / samples)
    return seen


def starts_beside_parked(lab: Lab, parked: int, runs: int) -> dict:
    """Figure 1: enqueue to start of a plain turn with nothing parked, then with `parked` turns parked."""
    before = start_delays(lab, runs, warmup=2)
    park_many(lab, parked)
    busy = busy_while_parked(lab)
    after = start_delays(lab, runs)
    alone, beside = summary(before, 1000, 1), summary(after, 1000, 1)
    return {"parked": parked, "parked_in_index": lab.store.flags.parked(), "busy_workers_while_parked": busy,
            "workers": WORKERS, "poll_interval_ms": DEFAULT_POLL_INTERVAL_MS,
            "start_ms_nothing_parked": alone, "start_ms_beside_parked": beside,
            "added_ms": {q: round(beside[q] - alone[q], 1) for q in ("p50", "p95")}}


def _expiry_step(state: dict) -> dict | None:
    return next((s for s in state["steps"] if s["kind"] == Kind.APPROVAL and s["turn_id"] == state["turn_id"]
                 and s["outcome"] == Outcome.EXPIRED), None)


def expiries(lab: Lab, count: int) -> dict:
    """Figure 2: `count` turns whose requests nobody answers, waiting 2 to 6 s; from each request's
    expires_at to the ended_at of the step that records its expiry (stamped by the watch that expired it)."""
    ids = []
    for i in range(count):
        cid = new_id()
        submit(lab, cid, ASKING_MESSAGE, asking(EXPIRIES_FROM_S + EXPIRIES_SPREAD_S * i / max(1, count - 1)))
        ids.append(cid)
    late, done = [], 0
    for cid in ids:
        state = _read_when(lab, cid, lambda s: s["done"], OBSERVE_S, "an expired turn ends")
        step = _expiry_step(state)
        assert step is not None, f"{cid} ended {state['status']} without an expired request"
        late.append(step["ended_at"] - state["approval"]["expires_at"])
        done += state["status"] == Status.DONE
    return {"requests": count, "after_expiry_s": summary(late, 1, 3), "goal_s": EXPIRY_GOAL_S,
            "turns_done": done, "waits_s": [EXPIRIES_FROM_S, EXPIRIES_FROM_S + EXPIRIES_SPREAD_S]}


def _per_look(lab: Lab, looks: int, look: Callable[[], None]) -> dict:
    """Redis commands (and server CPU) per call of `look`, from INFO commandstats deltas."""
    before = _commands(lab)
    for _ in range(looks):
        look()
    after = _commands(lab)
    delta = {k: (c - before.get(k, (0, 0))[0], u - before.get(k, (0, 0))[1]) for k, (c, u) in after.items()}
    delta = {k: v for k, v in delta.items() if v[0]}
    return {"commands_per_look": round(sum(c for c, _ in delta.values()) / looks, 2),
            "by_command_per_look": {k: round(c / looks, 2) for k, (c, _) in sorted(delta.items())},
            "redis_cpu_us_per_look": round(sum(u for _, u in delta.values()) / looks, 2)}


def watch_cost(lab: Lab, parked: int, looks: int = LOOKS) -> dict:
    """Figure 3: `parked` requests in the index of parked turns, none due for an hour, no pool on this Redis;
    the expiry look alone (expire_due), then the watch's whole look (TurnWatch.sweep, no turn running)."""
    now = time.time()
    lab.client.zadd(APPROVALS_KEY, {new_id(): now + NEVER_S for _ in range(parked)})
    try:
        watch = TurnWatch(lab.store, lab.queue_connection)
        expiry = _per_look(lab, looks, lambda: expire_due(lab.store, lab.queue))
        whole = _per_look(lab, looks, watch.sweep)
        assert watch.expired == 0, "a request not due was expired"
    finally:
        lab.client.delete(APPROVALS_KEY)
    return {"parked": parked, "looks": looks, "look_every_s": WATCH_S, "expiry_look": expiry, "whole_look": whole}


def approvals_figures(lab: Lab, *, parked: int, runs: int, expiring: int,
                      say: Callable[[str], None] = lambda _: None) -> dict:
    say(f"approvals: the watch's Redis commands per look over {parked} parked requests")
    out = {"watch_redis": watch_cost(lab, parked)}
    pool: PoolProcess = lab.pool(WORKERS, DEFAULT_WORKER_CLASS)
    try:
        say(f"approvals: a turn's start with nothing parked, then beside {parked} parked ({WORKERS} workers)")
        out["start_beside_parked"] = starts_beside_parked(lab, parked, runs)
        say(f"approvals: {expiring} requests nobody answers, expiring 2-6 s after they were asked")
        out["expiry"] = expiries(lab, expiring)
    finally:
        lab.stop_pool(pool)
    return out


def goals(section: dict) -> dict:
    starts = section["start_beside_parked"]
    return {"approvals_start_added_p95": starts["added_ms"]["p95"] <= DEFAULT_POLL_INTERVAL_MS,
            "approvals_no_worker_held": starts["busy_workers_while_parked"] == 0,
            "approvals_expiry_max": section["expiry"]["after_expiry_s"]["max"] <= EXPIRY_GOAL_S}


def main(argv: list[str] | None = None) -> int:
    return run_alone("python -m bench.approvals", __doc__, lambda lab, plan, args, say: approvals_figures(
        lab, parked=plan.approvals_parked, runs=plan.approvals_runs, expiring=plan.approvals_expiring, say=say),
        goals, argv)


if __name__ == "__main__":
    sys.exit(main())
