"""A conversation as a file: JSON (the stored state object, steps and clocks included, exactly as
`ask --json` and the page read it, and the whole tree of turns beside it) or Markdown (for a person: the
branch shown, or every branch, with messages, tool calls and results, how each turn ended, and at each
fork how many other branches there are). Pure: no I/O.

Everything stored is untrusted text, and a viewer opening the Markdown must fetch nothing and run
nothing, even one that renders raw HTML. So every part of it written there goes one of three ways:
messages are quoted as the page shows them (images as their alt text, links only to web pages and
mail addresses) and with no raw HTML at all (`no_html_markdown`); tool arguments (decoded, each key once,
every character a reader would not see as its escape: agent/text/visible.py) and results go in
fenced blocks whose fence is longer than any backtick run inside, so no content can end one; every
other stored text (the title, a tool's name, a status, an error's kind) is one line with each Markdown
character escaped (`inert`) or, for names, a code span no backtick can end. The JSON is the data as
stored.
"""

from __future__ import annotations

import datetime as dt
import json

from agent.contract import Kind, Outcome, Role, State
from agent.conversation.turns import TurnView, split_turns
from agent.conversation.words import exported_words
from agent.spend import money, spend_words, total
from agent.text.markdown import inert, no_html_markdown
from agent.text.visible import shown_json_text

FORMATS = ("md", "json")


def to_json(state: State, tree: list[dict] | None = None) -> str:
    """The stored state object (the branch shown), as one JSON document; with `tree` (every turn of the
    conversation: agent/conversation/tree.py `whole`), the whole tree beside it, as `tree`."""
    return json.dumps(state if tree is None else {**state, "tree": tree}, ensure_ascii=False, indent=2) + "\n"


def to_markdown(state: State, title: str | None = None) -> str:
    """The conversation for a person to read: the branch shown, and at each fork how many other branches
    there are."""
    lines = _heading(title, state)
    turns = split_turns(state)
    spent = total([turn.summary.get("spend") for turn in turns if turn.summary])
    if spent["turns"]:
        cost = f"{money(spent['usd'])} ({spent['tokens']:,} tokens)" if spent["usd"] is not None else \
            f"{spent['tokens']:,} tokens"
        lines += [f"Cost of the conversation: {cost}.", ""]
    lines += _turns(state, turns, "##")
    return "\n".join(lines).rstrip("\n") + "\n"


def branches_to_markdown(states: list[State], title: str | None = None) -> str:
    """Every branch of a conversation (`states`: the path to each of its latest turns, the branch shown among
    them), one after another."""
    lines = _heading(title, states[0] if states else {})
    for number, state in enumerate(states, start=1):
        lines += [f"## Branch {number} of {len(states)}, through turn `{_code_span(state.get('turn_id'))}`", ""]
        lines += _turns(state, split_turns(state), "###")
    return "\n".join(lines).rstrip("\n") + "\n"


def _heading(title: str | None, state) -> list[str]:
    return [f"# {inert(_one_line(title)) or 'Conversation'}", "",
            f"Conversation `{_code_span(state.get('conversation_id'))}`, exported "
            f"{_when(dt.datetime.now(dt.UTC).timestamp())}.", ""]


def _turns(state: State, turns: list[TurnView], level: str) -> list[str]:
    lines = []
    for number, turn in enumerate(turns, start=1):
        lines += [f"{level} Turn {number}", ""]
        fork = _fork(state, turn)
        if fork:
            lines += [fork, ""]
        approvals = {step.get("call_id"): step for step in turn.steps if step.get("kind") == Kind.APPROVAL}
        for message in turn.messages:
            if message.get("role") == Role.TOOL and message.get("tool_call_id") in approvals:
                lines += [_approval(approvals[message["tool_call_id"]]), ""]
            lines += _message(message)
        lines += [_ending(turn), ""]
    return lines


def _fork(state: State, turn: TurnView) -> str:
    """At a fork (turns that share this one's parent: regenerates and edits), which branch this is."""
    summary = turn.summary or {}
    siblings = summary.get("siblings") or (state.get("siblings") if turn.current else None) or []
    turn_id = summary.get("turn_id") or (state.get("turn_id") if turn.current else None)
    if not isinstance(siblings, list) or len(siblings) < 2 or turn_id not in siblings:
        return ""
    others = len(siblings) - 1
    return (f"*A fork: this is branch {siblings.index(turn_id) + 1} of {len(siblings)}; "
            f"{others} other branch{'es' if others > 1 else ''} here.*")


def _message(message: dict) -> list[str]:
    role = message.get("role")
    content = message.get("content")
    if role == Role.USER:
        return ["**You:**", "", _quoted(content), ""]
    if role == Role.TOOL:
        return ["**Tool result:**", "", *_fenced(content), ""]
    lines = []
    if content:
        lines += ["**Assistant:**", "", _quoted(content), ""]
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = shown_json_text(str(function.get("arguments") or "{}"))  # as the tool receives them
        lines += [f"**Tool call:** `{_code_span(function.get('name'))}`", "", *_fenced(arguments, "json"), ""]
    return lines


def _approval(step: dict) -> str:
    """A request for approval and its answer: approved, declined, or expired (nobody answered: not a decline)."""
    answer = {Outcome.APPROVED: "approved", Outcome.DENIED: "declined", Outcome.EXPIRED: "expired"}.get(
        step.get("outcome"), inert(_one_line(step.get("outcome"))))
    request = f", request `{_code_span(step.get('request_id'))}`" if step.get("request_id") else ""
    return (f"*Approval of `{_code_span(step.get('name'))}`: {answer} ({inert(_one_line(step.get('detail')))}), "
            f"at {_when(step.get('ended_at'))}{request}.*")


def _ending(turn: TurnView) -> str:
    summary = turn.summary or {}
    status = summary.get("status") or ""
    words = exported_words(status) or inert(_one_line(status))
    ended = f" at {_when(turn.ended_at)}" if turn.ended_at else ""
    error = summary.get("error") if isinstance(summary.get("error"), dict) else {}
    reason = f" ({inert(_one_line(error.get('kind')))})" if error.get("kind") else ""
    spend = summary.get("spend") if isinstance(summary.get("spend"), dict) else None
    cost = f" Cost: {spend_words(spend)}." if spend_words(spend) else ""
    return f"*Ending: {words}{reason}{ended}.{cost}*"


# A block quote's marker that puts its content at column 4: a tab in the content then ends at the
# column it ends at in the message, so its lines are read alike inside the quote (a fence line with a
# tab after `> ` would close a fence that the message's own parse leaves open).
QUOTE = "  > "


def _quoted(text) -> str:
    """Quoted line for line, so it reads as the message and nothing else; made inert as on the page,
    and with no raw HTML."""
    return "\n".join(QUOTE + line for line in no_html_markdown(str(text if text is not None else "")).split("\n"))


def _fenced(text, language: str = "") -> list[str]:
    body = str(text if text is not None else "")
    fence = "`" * max(3, _longest_run(body, "`") + 1)
    return [fence + language, body, fence]


def _code_span(text) -> str:
    return _one_line(text).replace("`", "'")


def _longest_run(text: str, char: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == char else 0
        longest = max(longest, run)
    return longest


def _one_line(text) -> str:
    return " ".join(str(text or "").split())


def _when(epoch_s) -> str:
    try:
        return dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):  # not a time a calendar has: said as stored
        return inert(_one_line(epoch_s))
