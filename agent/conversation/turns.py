"""A conversation's state cut into turns: one `TurnView` per user message, with its messages, steps
and summary. The page, the export and the command line's `show` all read turns from here. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.contract import Live, Message, Role, State, Step, TurnSummary, live_summary


@dataclass(frozen=True)
class TurnView:
    """One turn as the state holds it. The turn in flight (or ended without a summary of its own)
    takes its summary from the state itself."""

    messages: list[Message]
    summary: TurnSummary
    steps: list[Step]
    current: bool  # the state's latest turn
    in_flight: bool  # current, and not done yet
    live: Live | None  # the text being written now, when it belongs to this turn
    key: str  # names the turn for widget keys: by its place too, as a hand-written state may repeat an id
    ended_at: float | None  # when it ended; for the current turn without a summary, the state's last write


def split_turns(state: State) -> list[TurnView]:
    """The history cut at each user message: one view per turn, with its steps and summary."""
    segments: list[list[Message]] = []
    for message in state.get("history") or []:
        if message.get("role") == Role.USER or not segments:
            segments.append([])
        segments[-1].append(message)
    summaries = state.get("turns") or []
    steps_of: dict = {}  # each step read once, not once per turn
    for step in state.get("steps") or []:
        steps_of.setdefault(step.get("turn_id"), []).append(step)
    turns = []
    for index, messages in enumerate(segments):
        if index < len(summaries):
            summary = summaries[index]
            turns.append(TurnView(messages, summary, steps_of.get(summary.get("turn_id"), []), current=False,
                                  in_flight=False, live=None, key=f"{index}-{summary.get('turn_id')}",
                                  ended_at=summary.get("ended_at")))
        else:  # the turn in flight (no summary until it ends)
            turns.append(_current(state, messages, steps_of.get(state.get("turn_id"), []),
                                  key=f"{index}-{state.get('turn_id')}"))
    return turns


def current_turn(state: State) -> TurnView:
    """The latest turn alone, found from the end: a poll's cost must not grow with the conversation."""
    history = state.get("history") or []
    start = len(history) - 1
    while start > 0 and history[start].get("role") != Role.USER:
        start -= 1
    steps = state.get("steps") or []
    first = len(steps)
    while first > 0 and steps[first - 1]["turn_id"] == state["turn_id"]:
        first -= 1
    return _current(state, history[max(start, 0):], steps[first:], key=f"live-{state['turn_id']}")


def _current(state: State, messages: list[Message], steps: list[Step], *, key: str) -> TurnView:
    done = bool(state.get("done"))
    return TurnView(messages, live_summary(state), steps, current=True, in_flight=not done, live=live_text(state),
                    key=key, ended_at=state.get("updated_at") if done else None)


def live_text(state: State) -> Live | None:
    """The text of the model call in flight (the contract's `live`), when it belongs to this turn."""
    live = state.get("live")
    if not live or state.get("done") or live.get("turn_id") != state.get("turn_id"):
        return None
    return live
