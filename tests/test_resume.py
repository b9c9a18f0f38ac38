"""A turn outlives its worker: a worker SIGKILLed (or frozen by SIGSTOP) mid-turn has its turn resumed,
once, by a new job on another worker, from the history as last published and on the turn's original
clocks; with no resume (or too little time) left, the turn ends `failed` / `worker_lost` at once.

Real Redis (private to each test), real RQ workers (the pool, or `python worker.py`), the demo model or
a scripted model on loopback, and no front end: turns are submitted with agent.queue.submit_turn or the
CLI, and followed by reading the state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from rq import Worker
from rq.exceptions import NoSuchJobError
from rq.serializers import JSONSerializer

from agent.queue import SafeJob, job_status
from agent.settings import TurnConfig
from harness import pools
from harness.processes import alive, kill, processes_with_env
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, ask, start_pool, wait_done
from tests.scripted_server import chat_reply, tool_call

# The clocks scaled down: a 20 s job timeout and a 3 s margin (deadline 17 s after the start). The demo
# model takes 3 s per call and answers in one piece, so a kill lands inside a call.
SLOW_CALL = FAST.with_changes(model="demo@3~0", job_timeout_s=20, deadline_margin_s=3.0, call_timeout_cap_s=10.0,
                              min_call_s=0.5)
# Longer clocks for turns that are killed twice or written slowly (deadline 26 s after the start).
LONG = dict(job_timeout_s=30, deadline_margin_s=4.0, call_timeout_cap_s=15.0, min_call_s=0.5)
SETTLE_S = 0.3  # seconds after the turn's first write: its job is inside its first model call (3 s) by then
RESUME_WITHIN_S = 6.0  # seconds from a freeze to the resumed job's first write (~3 s lapse + the watch + a start)
# Seconds from a SIGKILL its supervisor sees (a worker's exit, a work horse's) to the resumed job's first write:
# the hand-over comes at once (agent/hosting/deaths.py), not after the mark's lapse (goal 0.5 s, with slack).
RESUME_SEEN_DEATH_S = 1.5
OBSERVE_S = 20.0  # seconds a test waits for an event it then measures (the bound it asserts is tighter)
TURN_S = 45.0  # seconds a test waits for a resumed turn to end (each turn's own clocks end it sooner)
MARGIN_S = 1.0  # seconds of slack on every time bound


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def workers(private_redis, tmp_path):
    """Start pools of real workers on this test's own Redis; every one is stopped at the end (also a
    worker a test froze with SIGSTOP, woken first)."""
    started: list[pools.PoolHandle] = []
    frozen: list[int] = []

    def start(count: int = 2, env: dict | None = None) -> pools.PoolHandle:
        handle = start_pool(private_redis.url, count, tmp_path / f"pool-{len(started)}.log", extra_env=env)
        started.append(handle)
        pools.wait_for_workers(handle, private_redis.queue_connection, count)
        return handle

    start.frozen = frozen
    try:
        yield start
    finally:
        kill(frozen, signal.SIGCONT)
        for handle in started:
            pools.stop_pool(handle, private_redis.url)


def running_jobs(connection) -> list[tuple[int, str, list]]:
    """(pid, job id, job arguments) of every live worker that is running a job now."""
    found = []
    for worker in Worker.all(connection=connection, serializer=JSONSerializer):
        job_id = worker.get_current_job_id()
        if not job_id or not worker.pid or not alive(worker.pid):
            continue
        try:
            job = SafeJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
        except NoSuchJobError:
            continue
        found.append((worker.pid, job_id, [*(job.args or ()), *(job.kwargs or {}).values()]))
    return found


def worker_running(connection, conversation_id: str, exclude: set[int] = frozenset()) -> tuple[int, str] | None:
    """(pid, job id) of the live worker running this conversation's turn (not one of `exclude`)."""
    for pid, job_id, arguments in running_jobs(connection):
        if pid not in exclude and conversation_id in arguments:
            return pid, job_id
    return None


def current_job_of(connection, pid: int) -> str | None:
    """The job the worker with this pid is running, as RQ's registry says (None: idle or gone)."""
    for worker in Worker.all(connection=connection, serializer=JSONSerializer):
        if worker.pid == pid:
            return worker.get_current_job_id()
    return None


def read_when(store, conversation_id: str, predicate, timeout_s: float, what: str) -> dict:
    """The conversation's state once `predicate(state)` holds."""
    return wait_for(lambda: (s := store.read(conversation_id)) is not None and predicate(s) and s, timeout_s, what)


def running(state: dict) -> bool:
    return state["status"] == "running" and not state["done"]


def resume_steps(state: dict) -> list[dict]:
    return [s for s in state["steps"] if s["kind"] == "resume" and s["turn_id"] == state["turn_id"]]


def turn_messages(state: dict) -> list[dict]:
    """This turn's messages: from its user message on."""
    history = state["history"]
    start = max(i for i, m in enumerate(history) if m["role"] == "user")
    return history[start:]


def assert_every_call_answered_once(history: list[dict]) -> None:
    asked = [c["id"] for m in history for c in m.get("tool_calls") or []]
    answers = [m["tool_call_id"] for m in history if m["role"] == "tool"]
    assert sorted(asked) == sorted(answers), f"tool calls {asked} answered by {answers}"
    assert len(set(answers)) == len(answers), f"a tool call answered twice: {answers}"


def assert_resumed(final: dict, before: dict, resumes: int) -> None:
    """The turn ended `done` after `resumes` resumes, on the clocks it started with."""
    assert final["done"] and final["status"] == "done", (final["status"], final["error"], final["history"][-1])
    assert final["error"] is None
    steps = resume_steps(final)
    assert [s["attempt"] for s in steps] == list(range(1, resumes + 1)), steps
    for step in steps:
        assert step["outcome"] == "ok", step
        assert step["started_at"] <= step["ended_at"], step
        assert step["remaining_s"] is not None and 0 < step["remaining_s"] <= final["deadline_at"] - final["started_at"]
    assert final["attempt"] == resumes
    # The clocks fixed when the turn first started, kept across every resume.
    assert final["deadline_at"] == before["deadline_at"] and final["job_timeout_at"] == before["job_timeout_at"]
    assert final["started_at"] == before["started_at"]
    assert final["updated_at"] < final["job_timeout_at"], "the final write lands before the original job timeout"
    assert final["live"] is None
    assert_every_call_answered_once(final["history"])
    # One user message and one answer for the turn, whatever was cut on the way.
    assistant_texts = [m for m in turn_messages(final) if m["role"] == "assistant" and m.get("content")]
    assert len(assistant_texts) == 1, turn_messages(final)


def start_turn(private_redis, text: str, config: TurnConfig) -> tuple[str, dict, int, str]:
    """Submit a turn and wait until it runs: (conversation id, its first running state, the pid of the
    worker running it, that job's id)."""
    cid = ask(private_redis.store, private_redis.queue, text, config)
    first = read_when(private_redis.store, cid, running, OBSERVE_S, "the turn runs")
    pid, job_id = wait_for(lambda: worker_running(private_redis.queue_connection, cid), OBSERVE_S,
                           "a worker that runs the turn")
    assert first["attempt"] == 0, "no resume yet"
    assert first["deadline_at"] and first["job_timeout_at"]
    return cid, first, pid, job_id


def kill_and_see_resumed(private_redis, cid: str, pid: int) -> tuple[dict, float, float]:
    """SIGKILL the worker; returns (the state just before, when it was killed, when the resumed job's
    first write was seen)."""
    before = private_redis.store.read(cid)
    assert not before["done"], before["status"]
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    read_when(private_redis.store, cid, lambda s: s["version"] > before["version"], OBSERVE_S,
              "a write after the kill")
    return before, killed_at, time.time()


# -- killed mid-call, mid-stream, mid-tool --------------------------------------------------------


def test_a_turn_whose_worker_is_killed_mid_model_call_resumes_on_another_worker(private_redis, workers):
    workers(2)
    cid, first, pid, _ = start_turn(private_redis, "hello", SLOW_CALL)
    time.sleep(SETTLE_S)  # into its model call (3 s): not an assertion
    before, killed_at, seen_at = kill_and_see_resumed(private_redis, cid, pid)
    assert seen_at - killed_at < RESUME_SEEN_DEATH_S, f"resumed job wrote {seen_at - killed_at:.1f} s after the kill"
    assert not [s for s in before["steps"] if s["kind"] == "model" and s["turn_id"] == before["turn_id"]]

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert_resumed(final, first, 1)
    step = resume_steps(final)[0]
    # The gap: from the last write before the loss to the resumed job's start.
    assert before["updated_at"] - 0.01 <= step["started_at"] <= killed_at + 0.01, (step, before["updated_at"])
    assert killed_at < step["ended_at"] < killed_at + RESUME_SEEN_DEATH_S, (step, killed_at)
    assert abs(step["remaining_s"] - (final["deadline_at"] - step["ended_at"])) < MARGIN_S, step
    assert turn_messages(final)[-1]["content"].startswith("Hello!")
    # The resumed call ran after the resume, not the dead worker's.
    model_steps = [s for s in final["steps"] if s["kind"] == "model" and s["turn_id"] == final["turn_id"]]
    assert model_steps and all(s["started_at"] >= step["ended_at"] - 0.01 for s in model_steps), model_steps


def test_a_forking_workers_job_killed_mid_model_call_resumes_on_another_worker(private_redis, tmp_path):
    # A forking worker runs the turn in a child (the work horse): SIGKILL that child. RQ's worker marks
    # the job failed without running any callback; the heartbeat, beaten from the child, lapses.
    handle = pools.start_pool(private_redis.url, 2, tmp_path / "fork.log", worker_class="fork",
                              queue_connection=private_redis.queue_connection)
    try:
        cid, first, pid, _ = start_turn(private_redis, "hello", SLOW_CALL)
        horse = wait_for(lambda: next(iter(psutil.Process(pid).children()), None), OBSERVE_S, "the work horse")
        time.sleep(SETTLE_S)  # into its model call (3 s): not an assertion
        _, killed_at, seen_at = kill_and_see_resumed(private_redis, cid, horse.pid)
        assert seen_at - killed_at < RESUME_SEEN_DEATH_S, f"resumed {seen_at - killed_at:.1f} s after the kill"
        final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
        assert_resumed(final, first, 1)
        assert turn_messages(final)[-1]["content"].startswith("Hello!")
    finally:
        pools.stop_pool(handle, private_redis.url)


def test_a_reply_cut_mid_stream_by_the_kill_never_joins_the_history(private_redis, workers):
    workers(2)
    config = FAST.with_changes(model="demo@0.3~30", **LONG)  # a 288-character answer written over ~10 s
    cid, first, pid, _ = start_turn(private_redis, "hello", config)
    cut = read_when(private_redis.store, cid, lambda s: s["live"] and len(s["live"]["text"]) >= 30, OBSERVE_S,
                    "the reply is being written")
    seen_text = cut["live"]["text"]
    kill_and_see_resumed(private_redis, cid, pid)

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert_resumed(final, first, 1)
    step = resume_steps(final)[0]
    partial = step["partial_text"]
    answer = turn_messages(final)[-1]["content"]
    assert partial.startswith(seen_text), (partial, seen_text)
    assert answer.startswith(partial) and len(partial) < len(answer), (partial, answer)
    assert all(m.get("content") != partial for m in final["history"]), "the cut text joined the history"
    assert [m["role"] for m in turn_messages(final)] == ["user", "assistant"]


def test_a_built_in_tool_cut_by_the_kill_runs_again(private_redis, workers):
    workers(2)
    config = FAST.with_changes(model="demo@0.2~0", tool_timeout_cap_s=15.0, **LONG)
    cid, first, pid, _ = start_turn(private_redis, "slow 4", config)  # the demo model calls wait(4)
    read_when(private_redis.store, cid, lambda s: any(c["function"]["name"] == "wait"
                                                     for m in s["history"] for c in m.get("tool_calls") or []),
              OBSERVE_S, "the wait tool is called")
    time.sleep(SETTLE_S)  # into the tool's 4 s: not an assertion
    before, _, _ = kill_and_see_resumed(private_redis, cid, pid)
    assert not [m for m in turn_messages(before) if m["role"] == "tool"], "the tool had no result yet"

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert_resumed(final, first, 1)
    results = [m for m in turn_messages(final) if m["role"] == "tool"]
    assert len(results) == 1 and results[0]["content"].startswith("Waited 4"), results
    assert "not run again" not in results[0]["content"]
    tool_steps = [s for s in final["steps"] if s["kind"] == "tool" and s["turn_id"] == final["turn_id"]]
    assert [(s["name"], s["outcome"]) for s in tool_steps] == [("wait", "ok")], tool_steps
    assert tool_steps[0]["started_at"] >= resume_steps(final)[0]["ended_at"] - 0.01, "run again by the resumed job"
    assert "I waited 4" in turn_messages(final)[-1]["content"]


def test_a_side_effecting_tool_cut_by_the_kill_is_not_run_again(private_redis, workers, scripted, tmp_path):
    effects = tmp_path / "effects.txt"
    workers(2, env={"AGENT_TOOLS": "tests.side_effect_tools", "SIDE_EFFECT_FILE": str(effects)})
    scripted.add(chat_reply(None, [tool_call("record", {"note": "once"}, call_id="call_effect")]),
                 chat_reply("finished anyway"))
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1",
                               tool_timeout_cap_s=15.0, **LONG)
    cid, first, pid, _ = start_turn(private_redis, "record it", config)
    wait_for(lambda: effects.exists() and effects.read_text().count("\n") >= 1, OBSERVE_S, "the side effect")
    assert int(effects.read_text().split()[0]) == pid, "the tool runs in the worker that runs the turn"
    kill_and_see_resumed(private_redis, cid, pid)

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert_resumed(final, first, 1)
    assert effects.read_text().splitlines() == [f"{pid} once"], "the side effect happened exactly once"
    results = [m for m in turn_messages(final) if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["call_effect"]
    assert "worker was lost" in results[0]["content"] and "not run again" in results[0]["content"], results
    assert turn_messages(final)[-1]["content"] == "finished anyway"
    # What the resumed call sent the model: the call, and the one answer that says it was not run again.
    sent = scripted.requests[-1].json["messages"]
    assert [m["content"] for m in sent if m["role"] == "tool"] == [results[0]["content"]]


# -- a frozen worker that wakes up --------------------------------------------------------------


def test_a_frozen_worker_that_wakes_after_the_resume_writes_nothing(private_redis, workers):
    handle = workers(2)
    cid, first, pid, old_job = start_turn(private_redis, "hello", SLOW_CALL)
    time.sleep(SETTLE_S)  # into its model call (3 s): not an assertion
    before = private_redis.store.read(cid)
    workers.frozen.append(pid)
    frozen_at = time.time()
    os.kill(pid, signal.SIGSTOP)

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert_resumed(final, first, 1)
    assert resume_steps(final)[0]["ended_at"] - frozen_at < RESUME_WITHIN_S
    assert before["version"] < final["version"]
    assert alive(pid), "frozen, not dead"

    os.kill(pid, signal.SIGCONT)
    workers.frozen.remove(pid)
    # The old job goes on from where it was frozen; whatever it tries to write is refused.
    wait_for(lambda: current_job_of(private_redis.queue_connection, pid) != old_job, first["job_timeout_at"]
             - time.time() + 10, "the woken worker's old job ends")
    after = private_redis.store.read(cid)
    assert after["version"] == final["version"], "a write of the old job landed"
    assert (after["status"], after["history"], after["steps"], after["turns"]) == (
        final["status"], final["history"], final["steps"], final["turns"])
    assert job_status(private_redis.queue_connection, old_job) in ("finished", "failed"), "the old job ended"
    assert alive(pid), "the woken worker goes on"
    assert "Traceback" not in handle.log_tail(50_000), "the old job ends quietly"


# -- how many resumes, and how much time ---------------------------------------------------------


def test_a_turn_killed_twice_is_resumed_twice(private_redis, workers):
    workers(3)
    config = FAST.with_changes(model="demo@3~0", **LONG)
    cid, first, pid, _ = start_turn(private_redis, "hello", config)
    time.sleep(SETTLE_S)
    kill_and_see_resumed(private_redis, cid, pid)
    second_pid, _ = wait_for(lambda: worker_running(private_redis.queue_connection, cid, exclude={pid}),
                             OBSERVE_S, "a worker runs the resumed turn")
    resumed = read_when(private_redis.store, cid, lambda s: s["attempt"] == 1, OBSERVE_S, "the first resume")
    assert resumed["deadline_at"] == first["deadline_at"]
    time.sleep(SETTLE_S)  # into the resumed job's model call: not an assertion
    kill_and_see_resumed(private_redis, cid, second_pid)

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert_resumed(final, first, 2)
    one, two = resume_steps(final)
    assert one["ended_at"] <= two["started_at"], (one, two)
    assert turn_messages(final)[-1]["content"].startswith("Hello!")


def test_with_no_resume_allowed_a_kill_ends_the_turn_worker_lost_at_once(private_redis, workers):
    workers(2)
    config = SLOW_CALL.with_changes(max_resumes=0)  # AGENT_MAX_RESUMES=0, fixed with the turn when it is enqueued
    cid, first, pid, _ = start_turn(private_redis, "hello", config)
    time.sleep(SETTLE_S)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    ended_after_s = final["updated_at"] - killed_at
    assert ended_after_s < RESUME_WITHIN_S, f"ended {ended_after_s:.1f} s after the kill, not within seconds"
    assert final["updated_at"] < first["job_timeout_at"], "not after the job timeout"
    assert (final["status"], final["error"]["kind"]) == ("failed", "worker_lost"), final["error"]
    message = final["error"]["message"].lower()
    assert "worker" in message and "lost" in message and "resum" in message, final["error"]
    assert not resume_steps(final)
    assert final["deadline_at"] == first["deadline_at"] and final["job_timeout_at"] == first["job_timeout_at"]
    assert final["history"][-1]["role"] == "assistant" and "lost" in final["history"][-1]["content"].lower()
    assert_every_call_answered_once(final["history"])


def test_a_turn_killed_with_too_little_time_left_ends_worker_lost(private_redis, workers):
    workers(2)
    # Deadline 8 s after the start, and no call under 3 s: killed 5.5 s in, it cannot be resumed in time, even
    # at once (its supervisor sees the worker die). Its model call (20 s) is still in flight when it is killed.
    config = FAST.with_changes(model="demo@20~0", job_timeout_s=10, deadline_margin_s=2.0, call_timeout_cap_s=10.0,
                               min_call_s=3.0)
    cid, first, pid, _ = start_turn(private_redis, "hello", config)
    late = first["started_at"] + 5.5
    wait_for(lambda: time.time() >= late, OBSERVE_S, "late in the turn")
    assert not private_redis.store.read(cid)["done"]
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    final = wait_done(private_redis.store, cid, timeout_s=TURN_S)
    assert (final["status"], final["error"]["kind"]) == ("failed", "worker_lost"), final["error"]
    assert final["updated_at"] < first["job_timeout_at"] + MARGIN_S, (final["updated_at"], first["job_timeout_at"])
    assert final["updated_at"] - killed_at < RESUME_WITHIN_S + MARGIN_S
    message = final["error"]["message"].lower()
    assert "worker" in message and "lost" in message and "no time" in message, final["error"]
    assert final["deadline_at"] == first["deadline_at"] and final["job_timeout_at"] == first["job_timeout_at"]
    assert final["history"][-1]["role"] == "assistant" and "lost" in final["history"][-1]["content"].lower()


# -- no page: external workers from worker.py and the CLI ----------------------------------------


def test_external_workers_resume_a_cli_turn_and_the_cli_says_so(private_redis, base_env, tmp_path):
    url = private_redis.url
    env = {**base_env, "REDIS_URL": url, "AGENT_WORKERS": "0", "AGENT_MODEL": "demo@3~0",
           "AGENT_JOB_TIMEOUT": "20", "AGENT_DEADLINE_MARGIN": "3", "AGENT_CALL_TIMEOUT_CAP": "10",
           "AGENT_MIN_CALL_SECONDS": "0.5", "AGENT_STATE_TTL": "600"}
    worker_log, cli_out, cli_err = tmp_path / "worker.log", tmp_path / "cli.out", tmp_path / "cli.err"
    with open(worker_log, "wb") as log:
        worker_py = subprocess.Popen([sys.executable, "worker.py", "--workers", "2"], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    cli = None
    try:
        wait_for(lambda: len(private_redis.queue_connection.smembers("rq:workers")) >= 2, 60, "two workers")
        with open(cli_out, "wb") as out, open(cli_err, "wb") as err:
            cli = subprocess.Popen([sys.executable, "-m", "agent", "ask", "hello"], cwd=ROOT, env=env,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        pid, _, arguments = wait_for(lambda: next(iter(running_jobs(private_redis.queue_connection)), None),
                                     OBSERVE_S, "a worker runs the CLI's turn")
        cid = arguments[0]
        first = read_when(private_redis.store, cid, running, OBSERVE_S, "the turn runs")
        time.sleep(SETTLE_S)
        os.kill(pid, signal.SIGKILL)
        assert cli.wait(TURN_S) == 0, cli_err.read_text() + worker_log.read_text()[-3000:]
        final = private_redis.store.read(cid)
        assert_resumed(final, first, 1)
        stderr = cli_err.read_text().lower()
        assert "resum" in stderr and "worker" in stderr, stderr
        assert "Hello!" in cli_out.read_text()
    finally:
        for proc in (cli, worker_py):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        kill(processes_with_env("REDIS_URL", url, command_part=pools.WORKER_COMMAND))
