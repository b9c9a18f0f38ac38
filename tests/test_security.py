"""Security: attacks through a real turn and real workers, forged jobs, key leaks, and exposure."""

from __future__ import annotations

import os
import pickle
import re
import socket
import stat
import time
import tomllib
import zlib
from pathlib import Path

import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from agent.embedded_redis import EmbeddedRedis
from agent.queue import JOB_FUNCTION, QUEUE_NAME, new_id
from tests.conftest import CANARY_KEY, FAST, ROOT, ask, redis_dump, wait_done
from tests.scripted_server import chat_reply, reply, tool_call

FORGED_WAIT_S = 30.0  # seconds for a worker to pick up and refuse a forged job
OFF_QUEUE_SETTLE_S = 5.0  # seconds a job may be off the queue before a busy worker marks it


def scripted_config(server, **changes):
    return FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1", **changes)


def worker_pids(client: redis.Redis) -> set[int]:
    pids = set()
    for key in client.smembers("rq:workers"):
        pid = client.hget(key, "pid")
        if pid and _alive(int(pid)):
            pids.add(int(pid))
    return pids


def ready_worker_pids(client: redis.Redis, count: int = 2, timeout_s: float = 15.0) -> set[int]:
    """The pool's worker pids, once all of them have registered."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and len(worker_pids(client)) < count:
        time.sleep(0.1)
    return worker_pids(client)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_job_ended(client: redis.Redis, job_id: str, timeout_s: float = FORGED_WAIT_S) -> bytes | None:
    """The job's status once a worker has failed or finished it, or has taken it off the queue
    and could not even load it (then its status stays whatever the forger wrote)."""
    end = time.monotonic() + timeout_s
    left_queue_at = None
    while time.monotonic() < end:
        status = client.hget(f"rq:job:{job_id}", "status")
        if status in (b"failed", b"finished"):
            return status
        if job_id.encode() not in client.lrange(f"rq:queue:{QUEUE_NAME}", 0, -1):
            left_queue_at = left_queue_at or time.monotonic()
            if time.monotonic() - left_queue_at > OFF_QUEUE_SETTLE_S:
                return status
        time.sleep(0.05)
    return client.hget(f"rq:job:{job_id}", "status")


def assert_workers_still_answer(store, queue, before: set[int], client: redis.Redis) -> None:
    """The same worker processes are alive, and they still run turns."""
    assert worker_pids(client) == before
    cid = ask(store, queue, "What is 1+1?")
    assert wait_done(store, cid)["status"] == "done"


# -- calculator escapes inside a real worker ------------------------------------------------


ESCAPES = [
    "().__class__.__bases__[0].__subclasses__()",
    "__import__('os').system('id')",
    "9**9**9**9",
    "raise SystemExit",
    "(" * 300 + "1" + ")" * 300,
    "2+" * 5000 + "2",
    "[1]*10**9",
]


@pytest.mark.usefixtures("pool")
def test_calculator_escapes_sent_by_the_model_are_refused_inside_a_worker_that_stays_alive(
    store, queue, scripted, redis_client
):
    before = ready_worker_pids(redis_client)
    calls = [tool_call("calculator", {"expression": e}, call_id=f"call_{i}") for i, e in enumerate(ESCAPES)]
    scripted.add(chat_reply(None, calls), chat_reply("none of that worked"))
    cid = ask(store, queue, "calc", scripted_config(scripted, job_timeout_s=8))
    state = wait_done(store, cid)
    assert state["status"] == "done"
    results = [m["content"] for m in state["history"] if m["role"] == "tool"]
    assert len(results) == len(ESCAPES)
    assert all(r.startswith("Error:") for r in results), results
    assert worker_pids(redis_client) == before  # no worker died or was replaced
    assert_workers_still_answer(store, queue, before, redis_client)


# -- forged jobs ------------------------------------------------------------------------------


@pytest.mark.usefixtures("pool")
def test_a_job_hash_written_straight_into_redis_naming_another_function_is_refused(
    store, queue, redis_client, tmp_path
):
    marker = tmp_path / "forged-function-ran"
    before = ready_worker_pids(redis_client)
    # Written with the plain rq Job class (no allowlist), as an attacker with Redis access would.
    job = Job.create("os.system", args=[f"touch {marker}"], connection=redis_client, serializer=JSONSerializer,
                     id="forged-fn-" + new_id(), origin=QUEUE_NAME)
    job.save()
    redis_client.hset(job.key, mapping={"status": "queued", "failure_callback_name": "os.system"})
    redis_client.rpush(f"rq:queue:{QUEUE_NAME}", job.id)
    status = wait_job_ended(redis_client, job.id)
    assert status == b"failed"
    time.sleep(0.3)
    assert not marker.exists()
    assert_workers_still_answer(store, queue, before, redis_client)


class _Touch:
    """Unpickling this runs os.system: the classic pickle payload."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.usefixtures("pool")
@pytest.mark.parametrize("compress", [False, True], ids=["raw", "zlib"])
def test_a_pickle_blob_in_a_job_is_never_unpickled(store, queue, redis_client, tmp_path, compress):
    marker = tmp_path / f"pickle-ran-{compress}"
    payload = pickle.dumps((JOB_FUNCTION, None, [_Touch(marker)], {}))
    pickle.loads(pickle.dumps(_Touch(tmp_path / "self-check")))  # the payload does work when unpickled
    assert (tmp_path / "self-check").exists()
    before = ready_worker_pids(redis_client)
    job_id = "forged-pickle-" + new_id()
    redis_client.hset(f"rq:job:{job_id}", mapping={
        "data": zlib.compress(payload) if compress else payload,
        "status": "queued",
        "origin": QUEUE_NAME,
        "created_at": "2026-01-01T00:00:00.000000Z",
        "enqueued_at": "2026-01-01T00:00:00.000000Z",
        "description": "forged",
        "timeout": "5",
        "result": pickle.dumps(_Touch(marker)),
        "meta": pickle.dumps(_Touch(marker)),
    })
    redis_client.rpush(f"rq:queue:{QUEUE_NAME}", job_id)
    wait_job_ended(redis_client, job_id)
    time.sleep(0.5)
    assert not marker.exists()
    assert_workers_still_answer(store, queue, before, redis_client)


# -- tool arguments -------------------------------------------------------------------------


@pytest.mark.usefixtures("pool")
def test_a_path_as_the_time_zone_is_rejected_inside_a_real_turn(store, queue, scripted):
    zones = ["../../etc/passwd", "/etc/passwd", "../../../../usr/share/zoneinfo/UTC", "Europe/../../etc/shadow"]
    calls = [tool_call("current_time", {"timezone": z}, call_id=f"call_{i}") for i, z in enumerate(zones)]
    scripted.add(chat_reply(None, calls), chat_reply("no such zones"))
    cid = ask(store, queue, "time?", scripted_config(scripted))
    state = wait_done(store, cid)
    results = [m["content"] for m in state["history"] if m["role"] == "tool"]
    assert len(results) == len(zones)
    assert all(r.startswith("Error:") and "not a valid time zone" in r for r in results), results
    assert not any("root:" in r for r in results)


# -- key leaks ------------------------------------------------------------------------------


@pytest.mark.usefixtures("pool")
def test_a_canary_key_echoed_back_by_the_provider_reaches_neither_redis_nor_the_logs(
    store, queue, scripted, redis_client, pool
):
    # A hostile or buggy provider quotes the key it was sent, in an error and in a retry.
    echo = {"error": {"message": f"Incorrect API key provided: {CANARY_KEY}"}}
    scripted.add(reply(500, echo), reply(429, echo, headers={"Retry-After": "0.1"}), reply(400, echo))
    cid = ask(store, queue, "hi", scripted_config(scripted, job_timeout_s=8))
    state = wait_done(store, cid)
    assert state["status"] == "failed"
    assert scripted.requests[0].headers["authorization"] == f"Bearer {CANARY_KEY}"  # the key was used
    assert CANARY_KEY.encode() not in redis_dump(redis_client)
    assert CANARY_KEY not in pool.log_path.read_text(errors="replace")


# -- the embedded Redis and Streamlit are not exposed ------------------------------------------


@pytest.fixture
def private_redis(tmp_path):
    server = EmbeddedRedis(tmp_path / "r")
    server.acquire()
    try:
        yield server
    finally:
        server.stop()


def _listening_tcp_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        match = re.fullmatch(r"socket:\[(\d+)\]", target)
        if match:
            inodes.add(match.group(1))
    return inodes


def test_the_embedded_redis_has_no_tcp_listener_only_its_unix_socket(private_redis):
    client = redis.Redis(unix_socket_path=str(private_redis.socket), password=private_redis.password)
    marker = "tcp-probe-" + new_id()
    try:
        assert client.config_get("port") == {"port": "0"}
        client.set(marker, "1", ex=60)
    finally:
        client.close()
    # No socket the server owns is a listening TCP socket (IPv4 or IPv6).
    assert not (_socket_inodes(private_redis.pid) & _listening_tcp_inodes())
    # And the default port is not it: closed, or another server that has never seen our key.
    if _port_open(6379):
        other = redis.Redis(host="127.0.0.1", port=6379, password=private_redis.password, socket_timeout=1)
        try:
            assert not other.exists(marker)
        except redis.RedisError:
            pass
        finally:
            other.close()


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_embedded_redis_refuses_a_client_without_its_password(private_redis):
    anonymous = redis.Redis(unix_socket_path=str(private_redis.socket), socket_timeout=2)
    wrong = redis.Redis(unix_socket_path=str(private_redis.socket), password="guess", socket_timeout=2)
    try:
        with pytest.raises(redis.AuthenticationError):
            anonymous.get("anything")
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
    finally:
        anonymous.close()
        wrong.close()
    assert len(private_redis.password) >= 32  # generated, not a constant


def test_the_embedded_redis_files_are_private_to_their_owner(private_redis):
    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(private_redis.password_file) == 0o600
    assert mode(private_redis.conf_file) == 0o600
    assert mode(private_redis.dir) == 0o700
    assert stat.S_ISSOCK(private_redis.socket.stat().st_mode)
    assert mode(private_redis.socket) == 0o700


def test_streamlit_binds_loopback_by_default():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", makefile, re.MULTILINE)
    run_recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "--server.address $(HOST)" in run_recipe
