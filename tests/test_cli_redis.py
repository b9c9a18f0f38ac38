"""`python -m agent ask` while Redis pauses, restarts, goes away or refuses writes (a full disk):
a brief outage is waited out, a long one ends in exit 1 with a sentence, within the turn's clocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from rq.serializers import JSONSerializer

from agent.cli.main import REDIS_OUTAGE_GRACE_S
from agent.conversation.store import Store
from agent.hosting.lost_worker import CALLBACK_GRACE_S, LOST_GRACE_S, lost_reason, lost_worker_check
from agent.queue import SafeJob, get_queue
from agent.runtime.connection import queue_client
from agent.runtime.embedded_redis import EmbeddedRedis
from agent.settings import TurnConfig
from harness.pools import stop_pool
from harness.private_redis import PrivateRedis
from harness.waiting import wait_for
from tests.conftest import ROOT, ask, start_pool, wait_done

CLI_TIMEOUT_S = 90  # seconds for any one CLI run here (outages are part of it)
EVENT_TIMEOUT_S = 30  # seconds to wait for a turn to reach a state
PAUSE_MS = 6000  # milliseconds: longer than a state call's two 2 s attempts, so the CLI sees errors
SLOW_DEMO = "demo@1.5"  # each model call takes 1.5 s: the turn is still running during the outage
CLOCKS = {"AGENT_JOB_TIMEOUT": "20", "AGENT_DEADLINE_MARGIN": "5", "AGENT_CALL_TIMEOUT_CAP": "5",
          "AGENT_CONNECT_TIMEOUT": "1", "AGENT_MIN_CALL_SECONDS": "0.5"}
SHORT_CLOCKS = {**CLOCKS, "AGENT_JOB_TIMEOUT": "8", "AGENT_DEADLINE_MARGIN": "3"}
CLOCK_SLACK_S = 15  # seconds beyond the CLI's own bound that a busy machine may add (process start, timeouts)


@dataclass
class Private:
    """A private Redis and one worker, so that stopping or breaking Redis touches no other test."""

    redis: PrivateRedis
    log: Path  # the worker pool's log

    @property
    def url(self) -> str:
        return self.redis.url

    @property
    def server(self) -> EmbeddedRedis:
        return self.redis.server

    def store(self) -> Store:
        return self.redis.store


@pytest.fixture
def private(private_redis, tmp_path):
    log = tmp_path / "pool.log"
    handle = start_pool(private_redis.url, 1, log)
    try:
        yield Private(private_redis, log)
    finally:
        private_redis.resume()  # a frozen server must answer the workers' goodbyes
        stop_pool(handle, private_redis.url)


def start_cli(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent", *args], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def conversation(store: Store, url: str) -> str:
    """A conversation that exists (the CLI refuses an unknown id), its first turn ended."""
    cid = ask(store, get_queue(queue_client(url)), "hello")
    wait_done(store, cid, timeout_s=EVENT_TIMEOUT_S)
    return cid


def running(store: Store, cid: str, turns_before: int):
    state = store.read(cid)
    return state if len(state["turns"]) == turns_before and state["status"] == "running" else None


def cli_on_a_running_turn(base_env: dict, private) -> tuple[Store, str, subprocess.Popen, dict]:
    """`ask` on a conversation that exists, once its turn runs: the store, the id, the CLI, the state."""
    store = private.store()
    cid = conversation(store, private.url)
    proc = start_cli(cli_env(base_env, private.url, SHORT_CLOCKS), "ask", "--conversation", cid, "What is 17*23?")
    return store, cid, proc, wait_for(lambda: running(store, cid, 1), EVENT_TIMEOUT_S, "the turn runs")


def ended_by_a_look(store: Store, queue_connection, cid: str, what: str = "a front end writes the ending") -> None:
    """The first look by a front end (a page tick, a CLI) ends a turn whose worker could not."""
    wait_for(lambda: lost_worker_check(store, queue_connection, cid) or store.read_meta(cid)["done"],
             EVENT_TIMEOUT_S, what)


def cli_env(base: dict, url: str, clocks: dict) -> dict:
    return {**base, **clocks, "REDIS_URL": url, "AGENT_WORKERS": "0", "AGENT_MODEL": SLOW_DEMO}


# -- brief outages: the turn finishes and the CLI prints it ----------------------------------


def ask_through(base_env: dict, private, clocks: dict, outage) -> tuple[int, str, str, dict]:
    """`ask` on a new turn, `outage(store)` once the turn runs: (exit code, stdout, stderr, the running state)."""
    store = private.store()
    cid = conversation(store, private.url)
    proc = start_cli(cli_env(base_env, private.url, clocks), "ask", "--conversation", cid, "What is 17*23?")
    try:
        state = wait_for(lambda: running(store, cid, 1), EVENT_TIMEOUT_S, "the turn runs")
        outage(store)
    finally:
        code, out, err = finish(proc)
    return code, out, err, state


def test_a_redis_pause_mid_turn_is_waited_out_and_the_cli_exits_0_with_the_answer(base_env, private):
    def pause(store):
        store.redis.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")  # every client waits, the CLI too

    code, out, err, _ = ask_through(base_env, private, CLOCKS, pause)
    assert code == 0, err
    assert "17*23 = 391" in out
    assert "Traceback" not in err


def test_a_redis_restart_mid_turn_is_waited_out_and_the_cli_exits_0_with_the_answer(base_env, private):
    def restart(store):
        private.server.stop()  # SIGTERM: Redis writes its append-only file and exits
        time.sleep(1.0)  # the CLI and the worker meet a refused socket for a while
        private.server.acquire()  # the same socket, password and data

    code, out, err, _ = ask_through(base_env, private, CLOCKS, restart)
    assert code == 0, err
    assert "17*23 = 391" in out
    assert "Traceback" not in err


# -- Redis stays away: exit 1 with a sentence, within the clocks ------------------------------


@pytest.mark.parametrize("how", ["stopped", "frozen"])
def test_redis_that_stays_away_ends_the_cli_with_exit_1_and_a_sentence_within_the_clocks(base_env, private, how):
    lost = []

    def stay_away(store):
        lost.append(time.time())
        if how == "stopped":
            private.server.stop()
        else:
            os.kill(private.server.pid, signal.SIGSTOP)  # it accepts connections and never answers

    code, out, err, state = ask_through(base_env, private, SHORT_CLOCKS, stay_away)
    ended_at, (lost_at,), cid = time.time(), lost, state["conversation_id"]
    assert code == 1, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert "lost the connection to Redis" in line and f"--conversation {cid}" in line
    assert "may still finish" in line
    assert "password" not in line.lower()
    bound = max(state["job_timeout_at"], lost_at) + REDIS_OUTAGE_GRACE_S
    assert ended_at < bound + CLOCK_SLACK_S, (ended_at - bound)
    assert ended_at > lost_at + REDIS_OUTAGE_GRACE_S - 1  # it did retry for a while first


# -- Redis cannot save to disk (MISCONF) -------------------------------------------------------


def break_disk(client) -> str:
    """Make Redis refuse writes the way a full disk does: its snapshot fails and it stops writes."""
    good_dir = client.config_get("dir")["dir"]
    client.config_set("stop-writes-on-bgsave-error", "yes")
    client.config_set("dir", "/proc")  # nobody, root included, can create a file there
    client.bgsave()
    wait_for(lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0
             and client.info("persistence")["rdb_last_bgsave_status"] == "err", EVENT_TIMEOUT_S, "the snapshot fails")
    return good_dir


def heal_disk(client, good_dir: str) -> None:
    client.config_set("dir", good_dir)
    client.bgsave()
    wait_for(lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0
             and client.info("persistence")["rdb_last_bgsave_status"] == "ok",
             EVENT_TIMEOUT_S, "the snapshot works again")


def test_a_message_sent_while_redis_cannot_save_says_so_in_words_and_exits_1(base_env, private):
    store = private.store()
    cid = conversation(store, private.url)
    good_dir = break_disk(store.redis)
    try:
        proc = start_cli(cli_env(base_env, private.url, CLOCKS), "ask", "--conversation", cid, "hi")
        code, out, err = finish(proc)
    finally:
        heal_disk(store.redis, good_dir)
    assert code == 1, err
    line = err.strip()
    assert len(line.splitlines()) == 1, err
    assert line.startswith("error: Redis could not save to disk (MISCONF): ") and "Nothing was sent" in line
    assert "Lua" not in line and "user_script" not in line


def test_redis_refusing_writes_mid_turn_is_said_in_words_and_the_turn_still_ends(base_env, private):
    store, cid, proc, state = cli_on_a_running_turn(base_env, private)
    good_dir = None
    try:
        good_dir = break_disk(store.redis)
        code, out, err = finish(proc)
        ended_at = time.time()
        assert code == 1, err
        line = err.strip().splitlines()[-1]
        assert "Redis could not save to disk (MISCONF): " in line and "user_script" not in line
        assert ended_at < state["job_timeout_at"] + LOST_GRACE_S + CLOCK_SLACK_S
        # The worker's log says it in words too.
        wait_for(lambda: "Redis could not save to disk (MISCONF)" in private.log.read_text(errors="replace"),
                 EVENT_TIMEOUT_S, "the worker logs the refused write")
        assert store.read_meta(cid)["status"] == "running"  # nothing could be written meanwhile
    finally:
        if good_dir is not None:
            heal_disk(store.redis, good_dir)
    # Once Redis takes writes again, the first look by a front end (a page tick, a CLI) ends the turn.
    queue_connection = queue_client(private.url)
    ended_by_a_look(store, queue_connection, cid)
    state = store.read(cid)
    assert state["done"] and state["status"] == "failed"
    assert "could not be finished" in state["history"][-1]["content"]


def test_a_job_that_finished_without_its_last_write_is_taken_up_by_the_next_look(private):
    # The final write failed (Redis refused it until the job gave up), then RQ marked the job
    # finished: the state said running until job_timeout_at plus a grace, or its TTL with no front end.
    # The next look hands the turn to a new job while time is left (it answers), and ends it otherwise.
    store = private.store()
    queue_connection = queue_client(private.url)
    cid = conversation(store, private.url)
    meta = store.read_meta(cid)
    doc = {k: meta[k] for k in ("deadline_at", "job_timeout_at", "started_at", "enqueued_at", "config", "job_id")}
    # The state as a lost final write leaves it: still running.
    store.redis.hset(f"agent:conv:{cid}:meta", mapping={"done": "0", "doc": json.dumps({**doc, "status": "running"})})
    job = SafeJob.fetch(meta["job_id"], connection=queue_connection, serializer=JSONSerializer)
    assert job.get_status() == "finished"
    soon = job.ended_at.timestamp() + CALLBACK_GRACE_S + 0.5  # long before the job timeout's own rule
    assert soon < meta["job_timeout_at"] + LOST_GRACE_S
    assert "last write did not reach Redis" in (lost_reason(store, queue_connection, cid, now=soon) or "")
    resumable = meta["deadline_at"] - time.time() >= TurnConfig.from_dict(meta["config"]).min_call_s
    ended_by_a_look(store, queue_connection, cid)
    state = store.read(cid)
    assert state["done"]
    if resumable:  # resumed by a new job on the pool's workers, which answered
        assert state["status"] == "done" and [s["attempt"] for s in state["steps"] if s["kind"] == "resume"] == [1]
    else:
        assert state["status"] == "failed" and "last write did not reach Redis" in state["history"][-1]["content"]


# -- Redis out of memory (maxmemory reached, nothing to evict) -----------------------------------------

OOM_HOLD_S = 8.0  # seconds Redis stays full in the brief case: past the 6 s the CLI once gave up after


def fill_memory(client) -> dict:
    """Make Redis refuse writes as a full memory does: maxmemory far below what it uses, nothing evicted.
    Returns the settings to put back."""
    before = {**client.config_get("maxmemory"), **client.config_get("maxmemory-policy")}
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")  # one byte: every command that may add data is refused (OOM)
    return before


def free_memory(client, before: dict) -> None:
    client.config_set("maxmemory", before["maxmemory"])
    client.config_set("maxmemory-policy", before["maxmemory-policy"])


def write_that_fills_memory(client, conversation_id: str) -> dict:
    """A write lands and fills Redis, atomically (Redis refuses every command queued in a transaction once
    it is full, so the fill comes last in it): the CLI wakes for that write and must read the state
    from a full Redis, which serves reads, but not in a transaction. Returns the settings to put back."""
    before = {**client.config_get("maxmemory"), **client.config_get("maxmemory-policy")}
    client.config_set("maxmemory-policy", "noeviction")
    meta = f"agent:conv:{conversation_id}:meta"
    version = int(client.hget(meta, "version")) + 1
    with client.pipeline(transaction=True) as pipe:
        pipe.hincrby(meta, "version", 1)
        pipe.xadd(f"agent:conv:{conversation_id}:events", {"v": version}, id=f"{version}-1")  # the wake-up
        pipe.config_set("maxmemory", "1")  # one byte: every command that may add data is refused (OOM)
        pipe.execute()
    return before


def test_redis_out_of_memory_mid_turn_is_waited_out_and_the_cli_exits_0_with_the_answer(base_env, private):
    full_since = []

    def brief_oom(store):
        cid = next(key.decode().split(":")[2] for key in store.redis.scan_iter("agent:conv:*:meta"))  # the only one
        before = write_that_fills_memory(store.redis, cid)
        full_since.append(time.monotonic())
        try:
            with pytest.raises(redis.exceptions.OutOfMemoryError):  # as the CLI and the worker meet it
                store.redis.set("agent:test:oom-probe", "x")
            time.sleep(OOM_HOLD_S)
        finally:
            free_memory(store.redis, before)

    code, out, err, _ = ask_through(base_env, private, CLOCKS, brief_oom)
    assert full_since, "Redis was made full"
    assert code == 0, err
    assert "17*23 = 391" in out
    assert "Traceback" not in err


def test_redis_out_of_memory_for_the_rest_of_a_turn_still_takes_its_ending_and_the_cli_exits_0(base_env, private):
    # The turn reserved memory for its final write when it was accepted (agent/conversation/room.py): its
    # writes meanwhile are refused and kept, and its ending lands, with them, on that reservation.
    store, cid, proc, state = cli_on_a_running_turn(base_env, private)
    before = None
    try:
        before = fill_memory(store.redis)
        code, out, err = finish(proc)
        with pytest.raises(redis.exceptions.OutOfMemoryError):  # still full when the turn ended
            store.redis.set("agent:test:oom-probe", "x")
    finally:
        if before is not None:
            free_memory(store.redis, before)
    assert code == 0, err
    assert "17*23 = 391" in out
    assert "Traceback" not in err
    final = store.read(cid)
    assert final["done"] and final["status"] == "done"
    assert final["updated_at"] < final["job_timeout_at"], "the ending landed inside the turn's clocks"
