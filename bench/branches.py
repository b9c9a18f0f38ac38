"""`python -m bench.branches`: what a branch costs in Redis, at turn 2 against turn 1,000 of one conversation.

One conversation of 1,000 calculator turns, every turn written through the store's own scripts (the writes a
worker makes: bench/conversations.py's `write_turn`). Then, on that one conversation:

- **write**: a regenerate and an edit of turn 2, and of turn 1,000: the new turn begun beside the old one
  (`begin_turn(branch_of=…)`), then the same three writes a worker makes for a calculator turn (a tool call and
  its result, then the answer and its summary). Measured three ways, each from Redis's own counters:
  `aof_bytes`, what Redis appended to its append-only file for those writes (Redis 6.2 logs a script's effects,
  its HSETs and the rest, not the script call: the bytes Redis itself writes to disk); `sent_bytes`, what the
  client sent (INFO's total_net_input_bytes: the scripts' arguments); `tree_bytes`, the fields and values of the
  conversation's tree hash that are new or changed (HGETALL before and after). A branch copies nothing: each is
  the same at turn 2 as at turn 1,000 (goal: within 10%).
- **read**: a page showing the branch at turn 1,000 (the regenerate), in a process that has read nothing yet,
  then each next read of that page (Store.read_since with what it read before, as the page and `ask` follow):
  `open` (the whole branch: every turn once), `poll` (nothing changed: the version, one HGET), `switch` (to the
  other answer of turn 1,000: the path below the fork, the fork's turn and that answer, read), `switch_back` (every
  turn already read: the same two rows, no turn fetched), `new_message` (a message published to the turn shown:
  only it). Bytes are both directions on the wire (INFO's total_net_input/output_bytes); commands are every
  command Redis ran (INFO commandstats, those a script runs included; INFO's own left out); round_trips are the
  client's calls.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from agent.contract import Kind, Outcome, Role, make_step, queued_doc, turn_summary
from agent.conversation import reads
from agent.conversation.keys import Keys
from agent.conversation.store import Store
from agent.queue import new_id
from bench.conversations import CONFIG, write_turn
from harness.private_redis import PrivateRedis

TURNS = 1000
WRITE_GOAL = 0.10  # a branch at turn 1,000 writes at most 10% more (or less) than one at turn 2


def write_branch_turn(store: Store, cid: str, of: str, message: str) -> str:
    """A turn beside `of` (a regenerate when `message` is its message, else an edit), written as a worker writes a
    calculator turn."""
    tid = new_id()
    doc = queued_doc(CONFIG, f"turn-{tid}", time.time())
    store.begin_turn(cid, tid, {"role": Role.USER, "content": message}, doc, branch_of=of)
    now = time.time()
    doc.update(status="running", started_at=now, deadline_at=now + 100, job_timeout_at=now + 120)
    call = {"id": "call_b", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": "500*17"})}}
    steps = [make_step(tid, 1, Kind.MODEL, "demo", now, now + 1, Outcome.OK, timeout_s=60.0, remaining_s=99.0,
                       attempt=1, last_call=False, tool_calls=1),
             make_step(tid, 2, Kind.TOOL, "calculator", now + 1, now + 1.01, Outcome.OK, timeout_s=60.0,
                       remaining_s=98.0, arguments=call["function"]["arguments"], result="8500")]
    store.publish(cid, tid, doc, new_messages=[{"role": Role.ASSISTANT, "content": None, "tool_calls": [call]},
                                               {"role": Role.TOOL, "tool_call_id": "call_b", "content": "8500"}],
                  new_steps=steps, writer=doc["job_id"])
    doc.update(status="done", ended_at=now + 2)
    store.publish(cid, tid, doc, done=True,
                  new_messages=[{"role": Role.ASSISTANT, "content": "**500*17 = 8500**, by the calculator tool."}],
                  new_steps=[make_step(tid, 3, Kind.MODEL, "demo", now + 1.01, now + 2, Outcome.OK, timeout_s=60.0,
                                       remaining_s=97.0, attempt=1, last_call=False, tool_calls=0)],
                  summary=turn_summary(tid, doc, now + 2), writer=doc["job_id"])
    return tid


def _aof_written(client) -> int:
    """The AOF's size once Redis has written what it holds: with `appendfsync everysec`, a write waits (up to 2 s)
    while the last second's fsync still runs, and the size counts only what was written (a measure once read 0
    bytes for a branch)."""
    for _ in range(100):
        persistence = client.info("persistence")
        if not int(persistence.get("aof_buffer_length", 0)) and not int(persistence.get("aof_pending_bio_fsync", 0)):
            break
        time.sleep(0.05)
    return int(persistence.get("aof_current_size", 0))


def _counters(client) -> tuple[int, int, int, int, int]:
    """(AOF bytes, bytes received, bytes sent, commands run, INFO calls) as Redis counts them. The network's and the
    commands' first, the AOF's last: its wait (more INFO calls) then falls outside the window measured."""
    stats, commands = client.info("stats"), client.info("commandstats")
    run = sum(v["calls"] for k, v in commands.items() if k not in ("cmdstat_info",))
    return (_aof_written(client), int(stats["total_net_input_bytes"]),
            int(stats["total_net_output_bytes"]), run, int(commands.get("cmdstat_info", {}).get("calls", 0)))


class Meter:
    """Redis's counters around an operation, less what reading them costs (measured once, empty)."""

    def __init__(self, client):
        self.client = client
        first = _counters(client)
        second = _counters(client)
        self.empty = [b - a for a, b in zip(first, second, strict=True)]

    def measure(self, operation, *, round_trips=None) -> tuple[object, dict]:
        _aof_written(self.client)  # what an earlier write left in Redis's buffer is not this operation's
        before = _counters(self.client)
        result = operation()
        after = _counters(self.client)
        delta = [b - a - e for a, b, e in zip(before, after, self.empty, strict=True)]
        out = {"aof_bytes": delta[0], "sent_bytes": delta[1], "bytes": delta[1] + delta[2], "commands": delta[3]}
        if round_trips is not None:
            out["round_trips"] = round_trips()
        return result, out


def _tree_bytes(before: dict, after: dict) -> int:
    return sum(len(k) + len(v) for k, v in after.items() if before.get(k) != v)


def write_cost(store: Store, cid: str, turn_ids: list[str], meter: Meter) -> dict:
    """A regenerate and an edit of turn 2 and of turn TURNS of the conversation `cid` (its turns `turn_ids`)."""
    tree = Keys.of(cid).tree
    rows = {}
    for kind in ("regenerate", "edit"):
        for at in (2, len(turn_ids)):
            of = turn_ids[at - 1]
            message = (reads.turn_message(store.redis, cid, of) or {}).get("content") if kind == "regenerate" \
                else f"What is 500*17, and why? (edited at turn {at:04d})"
            before = store.redis.hgetall(tree)
            _, figures = meter.measure(lambda of=of, message=message: write_branch_turn(store, cid, of, message))
            figures.pop("bytes")
            figures["tree_bytes"] = _tree_bytes(before, store.redis.hgetall(tree))
            rows[f"{kind}_at_{at}"] = figures
    for kind in ("regenerate", "edit"):
        small, large = rows[f"{kind}_at_2"], rows[f"{kind}_at_{len(turn_ids)}"]
        rows[f"{kind}_ratio"] = {k: round(large[k] / small[k], 3) for k in ("aof_bytes", "sent_bytes", "tree_bytes")}
    return rows


class Calls:
    """Counts the client's calls (a pipeline's execute is one)."""

    def __init__(self, client):
        self.client, self.n = client, 0
        real_command, real_pipeline = client.execute_command, client.pipeline

        def command(*args, **kwargs):
            self.n += 1
            return real_command(*args, **kwargs)

        def pipeline(*args, **kwargs):
            pipe = real_pipeline(*args, **kwargs)
            real_execute = pipe.execute

            def execute(*a, **k):
                self.n += 1
                return real_execute(*a, **k)

            pipe.execute = execute
            return pipe

        client.execute_command, client.pipeline = command, pipeline

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


def read_cost(store: Store, cid: str, last: str, meter: Meter, turns: int = TURNS) -> dict:
    """What a page reads to show the branch at turn TURNS: open it, poll, switch to the other answer and back, and
    follow a new message."""
    regenerated = write_branch_turn(store, cid, last, (reads.turn_message(store.redis, cid, last) or {})["content"])
    # A process that read nothing yet.
    reads.TURN_CACHE = reads._Cache(reads.TURN_CACHE_SIZE, reads.TURN_CACHE_BYTES, reads._size)
    reader = Store(store.redis.__class__(connection_pool=store.redis.connection_pool), ttl_s=store.ttl_s)
    calls = Calls(reader.redis)
    rows = {}
    known, rows["open"] = meter.measure(lambda: reader.read(cid), round_trips=calls.take)
    assert len(known["turns"]) == turns and known["turn_id"] == regenerated
    _, rows["poll"] = meter.measure(lambda: reader.version(cid), round_trips=calls.take)
    store.switch(cid, last)  # another tab, or the CLI
    known, rows["switch"] = meter.measure(lambda: reader.read_since(cid, known), round_trips=calls.take)
    assert known["turn_id"] == last and len(known["turns"]) == turns
    store.switch(cid, regenerated)
    known, rows["switch_back"] = meter.measure(lambda: reader.read_since(cid, known), round_trips=calls.take)
    assert known["turn_id"] == regenerated
    # A new turn on the branch shown, then a message published to it: the page follows it.
    tid = new_id()
    doc = queued_doc(CONFIG, f"turn-{tid}", time.time())
    store.begin_turn(cid, tid, {"role": Role.USER, "content": "And 3*17?"}, doc)
    known = reader.read_since(cid, known)
    calls.take()
    store.publish(cid, tid, doc, new_messages=[{"role": Role.ASSISTANT, "content": "3*17 = 51."}])
    known, rows["new_message"] = meter.measure(lambda: reader.read_since(cid, known), round_trips=calls.take)
    assert known["history"][-1]["content"] == "3*17 = 51." and len(known["history"]) == 4 * turns + 2
    for row in rows.values():
        row.pop("aof_bytes")
    return rows


def branch_figures(store: Store, turns: int = TURNS) -> dict:
    """Both figures on one conversation of `turns` turns (a private Redis's store: it changes its AOF's config)."""
    rewrite = store.redis.config_get("auto-aof-rewrite-percentage").get("auto-aof-rewrite-percentage", "100")
    store.redis.config_set("auto-aof-rewrite-percentage", 0)  # no rewrite shrinks the file mid-measure
    try:
        cid, turn_ids = new_id(), []
        for index in range(turns):
            write_turn(store, cid, index)
            turn_ids.append(store.read_meta(cid)["turn_id"])
        meter = Meter(store.redis)
        out = {"turns": turns, "write": write_cost(store, cid, turn_ids, meter)}
        store.switch(cid, turn_ids[-1])
        out["read"] = read_cost(store, cid, turn_ids[-1], meter, turns)
    finally:
        store.redis.config_set("auto-aof-rewrite-percentage", rewrite)
    return out


def goals(figures: dict) -> dict:
    write = figures["write"]
    return {f"branch_write_{kind}_flat": all(abs(r - 1) <= WRITE_GOAL for r in write[f"{kind}_ratio"].values())
            for kind in ("regenerate", "edit")}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, PrivateRedis(Path(tmp) / "redis", state_ttl_s=3600) as server:
        figures = branch_figures(server.store)
    n = figures["turns"]
    print(f"Redis bytes written by a branch turn, at turn 2 and at turn {n:,} of one {n:,}-turn conversation:")
    for kind in ("regenerate", "edit"):
        for at in (2, n):
            row = figures["write"][f"{kind}_at_{at}"]
            print(f"  {kind:>10} at turn {at:>5}: AOF {row['aof_bytes']:,} B, sent {row['sent_bytes']:,} B, "
                  f"tree {row['tree_bytes']:,} B, {row['commands']} commands")
        print(f"  {kind:>10} ratio {n:,} / 2: {figures['write'][f'{kind}_ratio']}")
    print(f"What a page reads to show the branch at turn {n:,}:")
    for name, row in figures["read"].items():
        print(f"  {name:>12}: {row['bytes']:,} B, {row['commands']} commands, {row['round_trips']} round trips")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
