"""The tool registry and the built-in tools.

A tool is a plain typed function; its OpenAI schema comes from its signature and docstring.
`run_tool` turns every tool problem into an "Error: ..." result for the model and bounds
each run by the turn's remaining time, without signals (RQ owns SIGALRM).
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import time
import typing
import zoneinfo
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from agent import calculator as calculator_module
from agent.calculator import MAX_EXPRESSION_CHARS  # noqa: F401 - part of this module's interface
from agent.surrogates import scrub

MAX_OUTPUT_CHARS = 4000  # characters of a tool's output sent back to the model
TRUNCATED_MARKER = "\n... [output truncated]"
RETURN_GRACE_S = 0.2  # seconds a deadline-aware tool gets to return after its own budget ends
WAIT_SLICE_S = 0.05  # seconds between heartbeats while a tool runs

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_HIDDEN_PARAMETER = "timeout_s"  # filled by run_tool with the remaining time, never shown to the model
_STOP_PARAMETER = "stop"  # filled by run_tool with an Event set when the user stops the turn; never shown
STOP_GRACE_S = 0.2  # seconds a tool gets to return its own result once a stop is requested


class ToolError(Exception):
    """A tool's expected failure; its message goes to the model as is."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object
    func: Callable


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    output: str  # the tool message content; starts with "Error: " when ok is False
    duration_s: float
    stopped: bool = False  # a stop request ended the run (the output says how far it got)


REGISTRY: dict[str, Tool] = {}


def make_tool(func: Callable) -> Tool:
    """Build a Tool from a typed function without registering it."""
    hints = typing.get_type_hints(func)
    description, arg_docs = _parse_docstring(inspect.getdoc(func) or "")
    properties: dict[str, dict] = {}
    required: list[str] = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"tool {func.__name__}: parameter {param.name!r} must be a named parameter")
        if param.name == _HIDDEN_PARAMETER:
            if param.kind is not param.KEYWORD_ONLY or hints.get(param.name) is not float:
                raise TypeError(f"tool {func.__name__}: {_HIDDEN_PARAMETER} must be keyword-only and a float")
            continue
        if param.name == _STOP_PARAMETER:
            if param.kind is not param.KEYWORD_ONLY or hints.get(param.name) != threading.Event | None:
                raise TypeError(f"tool {func.__name__}: {_STOP_PARAMETER} must be keyword-only and a threading.Event "
                                "| None")
            continue
        json_type = _JSON_TYPES.get(hints.get(param.name))
        if json_type is None:
            raise TypeError(f"tool {func.__name__}: parameter {param.name!r} must be annotated str, int, float or bool")
        prop: dict = {"type": json_type}
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        else:
            prop["default"] = param.default
        properties[param.name] = prop
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return Tool(name=func.__name__, description=description, parameters=parameters, func=func)


def tool(func: Callable) -> Callable:
    """Register a typed function as a tool; returns the function unchanged."""
    new = make_tool(func)
    old = REGISTRY.get(new.name)
    # A module reload re-registers the same function; two different functions under one name is a bug.
    if old is not None and (old.func.__module__, old.func.__qualname__) != (func.__module__, func.__qualname__):
        raise ValueError(f"a tool named {new.name!r} is already registered")
    REGISTRY[new.name] = new
    return func


def schemas(names: Iterable[str] | None = None) -> list[dict]:
    """Tools in the OpenAI `tools` format; all registered tools when names is None."""
    selected = list(REGISTRY) if names is None else list(names)
    unknown = [n for n in selected if n not in REGISTRY]
    if unknown:
        raise KeyError(f"unknown tools: {', '.join(unknown)}")
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in (REGISTRY[n] for n in selected)
    ]


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """First line is the description; a Google-style "Args:" section describes parameters."""
    lines = doc.splitlines()
    description = lines[0].strip() if lines else ""
    args: dict[str, str] = {}
    in_args, entry_indent, current = False, None, None
    for line in lines[1:]:
        stripped = line.strip()
        if stripped == "Args:":
            in_args, entry_indent, current = True, None, None
            continue
        if not in_args or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:  # the next section ("Returns:") ends Args
            in_args = False
            continue
        match = re.match(r"^(\w+)\s*(?:\([^)]*\))?:\s*(.*)$", stripped)
        if match and (entry_indent is None or indent <= entry_indent):
            entry_indent, current = indent, match.group(1)
            args[current] = match.group(2)
        elif current is not None:  # a continuation line of the current entry
            args[current] = f"{args[current]} {stripped}".strip()
    return description, args


def run_tool(
    name: str,
    arguments_json: str,
    timeout_s: float,
    *,
    stop: threading.Event | None = None,
    heartbeat: Callable[[], None] | None = None,
) -> ToolResult:
    """Run a registered tool within timeout_s; tool problems become an "Error: ..." result, never an exception.

    Setting `stop` (from another thread) ends the run within about STOP_GRACE_S: a tool that takes
    a `stop` parameter returns its own account, any other is abandoned. `heartbeat`, when given, is
    called in the caller's thread about every WAIT_SLICE_S while the tool runs."""
    started = time.monotonic()

    def failed(reason: str, stopped: bool = False) -> ToolResult:
        output = _truncate(f"Error: {reason}")
        return ToolResult(ok=False, output=output, duration_s=time.monotonic() - started, stopped=stopped)

    found = REGISTRY.get(name)
    if found is None:
        known = ", ".join(sorted(REGISTRY)) or "none"
        return failed(f"unknown tool {name[:80]!r}; available tools: {known}")
    try:
        kwargs = _parse_arguments(found, arguments_json)
    except ToolError as exc:
        return failed(str(exc))
    if not timeout_s > 0:  # also catches NaN
        return failed(f"no time left in this turn to run {name}")
    if stop is not None and stop.is_set():
        return failed(f"stopped at your request before {name} started", stopped=True)
    parameters = inspect.signature(found.func).parameters
    if _HIDDEN_PARAMETER in parameters:
        kwargs[_HIDDEN_PARAMETER] = max(0.0, timeout_s - min(RETURN_GRACE_S, timeout_s / 10))
    if _STOP_PARAMETER in parameters:
        kwargs[_STOP_PARAMETER] = stop if stop is not None else threading.Event()

    outcome: dict = {}
    finished = threading.Event()

    def work() -> None:
        try:
            outcome["output"] = _to_text(found.func(**kwargs))
        except BaseException as exc:  # handed to the caller thread, which decides what to convert
            outcome["error"] = exc
        finally:
            finished.set()

    # A daemon thread, not a `with ThreadPoolExecutor()`: a stuck tool must not block the turn or process exit.
    threading.Thread(target=work, name=f"tool-{name}", daemon=True).start()
    # No broad except here: RQ's JobTimeoutException (an Exception) raised in this thread must propagate.
    give_up_at = started + min(timeout_s, threading.TIMEOUT_MAX)
    stopped = False
    while not finished.wait(max(0.0, min(WAIT_SLICE_S, give_up_at - time.monotonic()))):
        if stop is not None and stop.is_set():
            stopped = True
            if finished.wait(STOP_GRACE_S):
                break
            took_s = time.monotonic() - started
            return failed(f"stopped at your request after {took_s:.1f} s, before {name} finished", stopped=True)
        if time.monotonic() >= give_up_at:
            return failed(f"{name} did not finish within {timeout_s:.1f} s (the turn's time budget) and was abandoned")
        if heartbeat is not None:
            heartbeat()
    # A tool that watches `stop` returns as soon as it is set, often before this loop looks at it.
    stopped = stopped or (stop is not None and stop.is_set())
    error = outcome.get("error")
    if error is not None:
        if not isinstance(error, Exception):
            raise error  # SystemExit, KeyboardInterrupt: never swallowed
        if isinstance(error, ToolError):
            return failed(str(error), stopped)
        return failed(f"{name} raised {type(error).__name__}: {error}", stopped)
    output = _truncate(outcome["output"])
    return ToolResult(ok=True, output=output, duration_s=time.monotonic() - started, stopped=stopped)


def _parse_arguments(found: Tool, arguments_json: str) -> dict:
    """Decode and check the model's arguments against the tool's schema."""
    if arguments_json is None or not str(arguments_json).strip():
        arguments: object = {}  # some models send "" for a tool without parameters
    else:
        try:
            arguments = json.loads(arguments_json)
        except (ValueError, RecursionError) as exc:
            raise ToolError(f"arguments for {found.name} are not valid JSON ({exc})") from None
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments for {found.name} must be a JSON object, not {type(arguments).__name__}")
    properties, required = found.parameters["properties"], found.parameters["required"]
    unexpected = sorted(set(arguments) - set(properties))
    if unexpected:
        raise ToolError(f"unexpected argument(s) for {found.name}: {', '.join(map(repr, unexpected))}")
    missing = [p for p in required if p not in arguments]
    if missing:
        raise ToolError(f"missing required argument(s) for {found.name}: {', '.join(map(repr, missing))}")
    checked = {}
    for key, value in arguments.items():
        expected = properties[key]["type"]
        if expected == "number" and type(value) is int:
            value = float(value)  # JSON has one number type; 3 is a fine float
        elif expected == "integer" and type(value) is float and value.is_integer():
            value = int(value)
        actual = _JSON_TYPES.get(type(value)) or {list: "array", dict: "object"}.get(type(value), "null")
        if actual != expected:
            raise ToolError(f"argument {key!r} of {found.name} must be {expected}, not {actual}")
        checked[key] = value
    return checked


def _to_text(result: object) -> str:
    if isinstance(result, dict | list):
        return json.dumps(result, ensure_ascii=False, default=str)
    return "" if result is None else str(result)


def _truncate(text: str) -> str:
    # A tool's output goes to Redis and back to the provider as UTF-8: no lone surrogates.
    text = scrub(text)
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[: MAX_OUTPUT_CHARS - len(TRUNCATED_MARKER)] + TRUNCATED_MARKER


# --- calculator: the safe evaluator lives in agent/calculator.py ---


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.

    Args:
        expression: the expression, e.g. "17*23" or "(2.5 + 4) ** 2 / 3"
    """
    try:
        return calculator_module.evaluate(expression)
    except calculator_module.CalculatorError as exc:
        raise ToolError(str(exc)) from None


# --- current_time ---

MAX_TIMEZONE_CHARS = 64
_TIMEZONE_PATTERN = re.compile(r"^[A-Za-z]+(?:[/_+\-][A-Za-z0-9]+)*$")


@lru_cache(maxsize=1)
def _timezones_by_lowercase() -> dict[str, str]:
    # available_timezones() scans tzdata on every call; names are compared case-insensitively.
    return {name.lower(): name for name in zoneinfo.available_timezones()}


@tool
def current_time(timezone: str = "UTC") -> str:
    """The current date and time in an IANA time zone.

    Args:
        timezone: an IANA time zone name such as "Asia/Tokyo", "Europe/Paris" or "UTC"
    """
    name = timezone.strip()
    shown = repr(timezone[:MAX_TIMEZONE_CHARS]) + ("..." if len(timezone) > MAX_TIMEZONE_CHARS else "")
    # The pattern refuses paths ("../", "/etc/passwd") before the name reaches zoneinfo's file lookup.
    if len(name) > MAX_TIMEZONE_CHARS or not _TIMEZONE_PATTERN.match(name):
        raise ToolError(f"{shown} is not a valid time zone name; use an IANA name such as 'Asia/Tokyo' or 'UTC'")
    known = _timezones_by_lowercase()
    key = known.get(name.lower())
    if key is None:
        cities = [zone for zone in known.values() if zone.lower().rsplit("/", 1)[-1] == name.lower()]
        hint = f"did you mean {cities[0]!r}? " if len(cities) == 1 else ""
        raise ToolError(f"unknown time zone {shown}; {hint}use an IANA name such as 'Asia/Tokyo' or 'UTC'")
    now = datetime.now(zoneinfo.ZoneInfo(key))
    offset = now.strftime("%z")  # "+0900"
    return f"{now:%Y-%m-%d %H:%M:%S} {now.tzname()} ({key}, UTC{offset[:3]}:{offset[3:5]})"


# --- search_docs: word overlap over README.md and docs/*.md ---

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MAX_QUERY_CHARS = 1000  # the demo model sends the whole user message as the query
MAX_PASSAGES = 3
MAX_PASSAGE_CHARS = 1200  # three passages and their headings fit in MAX_OUTPUT_CHARS
_STOPWORDS = frozenset(  # common words, and the words people use to ask for docs at all ("search the docs")
    "a about an and are as at be by can do does for from how i if in is it its me my of on or so that the their "
    "then there this to was what when where which who why will with you your "
    "doc docs documentation search find look say says tell explain please project mean means work works use".split()
)


@dataclass(frozen=True)
class _Passage:
    source: str
    heading: str
    text: str
    words: Counter[str]  # word -> occurrences, heading included
    heading_words: frozenset[str]


_corpus_lock = threading.Lock()
_corpus_cache: dict = {"key": None, "passages": []}


def _words(text: str) -> Counter[str]:
    tokens = [t for t in re.findall(r"[a-z0-9_]+", text.lower()) if t not in _STOPWORDS]
    # A crude plural fold ("deadlines" ~ "deadline"), applied to query and docs alike.
    return Counter(t[:-1] if len(t) > 3 and t.endswith("s") else t for t in tokens)


def _doc_files() -> list[Path]:
    files = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
    return [f for f in files if f.is_file()]


def _split_passages(source: str, text: str) -> list[_Passage]:
    passages, heading, paragraph, in_fence = [], source, [], False

    def flush() -> None:
        body = "\n".join(paragraph).strip()
        if body:
            passages.append(_Passage(source, heading, body, _words(body) + _words(heading), frozenset(_words(heading))))
        paragraph.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not in_fence and re.match(r"^#{1,6}\s", line):
            flush()
            heading = line.lstrip("#").strip()
        elif not in_fence and not line.strip():
            flush()
        else:
            paragraph.append(line)
    flush()
    return passages


def _corpus() -> list[_Passage]:
    files = _doc_files()
    key = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    with _corpus_lock:  # tools run in threads; parse once per change, per process
        if _corpus_cache["key"] != key:
            passages = []
            for f in files:
                source = f.relative_to(PROJECT_ROOT).as_posix()
                passages.extend(_split_passages(source, f.read_text(encoding="utf-8", errors="replace")))
            _corpus_cache.update(key=key, passages=passages)
        return _corpus_cache["passages"]


@tool
def search_docs(query: str) -> str:
    """Search this project's own documentation (README and docs/) and return the best matching passages.

    Args:
        query: a few words about what to look up, e.g. "deadline margin" or "stop button"
    """
    if not query.strip():
        raise ToolError("query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"query is too long ({len(query)} characters; the limit is {MAX_QUERY_CHARS})")
    wanted = frozenset(_words(query))
    if not wanted:
        raise ToolError(f"query {query!r} has no words to search for")
    scored = []
    for order, passage in enumerate(_corpus()):
        matched = wanted & passage.words.keys()
        if matched:
            # Distinct query words matched count most; heading matches and repeated mentions break ties.
            repeats = sum(passage.words[w] for w in matched)
            score = len(matched) + 0.5 * len(wanted & passage.heading_words) + 0.1 * min(repeats, 5)
            scored.append((-score, order, passage))
    if not scored:
        return f"No passage matches {query!r} in the project docs."
    scored.sort(key=lambda item: item[:2])
    blocks = []
    for _, _, passage in scored[:MAX_PASSAGES]:
        text = passage.text if len(passage.text) <= MAX_PASSAGE_CHARS else passage.text[:MAX_PASSAGE_CHARS] + " ..."
        blocks.append(f"[{passage.source} - {passage.heading}]\n{text}")
    return "\n\n".join(blocks)


# --- wait ---

MAX_WAIT_S = 600.0  # seconds


@tool
def wait(seconds: float, *, timeout_s: float, stop: threading.Event | None = None) -> str:
    """A slow tool for demonstrations: waits the given number of seconds, or until the turn's deadline.

    Args:
        seconds: how long to wait, 0 to 600
    """
    if not 0 <= seconds <= MAX_WAIT_S:  # also refuses NaN
        raise ToolError(f"seconds must be between 0 and {MAX_WAIT_S:g}, not {seconds:g}")
    planned_s = min(seconds, max(0.0, timeout_s))
    started = time.monotonic()
    stopped = (stop or threading.Event()).wait(planned_s)
    waited_s = time.monotonic() - started
    if stopped:
        return f"Waited {waited_s:.1f} of {seconds:g} s: stopped at your request"
    if planned_s < seconds:
        return f"Waited {waited_s:.1f} of {seconds:g} s: stopped at the turn's deadline"
    return f"Waited {waited_s:.1f} s"
