"""The offline demo model: an OpenAI-format history -> the next assistant message, deterministically.

It reads the last user message, plans the tool calls it needs, and issues them ONE per response, so
a question that needs two tools takes two round-trips and the page shows the steps landing one by one.
A message that asks for a note ("note: buy milk") is the exception: the reply that calls add_note
carries every call still to make, as a real model's parallel calls do, so the turn runs the others
first and then asks a person before the note is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from agent import bounded_json
from agent.demo.scenarios import Scenario

LOOP_EXPRESSION = "1+1"  # what the `loop` scenario computes, forever
SLOW_TOOL_WAIT_S = 30.0  # seconds; the `slow-tool` scenario's wait, longer than a short deadline
DEFAULT_WAIT_S = 3.0  # seconds; "slow" without a number
MAX_WAIT_S = 600.0  # seconds; the wait tool honours the deadline anyway, this only tames typos
MAX_RESULT_CHARS = 1500  # a long docs passage is cut so the answer stays readable
VERBOSE_POINTS = 24  # the `verbose` scenario's answer goes on for this many paragraphs (~2,000 tokens)
VERBOSE_PARAGRAPH = (
    "To be thorough, point {n}: the figures above came straight from the tools, which I checked once more "
    "against what you asked, and nothing in them needs a caveat. I could say it again in other words, "
    "considering each assumption one by one, but the answer stays the same."
)

# ~20 common cities -> IANA zones. Longer names first, so "new york" wins over "york".
CITY_TIMEZONES: dict[str, str] = {
    "new york": "America/New_York",
    "nyc": "America/New_York",
    "san francisco": "America/Los_Angeles",
    "los angeles": "America/Los_Angeles",
    "la": "America/Los_Angeles",
    "seattle": "America/Los_Angeles",
    "chicago": "America/Chicago",
    "toronto": "America/Toronto",
    "mexico city": "America/Mexico_City",
    "sao paulo": "America/Sao_Paulo",
    "são paulo": "America/Sao_Paulo",
    "london": "Europe/London",
    "paris": "Europe/Paris",
    "berlin": "Europe/Berlin",
    "madrid": "Europe/Madrid",
    "rome": "Europe/Rome",
    "amsterdam": "Europe/Amsterdam",
    "moscow": "Europe/Moscow",
    "dubai": "Asia/Dubai",
    "mumbai": "Asia/Kolkata",
    "delhi": "Asia/Kolkata",
    "singapore": "Asia/Singapore",
    "hong kong": "Asia/Hong_Kong",
    "shanghai": "Asia/Shanghai",
    "beijing": "Asia/Shanghai",
    "seoul": "Asia/Seoul",
    "tokyo": "Asia/Tokyo",
    "sydney": "Australia/Sydney",
    "auckland": "Pacific/Auckland",
}
_CITY_RE = re.compile(
    r"\b(" + "|".join(re.escape(c) for c in sorted(CITY_TIMEZONES, key=len, reverse=True)) + r")\b", re.IGNORECASE
)
# "LA" only counts in capitals: "la" is too common a fragment otherwise.
_CASE_SENSITIVE_CITIES = {"la": "LA", "nyc": "NYC"}
_IANA_RE = re.compile(r"\b(UTC|GMT|[A-Z][a-z]+/[A-Z][A-Za-z_]+(?:/[A-Z][A-Za-z_]+)?)\b")

_TIME_WORD_RE = re.compile(r"\b(time|date)\b", re.IGNORECASE)
_TIME_QUESTION_RE = re.compile(
    r"\b(what time|what's the time|what is the time|time is it|time now|time in|time at|current time|current date|"
    r"local time|today'?s date|what day|date in|date today)\b",
    re.IGNORECASE,
)
_DOCS_RE = re.compile(
    r"\b(this app|the app|deadlines?|clocks?|timeouts?|how does|how do|docs|documentation|margin|done|retry|retries|"
    r"budget)\b",
    re.IGNORECASE,
)
_SLOW_RE = re.compile(r"\bslow\b|\bwait\s+(?:for\s+)?\d", re.IGNORECASE)
_WAIT_SECONDS_RE = re.compile(r"\b(?:slow|wait)\s+(?:for\s+)?(\d+(?:\.\d+)?)", re.IGNORECASE)
NOTE_TOOL = "add_note"  # the built-in that writes, so asks a person first
# "note: ...", "take a note ...", "add a note: ...", and at the start of a sentence or after "and",
# "note that ..." and "remember (to/that) ...". What follows, to the end of its sentence, is the note.
_NOTE_RE = re.compile(
    r"\bnote(?:\s+down)?\s*:"
    r"|\b(?:add|make|take|write|jot)(?:\s+down)?\s+(?:(?:a|an|another|this)\s+)?note\b"
    r"(?:\s*:|\s+(?:that|saying|of|about)\b)?"
    r"|(?:^|(?<=[.;!?,\n])|\b(?:and|then|also|please)\b)\s*"
    r"(?:note(?:\s+down)?(?:\s+that)?|remember(?:\s+(?:that|to))?)\b\s*:?",
    re.IGNORECASE,
)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])|\n")  # "call Bob. What is 2+3?": the note is "call Bob."
NOTE_QUOTE_CHARS = 80  # characters of a note the answer quotes; the tool step holds it whole

# A run of arithmetic characters; it counts as an expression if a digit meets an operator meets a digit.
_EXPR_RUN_RE = re.compile(r"[\d.+\-*/^%()\s]+")
_EXPR_SHAPE_RE = re.compile(r"\d[\s)]*(?:\*\*|[-+*/^%])[\s(]*[-+]?\.?\d")

CAPABILITIES = (
    "I'm the offline demo model. I can:\n\n"
    "- do arithmetic with the calculator (try “what is 17*23?”)\n"
    "- tell the time in a city (“what time is it in Tokyo?”)\n"
    "- answer questions about this app from its docs (“how does the deadline work?”)\n"
    "- be slow on purpose with the wait tool (“slow 5”)\n"
    "- add a note, once you approve it (“note: buy milk”)"
)


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: dict
    position: int  # where in the message it was asked for, so calls follow the question's order


def respond(messages: list[dict], tools: list[dict], scenario: Scenario) -> dict:
    """The next assistant message (OpenAI format) for this history, tool list and scenario."""
    available = _tool_names(tools)
    turn_start = _last_user_index(messages)
    user_text = _text(messages[turn_start].get("content")) if turn_start is not None else ""
    since_user = messages[turn_start + 1 :] if turn_start is not None else list(messages)
    calls_made = [c for m in since_user if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])]
    tool_results = [m for m in since_user if m.get("role") == "tool"]
    next_id = f"call_{len(tool_results) + 1}"

    if scenario.name == "loop" and "calculator" in available:
        return _tool_call_message(next_id, "calculator", {"expression": LOOP_EXPRESSION})

    plan = plan_calls(user_text, scenario, tools)
    # A call we cannot make (its tool is not offered) is not planned; it is mentioned in the answer instead.
    runnable = [c for c in plan if c.name in available]
    if available and len(calls_made) < len(runnable):
        pending = runnable[len(calls_made):]
        batch = pending if any(c.name == NOTE_TOOL for c in pending) else pending[:1]
        return _tool_calls_message(len(tool_results) + 1, batch)

    answer = _answer(calls_made, tool_results, _not_done(plan, calls_made))
    if scenario.name == "verbose":  # a model that will not stop: only max_tokens (the budget's clamp) ends it
        answer += "".join("\n\n" + VERBOSE_PARAGRAPH.format(n=n) for n in range(1, VERBOSE_POINTS + 1))
    return {"role": "assistant", "content": answer}


def _not_done(plan: list[PlannedCall], calls_made: list[dict]) -> list[PlannedCall]:
    """Planned calls that no tool call in the history made, e.g. because the tools were not offered."""
    made = [((c.get("function") or {}).get("name"), _arguments(c.get("function") or {})) for c in calls_made]
    missing = []
    for call in plan:
        if (call.name, call.arguments) in made:
            made.remove((call.name, call.arguments))
        else:
            missing.append(call)
    return missing


@dataclass(frozen=True)
class Note:
    """A note a message asks for: the text to write down, and the span of the message it takes."""

    start: int
    end: int
    text: str

    def call(self) -> PlannedCall:
        return PlannedCall(NOTE_TOOL, {"text": self.text}, self.start)

    def blanked(self, message: str) -> str:
        """The message without the note, its length kept (positions stay), so that "note: buy 2-3 apples"
        asks for no sum and "remember the deadline" for no docs."""
        return message[: self.start] + " " * (self.end - self.start) + message[self.end :]


def find_note(text: str) -> Note | None:
    """The note a message asks to write down: what follows "note:", "take a note", "remember" ...,
    to the end of its sentence (or line); None when it asks for none, or for an empty one."""
    asked = _NOTE_RE.search(text)
    if asked is None:
        return None
    ends = _SENTENCE_END_RE.search(text, asked.end())
    end = ends.start() if ends else len(text)
    note = " ".join(text[asked.end() : end].split()).lstrip(":,- ")
    return Note(asked.start(), end, note) if note else None


def plan_calls(text: str, scenario: Scenario, tools: list[dict] | None = None) -> list[PlannedCall]:
    """The tool calls a user message needs, in the order it asked for them: a note, and a tool of another
    source that it names, or the built-ins its words call for."""
    note = find_note(text)
    notes = [note.call()] if note else []
    text = note.blanked(text) if note else text
    if named := named_tool_calls(text, tools):
        return sorted(notes + named, key=lambda c: c.position)
    plan: list[PlannedCall] = notes
    if scenario.name == "slow-tool":
        plan.append(PlannedCall("wait", {"seconds": SLOW_TOOL_WAIT_S}, -1))
    for position, expression in find_expressions(text):
        plan.append(PlannedCall("calculator", {"expression": expression}, position))
    if _is_time_question(text):
        zones = _find_timezones(text)
        first = _TIME_WORD_RE.search(text) or _TIME_QUESTION_RE.search(text)
        default_position = first.start() if first else 0
        for position, zone in zones or [(default_position, "UTC")]:
            plan.append(PlannedCall("current_time", {"timezone": zone}, position))
    if docs := _DOCS_RE.search(text):
        plan.append(PlannedCall("search_docs", {"query": text.strip()}, docs.start()))
    if slow := _SLOW_RE.search(text):
        seconds = DEFAULT_WAIT_S
        if number := _WAIT_SECONDS_RE.search(text):
            seconds = min(float(number.group(1)), MAX_WAIT_S)
        plan.append(PlannedCall("wait", {"seconds": seconds}, slow.start()))
    return sorted(plan, key=lambda c: c.position)  # sorted() is stable: ties keep the order above


def named_tool_calls(text: str, tools: list[dict] | None) -> list[PlannedCall]:
    """A call to a tool from another source (an MCP server: "<server>__<tool>") that the message names,
    by its full name or its own ("... in Tokyo via get_current_time"); a time zone argument is filled in."""
    for tool in tools or []:
        function = (tool.get("function") or {}) if isinstance(tool, dict) else {}
        name = function.get("name")
        if not isinstance(name, str) or "__" not in name:
            continue
        own = name.split("__", 1)[1]
        named = re.search(rf"(?<![\w-])(?:{re.escape(name)}|{re.escape(own)})(?![\w-])", text)
        if named:
            properties = (function.get("parameters") or {}).get("properties") or {}
            zones = _find_timezones(text) or [(0, "UTC")]
            arguments = {key: zones[0][1] for key in properties if "timezone" in key.lower()}
            return [PlannedCall(name, arguments, named.start())]
    return []


def find_expressions(text: str) -> list[tuple[int, str]]:
    """Arithmetic expressions in free text, as (position, calculator expression); `^` becomes `**`."""
    found = []
    for run in _EXPR_RUN_RE.finditer(text):
        raw = run.group()
        expression = raw.strip()
        # Sentence punctuation and dangling operators ("is 2+2." / "3-second") are not part of the sum.
        expression = expression.rstrip("+-*/^%. ").lstrip("*/^%. ")
        while expression.startswith("(") and expression.count("(") > expression.count(")"):
            expression = expression[1:].strip()
        while expression.endswith(")") and expression.count(")") > expression.count("("):
            expression = expression[:-1].strip()
        if not _EXPR_SHAPE_RE.search(expression):
            continue
        position = run.start() + raw.find(expression[0])
        found.append((position, expression.replace("^", "**")))
    return found


def _is_time_question(text: str) -> bool:
    if _TIME_QUESTION_RE.search(text):
        return True
    return bool(_TIME_WORD_RE.search(text)) and bool(_find_timezones(text))


def _find_timezones(text: str) -> list[tuple[int, str]]:
    zones: list[tuple[int, str]] = []
    for match in _CITY_RE.finditer(text):
        city = match.group(1).lower()
        if city in _CASE_SENSITIVE_CITIES and match.group(1) != _CASE_SENSITIVE_CITIES[city]:
            continue
        zones.append((match.start(), CITY_TIMEZONES[city]))
    zones += [(m.start(), "UTC" if m.group(1) == "GMT" else m.group(1)) for m in _IANA_RE.finditer(text)]
    zones.sort()
    unique, seen = [], set()
    for position, zone in zones:  # "time in LA and Los Angeles" asks once
        if zone not in seen:
            seen.add(zone)
            unique.append((position, zone))
    return unique


def _answer(calls_made: list[dict], tool_results: list[dict], missing: list[PlannedCall]) -> str:
    """Compose the final Markdown answer from what the tools returned, naming what could not be done."""
    results_by_id = {m.get("tool_call_id"): _text(m.get("content")) for m in tool_results}
    parts = []
    for call in calls_made:
        if call.get("id") not in results_by_id:
            continue
        function = call.get("function") or {}
        parts.append(_describe(function.get("name", "?"), _arguments(function), results_by_id[call["id"]]))
    if missing:
        todo = ", ".join(f"`{c.name}` ({_brief(c)})" for c in missing)
        parts.append(
            f"I couldn't get to everything with the tools I had, so I'm answering with what I have. Not done: {todo}."
        )
    if not parts:
        return f"Hello! {CAPABILITIES}"
    return "\n\n".join(parts)


def _describe(name: str, arguments: dict, result: str) -> str:
    result = result.strip()
    if len(result) > MAX_RESULT_CHARS:
        result = result[:MAX_RESULT_CHARS].rstrip() + " …"
    failed = result.startswith("Error:")
    if name == "calculator":
        expression = arguments.get("expression", "?")
        return f"I couldn't compute `{expression}`: {result}" if failed else f"**{expression} = {result}**"
    if name == "current_time":
        place = _place(arguments.get("timezone", "UTC"))
        return f"I couldn't get the time in {place}: {result}" if failed else f"The time in {place} is {result}."
    if name == "search_docs":
        if failed:
            return f"I couldn't search the docs: {result}"
        return docs_answer(result)
    if name == "wait":
        seconds = arguments.get("seconds", "?")
        return f"The wait of {seconds} s failed: {result}" if failed else f"I waited {seconds} s as asked: {result}"
    if name == NOTE_TOOL:
        return note_answer(str(arguments.get("text", "")), result)
    return f"`{name}` failed: {result}" if failed else f"`{name}` returned: {result}"


def note_answer(text: str, result: str) -> str:
    """What became of a note: added (the tool's confirmation), or not, with the reason in brief: a person
    declined it, nobody answered in time, or the tool failed."""
    quoted = text if len(text) <= NOTE_QUOTE_CHARS else text[:NOTE_QUOTE_CHARS].rstrip() + " …"
    if not result.startswith("Error:"):
        return f"I added your note “{quoted}”. {result}"
    reason = result.removeprefix("Error:").strip().removeprefix("not run:").strip()
    reason = reason.split(". ", 1)[0].rstrip(".")  # its first sentence: "a person declined this tool call"
    return f"I did not add the note “{quoted}”: {reason}."


DOCS_ANSWER_CHARS = 600  # the reply quotes about this much of the best passage; the tool step holds them all


def docs_answer(result: str) -> str:
    """A short reply from search_docs' passages: the best one's first items or paragraphs, whole,
    with its source. Tables and code stay in the tool step, so one question does not fill the page."""
    first = result.split("\n\n[", 1)[0]
    header, _, body = first.partition("\n")
    if not body:
        return f"From the docs: {result.strip()}"
    items: list[list[str]] = []
    for line in body.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "```")):
            continue
        starts_item = stripped.startswith(("- ", "* ")) or stripped[:1].isdigit() or not items
        if starts_item:
            items.append([])
        items[-1].append(stripped)
    kept, size = [], 0
    for item in items:
        text = " ".join(item)
        if kept and size + len(text) > DOCS_ANSWER_CHARS:
            break
        if len(text) > DOCS_ANSWER_CHARS:  # one long paragraph: its first sentences
            cut = text.rfind(". ", 0, DOCS_ANSWER_CHARS)
            text = text[: cut + 1] if cut > 0 else text[:DOCS_ANSWER_CHARS] + " …"
        kept.append(text)
        size += len(text)
    quoted = "\n".join(f"> {text}" for text in kept) or "> (a table or code: open the tool step to read it)"
    return f"From the docs ({header.strip('[]').strip()}):\n\n{quoted}"


def _brief(call: PlannedCall) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in call.arguments.items())


def _place(zone: str) -> str:
    """A city name for a zone when the mapping has one (Tokyo), else the zone itself (UTC)."""
    for city, city_zone in CITY_TIMEZONES.items():
        if city_zone == zone and len(city) > 3:  # the first, full name: "New York", not "nyc"
            return city.title()
    return zone


def _tool_call_message(call_id: str, name: str, arguments: dict) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    call = {"id": call_id, "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _tool_calls_message(first_number: int, calls: list[PlannedCall]) -> dict:
    """One reply with these calls, numbered on from the results the turn already has."""
    made = [_tool_call_message(f"call_{first_number + n}", c.name, c.arguments)["tool_calls"][0]
            for n, c in enumerate(calls)]
    return {"role": "assistant", "content": None, "tool_calls": made}


def _tool_names(tools: list[dict] | None) -> set[str]:
    names = set()
    for tool in tools or []:
        if isinstance(tool, dict):  # accept both the OpenAI shape and a bare {"name": ...}
            name = (tool.get("function") or {}).get("name") or tool.get("name")
            if isinstance(name, str):
                names.add(name)
    return names


def _last_user_index(messages: list[dict]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], dict) and messages[index].get("role") == "user":
            return index
    return None


def _text(content: object) -> str:
    """Message content as text: a string, or the text parts of an OpenAI content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _arguments(function: dict) -> dict:
    try:
        arguments = bounded_json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):  # ValueError: not JSON, or nested too deeply (TooDeep)
        return {}
    return arguments if isinstance(arguments, dict) else {}
