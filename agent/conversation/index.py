"""The conversations' index (a sorted set scored by each one's last write) and the summary each meta
hash keeps for the list: the reads agent/conversation/listing.py builds its pages from.

The scripts that write a conversation keep its entry, so the index never disagrees with a write; an
entry whose keys expired stays until a listing meets it and drops it. Members are handed back as
Redis holds them (bytes), so that an entry is dropped by exactly the member it was read as.
"""

from __future__ import annotations

import redis

from agent.conversation.keys import INDEX_KEY, Keys
from agent.conversation.well_formed import decoded

# Of the meta hash, for one row of the list: `approval` is there while a turn waits for a person's answer.
SUMMARY_FIELDS = ("title", "turns", "done", "approval")


class ConversationIndex:
    """An index and the list's summaries, on one client: every conversation's (INDEX_KEY), or one signed-in
    person's (keys.person_conversations)."""

    def __init__(self, client: redis.Redis, key: str = INDEX_KEY):
        self.client = client
        self.key = key

    def count(self) -> int:
        """Entries in the index, those not yet swept included."""
        return int(self.client.zcard(self.key))

    def recent(self, start: int, count: int) -> list[tuple[bytes, float]]:
        """(member, last write) from the `start`-th most recent on, at most `count` of them."""
        return self.client.zrevrange(self.key, start, start + count - 1, withscores=True)

    def written_before(self, cutoff: float, limit: int) -> list[bytes]:
        """Up to `limit` members last written before `cutoff` (epoch seconds), oldest first."""
        return self.client.zrangebyscore(self.key, "-inf", cutoff, start=0, num=limit)

    def score(self, conversation_id: str) -> float | None:
        """The conversation's last write (epoch seconds), or None when it has no entry."""
        return self.client.zscore(self.key, conversation_id)

    def summaries(self, members: list[bytes]) -> list:
        """Each member's (title, turns, done) in one round-trip; where its keys are of the wrong kind, the
        error instead (one conversation's keys spoil no other row). `done` is None when its keys are gone."""
        with self.client.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.hmget(Keys.of(decoded(member)).meta, *SUMMARY_FIELDS)
            return pipe.execute(raise_on_error=False)

    def summary(self, conversation_id: str) -> list:
        """One conversation's (title, turns, done); redis.ResponseError when its keys are of the wrong kind."""
        return self.client.hmget(Keys.of(conversation_id).meta, *SUMMARY_FIELDS)

    def alive(self, members: list[bytes]) -> list[bool]:
        """For each member, whether its conversation's keys still exist, in one round-trip."""
        with self.client.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.exists(Keys.of(decoded(member)).meta)
            return [bool(exists) for exists in pipe.execute()]

    def drop(self, members: list[bytes]) -> None:
        """Remove entries whose conversations are gone."""
        if members:
            self.client.zrem(self.key, *members)
