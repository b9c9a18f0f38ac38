"""MCP servers as tool sources, against real servers: mcp-server-time from PyPI and the project's
own hostile server (tests/mcp_hostile_server.py), in this process and through real workers."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest
from mcp.types import Tool as ListedTool
from mcp.types import ToolAnnotations
from rq import Worker

from agent.conversation.store import Store
from agent.hosting.pool import launch
from agent.queue import get_queue, new_id, submit_turn
from agent.runtime.connection import queue_client, state_client
from agent.runtime.embedded_redis import EmbeddedRedis
from agent.tools import REGISTRY, mcp_stdio, needs_approval, run_tool, schemas, sources
from agent.tools.catalogue import CATALOGUE_KEY, read_catalogue
from agent.tools.mcp import (
    IDEMPOTENCY_META_KEY,
    MAX_DESCRIPTION_CHARS,
    MAX_SCHEMA_BYTES,
    MAX_TOOLS_PER_SERVER,
    McpConfigError,
    McpHub,
    ServerConfig,
    offered_tool,
    offered_tools,
    public_name,
    read_config,
)
from agent.tools.mcp_stdio import ID_PREFIX_BYTES, MAX_LINE_BYTES, LineReader, answered_id
from agent.tools.registry import make_tool
from agent.tools.running import MAX_OUTPUT_CHARS
from harness.processes import processes_with_env
from harness.waiting import wait_for
from tests.conftest import FAST, ROOT, start_pool, wait_done
from tests.mcp_hostile_server import HOSTILE_TEXT, SLEEPER_KINDS

HOSTILE = str(ROOT / "tests" / "mcp_hostile_server.py")
TIME = ServerConfig("time", "mcp-server-time", ("--local-timezone", "UTC"))
START_TIMEOUT_S = 15.0  # seconds: mcp-server-time starts in about 2 s on an idle machine
SHORT_START_TIMEOUT_S = 6.0  # seconds: the hostile server starts in about 1 s idle (importing the SDK), 4 s loaded
# Seconds a worker stopped mid start-up gets to close its servers (at most 5 s, then 2 s for the session
# thread) and exit, on a machine as busy as `make test` in 5 processes (it took 10 s there once).
CLOSE_BOUND_S = 15.0
DEREGISTER_BOUND_S = 4.0  # seconds from SIGTERM to its registration gone, busy machine included
SECRET = "mcp-env-canary-5b1f"  # an env value in the config: must never reach Redis


# -- the config file and the naming rule (pure) ----------------------------------------------


def test_tool_names_are_server_then_tool_within_the_providers_rule():
    assert public_name("time", "get_current_time") == "time__get_current_time"
    odd = public_name("docs", "search.pages/v2")
    long = public_name("a" * 24, "b" * 80)
    for name in (odd, long):
        assert len(name) <= 64 and all(c.isalnum() or c in "_-" for c in name)
    assert odd != public_name("docs", "search_pages_v2")  # a changed name gets a hash: no collision


@pytest.mark.parametrize("config, problem", [
    ({"servers": {}}, "mcpServers"),
    ({"mcpServers": {"bad name": {"command": "x"}}}, "a name is"),
    ({"mcpServers": {"a__b": {"command": "x"}}}, "a name is"),
    ({"mcpServers": {"t": {}}}, "either"),
    ({"mcpServers": {"t": {"command": "x", "url": "http://127.0.0.1/mcp"}}}, "either"),
    ({"mcpServers": {"t": {"command": "x", "args": "-v"}}}, "args"),
    ({"mcpServers": {"t": {"command": "x", "env": {"K": 1}}}}, "env"),
    ({"mcpServers": {"t": {"url": "file:///etc/passwd"}}}, "url"),
    ({"mcpServers": {"t": {"command": "x", "approve": "yes"}}}, "approve"),
    ({"mcpServers": {"t": {"command": "x", "approve": None}}}, "approve"),
    ({"mcpServers": {"t": {"command": "x", "approve": 1}}}, "approve"),
])  # fmt: skip
def test_a_bad_config_is_refused_naming_the_file_and_the_problem(tmp_path, config, problem):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(config))
    with pytest.raises(McpConfigError, match=problem) as caught:
        read_config(path)
    assert str(path) in str(caught.value)


def test_a_servers_approve_is_read_from_its_entry_and_unset_by_default(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"asks": {"command": "x", "approve": True},
                                               "trusted": {"url": "http://127.0.0.1/mcp", "approve": False},
                                               "plain": {"command": "x"}}}))
    assert [(s.name, s.approve) for s in read_config(path)] == [("asks", True), ("trusted", False), ("plain", None)]


def _listed(annotations: ToolAnnotations | None, name: str = "act") -> ListedTool:
    return ListedTool(name=name, description="does something", inputSchema={"type": "object"},
                      annotations=annotations)


def _never_called(*args):
    raise AssertionError("no call is made to build a tool")


@pytest.mark.parametrize(("annotations", "asks"), [
    (None, False),
    (ToolAnnotations(), False),  # the spec's default of destructiveHint is not said outright: no question
    (ToolAnnotations(destructiveHint=False), False),
    (ToolAnnotations(readOnlyHint=True), False),
    (ToolAnnotations(destructiveHint=True), True),
    (ToolAnnotations(destructiveHint=True, idempotentHint=True), True),
    (ToolAnnotations(destructiveHint=True, readOnlyHint=False), True),
    (ToolAnnotations(destructiveHint=True, readOnlyHint=True), False),  # read-only wins: it changes nothing
])  # fmt: skip
def test_an_mcp_tool_asks_first_when_its_annotations_say_destructive_and_not_read_only(annotations, asks):
    assert offered_tool("files", _listed(annotations), _never_called).needs_approval is asks


@pytest.mark.parametrize("annotations", [None, ToolAnnotations(readOnlyHint=True),
                                         ToolAnnotations(destructiveHint=True)])
def test_a_servers_approve_decides_for_every_one_of_its_tools_whatever_they_say(annotations):
    assert offered_tool("files", _listed(annotations), _never_called, approve=True).needs_approval is True
    assert offered_tool("files", _listed(annotations), _never_called, approve=False).needs_approval is False


def test_offered_tools_passes_the_servers_approve_on_to_each_tool():
    listing = [_listed(None, "read"), _listed(ToolAnnotations(destructiveHint=True), "erase")]
    asks = {t.name: t.needs_approval for t in offered_tools("files", listing, _never_called)[0]}
    assert asks == {"files__read": False, "files__erase": True}
    tools, _ = offered_tools("files", listing, _never_called, approve=True)
    assert all(t.needs_approval for t in tools)


def test_the_shipped_config_names_mcp_server_time():
    servers = read_config(ROOT / "mcp.json")
    assert [(s.name, s.command) for s in servers] == [("time", "mcp-server-time")]


def test_agent_tools_adds_the_typed_functions_a_module_lists(monkeypatch):
    monkeypatch.setattr("agent.tools.sources._hubs", [])
    try:
        loaded = sources.load({"AGENT_TOOLS": "tests.sample_tools", "AGENT_MCP_CONFIG": "off"})
        assert [s["name"] for s in loaded] == ["built-in", "tests.sample_tools"]
        assert loaded[1]["tools"] == [{"name": "shout", "description": "Say it louder.", "needs_approval": False}]
        (offered,) = schemas(["shout"])
        assert offered["function"]["parameters"]["properties"]["style"]["enum"] == ["caps", "stars"]
        assert run_tool("shout", json.dumps({"text": "hi", "style": "stars"}), 5).output == "*hi*"
    finally:
        REGISTRY.pop("shout", None)


def test_a_bad_agent_tools_module_is_reported_and_the_built_ins_still_work():
    loaded = sources.load({"AGENT_TOOLS": "tests.no_such_module", "AGENT_MCP_CONFIG": "off"})
    assert "ModuleNotFoundError" in loaded[-1]["error"]
    assert run_tool("calculator", json.dumps({"expression": "6*7"}), 5).output == "42"


def test_a_missing_config_named_by_the_variable_is_reported(tmp_path):
    loaded = sources.load({"AGENT_MCP_CONFIG": str(tmp_path / "nowhere.json")})
    assert loaded[-1]["name"] == "AGENT_MCP_CONFIG" and "cannot be read" in loaded[-1]["error"]


def test_a_python_source_whose_tool_name_is_taken_registers_none_of_its_tools(monkeypatch):
    from tests import sample_tools

    def calculator(expression: str) -> str:
        """Takes a built-in's name."""
        return expression

    monkeypatch.setattr(sample_tools, "TOOLS", [sample_tools.shout, calculator])
    loaded = sources.load({"AGENT_TOOLS": "tests.sample_tools", "AGENT_MCP_CONFIG": "off"})
    assert "'calculator' is already registered" in loaded[-1]["error"] and loaded[-1]["tools"] == []
    assert "shout" not in REGISTRY  # checked before any was added: the registry agrees with the catalogue
    assert run_tool("calculator", json.dumps({"expression": "6*7"}), 5).output == "42"


def test_an_mcp_source_whose_tool_name_is_taken_registers_none_of_its_tools(monkeypatch, tmp_path):
    def hostile__echo(text: str) -> str:
        """Takes the name of the hostile server's echo tool."""
        return text

    taken = make_tool(hostile__echo, source="tests.sample_tools")
    monkeypatch.setitem(REGISTRY, taken.name, taken)
    monkeypatch.setattr("agent.tools.sources._hubs", [])
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"hostile": {"command": sys.executable, "args": [HOSTILE]}}}))
    try:
        loaded = sources.load({"AGENT_MCP_CONFIG": str(config)})
        (hostile,) = [s for s in loaded if s["name"] == "hostile"]
        assert "'hostile__echo' is already registered" in hostile["error"] and hostile["tools"] == []
        assert "hostile__hang" not in REGISTRY and REGISTRY["hostile__echo"] is taken
    finally:
        sources.close()


def test_the_published_tools_say_which_ask_first_by_their_annotations_or_their_servers_approve(monkeypatch,
                                                                                              tmp_path):
    monkeypatch.setattr("agent.tools.sources._hubs", [])
    config = tmp_path / "mcp.json"
    annotated = {"command": sys.executable, "args": [HOSTILE, "--annotated"]}
    config.write_text(json.dumps({"mcpServers": {"files": annotated, "asks": {**annotated, "approve": True},
                                                 "trusted": {**annotated, "approve": False}}}))
    try:
        loaded = {s["name"]: s for s in sources.load({"AGENT_MCP_CONFIG": str(config)})}
        assert [s["error"] for s in loaded.values()] == [None] * 4
        asking = {name: sorted(t["name"] for t in s["tools"] if t["needs_approval"]) for name, s in loaded.items()}
        assert asking["built-in"] == ["add_note"] and asking["files"] == ["files__erase"]
        assert asking["trusted"] == [] and len(asking["asks"]) == len(loaded["asks"]["tools"]) > 10
        assert needs_approval("files__erase") and not needs_approval("files__peek") and needs_approval("asks__peek")
    finally:
        sources.close()
        for name in [n for n in REGISTRY if n.startswith(("files__", "asks__", "trusted__"))]:
            REGISTRY.pop(name)


def test_mcp_servers_are_not_started_for_a_worker_class_that_runs_jobs_elsewhere(tmp_path):
    config = tmp_path / "mcp.json"
    mark = uuid.uuid4().hex
    config.write_text(json.dumps({"mcpServers": {
        "hostile": {"command": sys.executable, "args": [HOSTILE], "env": {"MCP_TEST_MARK": mark}}}}))
    loaded = sources.load({"AGENT_MCP_CONFIG": str(config)}, jobs_in_process=False)
    assert loaded[-1]["name"] == "AGENT_MCP_CONFIG" and "simple worker class" in loaded[-1]["error"]
    assert not any(name.startswith("hostile__") for name in REGISTRY)
    assert not processes_with_env("MCP_TEST_MARK", mark)


def test_a_turn_runs_only_the_tools_it_was_offered():
    result = run_tool("calculator", json.dumps({"expression": "1+1"}), 5, offered=("current_time",))
    assert not result.ok and "unknown tool 'calculator'" in result.output and "current_time" in result.output


def test_a_dropped_line_is_matched_to_its_request_by_a_top_level_id_before_the_cut_or_as_the_only_one_pending():
    assert answered_id(b'{"jsonrpc": "2.0", "id": 7, "result": {"content": [{"text": "xxx', [3, 7]) == 7
    assert answered_id(b'{"jsonrpc":"2.0","id":"a-1","result":', ["a-1"]) == "a-1"
    assert answered_id(b'{"jsonrpc":"2.0","result":{"text":"\\"id\\":999 xxx', [4]) == 4  # cut before its id
    assert answered_id(b'{"jsonrpc":"2.0","result":{"text":"\\"id\\":999 xxx', [4, 5]) is None  # which one?
    assert answered_id(b"\x00\xff{yyy", [4]) == 4 and answered_id(b"", []) is None
    assert answered_id(b'{"jsonrpc":"2.0","id":9,"result":', [4]) is None  # answers no pending request
    assert answered_id(b'{"id":true,', [4]) is None
    assert answered_id(b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"xx', [4]) is None


def test_the_line_reader_keeps_lines_within_the_cap_and_reports_longer_ones_by_size_and_start():
    rng = random.Random(7)
    data = b"".join(rng.choice([b"a" * rng.randrange(0, 40), b"b" * rng.randrange(41, 200)]) + b"\n"
                    for _ in range(200))
    reader, got = LineReader(max_line_bytes=40), []
    position = 0
    while position < len(data):
        step = rng.randrange(1, 97)
        got += reader.feed(data[position:position + step])
        position += step
    expected = data.split(b"\n")[:-1]
    assert len(got) == len(expected)
    for line, item in zip(expected, got, strict=True):
        if len(line) <= 40:
            assert item == line
        else:
            start, size = item.args  # the start: what was read when the line passed the cap
            assert size == len(line) and line.startswith(start) and 40 < len(start) <= ID_PREFIX_BYTES


# -- real servers in this process ---------------------------------------------------------------


@pytest.fixture(scope="module")
def hub():
    """mcp-server-time and the hostile server, their tools registered for this module only."""
    started = McpHub()
    reports = started.start([TIME, ServerConfig("hostile", sys.executable, (HOSTILE,))], START_TIMEOUT_S)
    tools = {t.name: t for report in reports for t in report.tools}
    REGISTRY.update(tools)
    try:
        assert [r.error for r in reports] == [None, None]
        yield started
    finally:
        for name in tools:
            REGISTRY.pop(name, None)
        started.close()


def test_an_mcp_tool_is_offered_with_the_servers_own_input_schema(hub):
    (offered,) = schemas(["time__get_current_time"])
    parameters = offered["function"]["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["timezone"]
    assert "IANA timezone name" in parameters["properties"]["timezone"]["description"]


def test_get_current_time_answers_through_run_tool(hub):
    result = run_tool("time__get_current_time", json.dumps({"timezone": "Asia/Tokyo"}), 5)
    assert result.ok, result.output
    assert json.loads(result.output)["timezone"] == "Asia/Tokyo"


def test_a_hanging_mcp_tool_ends_as_a_tool_error_at_its_timeout_and_the_server_still_answers(hub):
    started = time.monotonic()
    result = run_tool("hostile__hang", "{}", 1.0)
    elapsed = time.monotonic() - started
    assert not result.ok and "did not answer within" in result.output and "hostile" in result.output
    assert 0.7 < elapsed < 1.0 + 1.0
    assert run_tool("hostile__echo", json.dumps({"text": "still here"}), 5).output == "still here"


def test_a_call_carries_its_idempotency_key_in_the_requests_meta(hub):
    # The key a turn gives each call (its turn and call, the same after a resume) reaches the server as
    # `_meta.idempotencyKey`, for a server that dedupes side effects; no key, no entry.
    result = run_tool("hostile__meta", "{}", 5, idempotency_key="turn-1:call_7")
    assert result.ok, result.output
    assert json.loads(result.output).get(IDEMPOTENCY_META_KEY) == "turn-1:call_7"
    result = run_tool("hostile__meta", "{}", 5)
    assert IDEMPOTENCY_META_KEY not in json.loads(result.output)


def test_an_error_result_ends_as_a_tool_error_that_says_so(hub):
    result = run_tool("hostile__fail", "{}", 5)
    assert not result.ok and result.output.startswith("Error: fail on the hostile MCP server reported an error")


def test_a_huge_result_ends_as_a_tool_error_that_says_how_big_it_was_and_keeps_its_start(hub):
    result = run_tool("hostile__huge", "{}", 10)
    assert not result.ok and "returned 2,000,000 characters, more than the 4,000" in result.output
    assert result.output.endswith("x" * 1000) and len(result.output) <= MAX_OUTPUT_CHARS


TOO_BIG_BOUND_S = 6.0  # seconds for a line past the cap to end as a tool error: 0.7 s idle for 100 MB,
# almost all of it the server making the line (this side reads 100 MB in 0.1 s of CPU)
NEXT_CALL_BOUND_S = 1.5  # seconds for the next call on that server to answer (milliseconds idle)


def assert_too_big_then_served(hub, call) -> None:
    """The call ends as a "too big" tool error in bounded time, and the server answers the next call at once."""
    started = time.monotonic()
    result = call()
    elapsed = time.monotonic() - started
    assert not result.ok and "too big" in result.output and "hostile" in result.output, result.output[:300]
    assert elapsed < TOO_BIG_BOUND_S, f"{elapsed:.1f} s"
    started = time.monotonic()
    assert run_tool("hostile__echo", json.dumps({"text": "next"}), 5).output == "next"
    assert time.monotonic() - started < NEXT_CALL_BOUND_S


def test_a_100_mb_answer_ends_as_a_too_big_tool_error_in_bounded_time_and_the_server_serves_on(hub):
    # 50 million characters, sent as text and again as structured content: a line of 100 MB
    assert_too_big_then_served(hub, lambda: run_tool("hostile__huge", json.dumps({"chars": 50_000_000}), 20))


def test_any_line_past_the_cap_ends_its_call_as_too_big_and_the_server_serves_on(hub):
    rng = random.Random(20261202)
    shapes = ["id_first", "id_last", "junk", "id_in_text"]
    for shape in shapes + [rng.choice(shapes) for _ in range(4)]:
        size_bytes = MAX_LINE_BYTES + rng.choice([1, rng.randrange(2, 64 * 1024), rng.randrange(MAX_LINE_BYTES * 3)])
        arguments = json.dumps({"size_bytes": size_bytes, "shape": shape})
        assert_too_big_then_served(hub, lambda arguments=arguments: run_tool("hostile__flood", arguments, 20))


def test_a_result_just_under_the_line_cap_is_read_whole(hub):
    chars = (MAX_LINE_BYTES - 1000) // 2  # the result comes twice: as text and as structured content
    result = run_tool("hostile__huge", json.dumps({"chars": chars}), 30)
    assert not result.ok and f"returned {chars:,} characters" in result.output  # read whole, then refused: > 4,000


def test_the_servers_own_schema_check_answers_bad_arguments(hub):
    result = run_tool("hostile__echo", json.dumps({"text": 5, "times": "x"}), 5)
    assert not result.ok and result.output.startswith("Error: echo on the hostile MCP server")


def test_a_server_that_crashes_mid_call_ends_as_a_tool_error_and_its_other_tools_say_it_is_gone():
    crashing = McpHub()
    (report,) = crashing.start([ServerConfig("crashy", sys.executable, (HOSTILE,))], START_TIMEOUT_S)
    tools = {t.name: t for t in report.tools}
    try:
        started = time.monotonic()
        with pytest.raises(Exception, match="crash on the crashy MCP server failed"):
            tools["crashy__crash"].func({}, timeout_s=5.0, stop=None)
        with pytest.raises(Exception, match="crashy"):
            tools["crashy__echo"].func({"text": "x"}, timeout_s=5.0, stop=None)
        assert time.monotonic() - started < 5.0
    finally:
        crashing.close()


def test_a_slow_or_broken_start_is_reported_within_the_start_timeout_and_the_other_server_works():
    mark = uuid.uuid4().hex
    starting = McpHub()
    started = time.monotonic()
    reports = starting.start([
        ServerConfig("slow", sys.executable, (HOSTILE, "--start-delay", "60"), {"MCP_TEST_MARK": mark}),
        ServerConfig("missing", "/nonexistent/mcp-server"),
        ServerConfig("fine", sys.executable, (HOSTILE,)),
    ], SHORT_START_TIMEOUT_S)
    try:
        assert time.monotonic() - started < SHORT_START_TIMEOUT_S + 1.5
        slow, missing, fine = reports
        assert slow.error == f"did not start and list its tools within {SHORT_START_TIMEOUT_S:g} s" and not slow.tools
        assert missing.error.startswith("did not start: FileNotFoundError")
        assert fine.error is None
        echo = {t.name: t for t in fine.tools}["fine__echo"]
        assert echo.func({"text": "ok"}, timeout_s=5.0, stop=None) == "ok"
        wait_for(lambda: not processes_with_env("MCP_TEST_MARK", mark), 10, "the slow server stopped")
    finally:
        starting.close()


def mcp_session_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mcp-sessions"]


def test_closing_a_hub_whose_servers_all_failed_to_start_ends_its_thread():
    before = mcp_session_threads()
    failed = McpHub()
    (report,) = failed.start([ServerConfig("missing", "/nonexistent/mcp-server")], START_TIMEOUT_S)
    assert report.error.startswith("did not start")
    failed.close()
    assert mcp_session_threads() == before and failed.loop.is_closed()


def test_closing_a_hub_stops_its_servers_its_loop_and_its_thread():
    mark = uuid.uuid4().hex
    before = mcp_session_threads()
    closing = McpHub()
    reports = closing.start([
        ServerConfig("fine", sys.executable, (HOSTILE,), {"MCP_TEST_MARK": mark}),
        ServerConfig("slow", sys.executable, (HOSTILE, "--start-delay", "60"), {"MCP_TEST_MARK": mark}),
    ], SHORT_START_TIMEOUT_S)
    assert [r.error is None for r in reports] == [True, False]
    closing.close()
    assert mcp_session_threads() == before and closing.loop.is_closed()
    wait_for(lambda: not processes_with_env("MCP_TEST_MARK", mark), 2.0, "no server process left")


def test_a_server_past_the_limits_offers_only_what_fits_and_says_what_it_left_out():
    from tests.mcp_hostile_server import EXTRA_TOOLS

    oversized = McpHub()
    try:
        (report,) = oversized.start([ServerConfig("big", sys.executable, (HOSTILE, "--oversized"))], START_TIMEOUT_S)
        tools = {t.name: t for t in report.tools}
        listed = 11 + 2 + EXTRA_TOOLS  # the hostile server's own tools, wordy and bloated, and the extras
        assert f"lists {listed} tools; only the first {MAX_TOOLS_PER_SERVER} are offered" in report.error
        assert len(tools) == MAX_TOOLS_PER_SERVER - 1  # bloated is refused
        assert "'bloated' left out: its input schema is" in report.error and f"{MAX_SCHEMA_BYTES:,}" in report.error
        assert "big__bloated" not in tools
        assert len(tools["big__wordy"].description) == MAX_DESCRIPTION_CHARS
    finally:
        oversized.close()


def test_a_worker_stopped_while_its_mcp_servers_start_deregisters_at_once(private_redis, base_env, tmp_path):
    mark, name = uuid.uuid4().hex, f"starting-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"slow": {
        "command": sys.executable, "args": [HOSTILE, "--start-delay", "60"], "env": {"MCP_TEST_MARK": mark}}}}))
    env = {**base_env, "REDIS_URL": private_redis.url, "AGENT_MCP_CONFIG": str(config),
           "AGENT_MCP_START_TIMEOUT": "60"}
    worker = subprocess.Popen([sys.executable, "-m", "agent.hosting.worker_process", "--name", name], env=env,
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    connection = queue_client(private_redis.url)
    try:
        wait_for(lambda: processes_with_env("MCP_TEST_MARK", mark), 20, "the slow server starting")
        assert name in [w.name for w in Worker.all(connection=connection)]
        worker.send_signal(signal.SIGTERM)
        # At once: the registration goes before the servers are closed (which takes up to 5 s here).
        wait_for(lambda: name not in [w.name for w in Worker.all(connection=connection)], DEREGISTER_BOUND_S,
                 "the worker deregistered")
        worker.wait(CLOSE_BOUND_S)
        assert "Traceback" not in worker.stderr.read().decode()
        wait_for(lambda: not processes_with_env("MCP_TEST_MARK", mark), 5, "the slow server stopped")
    finally:
        worker.kill()
        worker.wait()
        worker.stderr.close()
        connection.close()


SLEEPER_GONE_S = 10.0  # seconds for every `sleep 600` to be ended once its worker or hub stops (about 2 s idle)


def sleepers(mark: str) -> list[int]:
    """The live `sleep` processes that carry this test's mark (started by a server's tool)."""
    found = []
    for pid in processes_with_env("MCP_TEST_MARK", mark):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).name() == "sleep":
                found.append(pid)
    return found


def kill_marked(mark: str) -> None:
    """A failed run leaves nothing behind."""
    for pid in processes_with_env("MCP_TEST_MARK", mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_closing_a_hub_ends_what_its_servers_tools_started_however_they_started_it():
    mark = uuid.uuid4().hex
    closing = McpHub()
    (report,) = closing.start([ServerConfig("sleepy", sys.executable, (HOSTILE,), {"MCP_TEST_MARK": mark})],
                              START_TIMEOUT_S)
    sleeper = {t.name: t for t in report.tools}["sleepy__sleeper"]
    try:
        for kind in SLEEPER_KINDS:
            sleeper.func({"kind": kind}, timeout_s=5.0, stop=None)
        wait_for(lambda: len(sleepers(mark)) == len(SLEEPER_KINDS), 10, "a sleep 600 of each kind")
    finally:
        closing.close()
    try:
        wait_for(lambda: not processes_with_env("MCP_TEST_MARK", mark), SLEEPER_GONE_S, "no server or sleeper left")
    finally:
        kill_marked(mark)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL])
def test_what_a_servers_tools_started_ends_with_its_worker_stopped_or_killed(private_redis, base_env, tmp_path,
                                                                             stop_signal):
    mark = uuid.uuid4().hex
    config = tmp_path / "mcp.json"
    sleeper_args = [arg for kind in SLEEPER_KINDS for arg in ("--sleeper", kind)]
    config.write_text(json.dumps({"mcpServers": {
        "sleepy": {"command": sys.executable, "args": [HOSTILE, *sleeper_args], "env": {"MCP_TEST_MARK": mark}}}}))
    env = {**base_env, "REDIS_URL": private_redis.url, "AGENT_MCP_CONFIG": str(config)}
    worker = subprocess.Popen([sys.executable, "-m", "agent.hosting.worker_process", "--name", f"sleepy-{mark[:8]}"],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(sleepers(mark)) == len(SLEEPER_KINDS), 60, "a sleep 600 of each kind")
        worker.send_signal(stop_signal)
        worker.wait(CLOSE_BOUND_S)
        wait_for(lambda: not processes_with_env("MCP_TEST_MARK", mark), SLEEPER_GONE_S, "no server or sleeper left")
    finally:
        worker.kill()
        worker.wait()
        kill_marked(mark)


NOISE_LINES = 100_000  # lines of non-JSON a chatty server prints to stdout
MAX_NOISE_RECORDS = 50  # log records that may tell of them (one per LOG_EVERY_S, patched to 0.2 s below)
_LEFT_OUT = re.compile(r"\(([\d,]+) more like it in the last")


def test_a_server_printing_non_json_is_logged_at_most_once_per_interval_with_a_count_and_serves_on(
        monkeypatch, caplog):
    monkeypatch.setattr(mcp_stdio, "LOG_EVERY_S", 0.2)
    chatty = McpHub()
    (report,) = chatty.start([ServerConfig("chatty", sys.executable, (HOSTILE,))], START_TIMEOUT_S)
    tools = {t.name: t for t in report.tools}
    try:
        with caplog.at_level(logging.WARNING):
            assert tools["chatty__noise"].func({"lines": NOISE_LINES}, timeout_s=60.0, stop=None) == "quiet"
            assert tools["chatty__echo"].func({"text": "still here"}, timeout_s=5.0, stop=None) == "still here"
    finally:
        with caplog.at_level(logging.WARNING):
            chatty.close()  # its session's end sums up what was left out since the last line
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) <= MAX_NOISE_RECORDS and not any(r.exc_info for r in records)
    noise = [r.getMessage() for r in records if "not a JSON-RPC message" in r.getMessage()]
    lines_logged = [line for line in noise if not line.startswith("at the session's end")]
    told = len(lines_logged) + sum(int(m.group(1).replace(",", "")) for line in noise for m in _LEFT_OUT.finditer(line))
    assert told == NOISE_LINES and "chatty" in noise[0]


def test_the_pool_log_is_rotated_and_a_chatty_server_fills_at_most_its_bound(private_redis, base_env, tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"chatty": {
        "command": sys.executable, "args": [HOSTILE, "--noise", str(NOISE_LINES), "--stderr-bytes", "3000000"]}}}))
    log_path, max_bytes, backups = tmp_path / "logs" / "pool.log", 256 * 1024, 2
    env = {**base_env, "AGENT_MCP_CONFIG": str(config)}
    handle = launch(private_redis.url, 1, log_path=log_path, env=env, demo=False, log_max_bytes=max_bytes,
                    log_backups=backups)
    client = state_client(private_redis.url)
    try:
        wait_for(lambda: "chatty" in [s["name"] for s in read_catalogue(client)], 60, "the chatty server started")
    finally:
        handle.stop()
        client.close()
    files = sorted(log_path.parent.glob("pool.log*"))
    assert len(files) <= 1 + backups and sum(f.stat().st_size for f in files) <= (1 + backups) * max_bytes
    text = "".join(f.read_text(errors="replace") for f in files)
    assert "the hostile server chatters" in text  # its stderr is in the log, rotated
    noise = [line for line in text.splitlines() if "JSON-RPC" in line or "JSONRPC" in line]
    assert len(noise) <= 10 and "Failed to parse" not in text  # one line per 10 s, no SDK traceback per line (a stop
    # under load may still log RQ's own cold-shutdown traceback, so "Traceback" alone is not the test)
    assert any("chatty" in line and "more like it" in line for line in noise)


# -- through real workers, the demo provider and a scripted OpenAI-compatible server -------------


@pytest.fixture(scope="module")
def mcp_backend(tmp_path_factory):
    """A private Redis and two workers whose config names mcp-server-time and the hostile server
    (the session's workers have no MCP servers, and must not take these turns)."""
    folder = tmp_path_factory.mktemp("mcp")
    config = folder / "mcp.json"
    mark = uuid.uuid4().hex
    config.write_text(json.dumps({"mcpServers": {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"],
                 "env": {"MCP_TEST_MARK": mark, "SECRET_TOKEN": SECRET}},
        "hostile": {"command": sys.executable, "args": [HOSTILE], "env": {"MCP_TEST_MARK": mark}},
    }}))
    server = EmbeddedRedis(folder / "redis")
    url = server.acquire()
    pool = start_pool(url, 2, folder / "pool.log", {"AGENT_MCP_CONFIG": str(config)})
    client = state_client(url)
    try:
        wait_for(lambda: len(read_catalogue(client)) == 3, 60, "three tool sources in the catalogue")
        yield Store(client, ttl_s=600), get_queue(queue_client(url)), client
    finally:
        pool.stop()
        wait_for(lambda: not processes_with_env("MCP_TEST_MARK", mark), 15, "the servers stopped with their workers")
        client.close()
        server.stop()


def run_turn(mcp_backend, message: str, config=FAST) -> tuple[dict, list[dict]]:
    """One turn through the MCP workers: its final state and its tool steps."""
    store, queue, _ = mcp_backend
    cid = new_id()
    submit_turn(store, queue, cid, message, config)
    state = wait_done(store, cid)
    return state, [s for s in state["steps"] if s["kind"] == "tool"]


def test_workers_publish_their_tool_sources_without_commands_or_env_values(mcp_backend):
    _, _, client = mcp_backend
    sources = {s["name"]: s for s in read_catalogue(client)}
    assert set(sources) == {"built-in", "time", "hostile"}
    assert "time__get_current_time" in [t["name"] for t in sources["time"]["tools"]]
    asking = [t["name"] for s in sources.values() for t in s["tools"] if t["needs_approval"]]
    assert asking == ["add_note"]  # mcp-server-time and the hostile server annotate nothing destructive
    raw = client.get(CATALOGUE_KEY).decode()
    assert SECRET not in raw and "mcp-server-time" not in raw and HOSTILE not in raw


def test_a_turn_calls_get_current_time_when_the_message_names_it(mcp_backend):
    state, (step,) = run_turn(mcp_backend, "What time is it in Tokyo via get_current_time?")
    assert step["name"] == "time__get_current_time" and step["outcome"] == "ok"
    assert json.loads(step["arguments"]) == {"timezone": "Asia/Tokyo"}
    assert '"timezone": "Asia/Tokyo"' in step["result"]
    assert state["status"] == "done" and "Asia/Tokyo" in state["history"][-1]["content"]


def test_a_hanging_mcp_tool_ends_as_a_tool_error_inside_the_deadline(mcp_backend):
    state, (step,) = run_turn(mcp_backend, "Please run hang for me")
    assert step["name"] == "hostile__hang" and step["outcome"] == "error"
    assert "did not answer within" in step["result"]
    assert state["done"] and state["updated_at"] <= state["deadline_at"] + 1.0  # the final write, in time
    assert step["ended_at"] <= state["deadline_at"]


def test_a_tool_run_gets_the_tool_cap_when_less_than_the_time_left(mcp_backend):
    state, (step,) = run_turn(mcp_backend, "Please run hang for me", FAST.with_changes(tool_timeout_cap_s=1.0))
    assert step["timeout_s"] == 1.0 and step["outcome"] == "error" and "did not answer within" in step["result"]
    assert 0.7 < step["duration_s"] < 1.0 + 1.0


def test_the_turns_chosen_tools_are_the_only_ones_offered_and_run(mcp_backend):
    _, steps = run_turn(mcp_backend, "What time is it in Tokyo via get_current_time?",
                        FAST.with_changes(tools=("calculator",)))
    assert steps == []  # not offered: the demo model did not call it


def test_a_real_openai_compatible_model_is_offered_the_mcp_tools_schema(mcp_backend, scripted):
    from tests.scripted_server import chat_reply

    scripted.add(chat_reply("noted"))
    config = FAST.with_changes(provider="openai", model="scripted", base_url=scripted.url + "/v1")
    state, _ = run_turn(mcp_backend, "what time is it?", config)
    assert state["status"] == "done"
    offered = {t["function"]["name"]: t["function"] for t in scripted.requests[0].json["tools"]}
    get_time = offered["time__get_current_time"]
    assert get_time["parameters"]["required"] == ["timezone"]
    assert get_time["parameters"]["properties"]["timezone"]["type"] == "string"
    assert "hostile__hang" in offered and "calculator" in offered


def test_a_hostile_tool_result_is_stored_as_text_and_drawn_inert(mcp_backend):
    from agent.text.markdown import safe_markdown

    state, (step,) = run_turn(mcp_backend, "run markup please")
    assert step["result"] == HOSTILE_TEXT  # the page shows a tool result in a code block, as text
    reply = safe_markdown(state["history"][-1]["content"])  # the demo quotes it in its reply
    assert "tracker.png" not in reply and "<script" not in reply and "](javascript:" not in reply
