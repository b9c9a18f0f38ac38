"""The watch's look for accepted turns whose job is gone reads a batch of the index at a time, on from where the
last look stopped and round again: its cost is flat in the turns accepted, and every one is looked at."""

from __future__ import annotations

from agent.conversation.keys import RESERVED_KEY
from agent.hosting.turn_watch import STRANDED_BATCH, TurnWatch


def test_each_look_reads_one_batch_on_from_the_last_and_comes_round_to_every_accepted_turn(private_redis):
    client = private_redis.client
    accepted = STRANDED_BATCH * 2 + 7
    # Reservations of turns whose conversation is gone: a look that reads one forgets it (release_reservation).
    client.zadd(RESERVED_KEY, {f"gone-{i} turn-{i}": 1_000_000 + i for i in range(accepted)})
    client.zadd(RESERVED_KEY, {"not-a-turn": 1_000_000 + accepted})  # a member of another form is passed over
    watch = TurnWatch(private_redis.store, private_redis.queue_connection)
    left = [accepted]
    for _ in range(3):
        watch.end_stranded()
        left.append(client.zcard(RESERVED_KEY) - 1)
    assert left == [accepted, accepted - STRANDED_BATCH, accepted - 2 * STRANDED_BATCH, 0]
    # Round again: a turn accepted since (scored before the cursor's place) is read by the look after the wrap.
    client.zadd(RESERVED_KEY, {"gone-early turn-early": 5})
    watch.end_stranded()  # the index's end: reads what is left after the cursor, then starts over
    watch.end_stranded()
    assert client.zrange(RESERVED_KEY, 0, -1) == [b"not-a-turn"]
