"""Throughput across pools: one-call turns across several pools of `worker.py` on one Redis over TCP
(harness/fleet.py: Debian's redis-server 7 with its append-only file), against the ideal; the wait from enqueue
to start; what Redis spends per turn (INFO cpu); what a worker holds.

`python -m bench.fleet [--quick]` runs this section alone and prints its figures.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from agent.queue import new_id, submit_turn
from agent.settings import TurnConfig
from harness.fleet import Fleet
from harness.follow import wait_all_done
from harness.processes import children, rss_kib
from harness.stats import summary

EFFICIENCY_GOAL = 0.9  # turns/s against the ideal
RSS_SAMPLE_S = 2.0  # seconds between memory samples while the turns run (a sample reads 24 processes)
DONE_TICK_S = 1.0  # seconds between the bench's looks for the turns' ends (their times come from the state)
MESSAGE = "hello"  # the demo model answers without tools: one model call


class _Memory(threading.Thread):
    """Samples each worker's RSS (with its work horse, if any) across the fleet; keeps the peak mean and total."""

    def __init__(self, fleet: Fleet):
        super().__init__(daemon=True)
        self.fleet = fleet
        self.stopping = threading.Event()
        self.peak_mean_kib = 0.0
        self.peak_total_kib = 0

    def sample(self) -> list[int]:
        return [rss_kib(pid) + sum(rss_kib(c) for c in children(pid))
                for pool in self.fleet.members for pid, _ in pool.worker_processes()]

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of every worker process now running, its work horses included."""
        total = 0.0
        for pool in self.fleet.members:
            for pid, _ in pool.worker_processes():
                for process in [pid, *children(pid)]:
                    try:
                        times = psutil.Process(process).cpu_times()
                    except psutil.Error:
                        continue
                    total += times.user + times.system
        return total

    def record(self) -> None:
        per_worker = self.sample()
        if per_worker:
            self.peak_mean_kib = max(self.peak_mean_kib, statistics.mean(per_worker))
            self.peak_total_kib = max(self.peak_total_kib, sum(per_worker))

    def run(self) -> None:
        """A sample at once, then every RSS_SAMPLE_S until stopped, and a last one then (a short run has two)."""
        self.record()
        while not self.stopping.wait(RSS_SAMPLE_S):
            self.record()
        self.record()


def _submit_all(fleet: Fleet, turns: int, config: TurnConfig) -> dict[str, float]:
    submitted = {}
    for _ in range(turns):
        cid = new_id()
        submitted[cid] = time.time()
        submit_turn(fleet.store, fleet.queue, cid, MESSAGE, config)
    return submitted


def fleet_throughput(turns: int, pools: int, workers: int, latency_s: float, directory: Path,
                     say: Callable[[str], None] = print) -> dict:
    """`turns` one-call turns (`latency_s` a call) submitted at once to `pools` pools of `workers` simple workers."""
    total = pools * workers
    with Fleet(directory, pools=pools, workers=workers, pages=0, say=say) as fleet:
        say(f"fleet: {fleet.redis.kind} redis-server {fleet.redis.version()} on TCP, {pools} pools x {workers} "
            f"workers; {turns} turns of one {latency_s:g} s call")
        warm = _submit_all(fleet, total * 2, TurnConfig(model="demo@0~0"))  # imports and connections, not measured
        wait_all_done(fleet.client, list(warm), timeout_s=120)
        memory = _Memory(fleet)
        memory.start()
        cpu_before, workers_cpu_before = fleet.redis.cpu_s(), memory.cpu_s()
        submitted = _submit_all(fleet, turns, TurnConfig(model=f"demo@{latency_s:g}~0"))
        ideal_s = math.ceil(turns / total) * latency_s
        try:
            wait_all_done(fleet.client, list(submitted), timeout_s=max(120.0, 4 * ideal_s), tick_s=DONE_TICK_S)
        finally:
            memory.stopping.set()
            memory.join()
        redis_cpu_s = fleet.redis.cpu_s() - cpu_before
        workers_cpu_s = memory.cpu_s() - workers_cpu_before  # no worker restarted meanwhile: same processes
        finals = {cid: fleet.store.read_meta(cid) for cid in submitted}
        redis_version = fleet.redis.version()
    statuses: dict[str, int] = {}
    for final in finals.values():
        statuses[final["status"]] = statuses.get(final["status"], 0) + 1
    waits = [f["started_at"] - f["enqueued_at"] for f in finals.values() if f["started_at"] and f["enqueued_at"]]
    makespan_s = max(f["updated_at"] for f in finals.values()) - min(submitted.values())
    ideal = turns / ideal_s
    return {
        "redis": f"{fleet.redis.kind} {redis_version}",
        "pools": pools,
        "workers_per_pool": workers,
        "workers": total,
        "turns": turns,
        "latency_per_call_s": latency_s,
        "statuses": statuses,
        "makespan_s": round(makespan_s, 2),
        "turns_per_s": round(turns / makespan_s, 3),
        # The best any fleet can do: ceil(turns / workers) rounds of one call each.
        "ideal_turns_per_s": round(ideal, 3),
        "efficiency": round(turns / makespan_s / ideal, 3),
        "wait_enqueue_to_start_s": summary(waits, 1, 2),
        "latency_s": summary([f["updated_at"] - submitted[cid] for cid, f in finals.items()], 1, 2),
        "redis_cpu_ms_per_turn": round(redis_cpu_s / turns * 1000, 3),
        "redis_cpu_s": round(redis_cpu_s, 2),
        "workers_cpu_ms_per_turn": round(workers_cpu_s / turns * 1000, 1),
        "rss_mib_per_worker": round(memory.peak_mean_kib / 1024, 1),
        "rss_mib_all_workers": round(memory.peak_total_kib / 1024, 1),
    }


def goals(section: dict) -> dict:
    return {"fleet_throughput": section["efficiency"] >= EFFICIENCY_GOAL and set(section["statuses"]) == {"done"}}


def main(argv: list[str] | None = None) -> int:
    from bench.plans import FULL, QUICK, run_alone

    def figures(lab, plan, args, say):
        plan = QUICK if args.quick else FULL
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            return fleet_throughput(plan.fleet_turns, plan.fleet_pools, plan.fleet_workers, plan.fleet_latency_s,
                                    Path(tmp), say)

    return run_alone("python -m bench.fleet", __doc__, figures, goals, argv)


if __name__ == "__main__":
    sys.exit(main())
