"""Many turns at once: throughput against workers, and where turns end against their deadline."""

from __future__ import annotations

import math
import statistics
import threading

from agent.queue import new_id
from agent.settings import TurnConfig
from bench.lab import ONE_CALL_MESSAGE, THREE_TOOL_MESSAGE, Lab, PoolProcess, submit
from harness.follow import wait_all_done
from harness.stats import percentile, summary

RSS_SAMPLE_S = 0.5  # seconds between memory samples while the turns run


class _RssSampler(threading.Thread):
    def __init__(self, pool: PoolProcess):
        super().__init__(daemon=True)
        self.pool = pool
        self.stopping = threading.Event()
        self.peak_mean_kib = 0.0
        self.peak_total_kib = 0

    def run(self) -> None:
        while not self.stopping.wait(RSS_SAMPLE_S):
            per_worker = self.pool.rss_per_worker_kib()
            if per_worker:
                self.peak_mean_kib = max(self.peak_mean_kib, statistics.mean(per_worker))
                self.peak_total_kib = max(self.peak_total_kib, sum(per_worker))


def warm_up(lab: Lab, workers: int) -> None:
    """One instant turn per worker (roughly), so imports and connections are not in the figures."""
    cids = [new_id() for _ in range(workers * 2)]
    for cid in cids:
        submit(lab, cid, ONE_CALL_MESSAGE, TurnConfig(model="demo@0~0"))
    wait_all_done(lab.client, cids, timeout_s=60)


def throughput(lab: Lab, pool: PoolProcess, turns: int, latency_s: float = 1.0) -> dict:
    """`turns` one-call turns (`latency_s` per call) submitted at once to `pool`; timings from the stored state."""
    config = TurnConfig(model=f"demo@{latency_s:g}~0")
    warm_up(lab, pool.workers)
    sampler = _RssSampler(pool)
    sampler.start()
    cids, submitted = [], {}
    for _ in range(turns):
        cid = new_id()
        _, submitted[cid] = submit(lab, cid, ONE_CALL_MESSAGE, config)
        cids.append(cid)
    ideal_s = turns / pool.workers * latency_s
    try:
        wait_all_done(lab.client, cids, timeout_s=max(60.0, 4 * ideal_s), tick_s=0.1)
    finally:
        sampler.stopping.set()
        sampler.join()
    ended, latencies, statuses = [], [], {}
    for cid in cids:
        final = lab.store.read_meta(cid)
        statuses[final["status"]] = statuses.get(final["status"], 0) + 1
        ended.append(final["updated_at"])
        latencies.append(final["updated_at"] - submitted[cid])
    makespan_s = max(ended) - min(submitted.values())
    return {
        "workers": pool.workers,
        "worker_class": pool.worker_class,
        "turns": turns,
        "statuses": statuses,
        "makespan_s": round(makespan_s, 2),
        "turns_per_s": round(turns / makespan_s, 3),
        "latency_per_call_s": latency_s,
        # The best any pool can do: ceil(turns / workers) rounds of one call each.
        "ideal_turns_per_s": round(turns / (math.ceil(turns / pool.workers) * latency_s), 3),
        "scaling_efficiency": round(turns / makespan_s / (turns / (math.ceil(turns / pool.workers) * latency_s)), 3),
        "latency_s": summary(latencies, 1, 2),
        "rss_mib_per_worker": round(sampler.peak_mean_kib / 1024, 1),
        "rss_mib_all_workers": round(sampler.peak_total_kib / 1024, 1),
    }


# Short clocks, so that deadlines bind: job timeout 5 s, margin 2 s -> deadline 3 s after start.
DEADLINE_CLOCKS = dict(job_timeout_s=5, deadline_margin_s=2.0, call_timeout_cap_s=2.0, connect_timeout_s=1.0,
                       min_call_s=0.5, max_steps=8)


def random_model(rng) -> tuple[str, str]:
    """(kind, model): mostly healthy at a random latency, some slower than the cap, some hanging, some 429s."""
    roll = rng.random()
    if roll < 0.5:
        return "fast", f"demo@{rng.uniform(0.05, 1.5):.3f}"
    if roll < 0.7:
        return "slow", f"demo@{rng.uniform(1.5, 4.0):.3f}"  # calls that can outlive the cap or the deadline
    if roll < 0.85:
        return "hang", "demo:hang"
    return "flaky", f"demo:flaky@{rng.uniform(0.05, 1.0):.3f}"  # 429 with Retry-After, then success


def deadline_accuracy(lab: Lab, pool: PoolProcess, turns: int, rng, clocks: dict | None = None) -> dict:
    """`turns` three-tool turns with random providers; for each, final write - deadline, and the same
    against the job timeout (which must stay negative: the turn ended before the queue would kill it)."""
    clocks = clocks or DEADLINE_CLOCKS
    warm_up(lab, pool.workers)
    cids, providers = [], {}
    for _ in range(turns):
        cid = new_id()
        kind, model = random_model(rng)
        providers[kind] = providers.get(kind, 0) + 1
        submit(lab, cid, THREE_TOOL_MESSAGE, TurnConfig(model=model, **clocks))
        cids.append(cid)
    wait_all_done(lab.client, cids, timeout_s=max(60.0, 2 * clocks["job_timeout_s"] * turns / pool.workers), tick_s=0.2)
    to_deadline, to_job_timeout, statuses, kinds = [], [], {}, {}
    for cid in cids:
        final = lab.store.read_meta(cid)
        statuses[final["status"]] = statuses.get(final["status"], 0) + 1
        kind = (final["error"] or {}).get("kind", "answer")
        kinds[kind] = kinds.get(kind, 0) + 1
        to_deadline.append(final["updated_at"] - final["deadline_at"])
        to_job_timeout.append(final["updated_at"] - final["job_timeout_at"])
    past_deadline = [d for d in to_deadline if d > 0]
    return {
        "turns": turns,
        "clocks": clocks,
        "providers": providers,
        "statuses": statuses,
        "endings": kinds,
        "final_write_minus_deadline_ms": {
            **summary(to_deadline, 1000, 1),
            "p5": round(percentile(to_deadline, 5) * 1000, 1),
            "p99": round(percentile(to_deadline, 99) * 1000, 1),
        },
        "turns_past_deadline": len(past_deadline),
        "max_past_deadline_ms": round(max(past_deadline) * 1000, 1) if past_deadline else 0.0,
        "final_write_minus_job_timeout_ms": summary(to_job_timeout, 1000, 1),
        "turns_past_job_timeout": sum(1 for d in to_job_timeout if d >= 0),
        "killed_by_queue": kinds.get("job_timeout", 0),
        "histogram_ms": _histogram([d * 1000 for d in to_deadline]),
    }


def _histogram(values_ms: list[float], width_ms: int = 250) -> dict:
    """Counts per bucket of `width_ms`, keyed by the bucket's lower edge."""
    buckets: dict[int, int] = {}
    for v in values_ms:
        edge = int(v // width_ms) * width_ms
        buckets[edge] = buckets.get(edge, 0) + 1
    return {str(k): buckets[k] for k in sorted(buckets)}
