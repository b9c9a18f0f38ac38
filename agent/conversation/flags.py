"""Small markers beside the conversations: who runs a turn, whether Stop was asked, since when a
queued job has been missing from its queue (agent/hosting/lost_worker.py), the turns running and
their heartbeats (agent/turn/heartbeat.py, agent/hosting/turn_watch.py), and the turns parked on a
request for approval (agent/turn/approvals.py)."""

from __future__ import annotations

import redis

from agent.conversation.keys import (
    APPROVALS_KEY,
    CONTINUING_KEY,
    RESERVED_KEY,
    RUNNING_KEY,
    Keys,
    job_off_queue_since,
    job_requeued,
    turn_alive,
    turn_cancel,
    turn_claim,
)
from agent.conversation.lua import source

OFF_QUEUE_MARK_TTL_S = 600  # seconds a job's off-queue mark lives: far past the grace that reads it


class Flags:
    """The per-turn and per-job markers, on one client."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._beat = client.register_script(source("beat"))
        self._lapsed = client.register_script(source("lapsed"))
        self._claim = client.register_script(source("claim"))

    def claim_turn(self, turn_id: str, job_id: str, ttl_s: int) -> bool:
        """The first job to run a turn claims it; a duplicate or a re-run finds it taken."""
        return bool(self.client.set(turn_claim(turn_id), job_id, nx=True, ex=ttl_s))

    def claim(self, conversation_id: str, turn_id: str, job_id: str, ttl_s: int, alive_ms: int) -> str:
        """The job `job_id` claims its turn (scripts/claim.lua): "ok" only while it writes the turn in flight and
        has not claimed it before ("ended", "not its job", "duplicate" otherwise). From that instant the turn is
        watched: its heartbeat mark is set and it is in the index of running turns, in the same step."""
        keys = Keys.of(conversation_id)
        outcome = self._claim(keys=[keys.meta, turn_claim(turn_id), turn_alive(turn_id), RUNNING_KEY],
                              args=[turn_id, job_id, ttl_s, alive_ms, conversation_id, keys.base])
        return _text(outcome)

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

    def release_reservation(self, conversation_id: str, turn_id: str) -> None:
        """The turn will write no ending (its conversation was deleted or expired): its memory reservation goes
        (room.py)."""
        self.client.zrem(RESERVED_KEY, f"{conversation_id} {turn_id}")

    def accepted(self, limit: int, after: float | None = None) -> list[tuple[str, str, float]]:
        """(conversation, turn, score) of at most `limit` turns accepted and not ended, in the order their
        reservations lapse: the first ones, or those scored after `after` (one range read, whatever the count); a
        member not of that form has an empty turn."""
        low = "-inf" if after is None else f"({after!r}"
        rows = self.client.zrangebyscore(RESERVED_KEY, low, "+inf", start=0, num=limit, withscores=True)
        members = [(*_text(member).partition(" "), score) for member, score in rows]
        return [(conversation_id, turn_id, score) for conversation_id, _, turn_id, score in members]

    # -- the turns running, and their heartbeats ---------------------------------------------------

    def start_running(self, conversation_id: str, turn_id: str, job_id: str, alive_ms: int) -> None:
        """A job started the turn: it is watched from now on, and its first heartbeat is in."""
        self._beat(keys=[turn_alive(turn_id), RUNNING_KEY], args=[job_id, alive_ms, conversation_id, "1"])

    def beat(self, conversation_id: str, turn_id: str, job_id: str, alive_ms: int) -> None:
        """Renew the job's mark and its lease (scripts/beat.lua: taken even when Redis is full, while the mark
        is there); a turn no longer in the running index is not put back."""
        self._beat(keys=[turn_alive(turn_id), RUNNING_KEY], args=[job_id, alive_ms, conversation_id, "0"])

    def running(self, limit: int) -> list[str]:
        """The conversations whose turn is running, the soonest lease lapse first (at most `limit`)."""
        return [_text(member) for member in self.client.zrange(RUNNING_KEY, 0, limit - 1)]

    def lapsed(self, limit: int) -> list[str]:
        """The conversations whose running turn's lease lapsed, by Redis's clock (at most `limit`): one range
        read, however many turns run."""
        return [_text(member) for member in self._lapsed(keys=[RUNNING_KEY], args=[limit])]

    def not_running(self, conversation_id: str) -> None:
        self.client.zrem(RUNNING_KEY, conversation_id)

    def writers(self, conversation_ids: list[str]) -> list[tuple]:
        """Per conversation: (turn_id, done, writer, attempt) from its meta (the writer: the job that writes its
        turn), in one round trip. (A conversation the release before the tree left in flight names it `owner`,
        until its first write moves it into the tree: scripts/included/tree.lua.)"""
        with self.client.pipeline(transaction=False) as pipe:
            for conversation_id in conversation_ids:
                pipe.hmget(Keys.of(conversation_id).meta, "turn_id", "done", "writer", "attempt", "owner")
            rows = pipe.execute()
        return [(_text(turn_id), _text(done), _text(writer if writer is not None else owner), _text(attempt))
                for turn_id, done, writer, attempt, owner in rows]

    def alive(self, turn_ids: list[str]) -> list[bool]:
        """Whether each turn's heartbeat mark is there, in one round trip."""
        with self.client.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids:
                pipe.exists(turn_alive(turn_id))
            return [bool(found) for found in pipe.execute()]

    def alive_mark(self, turn_id: str) -> tuple[str | None, int]:
        """The turn's heartbeat mark: the job it names (None: lapsed, or never set) and the milliseconds it has
        left, in one round trip."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.get(turn_alive(turn_id))
            pipe.pttl(turn_alive(turn_id))
            job, left_ms = pipe.execute()
        return _text(job), max(0, int(left_ms)) if job is not None else 0

    # -- the turns parked on a request for approval ----------------------------------------------------

    def approvals_due(self, now: float, limit: int) -> list[str]:
        """The conversations whose request for approval expired by `now`, the oldest first (at most `limit`)."""
        return [_text(member) for member in self.client.zrangebyscore(APPROVALS_KEY, "-inf", now, 0, limit)]

    def parked(self) -> int:
        """How many turns are parked on a request for approval."""
        return int(self.client.zcard(APPROVALS_KEY))

    def not_parked(self, conversation_id: str) -> None:
        """Forget a conversation in the approvals index (it ended, or is gone, without its entry removed)."""
        self.client.zrem(APPROVALS_KEY, conversation_id)

    # -- the answered turns whose continuation must still reach the queue ---------------------------------

    def continuations_due(self, now: float, limit: int) -> list[str]:
        """The answered conversations whose continuation is due for a look by `now` (at most `limit`)."""
        return [_text(member) for member in self.client.zrangebyscore(CONTINUING_KEY, "-inf", now, 0, limit)]

    def look_again(self, conversation_id: str, at: float) -> None:
        self.client.zadd(CONTINUING_KEY, {conversation_id: at}, xx=True)

    def requeue_once(self, job_id: str, ttl_s: float) -> bool:
        """The first of the watches and front ends that finds a job missing enqueues it again, for `ttl_s`."""
        return bool(self.client.set(job_requeued(job_id), "1", nx=True, px=max(1, round(ttl_s * 1000))))

    def continued(self, conversation_id: str) -> None:
        """The continuation is on the queue (or its turn moved on): nothing more to look at."""
        self.client.zrem(CONTINUING_KEY, conversation_id)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
