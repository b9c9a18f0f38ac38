"""Endings: the per-turn summary, and the ending written for a turn from outside its job.

Every ending writes `done: true` with the reason in the chat. The job writes its own; when it
cannot (killed, lost, stopped before it started), the failure callback or a front end writes
it through `write_ending`. The store refuses a second ending, so whoever is first wins.
"""

from __future__ import annotations

import time

from agent.store import Store, StoreError


def turn_summary(turn_id: str, doc: dict, ended_at: float) -> dict:
    return {
        "turn_id": turn_id,
        "status": doc.get("status"),
        "error": doc.get("error"),
        "enqueued_at": doc.get("enqueued_at"),
        "started_at": doc.get("started_at"),
        "deadline_at": doc.get("deadline_at"),
        "job_timeout_at": doc.get("job_timeout_at"),
        "ended_at": ended_at,
        "config": doc.get("config"),
    }



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
    doc = {k: state[k] for k in ("deadline_at", "job_timeout_at", "started_at", "enqueued_at", "config", "job_id")}
    doc["started_at"] = doc["started_at"] or started_at
    doc["job_timeout_at"] = doc["job_timeout_at"] or job_timeout_at
    now = time.time()
    doc.update(status=status, error={"kind": kind, "message": message}, current_step=None, ended_at=now)
    try:
        store.publish(
            conversation_id,
            turn_id,
            doc,
            done=True,
            new_messages=[{"role": "assistant", "content": message}],
            summary=turn_summary(turn_id, doc, now),
        )
    except StoreError:
        return False
    return True
