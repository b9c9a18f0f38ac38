"""Redis cost against history length, and publish-to-observed latency for the two kinds of poll."""

from __future__ import annotations

import json
import threading
import time

from agent.conversation.store import Store
from agent.queue import new_id
from bench.lab import Lab
from harness.stats import percentile, summary

HISTORY_LENGTHS = (10, 100, 1000)


def _message(i: int) -> dict:
    """A realistic mix: user question, assistant tool call, tool result, assistant answer."""
    kind = i % 4
    if kind == 0:
        return {"role": "user", "content": f"Question {i}: what is {i}*17, and what time is it in Tokyo?"}
    if kind == 1:
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": f"{i}*17"})}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == 2:
        return {"role": "tool", "tool_call_id": f"call_{i - 1}", "content": str(i * 17)}
    return {"role": "assistant", "content": f"**{i - 3}*17 = {(i - 3) * 17}**. " + "The time in Tokyo is 09:41. " * 4}


def _step(i: int, turn_id: str) -> dict:
    now = time.time()
    return {"turn_id": turn_id, "index": i, "kind": "model", "name": "demo@1.0", "started_at": now - 1,
            "ended_at": now, "timeout_s": 60.0, "remaining_s": 99.0, "outcome": "ok", "duration_s": 1.0,
            "attempt": 1, "last_call": False, "tool_calls": 1}


def _doc(turn_id: str) -> dict:
    return {"status": "running", "error": None, "deadline_at": time.time() + 100, "job_timeout_at": time.time() + 120,
            "started_at": time.time(), "enqueued_at": time.time(), "current_step": None,
            "config": {"provider": "demo", "model": "demo@1.0"}, "job_id": f"turn-{turn_id}"}


def _net_bytes(lab: Lab) -> tuple[int, int]:
    stats = lab.client.info("stats")
    return int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])


def _measure(lab: Lab, operation, targets: list) -> dict:
    """Time each call, and count the bytes on the wire (both ways) per call from Redis's own counters."""
    baseline_in, baseline_out = _net_bytes(lab)
    empty_in, empty_out = _net_bytes(lab)  # what the INFO round-trip itself adds
    info_in, info_out = empty_in - baseline_in, empty_out - baseline_out
    before_in, before_out = _net_bytes(lab)
    times = []
    for target in targets:
        started = time.perf_counter()
        operation(target)
        times.append(time.perf_counter() - started)
    after_in, after_out = _net_bytes(lab)
    n = len(targets)
    return {
        "bytes": round(((after_in - before_in - info_in) + (after_out - before_out - info_out)) / n),
        "bytes_sent": round((after_in - before_in - info_in) / n),
        "bytes_received": round((after_out - before_out - info_out) / n),
        "time_us": summary(times, 1e6, 0),
    }


def history_cost(lab: Lab, samples: int) -> list[dict]:
    """Per history length: a publish of one round-trip (one message, one step), a no-change poll,
    and for contrast a full-state read and a whole-state rewrite (one JSON blob per write).

    Each sample is a separate conversation prepared to exactly that length, so the length does
    not drift while it is measured. Nothing else talks to Redis meanwhile.
    """
    store = lab.store
    rows = []
    for length in HISTORY_LENGTHS:
        convs = []
        for _ in range(samples):
            cid, tid = new_id(), new_id()
            store.begin_turn(cid, tid, _message(0), _doc(tid))
            history = [_message(i) for i in range(1, length)]
            store.publish(cid, tid, _doc(tid), new_messages=history, new_steps=[_step(1, tid)])
            convs.append((cid, tid))
        publish_args = {cid: (tid, _message(length), _step(2, tid)) for cid, tid in convs}
        store.publish(*convs[0], _doc(convs[0][1]))  # loads the script, so what follows is EVALSHA
        store.publish(*convs[0], _doc(convs[0][1]))
        full_state = {cid: json.dumps(store.read(cid)) for cid, _ in convs}

        def publish(cid: str, args=publish_args) -> None:
            tid, message, step = args[cid]
            store.publish(cid, tid, _doc(tid), new_messages=[message], new_steps=[step])

        def rewrite(cid: str, blobs=full_state) -> None:
            lab.client.set(f"bench:rewrite:{cid}", blobs[cid], ex=60)

        cids = [cid for cid, _ in convs]
        row = {
            "messages": length,
            "publish": _measure(lab, publish, cids),
            "poll_no_change": _measure(lab, store.version, cids),
        }
        # What a follower knew one message ago: its next read fetches just that message.
        known = {}
        for cid in cids:
            state = store.read(cid)
            known[cid] = {**state, "history": state["history"][:-1]}
        rows.append({
            **row,
            "poll_one_new_message": _measure(lab, lambda cid, known=known: store.read_since(cid, known[cid]), cids),
            "contrast_full_read": _measure(lab, store.read, cids),
            "contrast_whole_state_rewrite": _measure(lab, rewrite, cids),
        })
        lab.client.flushdb()
    return rows


class _Publisher(threading.Thread):
    """Writes new steps to one in-flight conversation at random intervals; records when."""

    def __init__(self, store: Store, cid: str, tid: str, duration_s: float, gaps: list[float]):
        super().__init__(daemon=True)
        self.store, self.cid, self.tid, self.duration_s, self.gaps = store, cid, tid, duration_s, gaps
        self.published: list[tuple[int, float]] = []  # (version, time the write was sent)

    def run(self) -> None:
        end = time.time() + self.duration_s
        for i, gap in enumerate(self.gaps):
            time.sleep(gap)
            if time.time() > end:
                break
            sent = time.time()
            version = self.store.publish(self.cid, self.tid, _doc(self.tid), new_steps=[_step(i, self.tid)])
            self.published.append((version, sent))


class _Watcher(threading.Thread):
    """A client following the version: plain poll at an interval, or the event-driven wait."""

    def __init__(self, store: Store, cid: str, event_driven: bool, interval_s: float, phase_s: float, until: float):
        super().__init__(daemon=True)
        self.store, self.cid, self.event_driven = store, cid, event_driven
        self.interval_s, self.phase_s, self.until = interval_s, phase_s, until
        self.seen: list[tuple[int, float]] = []  # (version, time first seen)
        self.commands = 0

    def run(self) -> None:
        seen = self.store.version(self.cid)
        next_tick = time.time() + self.phase_s
        while time.time() < self.until:
            if self.event_driven:
                version = self.store.wait_version(self.cid, seen, int(self.interval_s * 1000))
                self.commands += 2  # XREAD BLOCK, then HGET
            else:
                time.sleep(max(0.0, next_tick - time.time()))
                next_tick += self.interval_s
                version = self.store.version(self.cid)
                self.commands += 1
            if version != seen:
                self.seen.append((version, time.time()))
                seen = version


def publish_to_observed(lab: Lab, conversations: int, duration_s: float, interval_s: float, rng) -> dict:
    """For every write, the time until a client first sees that version (or a later one).

    Each conversation gets a writer publishing at random gaps (0.2-2 s, like model and tool
    round-trips) and two clients at once: a plain poll every `interval_s` with a random phase,
    and the event-driven wait with the same interval as its bound.
    """
    store = lab.store
    # A fast plain poll for contrast: the interval a poll would need for a p50 near 100 ms.
    clients = (("plain_poll", False, interval_s), ("plain_poll_fast", False, interval_s / 5),
               ("event_driven", True, interval_s))
    publishers, watchers = [], {label: [] for label, _, _ in clients}
    until = time.time() + duration_s + 2 * interval_s
    for _ in range(conversations):
        cid, tid = new_id(), new_id()
        store.begin_turn(cid, tid, _message(0), _doc(tid))
        gaps = [rng.uniform(0.2, 2.0) for _ in range(int(duration_s / 0.2) + 1)]
        publishers.append(_Publisher(store, cid, tid, duration_s, gaps))
        for label, event_driven, every_s in clients:
            watchers[label].append(_Watcher(store, cid, event_driven, every_s, rng.uniform(0, every_s), until))
    threads = [*publishers, *(w for label in watchers for w in watchers[label])]
    stats_before = _command_stats(lab)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration_s + 10)
    usec_per_call = _usec_per_call(stats_before, _command_stats(lab))
    elapsed_s = duration_s + 2 * interval_s
    out = {"interval_ms": round(interval_s * 1000), "p50_goal_ms": 100}
    for label, event_driven, every_s in clients:
        delays, commands = [], 0
        for publisher, watcher in zip(publishers, watchers[label], strict=True):
            commands += watcher.commands
            for version, sent in publisher.published:
                seen_at = next((at for v, at in watcher.seen if v >= version), None)
                if seen_at is not None:
                    delays.append(seen_at - sent)
        out[label] = {
            **summary(delays, 1000, 1),
            "p99": round(percentile(delays, 99) * 1000, 1) if delays else None,
            "interval_ms": round(every_s * 1000),
            "writes": sum(len(p.published) for p in publishers),
            "redis_commands_per_client_s": round(commands / conversations / elapsed_s, 2),
            # Redis's own CPU time for this client's reads (a blocked XREAD costs nothing while it waits).
            "redis_server_us_per_client_s": round(
                commands / conversations / elapsed_s
                * (usec_per_call["hget"] if not event_driven
                   else (usec_per_call["hget"] + usec_per_call["xread"]) / 2), 1),
        }
    out["redis_us_per_call"] = usec_per_call
    return out


def _command_stats(lab: Lab) -> dict:
    stats = lab.client.info("commandstats")
    return {name: (stats.get(f"cmdstat_{name}", {}).get("calls", 0), stats.get(f"cmdstat_{name}", {}).get("usec", 0))
            for name in ("hget", "xread")}


def _usec_per_call(before: dict, after: dict) -> dict:
    out = {}
    for name in before:
        calls = after[name][0] - before[name][0]
        out[name] = round((after[name][1] - before[name][1]) / calls, 2) if calls else 0.0
    return out
