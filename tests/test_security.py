"""Security: attacks through a real turn and real workers, forged jobs, key leaks, and exposure."""

from __future__ import annotations

import json
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

from agent.queue import FAILURE_CALLBACK_TIMEOUT_S, JOB_FUNCTION, QUEUE_NAME, SafeJob, new_id
from agent.runtime.loopback_server import hang, raw, reply
from harness.processes import alive, listening_tcp_sockets
from tests.conftest import CANARY_KEY, FAST, ROOT, ask, redis_dump, wait_done
from tests.scripted_server import ScriptedServer, chat_reply, tool_call

FORGED_WAIT_S = 30.0  # seconds for a worker to pick up and refuse a forged job
OFF_QUEUE_SETTLE_S = 5.0  # seconds a job may be off the queue before a busy worker marks it


def scripted_config(server, **changes):
    return FAST.with_changes(provider="openai", model="scripted", base_url=server.url + "/v1", **changes)


def worker_pids(client: redis.Redis) -> set[int]:
    pids = set()
    for key in client.smembers("rq:workers"):
        pid = client.hget(key, "pid")
        if pid and alive(int(pid)):
            pids.add(int(pid))
    return pids


def ready_worker_pids(client: redis.Redis, count: int = 2, timeout_s: float = 15.0) -> set[int]:
    """The pool's worker pids, once all of them have registered."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and len(worker_pids(client)) < count:
        time.sleep(0.1)
    return worker_pids(client)


def wait_forged_job_settled(client: redis.Redis, job_id: str, timeout_s: float = FORGED_WAIT_S) -> bytes | None:
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
    status = wait_forged_job_settled(redis_client, job.id)
    assert status == b"failed"
    time.sleep(0.3)
    assert not marker.exists()
    assert_workers_still_answer(store, queue, before, redis_client)


WEBHOOK_TIMEOUT_S = 10**6  # seconds a forged webhook asks its worker to wait for an answer
FORGED_HEADERS = {"Authorization": "Bearer forged", "X-Forged": "1", "Host": "evil.test", "Content-Type": "text/x"}


def forged_webhooks(url: str) -> str:
    """Every kind of webhook RQ sends: each terminal status, each method, forged headers, a huge timeout."""
    hooks = [{"url": f"{url}/{status}/{method}", "job_status": status, "method": method, "headers": FORGED_HEADERS,
              "timeout": WEBHOOK_TIMEOUT_S} for status in ("failed", "finished") for method in ("GET", "POST")]
    return json.dumps(hooks)


UNLISTENED_URL = "http://127.0.0.1:9"  # the discard port: what a forged webhook points at when no test listens
# Payload fields a forger can set that make a worker connect, wait, or run a job again; and what SafeJob leaves.
FORGED_FIELDS = {
    "webhooks": (forged_webhooks(UNLISTENED_URL), "webhooks", []),
    "retries_left": ("1000000", "retries_left", None),
    "retry_intervals": ("[0, 1000000]", "retry_intervals", None),
    "enqueue_at_front_on_retry": ("1", "enqueue_at_front_on_retry", False),
    "repeats_left": ("1000000", "repeats_left", None),
    "repeat_intervals": ("[0]", "repeat_intervals", None),
    "rate_limit_key": ("forged", "rate_limit_key", None),
    "rate_limit_concurrency": ("1", "rate_limit_concurrency", None),
    "dependency_ids": (json.dumps(["forged-dependency"]), "_dependency_ids", []),
    "success_callback_name": ("agent.turn.on_failure", "_success_callback_name", None),
    "stopped_callback_name": ("agent.turn.on_failure", "_stopped_callback_name", None),
    "failure_callback_name": ("os.getcwd", "_failure_callback_name", None),
    "failure_callback_timeout": ("1000000", "failure_callback_timeout", FAILURE_CALLBACK_TIMEOUT_S),
    "success_callback_timeout": ("1000000", "_success_callback_timeout", None),
    "stopped_callback_timeout": ("1000000", "_stopped_callback_timeout", None),
}


def forge_job(client: redis.Redis, func: str, args: list, fields: dict, prefix: str = "forged-") -> str:
    """A job written straight into Redis with the plain rq Job class, then its hash edited, as a forger would."""
    job = Job.create(func, args=args, connection=client, serializer=JSONSerializer, id=prefix + new_id(),
                     origin=QUEUE_NAME)
    job.save()
    client.hset(job.key, mapping={"status": "queued", **fields})
    return job.id


@pytest.mark.parametrize("field", sorted(FORGED_FIELDS))
def test_a_forged_payload_field_that_makes_a_worker_connect_wait_or_rerun_is_dropped_on_load(redis_client, field):
    value, attribute, expected = FORGED_FIELDS[field]
    job_id = forge_job(redis_client, JOB_FUNCTION, ["c", "t"], {field: value})
    try:
        plain = Job.fetch(job_id, connection=redis_client, serializer=JSONSerializer)
        assert getattr(plain, attribute) != expected  # the forged value is really there for RQ to act on
        safe = SafeJob.fetch(job_id, connection=redis_client, serializer=JSONSerializer)
        assert getattr(safe, attribute) == expected
        assert safe.success_callback is None and safe.stopped_callback is None
    finally:
        redis_client.delete(f"rq:job:{job_id}")


@pytest.mark.usefixtures("pool")
@pytest.mark.parametrize("listener", ["answering", "silent"])
def test_forged_webhooks_are_never_sent_and_leave_every_worker_free(store, queue, redis_client, listener):
    """A refused job (failed webhooks), a job of ours on a gone conversation (finished webhooks), one with
    endless retries and one with endless repeats: no request reaches the listener, every worker stays free."""
    target = ScriptedServer(default=reply(200, {}) if listener == "answering" else hang())
    try:
        before = ready_worker_pids(redis_client)
        every_field = {field: value for field, (value, _, _) in FORGED_FIELDS.items()
                       if field not in ("dependency_ids", "rate_limit_key", "rate_limit_concurrency",
                                        "failure_callback_name")} | {"webhooks": forged_webhooks(target.url)}
        jobs = [
            forge_job(redis_client, "os.getcwd", [], {"webhooks": forged_webhooks(target.url)}),
            forge_job(redis_client, JOB_FUNCTION, ["gone-" + new_id(), "t"], {"webhooks": forged_webhooks(target.url)}),
            forge_job(redis_client, "os.getcwd", [], {"retries_left": "1000000",
                                                       "webhooks": forged_webhooks(target.url)}),
            forge_job(redis_client, JOB_FUNCTION, ["gone-" + new_id(), "t"], {"repeats_left": "1000000",
                                                                               "repeat_intervals": "[0]"}),
            forge_job(redis_client, "os.getcwd", [], every_field),
            forge_job(redis_client, JOB_FUNCTION, ["gone-" + new_id(), "t"], every_field),
        ]
        for job_id in jobs:
            redis_client.rpush(f"rq:queue:{QUEUE_NAME}", job_id)
        statuses = [wait_forged_job_settled(redis_client, job_id, timeout_s=20.0) for job_id in jobs]
        assert statuses == [b"failed", b"finished", b"failed", b"finished", b"failed", b"finished"]
        # The workers are free: a real turn runs at once, on the same worker processes.
        assert_workers_still_answer(store, queue, before, redis_client)
        time.sleep(0.5)  # a webhook would have been sent before the job's worker took the turn
        assert [r.path for r in target.requests] == []
        assert all(redis_client.hget(f"rq:job:{job_id}", "status") in (b"failed", b"finished") for job_id in jobs)
        assert not any(job_id.encode() in redis_client.lrange(f"rq:queue:{QUEUE_NAME}", 0, -1) for job_id in jobs)
    finally:
        target.stop()


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
    wait_forged_job_settled(redis_client, job_id)
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


def key_variants(key: str) -> list[str]:
    """The key as a server might echo it: as sent, upper, lower, swapped and alternating case."""
    alternating = "".join(ch.upper() if i % 2 else ch.lower() for i, ch in enumerate(key))
    return [key, key.upper(), key.lower(), key.swapcase(), alternating, key.title()]


def echoing_script(key: str) -> list:
    """A configured server that echoes the key in every field a reply has, then in errors, then answers."""
    variants = key_variants(key)
    calls = []
    for i, variant in enumerate(variants):
        calls.append(tool_call(f"tool_{variant}", {variant: variant, "x": f"a {variant} b"}, call_id=f"call_{variant}"))
        calls.append(tool_call("calculator", {"expression": f"1+{variant}"}, call_id=f"call_{i}_{variant.upper()}"))
    errors = [{"error": {"message": f"bad key {v}"}} for v in variants]
    return [
        chat_reply(f"Your key is {' and '.join(variants)}.", calls),
        reply(500, errors[1], headers={"Retry-After": "0.1"}),
        raw(f"HTTP/1.1 200 OK\r\nBad Header {variants[3]}\r\n\r\n"),
        raw(f"{variants[4]} 200 OK\r\n\r\n"),
        chat_reply(f"Done, {variants[5]}: " + " ".join(variants)),
    ]


@pytest.mark.usefixtures("pool")
def test_a_key_echoed_in_any_case_in_any_field_of_a_reply_never_reaches_redis_or_the_logs(
    store, queue, scripted, redis_client, pool
):
    scripted.add(*echoing_script(CANARY_KEY))
    cid = ask(store, queue, "hi", scripted_config(scripted, job_timeout_s=10))
    state = wait_done(store, cid, timeout_s=30)
    assert state["status"] == "done", state["history"][-1]
    assert len(scripted.requests) == 5  # every echo was received and handled
    assert scripted.requests[0].headers["authorization"] == f"Bearer {CANARY_KEY}"
    dump = redis_dump(redis_client).lower()
    assert CANARY_KEY.lower().encode() not in dump
    assert b"[redacted]" in dump  # the echoes were kept, redacted, not dropped
    assert CANARY_KEY.lower() not in pool.log_path.read_text(errors="replace").lower()


# -- the embedded Redis and Streamlit are not exposed ------------------------------------------


def test_the_embedded_redis_has_no_tcp_listener_only_its_unix_socket(private_redis):
    server = private_redis.server
    client = redis.Redis(unix_socket_path=str(server.socket), password=server.password)
    marker = "tcp-probe-" + new_id()
    try:
        assert client.config_get("port") == {"port": "0"}
        client.set(marker, "1", ex=60)
    finally:
        client.close()
    # No socket the server owns is a listening TCP socket (IPv4 or IPv6).
    assert listening_tcp_sockets(server.pid) == []
    # And the default port is not it: closed, or another server that has never seen our key.
    if _port_open(6379):
        other = redis.Redis(host="127.0.0.1", port=6379, password=server.password, socket_timeout=1)
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
    server = private_redis.server
    anonymous = redis.Redis(unix_socket_path=str(server.socket), socket_timeout=2)
    wrong = redis.Redis(unix_socket_path=str(server.socket), password="guess", socket_timeout=2)
    try:
        with pytest.raises(redis.AuthenticationError):
            anonymous.get("anything")
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()
    finally:
        anonymous.close()
        wrong.close()
    assert len(server.password) >= 32  # generated, not a constant


def test_the_embedded_redis_files_are_private_to_their_owner(private_redis):
    server = private_redis.server

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(server.password_file) == 0o600
    assert mode(server.conf_file) == 0o600
    assert mode(server.dir) == 0o700
    assert stat.S_ISSOCK(server.socket.stat().st_mode)
    assert mode(server.socket) == 0o700


def test_streamlit_binds_loopback_by_default():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^HOST \?= 127\.0\.0\.1$", makefile, re.MULTILINE)
    run_recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "--server.address $(HOST)" in run_recipe


def test_both_providers_redact_a_key_echoed_in_any_case_from_every_field_and_error(scripted):
    from agent.deadline import CallTimeout
    from agent.providers import AnthropicProvider, OpenAIProvider, ProviderError

    timeout = CallTimeout(total_s=5.0, connect_s=2.0)
    variants = key_variants(CANARY_KEY)
    blocks = [{"type": "text", "text": " ".join(variants)}] + [
        {"type": "tool_use", "id": f"toolu_{v}", "name": f"tool_{v}", "input": {v: [v, {"k": v}]}} for v in variants
    ]
    errors = [reply(status, {"error": {"message": f"no {v}"}})
              for status, v in zip((400, 404, 429, 500), variants[:4], strict=True)]
    scripted.add(*echoing_script(CANARY_KEY), reply(200, {"type": "message", "role": "assistant", "content": blocks}),
                 *errors)
    openai = OpenAIProvider(scripted.url + "/v1", "m", CANARY_KEY)
    anthropic = AnthropicProvider(scripted.url, "m", CANARY_KEY)
    seen = []
    for provider in [openai] * 5 + [anthropic] + [openai] * 4:
        try:
            completion = provider.complete([{"role": "user", "content": "hi"}], [], timeout)
            seen.append(repr(completion))
        except ProviderError as exc:
            seen.append(exc.message)
    assert len(seen) == 10 and all("[redacted]" in text for text in seen), seen
    assert not any(CANARY_KEY.lower() in text.lower() for text in seen), seen


def test_no_part_of_an_echoed_key_survives_where_an_error_text_is_cut(scripted):
    # Regression: error texts were cut to length before the key was redacted, so a key straddling
    # the cut kept all but its last characters. The key is tried at every offset around the cut.
    from agent.deadline import CallTimeout
    from agent.providers import OpenAIProvider, ProviderError
    from agent.providers.http import ERROR_TEXT_LIMIT

    timeout = CallTimeout(total_s=5.0, connect_s=2.0)
    key = CANARY_KEY
    offsets = range(ERROR_TEXT_LIMIT - len(key) - 40, ERROR_TEXT_LIMIT + 10, 3)
    forms = [
        lambda pad: reply(404, {"detail": [pad + key.upper()]}),  # a structured detail, quoted as JSON
        lambda pad: reply(500, {"error": {"message": pad + key}}),
        lambda pad: raw(f"HTTP/1.1 200 OK\r\nBad Header {pad}{key.lower()}\r\n\r\n"),  # quoted by the transport
    ]
    fragments = {key[i:i + 8].lower() for i in range(len(key) - 7)}
    provider = OpenAIProvider(scripted.url + "/v1", "m", key)
    seen = []
    for form in forms:
        for offset in offsets:
            scripted.add(form("x" * offset))
            with pytest.raises(ProviderError) as caught:
                provider.complete([{"role": "user", "content": "hi"}], [], timeout)
            seen.append(caught.value.message)
    leaked = [text for text in seen if any(fragment in text.lower() for fragment in fragments)]
    assert not leaked, leaked[:3]
    assert sum("[redacted]" in text for text in seen) >= len(seen) // 3  # the key was there to redact
