"""Per-turn latencies: dispatch (enqueue to start), queue overhead, and the first-step ratio."""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from rq.serializers import JSONSerializer

from agent.queue import SafeJob, new_id, submit_turn
from agent.settings import TurnConfig
from bench.lab import ONE_CALL_MESSAGE, THREE_TOOL_MESSAGE, Lab, NoQueue, PoolProcess, submit
from harness.follow import Follower, follow
from harness.stats import summary

INSTANT = TurnConfig(model="demo@0~0")  # a provider that answers at once: what is left is our own cost


def dispatch_latency(lab: Lab, pool: PoolProcess, turns: int, warmup: int) -> dict:
    """Enqueue to start, on idle workers, one turn at a time.

    `start_ms`: submit to the moment RQ hands the job to the job code (RQ's `started_at`,
    stamped in the process that runs the job: after the fork or spawn). `first_call_ms`: submit
    to the start of the turn's first model call, i.e. also importing the job code, reading the
    state and the first write. The second is what a user waits for.
    """
    start, first_call, total = [], [], []
    for i in range(warmup + turns):
        cid = new_id()
        turn_id, submitted_at = submit(lab, cid, ONE_CALL_MESSAGE, INSTANT)
        follow(lab.store, cid, event_driven=True, timeout_s=30)
        state = lab.store.read(cid)
        job = SafeJob.fetch(state["job_id"], connection=lab.queue_connection, serializer=JSONSerializer)
        if i < warmup:
            continue
        start.append(job.started_at.timestamp() - submitted_at)
        first_call.append(state["steps"][0]["started_at"] - submitted_at)
        total.append(state["turns"][-1]["ended_at"] - submitted_at)
        time.sleep(0.05)  # let the worker go back to waiting, as it would between users
    return {
        "start_ms": summary(start, 1000),
        "first_call_ms": summary(first_call, 1000),
        "turn_ms": summary(total, 1000),
        "idle_rss_mib_per_worker": pool.mean_rss_mib(),
    }


def _in_process_turn(lab: Lab, config: TurnConfig, message: str) -> float:
    """submit_turn's state writes without the enqueue, then the job function called directly."""
    from agent.turn import run_turn

    cid = new_id()
    begun = time.time()
    turn_id = submit_turn(lab.store, NoQueue(), cid, message, config)
    run_turn(cid, turn_id)
    return time.time() - begun


def queue_overhead(lab: Lab, pool: PoolProcess, pairs: int, latency_s: float = 1.0) -> dict:
    """The same 1-s-per-call turn through RQ and called in-process, started together, `pairs` times.

    Through RQ: submit to the final write seen by an event-driven client. In-process: the same
    submit (without the enqueue) to `run_turn` returning after its final write, in one long-lived
    thread of this process, so it keeps its HTTP session like a warm worker does.
    """
    os.environ["REDIS_URL"] = lab.url
    os.environ["AGENT_DEMO_URL"] = pool.demo_url
    config = TurnConfig(model=f"demo@{latency_s:g}~0")
    queued, direct, ratios = [], [], []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="in-process") as baseline:
        baseline.submit(_in_process_turn, lab, INSTANT, ONE_CALL_MESSAGE).result(30)  # warm, like the workers
        for _ in range(pairs):
            cid = new_id()
            in_process = baseline.submit(_in_process_turn, lab, config, THREE_TOOL_MESSAGE)
            _, submitted_at = submit(lab, cid, THREE_TOOL_MESSAGE, config)
            through_rq = follow(lab.store, cid, event_driven=True, timeout_s=60)[-1].at - submitted_at
            direct_s = in_process.result(60)
            queued.append(through_rq)
            direct.append(direct_s)
            ratios.append(through_rq / direct_s)
    return {
        "ratio": round(statistics.median(ratios), 4),
        "ratios": [round(r, 4) for r in ratios],
        "through_rq_s": summary(queued, 1, 3),
        "in_process_s": summary(direct, 1, 3),
    }


def first_step(lab: Lab, repeats: int, interval_s: float, rng, latency_s: float = 1.0) -> dict:
    """The three-tool turn at 1 s per call, published as it goes and written at the end, side by side.

    Each turn is followed by two clients at once: the event-driven poll (`wait_version`) and a
    plain poll every `interval_s` with a random phase. Ratio = (first tool step visible) /
    (final answer visible), both from submit.
    """
    as_you_go = TurnConfig(model=f"demo@{latency_s:g}~0")
    naive = TurnConfig(model=f"demo@{latency_s:g}~0", safeguards=False)
    rows = {"publish_as_you_go": [], "write_at_end": []}
    for _ in range(repeats):
        runs = []
        for label, config in (("publish_as_you_go", as_you_go), ("write_at_end", naive)):
            cid = new_id()
            event = Follower(lab.store, cid, event_driven=True, timeout_s=60)
            plain = Follower(lab.store, cid, event_driven=False, interval_s=interval_s,
                             phase_s=rng.uniform(0, interval_s), timeout_s=60)
            _, submitted_at = submit(lab, cid, THREE_TOOL_MESSAGE, config)
            event.start()
            plain.start()
            runs.append((label, submitted_at, event, plain))
        for label, submitted_at, event, plain in runs:
            row = {}
            for client, follower in (("event", event), ("plain", plain)):
                seen = follower.wait()
                first_tool = next(o.at for o in seen if o.tool_steps > 0)
                done = seen[-1].at
                row[client] = (first_tool - submitted_at, done - submitted_at)
            rows[label].append(row)

    def ratios(label: str, client: str) -> list[float]:
        return [r[client][0] / r[client][1] for r in rows[label]]

    out = {}
    for label in rows:
        out[label] = {
            client: {
                "ratio_median": round(statistics.median(ratios(label, client)), 3),
                "ratios": [round(x, 3) for x in ratios(label, client)],
                "first_tool_s": summary([r[client][0] for r in rows[label]], 1, 3),
                "final_answer_s": summary([r[client][1] for r in rows[label]], 1, 3),
            }
            for client in ("event", "plain")
        }
    return out
