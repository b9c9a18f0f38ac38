"""A turn outlives its worker: how soon a SIGKILLed worker's turn goes on, whether it ends `done`, and
what the heartbeat, the pool's watch, and storing each side effect's start before it runs cost
(agent/turn/heartbeat.py, agent/hosting/turn_watch.py, agent/turn/tool_runs.py).

`python -m bench.resume [--quick]` runs this section alone on a lab of its own and prints its figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rq import Worker
from rq.serializers import JSONSerializer

from agent.conversation.keys import RUNNING_KEY, Keys, turn_alive
from agent.hosting.turn_watch import WATCH_S, TurnWatch
from agent.hosting.worker_process import DEFAULT_WORKER_CLASS
from agent.queue import new_id
from agent.settings import TurnConfig
from agent.turn import heartbeat
from bench.lab import Lab, PoolProcess, submit
from bench.plans import run_alone
from bench.tracing_cost import _turn_s
from harness.processes import alive
from harness.stats import summary
from harness.waiting import wait_for

WORKERS = 4  # a killed worker's turn needs an idle one; the pool restarts the dead one meanwhile
RESUME_GOAL_S = 5.0  # p95, kill to the resumed attempt's first write
SIDE_EFFECT_GOAL_MS = 50.0  # p50: what storing 16 side effects' starts adds to a turn (a model call takes seconds)
WATCHED_TURNS = 100  # running turns fabricated for the watch's Redis cost
OBSERVE_S = 30.0  # seconds to wait for any one event
TURN_S = 90.0  # seconds for a resumed turn to end (default clocks: a 120 s job timeout)

# Default clocks and heartbeat; only the demo model is slowed so that a kill lands where it should.
KILLED = {
    "call": ("hello", TurnConfig(model="demo@3~0")),  # one model call of 3 s
    "stream": ("hello", TurnConfig(model="demo@0.3~30")),  # a 288-character reply streamed over ~10 s
    "tool": ("slow 4", TurnConfig(model="demo@0.2~0")),  # the demo model calls wait(4)
}


def _worker_of(lab: Lab, job_id: str) -> int | None:
    for worker in Worker.all(connection=lab.queue_connection, serializer=JSONSerializer):
        if worker.pid and alive(worker.pid) and worker.get_current_job_id() == job_id:
            return worker.pid
    return None


def _idle_workers(lab: Lab) -> int:
    return sum(1 for w in Worker.all(connection=lab.queue_connection, serializer=JSONSerializer)
               if w.pid and alive(w.pid) and not w.get_current_job_id())


def _read_when(lab: Lab, cid: str, predicate: Callable[[dict], object], timeout_s: float, what: str) -> dict:
    return wait_for(lambda: (s := lab.store.read(cid)) is not None and predicate(s) and s, timeout_s, what,
                    poll_s=0.02)


def _into(kind: str, state: dict) -> bool:
    """The turn is where a kill of this kind should land."""
    if kind == "stream":
        return bool(state["live"] and len(state["live"]["text"]) >= 30)
    if kind == "tool":
        return any(c["function"]["name"] == "wait" for m in state["history"] for c in m.get("tool_calls") or [])
    return state["status"] == "running"


def kill_once(lab: Lab, kind: str, rng: random.Random) -> dict:
    """Submit a turn, SIGKILL its worker once mid-call / mid-stream / mid-tool, follow it to its end."""
    message, config = KILLED[kind]
    cid = new_id()
    submit(lab, cid, message, config)
    first = _read_when(lab, cid, lambda s: _into(kind, s) and s["job_id"], OBSERVE_S, f"the turn is mid-{kind}")
    pid = wait_for(lambda: _worker_of(lab, first["job_id"]), OBSERVE_S, "the worker running the turn", poll_s=0.02)
    if kind != "stream":
        time.sleep(rng.uniform(0.2, 1.8))  # a random phase against the heartbeat, still inside the 3 s / 4 s
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    resumed = _read_when(lab, cid, lambda s: _resume_step(s), OBSERVE_S, "the resumed attempt's first write")
    seen_at = time.time()
    final = _read_when(lab, cid, lambda s: s["done"], TURN_S, "the resumed turn ends")
    return {"kind": kind, "status": final["status"], "attempt": final["attempt"],
            # the resumed job stamps its resume step, then writes it: its first write
            "kill_to_first_write_s": round(_resume_step(resumed)["ended_at"] - killed_at, 3),
            "kill_to_seen_s": round(seen_at - killed_at, 3)}


def _resume_step(state: dict) -> dict | None:
    return next((s for s in state["steps"] if s["kind"] == "resume" and s["turn_id"] == state["turn_id"]), None)


def _ready(lab: Lab, pool: PoolProcess) -> None:
    wait_for(lambda: _idle_workers(lab) >= pool.workers, OBSERVE_S, "every worker back and idle")


def kills(lab: Lab, pool: PoolProcess, call_kills: int, other_rounds: int, rng: random.Random) -> dict:
    """`call_kills` mid-call kills one at a time (the timing); then `other_rounds` rounds of a mid-stream
    and a mid-tool kill side by side (whether they end `done`)."""
    runs = []
    for _ in range(call_kills):
        _ready(lab, pool)
        runs.append(kill_once(lab, "call", rng))
    for _ in range(other_rounds):
        _ready(lab, pool)
        with ThreadPoolExecutor(max_workers=2) as both:
            rounds = [both.submit(kill_once, lab, kind, random.Random(rng.random())) for kind in ("stream", "tool")]
            runs += [r.result(OBSERVE_S * 2 + TURN_S) for r in rounds]
    survived = {kind: {"killed": sum(r["kind"] == kind for r in runs),
                       "done": sum(r["kind"] == kind and r["status"] == "done" for r in runs)}
                for kind in KILLED}
    timing = [r["kill_to_first_write_s"] for r in runs if r["kind"] == "call"]
    return {
        "kill_to_first_write_s": summary(timing, 1, 2),
        "kill_to_seen_s": summary([r["kill_to_seen_s"] for r in runs if r["kind"] == "call"], 1, 2),
        "survival": survived,
        "done_share": round(sum(r["status"] == "done" for r in runs) / len(runs), 3),
        "runs": runs,
    }


def heartbeat_overhead(lab: Lab, pool: PoolProcess, pairs: int, latency_s: float) -> dict:
    """The three-tool turn in this process with its heartbeat (as always now) and with `heartbeat.beating`
    swapped for a no-op, back to back, order alternating; ratio = on / off per pair, median."""
    os.environ["REDIS_URL"] = lab.url
    os.environ["AGENT_DEMO_URL"] = pool.demo_url
    config = TurnConfig(model=f"demo@{latency_s:g}~0")
    beating = heartbeat.beating

    @contextlib.contextmanager
    def no_beat(*args, **kwargs):
        yield

    def turn_s(on: bool) -> float:
        heartbeat.beating = beating if on else no_beat
        try:
            return _turn_s(lab, config)[0]
        finally:
            heartbeat.beating = beating

    turn_s(True)  # warm: imports, the HTTP session
    on, off = [], []
    for i in range(pairs):
        for beat in ((True, False) if i % 2 else (False, True)):
            (on if beat else off).append(turn_s(beat))
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return {"ratio": round(statistics.median(ratios), 4), "ratios": [round(r, 4) for r in ratios],
            "on_s": summary(on, 1, 3), "off_s": summary(off, 1, 3)}


SIDE_EFFECT_CALLS = 16  # a reply's tool calls, the most one reply may run


class _Calls16:
    """An in-process model: one reply of SIDE_EFFECT_CALLS calls of `tool`, then the answer."""

    def __init__(self, tool: str):
        self.tool, self.replied = tool, False

    def complete(self, messages, tools, timeout, stop=None, on_text=None):
        from agent.providers.base import Completion, ToolCall

        if self.replied:
            return Completion("done")
        self.replied = True
        return Completion(None, [ToolCall(f"c{i}", self.tool, json.dumps({"n": i}))
                                 for i in range(SIDE_EFFECT_CALLS)])


def side_effect_cost(lab: Lab, pairs: int) -> dict:
    """A turn of 16 calls of a tool that is not safe to repeat (each call's start stored before it runs, its
    result written as it returns) against the same turn whose tool is safe to repeat (results in batches):
    in this process, on the lab's Redis, the model answering at once, so the figure is the writes' cost
    alone; back to back, order alternating; ratio = once / repeatable per pair, median."""
    from agent import tools
    from agent.turn import loop

    def bench_effect(n: int) -> str:
        """Not safe to repeat."""
        return f"effect {n}"

    def bench_repeatable(n: int) -> str:
        """Safe to repeat."""
        return f"repeatable {n}"

    bench_repeatable.safe_to_repeat = True
    for function in (bench_effect, bench_repeatable):
        tools.tool(function, source="bench")
    writes = {"n": 0}
    publish = type(lab.store).publish

    def counted(self, *args, **kwargs):
        writes["n"] += 1
        return publish(self, *args, **kwargs)

    make_provider = loop.make_provider
    config = TurnConfig(model="demo")

    def turn(tool: str) -> tuple[float, int]:
        cid, turn_id = new_id(), new_id()
        doc = {"status": "queued", "error": None, "config": config.to_dict(), "job_id": "job-" + turn_id,
               "enqueued_at": time.time()}
        lab.store.begin_turn(cid, turn_id, {"role": "user", "content": "16 calls"}, doc)
        loop.make_provider = lambda _: _Calls16(tool)
        writes["n"] = 0
        try:
            began = time.perf_counter()
            done = loop.Turn.create(lab.store, cid, turn_id, config, started_at=time.time(),
                                    history=[{"role": "user", "content": "16 calls"}], doc=dict(doc),
                                    persisted_len=1).run()
            took = time.perf_counter() - began
        finally:
            loop.make_provider = make_provider
        assert done == "done", done
        return took, writes["n"]

    type(lab.store).publish = counted
    try:
        turn("bench_effect")  # warm
        once, repeatable, once_writes, repeatable_writes = [], [], [], []
        for i in range(pairs):
            for tool in (("bench_effect", "bench_repeatable") if i % 2 else ("bench_repeatable", "bench_effect")):
                took, n = turn(tool)
                (once if tool == "bench_effect" else repeatable).append(took)
                (once_writes if tool == "bench_effect" else repeatable_writes).append(n)
    finally:
        type(lab.store).publish = publish
        for name in ("bench_effect", "bench_repeatable"):
            tools.REGISTRY.pop(name, None)
    ratios = [a / b for a, b in zip(once, repeatable, strict=True)]
    return {"calls": SIDE_EFFECT_CALLS, "ratio": round(statistics.median(ratios), 3),
            "once_ms": summary(once, 1000, 1), "repeatable_ms": summary(repeatable, 1000, 1),
            "extra_ms_p50": round((statistics.median(once) - statistics.median(repeatable)) * 1000, 1),
            "once_writes": statistics.median(once_writes), "repeatable_writes": statistics.median(repeatable_writes)}


def _commands(lab: Lab) -> dict[str, tuple[int, int]]:
    """(calls, usec) per command, INFO itself left out."""
    stats = lab.client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (v["calls"], v["usec"]) for k, v in stats.items() if k != "cmdstat_info"}


def _rate(lab: Lab, seconds: int, tick: Callable[[], None]) -> dict:
    """Redis commands (and server CPU) per second while `tick` runs once a second for `seconds`."""
    before = _commands(lab)
    start = time.monotonic()
    for n in range(seconds):
        tick()
        time.sleep(max(0.0, start + (n + 1) * WATCH_S - time.monotonic()))
    elapsed = time.monotonic() - start
    after = _commands(lab)
    delta = {k: (c - before.get(k, (0, 0))[0], u - before.get(k, (0, 0))[1]) for k, (c, u) in after.items()}
    delta = {k: v for k, v in delta.items() if v[0]}
    return {"commands_per_s": round(sum(c for c, _ in delta.values()) / elapsed, 1),
            "by_command_per_s": {k: round(c / elapsed, 1) for k, (c, _) in sorted(delta.items())},
            "redis_cpu_us_per_s": round(sum(u for _, u in delta.values()) / elapsed, 1)}


def watch_cost(lab: Lab, seconds: int, turns: int = WATCHED_TURNS, supervisors: int = 1,
               heartbeats: bool = True) -> dict:
    """`turns` running turns fabricated (meta, a live mark and lease), no pool on this Redis; then
    `supervisors` watches each sweep once a second, and apart from them `turns` heartbeats a second
    (Flags.beat), spread over the second as the turns' own threads would be."""
    flags = lab.store.flags
    ids = [(new_id(), new_id()) for _ in range(turns)]
    with lab.client.pipeline(transaction=False) as pipe:
        for cid, turn_id in ids:
            pipe.hset(Keys.of(cid).meta, mapping={"turn_id": turn_id, "done": "0", "writer": f"job-{turn_id}",
                                                  "attempt": "0"})
        pipe.execute()
    for cid, turn_id in ids:  # alive throughout: a lease far past the run's end
        flags.start_running(cid, turn_id, f"job-{turn_id}", (seconds * 3 + 60) * 1000)
    try:
        watches = [TurnWatch(lab.store, lab.queue_connection) for _ in range(supervisors)]

        def sweep_all() -> None:
            for watch in watches:
                watch.sweep()

        sweeping = _rate(lab, seconds, sweep_all)
        assert all(watch.resumed == 0 for watch in watches), "a fabricated turn was taken for lost"
        per_supervisor = {k: (round(v / supervisors, 1) if isinstance(v, float) else
                              {c: round(n / supervisors, 1) for c, n in v.items()}) for k, v in sweeping.items()}
        beating = None
        if heartbeats:
            def beats() -> None:
                start = time.monotonic()
                for i, (cid, turn_id) in enumerate(ids):
                    time.sleep(max(0.0, start + i * WATCH_S / turns - time.monotonic()))
                    flags.beat(cid, turn_id, f"job-{turn_id}", (seconds * 3 + 60) * 1000)

            beating = _rate(lab, seconds, beats)
    finally:
        with lab.client.pipeline(transaction=False) as pipe:
            pipe.delete(RUNNING_KEY)
            for cid, turn_id in ids:
                pipe.delete(Keys.of(cid).meta, turn_alive(turn_id))
            pipe.execute()
    return {"turns": turns, "supervisors": supervisors, "seconds": seconds, "watch_per_supervisor": per_supervisor,
            "heartbeats": beating}


WATCH_SIZES = (10, 100, 1000, 10_000)  # running turns for the watch's cost, flat in this if it holds
WATCH_FLAT_GOAL_PER_S = 10.0  # commands/s per supervisor at every size: a few small reads a second, whatever runs


def watch_scaling(lab: Lab, seconds: int, sizes: tuple[int, ...] = WATCH_SIZES) -> list[dict]:
    """The watch's Redis commands per second per supervisor at each of `sizes`, with 1 and 5 supervisors."""
    rows = []
    for n in sizes:
        for k in (1, 5):
            cost = watch_cost(lab, seconds, n, k, heartbeats=False)
            per_s = cost["watch_per_supervisor"]["commands_per_s"]
            rows.append({"turns": n, "supervisors": k, "commands_per_s": per_s})
    return rows


def resume_figures(lab: Lab, *, call_kills: int, other_rounds: int, watch_seconds: int, pairs: int,
                   latency_s: float, rng: random.Random, say: Callable[[str], None] = lambda _: None) -> dict:
    say(f"resume: the watch's Redis commands over {WATCHED_TURNS} running turns")
    out = {"watch_redis": watch_cost(lab, watch_seconds)}
    sizes = WATCH_SIZES if watch_seconds > 1 else WATCH_SIZES[::2]  # the quick plan: 10 and 1,000
    say(f"resume: the watch's Redis commands at {', '.join(map(str, sizes))} running turns, 1 and 5 supervisors")
    out["watch_scaling"] = watch_scaling(lab, watch_seconds, sizes)
    say(f"resume: {SIDE_EFFECT_CALLS} side-effecting calls against {SIDE_EFFECT_CALLS} that are safe to repeat")
    out["side_effect_cost"] = side_effect_cost(lab, pairs)
    pool = lab.pool(WORKERS, DEFAULT_WORKER_CLASS)
    try:
        say("resume: the heartbeat on and off")
        out["heartbeat_overhead"] = heartbeat_overhead(lab, pool, pairs, latency_s)
        say(f"resume: {call_kills} workers SIGKILLed mid-call, {other_rounds} x mid-stream and mid-tool")
        out |= kills(lab, pool, call_kills, other_rounds, rng)
    finally:
        lab.stop_pool(pool)
    return out


def goals(section: dict) -> dict:
    return {"resume_kill_to_first_write_p95": section["kill_to_first_write_s"]["p95"] <= RESUME_GOAL_S,
            "resume_done_share": section["done_share"] == 1.0,
            "heartbeat_overhead_ratio": section["heartbeat_overhead"]["ratio"] <= 1.02,
            "side_effect_extra_ms_p50": section["side_effect_cost"]["extra_ms_p50"] <= SIDE_EFFECT_GOAL_MS,
            "watch_flat": max(r["commands_per_s"] for r in section["watch_scaling"]) <= WATCH_FLAT_GOAL_PER_S}


def main(argv: list[str] | None = None) -> int:
    return run_alone("python -m bench.resume", __doc__, lambda lab, plan, args, say: resume_figures(
        lab, call_kills=plan.resume_call_kills, other_rounds=plan.resume_other_rounds,
        watch_seconds=plan.watch_seconds, pairs=plan.overhead_pairs, latency_s=plan.latency_s,
        rng=random.Random(args.seed), say=say),
        goals, argv, add_arguments=lambda parser: parser.add_argument("--seed", type=int, default=1))


if __name__ == "__main__":
    sys.exit(main())
