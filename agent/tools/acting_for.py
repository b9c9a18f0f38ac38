"""Whose turn a tool runs in: the id of the person who owns the conversation, or None (the local
playground, the command line).

The job sets it from the conversation's state (its `owned_by`, written by the store when the person's
turn started), never from anything the model sends, and `run_tool` hands it to the tool's thread. A tool
that keeps something per person (add_note) reads it with `person()`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

PERSON_ID_RE = re.compile(r"p[0-9a-f]{20}")  # agent.conversation.people.person_id's shape, and nothing else

_person: ContextVar[str | None] = ContextVar("agent_tool_person", default=None)


def person() -> str | None:
    """The person whose turn runs this tool; None when the turn has no owner."""
    return _person.get()


def set_person(person_id: str | None) -> None:
    """For the job, in a context of its own (agent/turn/job.py): the tools it runs act for this person."""
    _person.set(person_id or None)


@contextmanager
def running_for(person_id: str | None) -> Iterator[None]:
    """Tools run in this block act for `person_id` (None: for nobody in particular)."""
    token = _person.set(person_id or None)
    try:
        yield
    finally:
        _person.reset(token)
