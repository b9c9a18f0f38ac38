"""What a model call is sent of a long conversation: its latest turns, up to a byte cap.

The stored history is never cut; only what is sent is. Whole turns are left out, oldest first (a turn
starts at a user message), so a tool call is never sent without its result or a result without its
call. The turn in flight is always sent whole: its size is bounded by the turn's own limits.
Pure: no I/O.
"""

from __future__ import annotations

import json

from agent.contract import Message, Role


def message_bytes(message: Message) -> int:
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode())


def latest_turns(history: list[Message], max_bytes: int) -> tuple[list[Message], int]:
    """(the messages to send, how many earlier turns were left out to stay within `max_bytes`)."""
    starts = [i for i, message in enumerate(history) if message.get("role") == Role.USER]
    if len(starts) <= 1:
        return history, 0
    sizes = [message_bytes(message) for message in history]
    total = sum(sizes)
    first, dropped = 0, 0
    # Drop whole turns, oldest first, while the rest is over the cap and an earlier turn remains.
    for next_start in starts[1:]:
        if total <= max_bytes:
            break
        total -= sum(sizes[first:next_start])
        first, dropped = next_start, dropped + 1
    return history[first:], dropped
