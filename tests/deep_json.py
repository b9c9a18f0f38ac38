"""JSON nested to a given depth, as text (a value 10,000 deep cannot be made by json.dumps) and as a
value (built level by level), in three shapes; and a tool module (AGENT_TOOLS=tests.deep_json) whose
tools take and return such values."""

from __future__ import annotations

from typing import Any, Literal

SHAPES = ("objects", "arrays", "mixed")
Shape = Literal["objects", "arrays", "mixed"]
# Any JSON value, as a tool's annotation (msgspec checks it; typing.Any alone is refused as saying nothing).
JsonValue = dict[str, Any] | list[Any] | str | int | float | bool | None


def _opens(levels: int, shape: str) -> list[str]:
    return {"objects": ['{"a":'] * levels, "arrays": ["["] * levels,
            "mixed": ["[" if level % 2 else '{"a":' for level in range(levels)]}[shape]


def nested_text(depth: int, shape: str) -> str:
    """A JSON object `depth` levels deep: {"a": <the shape, depth - 1 deep, around a 1>}."""
    opens = _opens(depth - 1, shape)
    closes = "".join("]" if part == "[" else "}" for part in reversed(opens))
    return '{"a":' + "".join(opens) + "1" + closes + "}"


def nested_value(depth: int, shape: str) -> dict:
    """The value of nested_text(depth, shape), built from the inside out (no recursion)."""
    value: object = 1
    for part in reversed(_opens(depth - 1, shape)):
        value = [value] if part == "[" else {"a": value}
    return {"a": value}


def depth_of(a: JsonValue) -> str:
    """Says how deep the value it is given nests.

    Args:
        a: any JSON value
    """
    depth, level = 1, [a]  # the arguments object around it is the first level
    while containers := [v for v in level if isinstance(v, dict | list)]:
        depth += 1
        level = [child for v in containers for child in (v.values() if isinstance(v, dict) else v)]
    return f"{depth} levels"


def deep_value(depth: int, shape: Shape) -> dict:
    """Returns a value nested `depth` deep.

    Args:
        depth: how many levels of arrays and objects
        shape: objects, arrays or mixed
    """
    return nested_value(depth, shape)


TOOLS = [depth_of, deep_value]
