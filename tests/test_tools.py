"""The tool registry, run_tool's error paths and time bound, and the built-in tools."""

from __future__ import annotations

import enum
import json
import os
import random
import re
import signal
import threading
import time
from datetime import datetime
from typing import Annotated, Literal

import msgspec
import pytest
from rq.timeouts import JobTimeoutException

from agent import tools
from agent.tools import REGISTRY, ToolError, make_tool, needs_approval, run_tool, schemas
from agent.tools import docs as docs_tool
from agent.tools.acting_for import running_for
from agent.tools.notes import MAX_NOTE_CHARS, MAX_NOTES_BYTES, add_note, notes_path, read_notes
from agent.tools.waiting import wait


def args(**kwargs) -> str:
    return json.dumps(kwargs)


@pytest.fixture
def registered():
    """Register test tools for one test and remove them afterwards."""
    added = []

    def register(func):
        tools.tool(func)
        added.append(func.__name__)
        return func

    yield register
    for name in added:
        REGISTRY.pop(name, None)


# --- schemas ---


def sample_tool(city: str, count: int, ratio: float = 0.5, loud: bool = False, *, timeout_s: float) -> str:
    """Describe a city several times.

    Args:
        city: the city's name,
            spelled in English
        count (int): how many times
        ratio: a fraction
    Returns:
        nothing useful
    """
    return city


def test_schema_comes_from_signature_and_docstring():
    built = make_tool(sample_tool)
    assert built.name == "sample_tool"
    assert built.description == "Describe a city several times."
    props = built.parameters["properties"]
    assert props["city"] == {"type": "string", "description": "the city's name, spelled in English"}
    assert props["count"] == {"type": "integer", "description": "how many times"}
    assert props["ratio"] == {"type": "number", "description": "a fraction", "default": 0.5}
    assert props["loud"] == {"type": "boolean", "default": False}
    assert built.parameters["type"] == "object"


def test_schema_hides_timeout_s_and_requires_only_parameters_without_defaults():
    built = make_tool(sample_tool)
    assert "timeout_s" not in built.parameters["properties"]
    assert built.parameters["required"] == ["city", "count"]


def test_a_tool_may_take_its_calls_idempotency_key_which_the_model_is_never_offered(registered):
    def keyed(text: str, *, idempotency_key: str) -> str:
        """Echo with the key."""
        return f"{idempotency_key} {text}"

    built = make_tool(keyed)
    assert built.takes_idempotency_key and list(built.parameters["properties"]) == ["text"]
    registered(keyed)
    result = run_tool("keyed", json.dumps({"text": "hi"}), 5, idempotency_key="t1:call_2")
    assert result.ok and result.output == "t1:call_2 hi", result
    # The model cannot set it: it is no argument of the schema, and one sent anyway is refused.
    sent = run_tool("keyed", json.dumps({"text": "hi", "idempotency_key": "forged"}), 5, idempotency_key="t1:call_2")
    assert not sent.ok and "idempotency_key" in sent.output


def test_an_idempotency_key_parameter_must_be_a_keyword_only_str():
    def positional(idempotency_key: str) -> str:
        """Bad."""
        return ""

    def not_text(*, idempotency_key: int) -> str:
        """Bad."""
        return ""

    for bad in (positional, not_text):
        with pytest.raises(TypeError, match="idempotency_key must be keyword-only and a str"):
            make_tool(bad)


def test_schemas_are_in_openai_tools_format_for_the_built_in_tools():
    listed = schemas(["calculator", "current_time", "search_docs", "wait"])
    assert [s["function"]["name"] for s in listed] == ["calculator", "current_time", "search_docs", "wait"]
    for entry in listed:
        assert entry["type"] == "function"
        assert set(entry["function"]) == {"name", "description", "parameters"}
        assert entry["function"]["description"]
    by_name = {s["function"]["name"]: s["function"]["parameters"] for s in listed}
    assert by_name["calculator"]["required"] == ["expression"]
    assert by_name["current_time"]["required"] == []
    assert by_name["wait"]["properties"] == {"seconds": {"type": "number", "description": "how long to wait, 0 to 600"}}
    json.dumps(listed)  # must be sendable as is


def test_schemas_without_names_lists_every_registered_tool():
    assert {s["function"]["name"] for s in schemas()} == set(REGISTRY)


def test_tool_with_an_unsupported_annotation_is_refused_at_registration():
    def bad(items: list) -> str:
        """Bad."""
        return ""

    with pytest.raises(TypeError):
        make_tool(bad)


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


def rich_tool(cities: list[str], unit: Unit = Unit.CELSIUS, style: Literal["short", "long"] = "short",
              limit: int | None = None) -> dict:
    """Forecasts for several cities.

    Args:
        cities: city names
        unit: the temperature unit
    """
    return {"cities": cities, "unit": unit.value, "style": style, "limit": limit}


def test_list_enum_literal_and_optional_parameters_have_json_schemas():
    props = make_tool(rich_tool).parameters["properties"]
    assert props["cities"] == {"type": "array", "items": {"type": "string"}, "description": "city names"}
    assert props["unit"] == {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius",
                             "description": "the temperature unit"}
    # msgspec lists a Literal's values sorted
    assert props["style"] == {"type": "string", "enum": ["long", "short"], "default": "short"}
    assert props["limit"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert "$defs" not in json.dumps(make_tool(rich_tool).parameters)  # references are inlined for providers


def test_list_enum_literal_and_optional_arguments_are_checked_and_converted(registered):
    registered(rich_tool)
    result = run_tool("rich_tool", args(cities=["Paris", "Oslo"], unit="fahrenheit", style="long", limit=2), 5)
    assert result.ok, result.output
    assert json.loads(result.output) == {"cities": ["Paris", "Oslo"], "unit": "fahrenheit", "style": "long",
                                         "limit": 2}
    assert json.loads(run_tool("rich_tool", args(cities=[]), 5).output)["limit"] is None


@pytest.mark.parametrize("arguments", [{"cities": "Paris"}, {"cities": [1]}, {"cities": [], "unit": "kelvin"},
                                       {"cities": [], "style": "medium"}, {"cities": [], "limit": "2"}])
def test_a_wrong_list_enum_literal_or_optional_argument_is_an_error_result(registered, arguments):
    registered(rich_tool)
    result = run_tool("rich_tool", json.dumps(arguments), 5)
    assert not result.ok
    assert result.output.startswith("Error: argument ") and "must be" in result.output


def bounded_tool(count: Annotated[int, msgspec.Meta(ge=0, le=10)],
                 label: Annotated[str, msgspec.Meta(max_length=5)] = "x") -> str:
    """Counts.

    Args:
        count: how many
    """
    return label * count


def test_constraints_written_with_msgspec_meta_are_offered_and_checked(registered):
    props = make_tool(bounded_tool).parameters["properties"]
    assert props["count"] == {"type": "integer", "minimum": 0, "maximum": 10, "description": "how many"}
    assert props["label"] == {"type": "string", "maxLength": 5, "default": "x"}
    registered(bounded_tool)
    assert run_tool("bounded_tool", args(count=2, label="ab"), 5).output == "abab"
    below = run_tool("bounded_tool", args(count=-1), 5)
    assert not below.ok and "'count'" in below.output and "integer >= 0" in below.output, below.output
    too_long = run_tool("bounded_tool", args(count=1, label="toolong"), 5)
    assert not too_long.ok and "'label'" in too_long.output and "length <= 5" in too_long.output, too_long.output


def test_a_parameter_named_with_a_leading_underscore_is_refused_at_registration():
    def private(_value: int, __hidden: int = 0) -> str:
        """Private."""
        return ""

    with pytest.raises(TypeError, match="underscore"):
        make_tool(private)


def test_a_parameter_without_an_annotation_is_refused_at_registration():
    def untyped(value) -> str:
        """Untyped."""
        return ""

    with pytest.raises(TypeError, match="annotation"):
        make_tool(untyped)


# --- run_tool error paths ---


def test_unknown_tool_is_an_error_result():
    result = run_tool("no_such_tool", "{}", 5)
    assert not result.ok
    assert result.output.startswith("Error: ")
    assert "no_such_tool" in result.output and "calculator" in result.output


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"', "42", "null", "[" * 100_000])
def test_bad_json_or_a_non_object_is_an_error_result(raw):
    result = run_tool("calculator", raw, 5)
    assert not result.ok
    assert result.output.startswith("Error: ")


def test_missing_argument_is_an_error_result_naming_it():
    result = run_tool("calculator", "{}", 5)
    assert not result.ok
    assert "missing" in result.output and "expression" in result.output


def test_unexpected_argument_is_an_error_result_naming_it():
    result = run_tool("calculator", args(expression="1+1", mode="fast"), 5)
    assert not result.ok
    assert "unexpected" in result.output and "mode" in result.output


def test_the_hidden_timeout_argument_cannot_be_set_by_the_model():
    result = run_tool("wait", args(seconds=0, timeout_s=999), 5)
    assert not result.ok
    assert "timeout_s" in result.output


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("calculator", {"expression": 17}),
        ("calculator", {"expression": None}),
        ("calculator", {"expression": ["1+1"]}),
        ("wait", {"seconds": "3"}),
        ("wait", {"seconds": True}),
    ],
)
def test_wrongly_typed_argument_is_an_error_result(name, arguments):
    result = run_tool(name, json.dumps(arguments), 5)
    assert not result.ok
    assert result.output.startswith("Error: ") and "must be" in result.output


@pytest.mark.parametrize("raw", ['{"seconds": 1e400}', '{"seconds": -1e400}', '{"seconds": NaN}',
                                 '{"seconds": -Infinity}', '{"seconds": 123456789012345678901234567890}',
                                 '{"seconds": 1, "seconds": 1e400}', '{"seconds": 0, "": 1}',
                                 '{"seconds": 1' + '0' * 400 + '}'])
def test_numbers_json_allows_but_no_tool_wants_are_an_error_result(raw):
    result = run_tool("wait", raw, 5)
    assert not result.ok and result.output.startswith("Error: "), result.output


def test_an_integer_is_accepted_for_a_float_parameter():
    result = run_tool("wait", args(seconds=0), 5)
    assert result.ok, result.output


def test_empty_arguments_text_means_no_arguments():
    result = run_tool("current_time", "", 5)
    assert result.ok, result.output


def test_a_tool_that_raises_becomes_an_error_result(registered):
    @registered
    def explode(value: str) -> str:
        """Always fails."""
        raise RuntimeError(f"boom with {value}")

    result = run_tool("explode", args(value="x"), 5)
    assert not result.ok
    assert result.output == "Error: explode raised RuntimeError: boom with x"


def test_a_tool_error_message_goes_to_the_model_as_is(registered):
    @registered
    def refuse(value: str) -> str:
        """Always refuses."""
        raise ToolError("that is not allowed")

    assert run_tool("refuse", args(value="x"), 5).output == "Error: that is not allowed"


def test_a_system_exit_inside_a_tool_is_not_swallowed(registered):
    @registered
    def quit_process(value: str) -> str:
        """Exits."""
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        run_tool("quit_process", args(value="x"), 5)


def test_a_tool_exceeding_its_timeout_returns_an_error_soon_after(registered):
    release = threading.Event()

    @registered
    def stuck(value: str) -> str:
        """Never returns on its own."""
        release.wait(30)
        return "late"

    started = time.monotonic()
    result = run_tool("stuck", args(value="x"), 0.5)
    elapsed = time.monotonic() - started
    release.set()
    assert not result.ok
    assert "did not finish within 0.5 s (the tool's time limit)" in result.output
    assert 0.4 < elapsed < 0.5 + 1.5  # its 0.5 s timeout held, with room for a busy machine


def test_no_time_left_is_an_error_result_without_running_the_tool():
    result = run_tool("wait", args(seconds=1), 0)
    assert not result.ok
    assert "no time left" in result.output


def test_long_output_is_truncated(registered):
    @registered
    def chatty(value: str) -> str:
        """Talks a lot."""
        return value * 10_000

    result = run_tool("chatty", args(value="ab"), 5)
    assert result.ok
    assert len(result.output) == tools.MAX_OUTPUT_CHARS
    assert result.output.endswith("[output truncated]")


def test_a_dict_result_is_sent_as_json(registered):
    @registered
    def structured(value: str) -> dict:
        """Returns a dict."""
        return {"value": value, "n": 1}

    assert json.loads(run_tool("structured", args(value="x"), 5).output) == {"value": "x", "n": 1}


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs pthread_kill")
def test_job_timeout_in_the_calling_thread_propagates_out_of_run_tool():
    # RQ raises JobTimeoutException from a signal handler in the job's main thread; it must not be swallowed.
    def handler(signum, frame):
        raise JobTimeoutException("job timed out")

    previous = signal.signal(signal.SIGUSR1, handler)
    main_id = threading.get_ident()
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(main_id, signal.SIGUSR1))
    try:
        timer.start()
        started = time.monotonic()
        with pytest.raises(JobTimeoutException):
            run_tool("wait", args(seconds=60), 120)
        assert time.monotonic() - started < 30  # raised at the signal, not after the 60 s wait
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


# --- calculator ---


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("17*23", "391"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("-5 + 2", "-3"),
        ("--5", "5"),
        ("+7", "7"),
        ("2.5 * 4", "10"),
        ("0.1 + 0.2", "0.3"),
        ("1/3", "0.333333333333"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2**10", "1024"),
        ("2**-2", "0.25"),
        ("2**3**2", "512"),
        ("1.01**365", "37.7834343329"),
        ("1_000 * 3", "3000"),
        ("-0.0", "0"),
        ("  6 * 7  ", "42"),
    ],
)
def test_calculator_computes_arithmetic(expression, expected):
    result = run_tool("calculator", args(expression=expression), 5)
    assert result.ok, result.output
    assert result.output == expected


def test_calculator_keeps_big_integers_exact():
    assert run_tool("calculator", args(expression="2**64"), 5).output == "18446744073709551616"


@pytest.mark.parametrize("expression", ["1/0", "5 // 0", "5 % 0", "1.5 / 0.0", "0 ** -1"])
def test_calculator_reports_division_by_zero(expression):
    result = run_tool("calculator", args(expression=expression), 5)
    assert not result.ok
    assert "division by zero" in result.output


def test_calculator_refuses_a_complex_result():
    result = run_tool("calculator", args(expression="(-8) ** 0.5"), 5)
    assert not result.ok and "complex" in result.output


def test_calculator_refuses_an_empty_expression():
    assert run_tool("calculator", args(expression="   "), 5).output == "Error: expression is empty"


# --- current_time ---


@pytest.mark.parametrize("zone", ["UTC", "utc", "Asia/Tokyo", "asia/tokyo", "America/Argentina/Buenos_Aires"])
def test_current_time_accepts_iana_names(zone):
    result = run_tool("current_time", args(timezone=zone), 5)
    assert result.ok, result.output
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \([\w/+-]+, UTC[+-]\d\d:\d\d\)", result.output)


def test_current_time_formats_tokyo_with_its_offset():
    output = run_tool("current_time", args(timezone="Asia/Tokyo"), 5).output
    assert output.endswith("JST (Asia/Tokyo, UTC+09:00)")


def test_current_time_defaults_to_utc():
    assert run_tool("current_time", "{}", 5).output.endswith("UTC (UTC, UTC+00:00)")


@pytest.mark.parametrize(
    "zone",
    ["../../etc/passwd", "/etc/passwd", "Asia/../../x", "Asia/Tokyo/", "Asia//Tokyo", "", " ", "Asia/Tokyo\x00",
     "A" * 200, "Mars/Olympus_Mons", "Asia\\Tokyo", "Europe/Paris;rm"],
)  # fmt: skip
def test_current_time_refuses_bad_zone_names_naming_the_value(zone):
    result = run_tool("current_time", args(timezone=zone), 5)
    assert not result.ok
    assert result.output.startswith("Error: ")
    assert repr(zone.strip()[:20])[1:-1] in result.output


def test_current_time_suggests_the_zone_for_a_bare_city():
    result = run_tool("current_time", args(timezone="Tokyo"), 5)
    assert not result.ok
    assert "Asia/Tokyo" in result.output


# --- search_docs ---


def test_search_docs_finds_the_deadline_passage_in_the_guide():
    result = run_tool("search_docs", args(query="What is the deadline margin?"), 5)
    assert result.ok, result.output
    assert "docs/guide.md" in result.output
    assert "deadline = job start + job timeout" in result.output


def test_search_docs_returns_at_most_three_passages_with_headings():
    output = run_tool("search_docs", args(query="turn timeout tool model deadline"), 5).output
    headings = re.findall(r"^\[[^\]]+ - [^\]]+\]$", output, flags=re.MULTILINE)
    assert 1 <= len(headings) <= 3


def test_search_docs_says_when_nothing_matches():
    result = run_tool("search_docs", args(query="xylophone quasar"), 5)
    assert result.ok
    assert result.output.startswith("No passage matches")


@pytest.mark.parametrize("query", ["", "   ", "x" * 5000, "the of and"])
def test_search_docs_refuses_empty_or_too_long_queries(query):
    result = run_tool("search_docs", args(query=query), 5)
    assert not result.ok


def test_search_docs_rereads_a_doc_after_it_changes(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "extra.md"
    doc.write_text("# Pelicans\n\nPelicans fly over the harbour.\n")
    monkeypatch.setattr(docs_tool, "PROJECT_ROOT", tmp_path)
    assert "harbour" in run_tool("search_docs", args(query="pelicans"), 5).output
    doc.write_text("# Pelicans\n\nPelicans now nest by the lighthouse.\n")
    later = doc.stat().st_mtime_ns + 5_000_000_000
    os.utime(doc, ns=(later, later))
    assert "lighthouse" in run_tool("search_docs", args(query="pelicans"), 5).output


def test_search_docs_skips_a_list_of_links_to_other_pages(tmp_path, monkeypatch):
    # The README's list of docs pages names every topic; quoting it answers nothing.
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n\n## Documentation\n\n- [Streaming](docs/streaming.md): how streaming works, streaming.\n"
        "- [Tools](docs/tools.md): tools.\n"
    )
    (tmp_path / "docs" / "streaming.md").write_text("# Streaming\n\nReplies stream as server-sent events.\n")
    monkeypatch.setattr(docs_tool, "PROJECT_ROOT", tmp_path)
    output = run_tool("search_docs", args(query="streaming"), 5).output
    assert output.startswith("[docs/streaming.md - Streaming]")
    assert "docs/streaming.md)" not in output


def test_search_docs_quotes_prose_before_an_equally_matching_table(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Figures\n\n| measure | value |\n| --- | --- |\n| margin | 20 |\n")
    (tmp_path / "docs" / "b.md").write_text("# Clocks\n\nThe margin is kept free for the final write.\n")
    monkeypatch.setattr(docs_tool, "PROJECT_ROOT", tmp_path)
    output = run_tool("search_docs", args(query="margin"), 5).output
    assert output.startswith("[docs/b.md - Clocks]")


@pytest.mark.parametrize(("question", "source"), [
    ("How do I point it at a real model?", "[docs/configuration.md - Pointing it at a real model]"),
    ("How does streaming work?", "[docs/configuration.md - Pointing it at a real model]"),
    ("worker pool", "[docs/scaling.md - Worker pool]"),
    ("stop button", "[docs/guide.md - The Stop button]"),
    ("MCP servers", "[docs/tools.md - Tools from MCP servers and Python modules]"),
])
def test_search_docs_answers_a_question_from_the_page_on_its_topic(question, source):
    output = run_tool("search_docs", args(query=question), 5).output
    assert output.startswith(source + "\n"), output[:200]


# --- wait ---


def test_wait_waits_the_seconds_asked():
    started = time.monotonic()
    result = run_tool("wait", args(seconds=0.3), 5)
    assert result.ok
    assert result.output == "Waited 0.3 s"
    assert time.monotonic() - started >= 0.3


def test_wait_stops_at_the_turns_deadline():
    # A 3 s limit: the tool stops 0.2 s before it (RETURN_GRACE_S; a 1 s limit left it 0.1 s, and a busy machine
    # woke its thread later than that, so the runner abandoned it first).
    started = time.monotonic()
    result = run_tool("wait", args(seconds=10), 3.0)
    elapsed = time.monotonic() - started
    assert result.ok, result.output
    assert result.output.endswith("of 10 s: stopped at the tool's time limit")
    assert elapsed < 3.0 + 1.5  # its 3 s deadline held, with room for a busy machine


def test_wait_called_directly_uses_the_timeout_it_is_given():
    assert wait(5, timeout_s=0.05) == "Waited 0.1 of 5 s: stopped at the tool's time limit"


@pytest.mark.parametrize("seconds", [-1, 601, 1e9])
def test_wait_refuses_seconds_out_of_range(seconds):
    result = run_tool("wait", args(seconds=seconds), 5)
    assert not result.ok
    assert "between 0 and 600" in result.output


# --- tools that ask a person first ---


def test_a_function_asks_first_only_when_it_says_needs_approval_true():
    def send(text: str) -> str:
        """Send a message.

        Args:
            text: what to send
        """
        return text

    assert not make_tool(send, source="mypackage.tools").needs_approval
    send.needs_approval = True
    assert make_tool(send, source="mypackage.tools").needs_approval
    send.needs_approval = "yes"  # only True itself counts
    assert not make_tool(send, source="mypackage.tools").needs_approval


def test_needs_approval_is_the_tools_own_word_or_the_turns_list():
    assert needs_approval("add_note") and not needs_approval("calculator")
    assert needs_approval("calculator", ("calculator", "time__get_current_time"))
    assert needs_approval("calculator", frozenset({"calculator"}))
    assert needs_approval("not_here__send", ("not_here__send",))  # a tool of a server this process lacks
    assert not needs_approval("not_here__send")
    assert [name for name, t in REGISTRY.items() if t.source == "built-in" and needs_approval(name)] == ["add_note"]


# --- add_note ---


@pytest.fixture
def notes_dir(tmp_path, monkeypatch):
    """A data directory of the test's own, not created yet: add_note makes it."""
    folder = tmp_path / "data"
    monkeypatch.setenv("AGENT_DATA_DIR", str(folder))
    return folder


def test_add_note_is_offered_last_asks_first_and_never_runs_twice():
    assert [s["function"]["name"] for s in schemas()][:5] == [
        "calculator", "current_time", "search_docs", "wait", "add_note"]
    assert REGISTRY["add_note"].needs_approval and not REGISTRY["add_note"].repeatable
    assert REGISTRY["add_note"].parameters["required"] == ["text"]


def test_add_note_appends_one_timestamped_line_and_says_its_number(notes_dir):
    first = run_tool("add_note", args(text="buy milk"), 5)
    second = run_tool("add_note", args(text="call Bob"), 5)
    assert first.ok and first.output == "Added note 1 to notes.txt."
    assert second.output == "Added note 2 to notes.txt."
    assert notes_path() == notes_dir / "notes.txt"
    lines = notes_path().read_text(encoding="utf-8").splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["buy milk", "call Bob"]
    stamp = lines[0].split(" ", 1)[0]  # UTC, to the second
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", stamp)
    assert abs(time.time() - datetime.fromisoformat(stamp).timestamp()) < 60
    assert read_notes() == lines


def test_a_note_is_always_one_line_without_control_characters(notes_dir):
    text = "line one\nline two\r\nthree\u2028four\x85five\x1e six\x1b[2J\x00 end"
    assert run_tool("add_note", args(text=text), 5).ok
    (line,) = read_notes()
    assert line.split(" ", 1)[1] == "line one line two three four five six[2J end"
    assert notes_path().read_bytes().count(b"\n") == 1


def test_a_long_note_is_cut_and_the_confirmation_says_so(notes_dir):
    result = run_tool("add_note", args(text="x" * 2000), 5)
    assert result.ok and f"cut to its first {MAX_NOTE_CHARS} characters" in result.output
    (line,) = read_notes()
    assert len(line.split(" ", 1)[1]) == MAX_NOTE_CHARS and line.endswith("…")


@pytest.mark.parametrize("text", ["", "   ", "\n\t\x00"])
def test_an_empty_note_is_refused_and_nothing_is_written(notes_dir, text):
    result = run_tool("add_note", args(text=text), 5)
    assert not result.ok and "the note is empty" in result.output
    assert not notes_path().exists()


def test_a_full_notes_file_refuses_the_note_and_keeps_what_it_has(notes_dir):
    notes_dir.mkdir()
    notes_path().write_bytes(b"x" * (MAX_NOTES_BYTES - 10) + b"\n")
    result = run_tool("add_note", args(text="one more"), 5)
    assert not result.ok and "full" in result.output and "not added" in result.output
    assert notes_path().stat().st_size == MAX_NOTES_BYTES - 9


def test_a_last_line_without_its_end_is_not_joined_to_the_new_note(notes_dir):
    notes_dir.mkdir()
    notes_path().write_text("written by hand", encoding="utf-8")
    assert run_tool("add_note", args(text="from the tool"), 5).output == "Added note 2 to notes.txt."
    assert read_notes()[0] == "written by hand" and read_notes()[1].endswith(" from the tool")


def test_notes_added_at_once_each_get_their_own_line_and_number(notes_dir):
    results = [None] * 20

    def note(index):
        results[index] = run_tool("add_note", args(text=f"note {index}"), 10).output

    threads = [threading.Thread(target=note, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    numbers = sorted(int(re.match(r"Added note (\d+) ", r).group(1)) for r in results)
    assert numbers == list(range(1, 21))
    assert sorted(line.split(" ", 1)[1] for line in read_notes(50)) == sorted(f"note {n}" for n in range(20))


def test_read_notes_gives_the_last_ones_oldest_first(notes_dir):
    assert read_notes() == []  # no notes file yet
    for n in range(5):
        add_note(f"note {n}")
    assert [line.split(" ", 1)[1] for line in read_notes(2)] == ["note 3", "note 4"]
    assert read_notes(0) == []


def test_add_note_does_not_write_through_a_symbolic_link(notes_dir, tmp_path):
    notes_dir.mkdir()
    target = tmp_path / "elsewhere.txt"
    notes_path().symlink_to(target)
    assert not run_tool("add_note", args(text="buy milk"), 5).ok
    assert not target.exists()


ALICE, BOB = "p" + "a" * 20, "p" + "b" * 20  # person ids, as agent.conversation.people makes them


def test_each_persons_notes_are_their_own_and_a_turn_with_no_owner_writes_the_shared_file(notes_dir):
    # run_tool runs the tool in a thread of its own: whose turn it is must reach it there.
    with running_for(ALICE):
        assert run_tool("add_note", args(text="alice's note"), 5).output == "Added note 1 to your notes."
    with running_for(BOB):
        assert run_tool("add_note", args(text="bob's note"), 5).output == "Added note 1 to your notes."
    assert run_tool("add_note", args(text="nobody's note"), 5).output == "Added note 1 to notes.txt."
    assert notes_path(ALICE) == notes_dir / "notes" / f"{ALICE}.txt"
    assert [line.split(" ", 1)[1] for line in read_notes(person=ALICE)] == ["alice's note"]
    assert [line.split(" ", 1)[1] for line in read_notes(person=BOB)] == ["bob's note"]
    assert [line.split(" ", 1)[1] for line in read_notes()] == ["nobody's note"]
    assert read_notes(person="p" + "c" * 20) == []  # someone with no notes yet sees none of anyone else's


def test_a_persons_full_notes_file_names_itself(notes_dir):
    notes_path(ALICE).parent.mkdir(parents=True)
    notes_path(ALICE).write_bytes(b"x" * (MAX_NOTES_BYTES - 10) + b"\n")
    with running_for(ALICE):
        result = run_tool("add_note", args(text="one more"), 5)
    assert not result.ok and f"clear notes/{ALICE}.txt in the data directory" in result.output


@pytest.mark.parametrize("owner", ["../notes", "p" + "A" * 20, "alice", "p" + "a" * 20 + "/x"])
def test_an_owner_that_is_no_person_id_never_names_a_file(notes_dir, owner):
    with running_for(owner):
        result = run_tool("add_note", args(text="buy milk"), 5)
    assert not result.ok and "no note was added" in result.output
    assert not notes_dir.exists() or not any(notes_dir.rglob("*.txt"))
    with pytest.raises(ValueError):
        notes_path(owner)


# --- arguments of any shape: a tool error or checked keywords, never an exception ---

def _random_json(rng, depth: int = 0):
    """Text of one JSON value of any kind, numbers Python's json reads but no tool wants included."""
    kinds = ["int", "big", "float", "special", "str", "bool", "null"] + (["list", "object"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "list":
        return "[" + ",".join(_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    if kind == "object":
        return "{" + ",".join(f'{json.dumps(rng.choice(["a", "", "x" * 50, "é"]))}:{_random_json(rng, depth + 1)}'
                              for _ in range(rng.randint(0, 3))) + "}"
    specials = ["NaN", "Infinity", "-Infinity", "1e400", "-0.0", "5e-324"]
    return {"int": lambda: str(rng.randint(-10, 10)),
            "big": lambda: str(rng.choice([1, -1]) * 10 ** rng.randint(19, 400)),
            "float": lambda: repr(rng.uniform(-1e6, 1e6)), "special": lambda: rng.choice(specials),
            "str": lambda: json.dumps(rng.choice(["", "3", "celsius", "\ud800", "2026-01-02", "a" * 300, "\u0000"])),
            "bool": lambda: rng.choice(["true", "false"]), "null": lambda: "null"}[kind]()


@pytest.mark.parametrize("seed", range(8))
def test_arguments_of_any_shape_are_checked_keywords_or_a_tool_error(seed):
    from agent.tools.registry import check_arguments

    rng = random.Random(seed)
    tools = [REGISTRY[name] for name in sorted(REGISTRY)] + [make_tool(rich_tool), make_tool(sample_tool)]
    for _ in range(60):
        for found in tools:
            names = list(found.parameters["properties"]) + ["unexpected", ""]
            chosen = rng.sample(names, rng.randint(0, len(names)))
            raw = "{" + ",".join(f"{json.dumps(name)}:{_random_json(rng)}" for name in chosen) + "}"
            try:
                checked = check_arguments(found, raw)
            except ToolError as exc:
                assert str(exc) and "Traceback" not in str(exc), raw
                continue
            assert set(checked) <= set(found.parameters["properties"]) | {"arguments"}, raw
