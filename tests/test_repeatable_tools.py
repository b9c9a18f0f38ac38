"""Which tools a resumed turn may run again after their worker was lost mid-run (agent/turn/resume.py):
the built-ins, MCP tools whose annotations say read-only or idempotent, and functions that say so."""

from __future__ import annotations

import pytest
from mcp.types import Tool as ListedTool
from mcp.types import ToolAnnotations

from agent.tools import REGISTRY, make_tool, safe_to_repeat
from agent.tools.mcp import offered_tool


def _listed(annotations: ToolAnnotations | None) -> ListedTool:
    return ListedTool(name="act", description="does something", inputSchema={"type": "object"},
                      annotations=annotations)


def _never_called(*args):
    raise AssertionError("no call is made to build a tool")


def test_every_built_in_may_run_again_but_add_note_which_would_write_its_note_twice():
    built_ins = [name for name, tool in REGISTRY.items() if tool.source == "built-in"]
    assert [name for name in built_ins if not safe_to_repeat(name)] == ["add_note"]


def test_an_unknown_tool_may_not_run_again():
    assert not safe_to_repeat("no_such_tool")


def test_a_python_function_runs_again_only_when_it_says_so():
    def note(text: str) -> str:
        """Write a note.

        Args:
            text: the note
        """
        return text

    assert not make_tool(note, source="mypackage.tools").repeatable
    note.safe_to_repeat = True
    assert make_tool(note, source="mypackage.tools").repeatable
    note.safe_to_repeat = "yes"  # only True itself counts
    assert not make_tool(note, source="mypackage.tools").repeatable


@pytest.mark.parametrize(("annotations", "repeatable"), [
    (None, False),
    (ToolAnnotations(), False),
    (ToolAnnotations(destructiveHint=True), False),
    (ToolAnnotations(readOnlyHint=False, idempotentHint=False), False),
    (ToolAnnotations(readOnlyHint=True), True),
    (ToolAnnotations(idempotentHint=True), True),
    (ToolAnnotations(destructiveHint=True, idempotentHint=True), True),
])
def test_an_mcp_tool_runs_again_only_when_its_annotations_say_read_only_or_idempotent(annotations, repeatable):
    assert offered_tool("files", _listed(annotations), _never_called).repeatable is repeatable
