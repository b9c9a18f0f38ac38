"""Small markers beside the conversations: who runs a turn, whether Stop was asked, and since when a
queued job has been missing from its queue (agent/hosting/lost_worker.py)."""

from __future__ import annotations

import redis

from agent.conversation.keys import job_off_queue_since, turn_cancel, turn_claim

OFF_QUEUE_MARK_TTL_S = 600  # seconds a job's off-queue mark lives: far past the grace that reads it


class Flags:
    """The per-turn and per-job markers, on one client."""

    def __init__(self, client: redis.Redis):
        self.client = client

    def claim_turn(self, turn_id: str, job_id: str, ttl_s: int) -> bool:
        """The first job to run a turn claims it; a duplicate or a re-run finds it taken."""
        return bool(self.client.set(turn_claim(turn_id), job_id, nx=True, ex=ttl_s))

    def request_cancel(self, turn_id: str, ttl_s: int) -> None:
        self.client.set(turn_cancel(turn_id), "1", ex=ttl_s)

    def cancel_requested(self, turn_id: str) -> bool:
        return bool(self.client.exists(turn_cancel(turn_id)))

    def off_queue_since(self, job_id: str, now: float) -> float:
        """When the queued job was first seen missing from its queue (`now`, if this is the first time)."""
        key = job_off_queue_since(job_id)
        self.client.set(key, repr(now), nx=True, ex=OFF_QUEUE_MARK_TTL_S)
        return float(self.client.get(key) or now)

    def on_queue(self, job_id: str) -> None:
        """The job is on its queue: forget any earlier sighting of it missing."""
        self.client.delete(job_off_queue_since(job_id))
