"""The ending written for a turn from outside its job.

Every ending writes `done: true` with the reason in the chat. The job writes its own (agent/turn/);
when it cannot (killed, lost, stopped before it started), the failure callback or a front end
writes it through `write_ending`. The store refuses a second ending, so whoever is first wins.
"""

from __future__ import annotations

import time

from agent import tracing
from agent.contract import Error, Role, carried, turn_summary
from agent.conversation.errors import StoreError
from agent.conversation.store import Store


def write_ending(
    store: Store,
    conversation_id: str,
    turn_id: str,
    status: str,
    kind: str,
    message: str,
    *,
    started_at: float | None = None,
    job_timeout_at: float | None = None,
) -> bool:
    """End a turn from outside its job (failure callback, lost worker, stop). False if already ended."""
    state = store.read_meta(conversation_id)
    if state is None or state["turn_id"] != turn_id or state["done"]:
        return False
    doc = carried(state)
    doc["started_at"] = doc["started_at"] or started_at
    doc["job_timeout_at"] = doc["job_timeout_at"] or job_timeout_at
    now = time.time()
    doc.update(status=status, error=Error(kind=kind, message=message), current_step=None, ended_at=now)
    try:
        store.publish(
            conversation_id,
            turn_id,
            doc,
            done=True,
            new_messages=[{"role": Role.ASSISTANT, "content": message}],
            summary=turn_summary(turn_id, doc, now),
        )
    except StoreError:
        return False
    tracing.turn_ended(store, conversation_id, turn_id)
    return True
