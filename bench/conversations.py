"""`python -m bench.conversations`: what listing conversations costs at 20, 1,000 and 10,000 of them,
and what a conversation of N turns holds in Redis (for AGENT_REDIS_MAXMEMORY_MB).

A private embedded Redis in a temp dir; every turn is written through the store's own scripts (the
same writes a worker makes): a user question, the model's tool call, the tool's result, the answer,
two model steps and a tool step, and the turn's summary.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from agent.contract import Kind, Outcome, Role, make_step, queued_doc, turn_summary
from agent.conversation.keys import Keys
from agent.conversation.listing import list_conversations
from agent.conversation.store import Store
from agent.queue import new_id
from agent.settings import TurnConfig
from harness.private_redis import PrivateRedis

LIST_SIZES = (20, 1000, 10_000)  # from one full page up
LIST_PAGE = 20  # rows, as the sidebar shows
LIST_REPEATS = 50
TURN_COUNTS = ((1, 50), (10, 20), (100, 4))  # (turns per conversation, conversations measured)
CONFIG = TurnConfig().to_dict()


def write_turn(store: Store, cid: str, index: int) -> None:
    """One calculator turn, as a worker writes it."""
    tid = new_id()
    doc = queued_doc(CONFIG, f"turn-{tid}", time.time())
    store.begin_turn(cid, tid, {"role": Role.USER, "content": f"What is {index}*17, and why?"}, doc)
    now = time.time()
    doc.update(status="running", started_at=now, deadline_at=now + 100, job_timeout_at=now + 120)
    call = {"id": f"call_{index}", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": f"{index}*17"})}}
    steps = [make_step(tid, 1, Kind.MODEL, "demo", now, now + 1, Outcome.OK, timeout_s=60.0, remaining_s=99.0,
                       attempt=1, last_call=False, tool_calls=1),
             make_step(tid, 2, Kind.TOOL, "calculator", now + 1, now + 1.01, Outcome.OK, timeout_s=60.0,
                       remaining_s=98.0, arguments=call["function"]["arguments"], result=str(index * 17))]
    store.publish(cid, tid, doc, new_messages=[{"role": Role.ASSISTANT, "content": None, "tool_calls": [call]},
                                               {"role": Role.TOOL, "tool_call_id": call["id"],
                                                "content": str(index * 17)}], new_steps=steps)
    doc.update(status="done", ended_at=now + 2)
    store.publish(cid, tid, doc, done=True,
                  new_messages=[{"role": Role.ASSISTANT, "content": f"**{index}*17 = {index * 17}**, by the "
                                 "calculator tool, which I called once."}],
                  new_steps=[make_step(tid, 3, Kind.MODEL, "demo", now + 1.01, now + 2, Outcome.OK, timeout_s=60.0,
                                       remaining_s=97.0, attempt=1, last_call=False, tool_calls=0)],
                  summary=turn_summary(tid, doc, now + 2))


def list_cost(store: Store, sizes: tuple[int, ...] = LIST_SIZES) -> dict:
    """Milliseconds per listing of a page (median of LIST_REPEATS) and the Redis commands it sent, at each
    size of the index."""
    rows, have = [], 0
    for size in sizes:
        while have < size:
            write_turn(store, new_id(), have)
            have += 1
        store.redis.config_resetstat()
        list_conversations(store, limit=LIST_PAGE)
        commands = sum(v["calls"] for k, v in store.redis.info("commandstats").items() if not k.endswith("info"))
        times = []
        for _ in range(LIST_REPEATS):
            started = time.perf_counter()
            list_conversations(store, limit=LIST_PAGE)
            times.append(time.perf_counter() - started)
        rows.append({"conversations": size, "list_ms_p50": round(statistics.median(times) * 1000, 2),
                     "redis_commands": commands})
    return {"page_rows": LIST_PAGE, "rows": rows}


def memory_per_conversation(store: Store, turn_counts: tuple = TURN_COUNTS) -> list[dict]:
    """Bytes a conversation's keys take (Redis's MEMORY USAGE, every element counted), by its turns.

    Not INFO's used_memory, which moves with the AOF's buffers and the allocator's caches."""
    rows = []
    for turns, count in turn_counts:
        sizes = []
        for _ in range(count):
            cid = new_id()
            for index in range(turns):
                write_turn(store, cid, index)
            sizes.append(sum(store.redis.memory_usage(key, samples=0) or 0 for key in Keys.of(cid).all))
        rows.append({"turns": turns, "kib_per_conversation": round(statistics.mean(sizes) / 1024, 1)})
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, PrivateRedis(Path(tmp) / "redis") as server:
        store = Store(server.client, ttl_s=3600)
        listing = list_cost(store)
        memory = memory_per_conversation(store)
    print(f"listing a page of {listing['page_rows']} conversations (median of {LIST_REPEATS}):")
    for row in listing["rows"]:
        print(f"  {row['conversations']:>6,} conversations: {row['list_ms_p50']:.2f} ms, "
              f"{row['redis_commands']} Redis commands")
    print("Redis memory per conversation (calculator turns: 4 messages, 3 steps, a summary each):")
    for row in memory:
        print(f"  {row['turns']:>4} turns: {row['kib_per_conversation']:,.1f} KiB")
    print(json.dumps({"list_cost": listing, "memory_per_conversation": memory}))


if __name__ == "__main__":
    main()
