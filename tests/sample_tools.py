"""Typed functions offered as tools through AGENT_TOOLS=tests.sample_tools (see tests/test_mcp.py)."""

from __future__ import annotations

from typing import Literal


def shout(text: str, style: Literal["caps", "stars"] = "caps") -> str:
    """Say it louder.

    Args:
        text: what to say
    """
    return text.upper() if style == "caps" else f"*{text}*"


TOOLS = [shout]
