"""Shared fixtures: a real Redis server, a real worker pool and the demo provider, all on
loopback or a unix socket, all stopped at the end (also on failure)."""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import redis

from agent.conversation.store import Store
from agent.hosting.pool import PoolHandle
from agent.queue import get_queue, new_id, submit_turn
from agent.runtime.connection import queue_client, state_client
from agent.settings import TurnConfig
from harness import pools
from harness.follow import states
from harness.private_redis import PrivateRedis, stored_values
from tests import live_owner

ROOT = Path(__file__).resolve().parent.parent
os.environ["AGENT_MCP_CONFIG"] = "off"  # no MCP servers unless a test names its own (tests/test_mcp.py)

# A test never reads or writes the checkout's .data (the notes add_note writes and the page's sidebar
# shows, an embedded Redis): this process, and every child it starts with its environment, use a data
# directory of the run's own, and each test gets one of its own (own_data_dir) on top of it.
TEST_DATA_ROOT = Path(tempfile.mkdtemp(prefix="agent-tests-"))  # short: an embedded Redis's socket lives in it
os.environ["AGENT_DATA_DIR"] = str(TEST_DATA_ROOT / "session")
_test_numbers = itertools.count(1)
CANARY_KEY = "sk-canary-7f3a9c1e5b2d4680"  # must never be seen in Redis, the page or logs

# The clocks scaled down: a 6 s job timeout and a 2 s margin give a 4 s deadline. The demo model
# answers at once (a 0.05 s latency, its answer in one piece), not at the pace a person reads.
FAST_DEMO = "demo@0.05~0"
FAST = TurnConfig(
    provider="demo",
    model=FAST_DEMO,
    job_timeout_s=6,
    deadline_margin_s=2.0,
    call_timeout_cap_s=3.0,
    connect_timeout_s=1.0,
    min_call_s=0.5,
    max_steps=8,
)


@pytest.fixture(autouse=True)
def own_data_dir(monkeypatch) -> Path:
    """This test's data directory (AGENT_DATA_DIR): notes another test added are not on its page."""
    folder = TEST_DATA_ROOT / f"test-{next(_test_numbers)}"
    monkeypatch.setenv("AGENT_DATA_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def owners_stopped() -> None:
    """The live owners a test gave the turns it wrote in flight end with it (tests/live_owner.py)."""
    yield
    live_owner.stop_all()


def pytest_unconfigure(config):
    """Stop any embedded Redis a test left in its data directory, then remove them all."""
    from agent.runtime.embedded_redis import EmbeddedRedis

    for folder in TEST_DATA_ROOT.glob("*"):
        if (folder / "redis.pid").exists():
            EmbeddedRedis(folder).stop()
    shutil.rmtree(TEST_DATA_ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A real Redis server binary, private to the test session."""
    with PrivateRedis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def private_redis(tmp_path):
    """A Redis of this test's own, so that only its workers take its jobs and stopping it touches no other test."""
    with PrivateRedis(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def redis_client(redis_url):
    # No flush: the session's workers keep their keys; every test uses fresh ids instead.
    client = state_client(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def store(redis_client):
    return Store(redis_client, ttl_s=600)


@pytest.fixture
def queue(redis_url, redis_client):
    return get_queue(queue_client(redis_url))


def start_pool(url: str, workers: int, log_path: Path, extra_env: dict | None = None) -> PoolHandle:
    """A real worker pool whose workers hold the canary keys (which must never leak)."""
    env = {"OPENAI_API_KEY": CANARY_KEY, "ANTHROPIC_API_KEY": CANARY_KEY, **(extra_env or {})}
    return pools.start_pool(url, workers, log_path, env=env)


@pytest.fixture(scope="session")
def pool(redis_url, tmp_path_factory):
    """Two real RQ workers (and the demo provider) in a supervisor process."""
    handle = start_pool(redis_url, 2, tmp_path_factory.mktemp("pool") / "pool.log")
    try:
        yield handle
    finally:
        pools.stop_pool(handle, redis_url)


def wait_done(store: Store, conversation_id: str, timeout_s: float = 20.0, on_state=None) -> dict:
    """Poll like a client until done; returns the final state. Fails the test if it never comes."""
    for state in states(store, conversation_id, timeout_s=timeout_s):
        if state is None:
            continue
        if on_state:
            on_state(state)
        if state["done"]:
            return state
    raise AssertionError(f"turn did not finish within {timeout_s} s: {store.read(conversation_id)}")


def ask(store: Store, queue, message: str, config: TurnConfig = FAST, conversation_id: str | None = None) -> str:
    conversation_id = conversation_id or new_id()
    submit_turn(store, queue, conversation_id, message, config)
    return conversation_id


def cpu_seconds(function, text: str, *, repeats: int = 1) -> float:
    """CPU seconds of this thread for function(text), the best of `repeats`: not wall-clock time, which
    a busy neighbour stretches, nor the process's, which a leftover thread of an earlier test adds to.
    The collector is paused: a full garbage collection walks every object the suite has made so far,
    so whether one lands inside the measurement depends on the heap, not on the function."""
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.thread_time()
            function(text)
            best = min(best, time.thread_time() - started)
    finally:
        gc.enable()
    return best


def repeated(pattern: str, size: int) -> str:
    """`pattern` over and over, cut to `size` characters: a pathological input for a linear-time test."""
    return (pattern * (size // len(pattern) + 1))[:size]


@pytest.fixture
def base_env(tmp_path):
    """The environment without any agent or provider setting, and a private data dir: for the CLI
    and other commands run as subprocesses."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AGENT_", "OPENAI_", "ANTHROPIC_")) and k != "REDIS_URL"}
    return {**env, "AGENT_DATA_DIR": str(tmp_path / "data"), "PYTHONUNBUFFERED": "1", "AGENT_MCP_CONFIG": "off"}


@pytest.fixture
def scripted():
    """A scripted OpenAI-compatible server on loopback (tests/scripted_server.py)."""
    from tests.scripted_server import ScriptedServer

    server = ScriptedServer()
    try:
        yield server
    finally:
        server.stop()


def redis_dump(client: redis.Redis) -> bytes:
    """Every key's value, for leak checks."""
    return b"\n".join(part for key, values in stored_values(client) for part in (*values, key))


# The files that take longest (measured, in seconds of test time: 160 down to 15), started first. `make
# test` gives each process a whole file at a time in this order (--no-loadscope-reorder): a long file
# handed out last would hold the run open alone at its end. The rest follow in collection order.
LONGEST_FIRST = (
    "test_browser.py",
    "test_browser_long_turns.py",
    "test_cli_redis.py",
    "test_hostile_states.py",
    "test_browser_long_chat.py",
    "test_resume.py",
    "test_faults.py",
    "test_fleet.py",
    "test_bench.py",
    "test_markdown.py",
    "test_approvals_page.py",
    "test_approvals.py",
    "test_browser_signin.py",
    "test_signin.py",
    "test_cli.py",
    "test_mcp.py",
    "test_conversations_cli.py",
    "test_queued_turns.py",
    "test_services.py",
    "test_app.py",
    "test_redis_stalls.py",
    "test_dashboard.py",
    "test_retention_restart.py",
    "test_branch_property.py",
    "test_turn.py",
    "test_tracing.py",
    "test_browser_resume.py",
    "test_browser_approvals.py",
    "test_streamed_redaction.py",
    "test_export.py",
    "test_abandoned_tools.py",
    "test_security.py",
    "test_empty_reply.py",
    "test_live.py",
    "test_embedded_redis.py",
    "test_conversations.py",
    "test_redaction.py",
    "test_streaming.py",
)


# The files that drive Chromium against a page server: `make test` runs them one after another, in
# one process (one group), so that two browsers and their page servers never share the two cores with
# the rest of the suite; a page that falls seconds behind fails a test that watches it live.
BROWSER_FILES = frozenset({
    "test_browser.py",
    "test_browser_signin.py",
    "test_browser_long_chat.py",
    "test_browser_resume.py",
    "test_browser_approvals.py",
    "test_browser_long_turns.py",
    "test_browser_branches.py",
})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file keeps its order
    if config.getoption("dist", "no") == "loadgroup":  # `make test`: a file to a process, the browser files as one
        for item in items:
            group = "browser" if item.path.name in BROWSER_FILES else item.path.name
            item.add_marker(pytest.mark.xdist_group(group))
