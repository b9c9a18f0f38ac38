"""`make dashboard`: the real rq-dashboard against the project's Redis, asked through its own HTTP API."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

from agent.queue import QUEUE_NAME
from harness import pools
from harness.page import free_port
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, ask, wait_done

START_TIMEOUT_S = 30.0  # seconds for the dashboard to answer
SLOW = dataclasses.replace(FAST, model="demo:slow@1.5")  # a model call a worker is busy with for 1.5 s


def _get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None, None


@pytest.fixture
def dashboard(redis_url, base_env):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "dashboard.py", "--port", str(port)], cwd=ROOT,
                            env={**base_env, "REDIS_URL": redis_url}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/0/data"
    try:
        wait_for(lambda: _get_json(f"{base}/queues.json")[0] == 200 or proc.poll() is not None, START_TIMEOUT_S,
                 "the dashboard to answer")
        assert proc.poll() is None, proc.stderr.read()
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_dashboard_lists_the_queue_and_the_pools_workers(dashboard, pool, store, queue):
    pools.wait_for_workers(pool, queue.connection, 2)
    wait_done(store, ask(store, queue, "What is 2+2?"))  # RQ lists a queue once a job has been enqueued on it
    status, queues = _get_json(f"{dashboard}/queues.json")
    assert status == 200
    assert QUEUE_NAME in [queue["name"] for queue in queues["queues"]]
    status, data = _get_json(f"{dashboard}/workers.json")
    assert status == 200, "the workers view failed"
    names = [worker["name"] for worker in data["workers"]]
    assert sum(name.startswith(f"agent-{pool.proc.pid}-") for name in names) == 2, names


def test_the_workers_view_shows_a_worker_busy_with_a_json_job(dashboard, pool, store, queue):
    """The case rq-dashboard 0.9 fails on its own: a worker's current job, read with the wrong serializer."""
    cid = ask(store, queue, "What is 2+2?", SLOW)
    job_id = wait_for(lambda: (store.read(cid) or {}).get("job_id"), 10, "the turn's job id")

    def busy_worker():
        status, data = _get_json(f"{dashboard}/workers.json")
        assert status == 200, "the workers view failed while a worker was busy"
        current = [w["current_job"] for w in data["workers"] if isinstance(w["current_job"], dict)]
        return [job for job in current if job["job_id"] == job_id]

    busy = wait_for(busy_worker, 10, "a worker shown busy with the turn's job")
    assert "run_turn" in busy[0]["call_string"]
    wait_done(store, cid)


def test_rq_info_shows_the_queue_and_workers_without_printing_the_password(redis_url, base_env, pool, store, queue):
    pools.wait_for_workers(pool, queue.connection, 2)
    wait_done(store, ask(store, queue, "What is 2+2?"))
    done = subprocess.run([sys.executable, "dashboard.py", "--rq-info"], cwd=ROOT, capture_output=True, text=True,
                          env={**base_env, "REDIS_URL": redis_url}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert QUEUE_NAME in done.stdout
    assert f"agent-{pool.proc.pid}-" in done.stdout
    password = urllib.parse.parse_qs(urllib.parse.urlsplit(redis_url).query).get("password", [""])[0]
    assert password and password not in done.stdout + done.stderr
