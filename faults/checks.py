"""What a client may observe of one turn, checked against what the system promises. Pure: no I/O.

The observations are the state objects a polling client read, in order. The promises:
done becomes true and never reverts, nothing is written after it, every observed history is
a prefix of the next, one user message per turn, every assistant message the provider sent
appears at most once and in order, tool call ids are unique and each call is answered once.

A turn outlives its worker (agent/turn/resume.py), so the promises of a resume too: `attempt` never
goes back nor past max_resumes, `deadline_at` and `job_timeout_at` never change once set, one resume
step per attempt at most, and no tool run twice (a turn parked on a request for approval starts its clocks
afresh when the answer's continuation runs). The runner offers the model built-in tools only,
all safe to repeat, so "no side-effecting tool run twice" is checked as: one result and at most one
recorded run per call, and a "not run again" result only for a tool that is not safe to repeat (an
unknown name), only in a resumed turn.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from agent.contract import ENDED_STATUSES
from agent.tools import safe_to_repeat

# Endings written from outside the job (or by a job interrupted mid-tool): a tool call the
# model asked for may have had no chance to run, so it may stay unanswered.
INTERRUPTED_KINDS = ("worker_lost", "job_timeout", "shutdown", "cancelled", "worker")
CLOCK_FIELDS = ("deadline_at", "job_timeout_at")  # fixed when the turn first starts; a resume keeps them
LOST_TOOL_WORDS = ("worker was lost", "not run again")  # the result of a call cut by a lost worker, not repeated


def check_observations(observed: list[dict], *, turn_id: str, user_text: str, served: list[dict],
                       max_resumes: int | None = None,
                       repeatable: Callable[[str], bool] = safe_to_repeat) -> list[str]:
    """Violations found in one turn's observed states (an empty list when none).

    `max_resumes`: the turn's TurnConfig.max_resumes (None: not checked); `repeatable`: whether a tool is
    safe to run again after its worker was lost (the registry's `safe_to_repeat`)."""
    problems: list[str] = []
    if not observed:
        return ["no state was ever observed"]
    problems.extend(check_resumes(observed, max_resumes=max_resumes))
    done_seen_at = None
    for i, (before, after) in enumerate(zip(observed, observed[1:], strict=False)):
        if after["version"] < before["version"]:
            problems.append(f"version went back from {before['version']} to {after['version']}")
        if after["history"][: len(before["history"])] != before["history"]:
            problems.append(f"history at version {after['version']} does not extend version {before['version']}")
        if before["done"] and done_seen_at is None:
            done_seen_at = i
        if before["done"] and not after["done"]:
            problems.append(f"done reverted at version {after['version']}")
        if before["done"] and after["version"] != before["version"]:
            problems.append(f"a write landed after done (version {before['version']} -> {after['version']})")
    for state in observed:
        if state["turn_id"] != turn_id:
            problems.append(f"another turn {state['turn_id']!r} appeared")
            break
    final = observed[-1]
    if not final["done"]:
        return problems  # stuck: reported by the runner
    problems.extend(check_final(final, user_text=user_text, served=served, repeatable=repeatable))
    return problems


def check_resumes(observed: list[dict], *, max_resumes: int | None) -> list[str]:
    """The attempt and the turn's clocks across the observed states: what a resume must leave alone."""
    problems: list[str] = []
    attempt = 0
    fixed: dict[str, float] = {}
    parked = False
    for state in observed:
        if parked or state.get("status") == "awaiting_approval":
            fixed = {}  # the answer's continuation runs on a fresh set of clocks (agent/turn/approvals.py)
        parked = state.get("status") == "awaiting_approval"
        now = state.get("attempt") or 0
        if now < attempt:
            problems.append(f"attempt went back from {attempt} to {now} at version {state['version']}")
        if max_resumes is not None and now > max_resumes and attempt <= max_resumes:
            problems.append(f"attempt {now} at version {state['version']}: more than max_resumes={max_resumes}")
        attempt = max(attempt, now)
        for name in CLOCK_FIELDS:
            value = state.get(name)
            if name in fixed and value != fixed[name]:
                problems.append(f"{name} changed at version {state['version']}: {fixed[name]!r} -> {value!r}")
                fixed[name] = value
            elif name not in fixed and value is not None:
                fixed[name] = value
    final = observed[-1]
    numbers = [s.get("attempt") for s in _own_steps(final) if s.get("kind") == "resume"]
    if len(set(numbers)) != len(numbers):
        problems.append(f"a resume step recorded twice: attempts {numbers}")
    last = final.get("attempt") or 0
    if any(not isinstance(n, int) or not 1 <= n <= last for n in numbers):
        problems.append(f"resume steps for attempts {numbers}, but the turn's attempt is {last}")
    return problems


def check_final(final: dict, *, user_text: str, served: list[dict],
                repeatable: Callable[[str], bool] = safe_to_repeat) -> list[str]:
    problems: list[str] = []
    history = final["history"]
    status, error = final["status"], final["error"]
    if status not in ENDED_STATUSES:
        problems.append(f"done with status {status!r}")
    if (status == "done") != (error is None):
        problems.append(f"status {status!r} with error {error!r}")
    users = [m for m in history if m.get("role") == "user"]
    if len(users) != 1 or users[0].get("content") != user_text:
        problems.append(f"{len(users)} user messages instead of exactly the one sent")
    if not history or history[-1].get("role") != "assistant" or history[-1].get("tool_calls"):
        problems.append("the chat does not end with an assistant message saying how the turn ended")
    elif error is not None and history[-1].get("content") != error.get("message"):
        problems.append("the last assistant message is not the ending's reason")
    endings = [m for m in history if error is not None and m.get("content") == error.get("message")]
    if len(endings) > 1:
        problems.append(f"the ending was written {len(endings)} times")

    # Tool calls: unique ids, each answered at most once, after its call; exactly once unless an ending
    # written from outside cut the last response's calls (a resumed job answers those before going on).
    asked: list[str] = []
    names: dict[str, str] = {}
    answered: Counter[str] = Counter()
    last_asked: list[str] = []  # the calls of the last response that asked for tools
    for message in history:
        calls = message.get("tool_calls") or []
        if calls:
            last_asked = [call.get("id") for call in calls]
        for call in calls:
            asked.append(call.get("id"))
            names[call.get("id")] = str((call.get("function") or {}).get("name"))
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in asked:
                problems.append(f"tool result for unknown or later call {call_id!r}")
            answered[call_id] += 1
            content = str(message.get("content") or "")
            if all(w in content for w in LOST_TOOL_WORDS):
                name = names.get(call_id, "")
                if repeatable(name):
                    problems.append(f"call {call_id!r} of {name!r} not run again after a lost worker, "
                                    "though safe to repeat")
                if not final.get("attempt"):
                    problems.append(f"call {call_id!r} answered as cut by a lost worker in a turn never resumed")
    duplicates = [cid for cid, n in Counter(asked).items() if n > 1]
    if duplicates:
        problems.append(f"tool call ids asked more than once: {duplicates}")
    twice = [cid for cid, n in answered.items() if n > 1]
    if twice:
        problems.append(f"tool calls answered more than once: {twice}")
    unanswered = [cid for cid in asked if not answered[cid]]
    interrupted = error is not None and error.get("kind") in INTERRUPTED_KINDS
    if unanswered and not interrupted:
        problems.append(f"tool calls never answered: {unanswered}")
    elif unanswered and any(cid not in last_asked for cid in unanswered):
        problems.append(f"tool calls never answered before a later model call: "
                        f"{[cid for cid in unanswered if cid not in last_asked]}")
    # At most one recorded run (or refusal, or not-run-again record) per call: none ran twice.
    runs = Counter(s.get("call_id") for s in _own_steps(final) if s.get("kind") == "tool" and s.get("call_id"))
    twice_run = [cid for cid, n in runs.items() if n > 1]
    if twice_run:
        problems.append(f"tool calls recorded as run more than once: {twice_run}")

    # The model's own messages: each one the provider completed appears at most once, in order.
    model_messages = [m for m in history if m.get("role") == "assistant" and (
        m.get("tool_calls") or (m.get("content") or "").startswith("answer "))]
    position = 0
    for message in model_messages:
        key = _key(message)
        while position < len(served) and _key(served[position]) != key:
            position += 1
        if position == len(served):
            problems.append(f"an assistant message the provider never sent (or sent once, seen twice): {key}")
            break
        position += 1
    return problems


def _own_steps(state: dict) -> list[dict]:
    """The steps of the state's own turn."""
    return [s for s in state.get("steps") or [] if s.get("turn_id", state.get("turn_id")) == state.get("turn_id")]


def _key(message: dict) -> str:
    calls = message.get("tool_calls") or []
    if calls:
        return "calls:" + ",".join(str(c.get("id")) for c in calls)
    return "text:" + str(message.get("content"))

