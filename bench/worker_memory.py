"""A worker's memory beside a bare `rq worker` (RQ's SimpleWorker), side by side against one Redis.

Both are idle and registered when measured; ours has also run one three-tool turn, so what a turn
imports (the provider client, the tools) is counted. Ours is measured twice: with no MCP server
configured (the SDK is never imported) and with the project's `mcp.json` (the time server's
session held for the life of the worker).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from agent import PROJECT_ROOT
from agent.queue import new_id
from agent.settings import TurnConfig
from bench.lab import THREE_TOOL_MESSAGE, Lab, submit
from harness.follow import follow
from harness.pools import start_pool, stop_pool, worker_pids
from harness.processes import rss_kib
from harness.waiting import wait_for

BARE_QUEUE = "bench-bare"  # a queue nobody enqueues to: the bare worker only waits
SETTLE_S = 1.0  # seconds an idle worker is left before its RSS is read
REGISTER_TIMEOUT_S = 30.0  # seconds for a worker to register with RQ
INSTANT = TurnConfig(model="demo@0~0")  # the turn is there to load what a turn loads, not to take time


def _bare_worker_rss_mib(lab: Lab) -> float:
    """`rq worker -w rq.worker.SimpleWorker`, idle on a queue of its own, as RQ ships it."""
    command = [str(Path(sys.executable).with_name("rq")), "worker", "--worker-class", "rq.worker.SimpleWorker",
               "--url", lab.url, "--serializer", "rq.serializers.JSONSerializer", BARE_QUEUE]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(BARE_QUEUE.encode() in (lab.queue_connection.hget(key, "queues") or b"")
                             for key in lab.queue_connection.smembers("rq:workers")),
                 timeout_s=REGISTER_TIMEOUT_S, what="the bare rq worker to register")
        time.sleep(SETTLE_S)
        return round(rss_kib(proc.pid) / 1024, 1)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _our_worker_rss_mib(lab: Lab, mcp_config: str) -> float:
    """One simple worker of the pool, after one three-tool turn, idle."""
    handle = start_pool(lab.url, 1, lab.dir / f"memory-{new_id()}.log", worker_class="simple",
                        env={"AGENT_MCP_CONFIG": mcp_config}, queue_connection=lab.queue_connection)
    try:
        cid = new_id()
        submit(lab, cid, THREE_TOOL_MESSAGE, INSTANT)
        follow(lab.store, cid, event_driven=True, timeout_s=60)
        time.sleep(SETTLE_S)
        return round(sum(rss_kib(pid) for pid in worker_pids(handle)) / 1024, 1)
    finally:
        stop_pool(handle, lab.url)


def worker_memory(lab: Lab, *, with_mcp_json: bool = True) -> dict:
    bare = _bare_worker_rss_mib(lab)
    ours = _our_worker_rss_mib(lab, "off")
    figures = {"bare_rq_simple_worker_mib": bare, "worker_mib": ours, "ratio": round(ours / bare, 2)}
    if with_mcp_json:
        with_mcp = _our_worker_rss_mib(lab, str(PROJECT_ROOT / "mcp.json"))
        figures |= {"worker_with_mcp_json_mib": with_mcp, "ratio_with_mcp_json": round(with_mcp / bare, 2)}
    return figures
