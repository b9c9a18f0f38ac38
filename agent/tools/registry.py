"""The tool registry: a tool is a plain typed function, or a tool an MCP server offers.

A function's arguments are checked by a msgspec Struct built from its signature, and the JSON
schema offered to the model is that Struct's schema; descriptions come from the docstring (its
first line, and a Google-style "Args:" section). Three keyword-only parameters are never offered:
`timeout_s: float` (the time the run may take), `stop: threading.Event | None` (set when the
user stops the turn) and `idempotency_key: str` (the same for every attempt at one tool call of one
turn, across resumes); `run_tool` fills them in.
"""

from __future__ import annotations

import inspect
import re
import sys
import threading
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from agent import bounded_json
from agent.contract import TOOL_NAME  # noqa: F401 - what every provider accepts as a tool name
from agent.text.surrogates import scrub_json

TIMEOUT_PARAMETER = "timeout_s"  # filled by run_tool with the time the run may take, never shown to the model
STOP_PARAMETER = "stop"  # filled by run_tool with an Event set when the user stops the turn; never shown
IDEMPOTENCY_KEY_PARAMETER = "idempotency_key"  # filled by run_tool with the call's key (turn and call); never shown
_HIDDEN_TYPES = {TIMEOUT_PARAMETER: (float, "a float"), STOP_PARAMETER: (threading.Event | None,
                                                                         "a threading.Event | None"),
                 IDEMPOTENCY_KEY_PARAMETER: (str, "a str")}
BUILT_IN = "built-in"  # the source name of the tools this package ships
_BARE_CONTAINERS = (list, dict, set, frozenset, tuple)  # their items' type says what the model must send


class ToolError(Exception):
    """A tool's expected failure; its message goes to the model as is."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object, as offered to the model
    func: Callable  # called with the checked arguments as keywords, plus timeout_s/stop when it takes them
    arguments: type[msgspec.Struct] | None  # None: the arguments object is passed whole, as `arguments`
    takes_timeout: bool = False
    takes_stop: bool = False
    takes_idempotency_key: bool = False
    source: str = BUILT_IN  # where it comes from: built-in, an AGENT_TOOLS module, an MCP server's name
    # Run again after its worker was lost mid-run (agent/turn/resume.py): only when that cannot do harm.
    # The built-ins can (unless one says `safe_to_repeat = False`); a function says so with `safe_to_repeat = True`;
    # an MCP tool through its annotations.
    repeatable: bool = False
    # Ask a person before it runs (the turn parks until an answer, agent/turn): a function says so with
    # `needs_approval = True`; an MCP tool through its destructive annotation or its server's "approve".
    needs_approval: bool = False


REGISTRY: dict[str, Tool] = {}


def safe_to_repeat(name: str) -> bool:
    """Whether the tool may run again after a worker was lost while it ran (unknown tools may not)."""
    tool = REGISTRY.get(name)
    return tool is not None and tool.repeatable


def needs_approval(name: str, approve_tools: tuple[str, ...] | frozenset = ()) -> bool:
    """Whether a call of this tool waits for a person's answer first: the turn's AGENT_APPROVE_TOOLS name it,
    or the tool says so itself (a name this process does not know asks only when listed)."""
    tool = REGISTRY.get(name)
    return name in approve_tools or (tool is not None and tool.needs_approval)


def make_tool(func: Callable, source: str = BUILT_IN) -> Tool:
    """Build a Tool from a typed function without registering it; TypeError says what is wrong with it."""
    hints = typing.get_type_hints(func, include_extras=True)  # Annotated[int, msgspec.Meta(ge=0)] keeps its Meta
    description, arg_docs = _parse_docstring(inspect.getdoc(func) or "")
    fields: list[tuple] = []
    hidden = set()
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"tool {func.__name__}: parameter {param.name!r} must be a named parameter")
        if param.name in _HIDDEN_TYPES:
            _check_hidden(func.__name__, param, hints.get(param.name))
            hidden.add(param.name)
            continue
        if param.name.startswith("_"):  # a private name by convention, and msgspec cannot hold "__x" as a field
            raise TypeError(f"tool {func.__name__}: parameter {param.name!r} must not start with an underscore")
        annotation = hints.get(param.name)
        if annotation is None or annotation is typing.Any or annotation in _BARE_CONTAINERS:
            raise TypeError(f"tool {func.__name__}: parameter {param.name!r} needs a type annotation that says "
                            "what to send (str, int, float, bool, list[str], a Literal or an Enum, ...)")
        if param.name in arg_docs:
            annotation = typing.Annotated[annotation, msgspec.Meta(description=arg_docs[param.name])]
        fields.append((param.name, annotation) if param.default is param.empty
                      else (param.name, annotation, param.default))
    try:  # strict: "3" is not a number (3 is a float); an argument the signature does not name is refused
        model = msgspec.defstruct(f"{func.__name__}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
        parameters = _offered_schema(msgspec.json.schema(model))
        msgspec.json.encode(parameters)  # a default that is no JSON (a set, an object) is refused here, not later
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise TypeError(f"tool {func.__name__}: its parameters have no JSON schema ({exc})") from None
    return Tool(name=func.__name__, description=description, parameters=parameters, func=func, arguments=model,
                takes_timeout=TIMEOUT_PARAMETER in hidden, takes_stop=STOP_PARAMETER in hidden,
                takes_idempotency_key=IDEMPOTENCY_KEY_PARAMETER in hidden, source=source,
                repeatable=getattr(func, "safe_to_repeat", source == BUILT_IN) is True,
                needs_approval=getattr(func, "needs_approval", False) is True)


def _check_hidden(tool_name: str, param: inspect.Parameter, annotation: object) -> None:
    expected, shown = _HIDDEN_TYPES[param.name]
    if param.kind is not param.KEYWORD_ONLY or annotation != expected:
        raise TypeError(f"tool {tool_name}: {param.name} must be keyword-only and {shown}")


def tool(func: Callable, source: str = BUILT_IN) -> Callable:
    """Register a typed function as a tool; returns the function unchanged."""
    add(make_tool(func, source))
    return func


def add(new: Tool) -> None:
    """Register a built Tool; a second, different tool under a name already taken is refused."""
    add_all([new])


def add_all(tools: list[Tool]) -> None:
    """Register a source's tools, all or none: every name is checked before any is added, so the
    registry never holds part of a source that is reported as failed."""
    batch: dict[str, Tool] = {}
    for new in tools:
        old = batch.get(new.name) or REGISTRY.get(new.name)
        # A module reload re-registers the same function; two different functions under one name is a bug.
        if old is not None and (old.source, _origin(old.func)) != (new.source, _origin(new.func)):
            raise ValueError(f"a tool named {new.name!r} is already registered (from {old.source})")
        batch[new.name] = new
    REGISTRY.update(batch)


def _origin(func: Callable) -> tuple[str, str]:
    return func.__module__, func.__qualname__


def schemas(names: Iterable[str] | None = None) -> list[dict]:
    """Tools in the OpenAI `tools` format: all registered tools when names is None, else those of
    `names` this process has (a chosen tool whose server did not start here is left out)."""
    selected = list(REGISTRY) if names is None else [n for n in names if n in REGISTRY]
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in (REGISTRY[n] for n in selected)
    ]


def decode_arguments(name: str, arguments_json: str | None) -> dict:
    """A call's arguments decoded as its tool receives them (a key given twice: the last value, as JSON
    readers do), before any check against the tool's parameters; ToolError says what is wrong. What a
    person is asked to approve is shown from this same value (agent/turn/approvals.py)."""
    text = "{}" if arguments_json is None or not str(arguments_json).strip() else str(arguments_json)
    try:  # some models send "" for a tool without parameters
        arguments = bounded_json.loads(text)
    except bounded_json.TooDeep as exc:
        raise ToolError(f"arguments for {name} are {exc}") from None
    except ValueError as exc:
        raise ToolError(f"arguments for {name} are not valid JSON ({exc})") from None
    if not isinstance(arguments, dict):
        raise ToolError(f"arguments for {name} must be a JSON object, not {type(arguments).__name__}")
    return scrub_json(arguments)  # "\\ud800" is valid JSON, but no UTF-8 text


def check_arguments(found: Tool, arguments_json: str | None) -> dict:
    """The keyword arguments for the tool's function, from the model's JSON; ToolError says what is wrong."""
    arguments = decode_arguments(found.name, arguments_json)
    if found.arguments is None:
        return {"arguments": arguments}  # the tool's own server checks them against its schema
    huge = _past_float_range(arguments)
    if huge is not None:  # no tool wants one, and msgspec cannot read one where it expects a float
        raise ToolError(f"argument {huge!r} of {found.name} is a number past any JSON reader's range")
    try:  # as msgspec reads JSON: an enum from its value, a tuple from an array, a date from its ISO text
        checked = msgspec.convert(arguments, found.arguments, strict=True)
    except msgspec.ValidationError as exc:
        raise ToolError(_describe(found, str(exc))) from None
    return {name: getattr(checked, name) for name in found.arguments.__struct_fields__}


def _past_float_range(arguments: dict) -> str | None:
    """The argument holding an integer no float can hold (JSON allows 10**400; readers do not), if any."""
    pending = list(arguments.items())
    while pending:
        name, value = pending.pop()
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _FLOAT_MAX:
            return name
        if isinstance(value, dict | list):
            pending += [(name, item) for item in (value.values() if isinstance(value, dict) else value)]
    return None


_FLOAT_MAX = int(sys.float_info.max)

# msgspec's words: "Object missing required field `a`", "Expected `int`, got `str` - at `$.a[0]`".
_VALIDATION_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_FIELD_NAMED = re.compile(r"^Object (?P<problem>missing required|contains unknown) field `(?P<field>[^`]*)`$")
_MISMATCH = re.compile(r"^Expected `(?P<expected>[^`]*)`, got `(?P<got>[^`]*)`$")
_JSON_KINDS = {"int": "integer", "float": "number", "str": "string", "bool": "boolean", "array": "array",
               "object": "object", "null": "null"}


def _describe(found: Tool, message: str) -> str:
    """msgspec's error in the words the model needs to fix its call."""
    parts = _VALIDATION_ERROR.match(message)
    what, path = parts["what"], (parts["path"] or "").removeprefix(".")
    named = _FIELD_NAMED.match(what)
    if named and not path:
        kind = "missing required" if named["problem"] == "missing required" else "unexpected"
        return f"{kind} argument(s) for {found.name}: {named['field']!r}"
    where = path or "arguments"
    mismatch = _MISMATCH.match(what)
    if mismatch:  # the schema's own word for what it wants, and what came
        wanted = " or ".join(_JSON_KINDS.get(kind, kind) for kind in mismatch["expected"].split(" | "))
        got = _JSON_KINDS.get(mismatch["got"], mismatch["got"])
        return f"argument {where!r} of {found.name} must be {wanted}, as its schema says, not {got}"
    said = re.sub(r"`(\w+)`", lambda kind: _JSON_KINDS.get(kind[1], kind[1]), what)  # "expected integer >= 0"
    return f"argument {where!r} of {found.name} must be as its schema says: {said[:1].lower()}{said[1:]}"


_ENUM_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _offered_schema(schema: dict) -> dict:
    """msgspec's schema as providers take it: references inlined, no generated titles, and an enum's
    JSON type said (`"type": "string"` beside `"enum"`, as providers' strict modes want it)."""
    definitions = schema.pop("$defs", {})

    def clean(node: object, key: str | None = None) -> object:
        if isinstance(node, dict):
            if "$ref" in node:
                target = definitions[node["$ref"].rsplit("/", 1)[-1]]
                node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            # "title" is a field name inside "properties", and msgspec's generated label everywhere else.
            cleaned = {k: clean(v, k) for k, v in node.items() if k != "title" or key == "properties"}
            if key != "properties" and "enum" in cleaned and "type" not in cleaned:
                kinds = {_ENUM_TYPES.get(type(value)) for value in cleaned["enum"]}
                if len(kinds) == 1 and None not in kinds:
                    cleaned["type"] = kinds.pop()
            return cleaned
        if isinstance(node, list):
            return [clean(item) for item in node]
        return node

    cleaned = clean(schema)
    cleaned.setdefault("required", [])
    return cleaned


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
