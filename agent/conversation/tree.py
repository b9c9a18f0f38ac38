"""A conversation's whole tree of turns, read for `branches` and `show --json` (scripts/branches.lua).

What it returns, as `branches --json` prints it: `tip` (the turn shown: the state's `turn_id`), `in_flight` (the
turn in flight, or None), and `turns`, depth first (each turn's children after it, oldest first): per turn its
`turn_id`, `parent_turn_id` (None for a first turn), `depth` (0 for a first turn), `siblings` (the ids of the turns
that share its parent, itself included, oldest first), `first_words` (of its person's message), `status` (its
ending's, or `in flight` / `unknown`), and `shown` (on the path to the tip).
"""

from __future__ import annotations

import redis

from agent.conversation import lua, reads, well_formed
from agent.conversation.keys import Keys
from agent.conversation.reads import read, readable
from agent.conversation.turns import split_turns

MESSAGE_BYTES = 400  # of a turn's message, read for its first words
FIRST_WORDS = 60  # characters of a message shown as a turn's first words


def first_words(text) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= FIRST_WORDS else text[: FIRST_WORDS - 1].rstrip() + "…"


def branches(client: redis.Redis, conversation_id: str) -> dict | None:
    keys = Keys.of(conversation_id)
    with readable(conversation_id):
        reply = client.register_script(lua.source("branches"))(keys=[keys.meta, keys.tree], args=[MESSAGE_BYTES])
    if not reply:  # none, or of the flat shape: its turns are a line, as its state says
        state = read(client, conversation_id)
        if state is None:
            return None
        return _flat(state)
    tip, in_flight, rows = well_formed.decoded(reply[0]), well_formed.decoded(reply[1]), reply[2]
    turns, kids = [], {}
    for row in rows:
        turn_id, parent = well_formed.decoded(row[0]), well_formed.decoded(row[1])
        kids.setdefault(parent, []).append(turn_id)
        message = well_formed.message(row[3]) if row[3] else {}
        status = well_formed.decoded(row[4]) or ("in flight" if turn_id == in_flight else "unknown")
        turns.append({"turn_id": turn_id, "parent_turn_id": parent or None, "depth": int(row[2]),
                      "first_words": first_words(message.get("content")), "status": status})
    parent_of = {t["turn_id"]: t["parent_turn_id"] or "" for t in turns}
    shown, turn = set(), tip
    while turn and turn in parent_of and turn not in shown:
        shown.add(turn)
        turn = parent_of[turn]
    for t in turns:
        t["siblings"] = kids.get(t["parent_turn_id"] or "", [t["turn_id"]])
        t["shown"] = t["turn_id"] in shown
    return {"tip": tip, "in_flight": in_flight or None, "turns": turns}


def _flat(state) -> dict:
    turns, parent = [], None
    ids = [t["turn_id"] for t in state["turns"]]
    if state["turn_id"] not in ids:
        ids.append(state["turn_id"])
    user = [m for m in state["history"] if m.get("role") == "user"]
    statuses = {t["turn_id"]: t["status"] for t in state["turns"]}
    for depth, turn_id in enumerate(ids):
        message = user[depth] if depth < len(user) else {}
        status = statuses.get(turn_id) or ("in flight" if not state["done"] else state["status"])
        turns.append({"turn_id": turn_id, "parent_turn_id": parent, "depth": depth, "siblings": [turn_id],
                      "first_words": first_words(message.get("content")), "status": status, "shown": True})
        parent = turn_id
    return {"tip": state["turn_id"], "in_flight": None if state["done"] else state["turn_id"], "turns": turns}


def leaves(tree: dict) -> list[str]:
    """The latest turn of every branch (the turns with no children), in the tree's order."""
    parents = {t["parent_turn_id"] for t in tree["turns"]}
    return [t["turn_id"] for t in tree["turns"] if t["turn_id"] not in parents]


def whole(client: redis.Redis, conversation_id: str, tree: dict) -> list[dict]:
    """Every turn of the conversation, in the tree's order (`tree`: what `branches` read): its place in the tree,
    its messages (its person's first), its steps and its summary (None while in flight)."""
    place = {t["turn_id"]: {"turn_id": t["turn_id"], "parent_turn_id": t["parent_turn_id"],
                            "siblings": t["siblings"]} for t in tree["turns"]}
    if not client.hexists(Keys.of(conversation_id).meta, "shape"):  # the flat shape: its turns in a line
        state = read(client, conversation_id)
        if state is None:
            return []
        views = split_turns(state)
        return [{**place.get(view.summary.get("turn_id"), {"turn_id": view.summary.get("turn_id")}),
                 "messages": view.messages, "steps": view.steps,
                 "summary": None if view.in_flight else view.summary} for view in views]
    records = reads.turn_records(client, conversation_id, list(place))
    in_flight = tree.get("in_flight")
    return [{**place[r.turn_id], "messages": r.messages, "steps": r.steps,
             "summary": None if r.turn_id == in_flight else r.summary} for r in records]
