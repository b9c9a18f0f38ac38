"""What a client may observe of one turn, checked against what the system promises. Pure: no I/O.

The observations are the state objects a polling client read, in order. The promises:
done becomes true and never reverts, nothing is written after it, every observed history is
a prefix of the next, one user message per turn, every assistant message the provider sent
appears at most once and in order, tool call ids are unique and each call is answered once.
"""

from __future__ import annotations

from collections import Counter

from agent.contract import ENDED_STATUSES

# Endings written from outside the job (or by a job interrupted mid-tool): a tool call the
# model asked for may have had no chance to run, so it may stay unanswered.
INTERRUPTED_KINDS = ("worker_lost", "job_timeout", "shutdown", "cancelled", "worker")


def check_observations(observed: list[dict], *, turn_id: str, user_text: str, served: list[dict]) -> list[str]:
    """Violations found in one turn's observed states (an empty list when none)."""
    problems: list[str] = []
    if not observed:
        return ["no state was ever observed"]
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
    problems.extend(check_final(final, user_text=user_text, served=served))
    return problems


def check_final(final: dict, *, user_text: str, served: list[dict]) -> list[str]:
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

    # Tool calls: unique ids, each answered at most once, after its call; exactly once unless interrupted.
    asked: list[str] = []
    answered: Counter[str] = Counter()
    for message in history:
        for call in message.get("tool_calls") or []:
            asked.append(call.get("id"))
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in asked:
                problems.append(f"tool result for unknown or later call {call_id!r}")
            answered[call_id] += 1
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


def _key(message: dict) -> str:
    calls = message.get("tool_calls") or []
    if calls:
        return "calls:" + ",".join(str(c.get("id")) for c in calls)
    return "text:" + str(message.get("content"))

