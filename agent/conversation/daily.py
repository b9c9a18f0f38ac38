"""A signed-in person's budget for the day (AGENT_USER_DAILY_BUDGET_USD): reserved at send, settled at the end.

A message is sent only if what is left of the person's day (the budget, less what their ended turns spent
and what their turns in flight reserved) can pay for a turn: in the same atomic step (scripts/daily_reserve.lua),
the turn's budget is reserved, at most what is left, and becomes the turn's own dollar budget, which the
turn never exceeds (agent/spend.py). So two tabs sending at once cannot both spend the same dollars. When the
turn ends, whoever writes its ending replaces the reservation with what it spent (scripts/daily_settle.lua,
once). A day is a UTC day: the budget renews at midnight UTC.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import uuid

import redis

from agent.conversation.errors import DailyBudgetSpent
from agent.conversation.keys import person_day_spend, turn_settled
from agent.conversation.lua import source
from agent.spend import money, pusd_to_usd

log = logging.getLogger(__name__)

DAY_TTL_S = 2 * 24 * 3600  # seconds a person's day is kept: past the longest turn that began on it


_registered: dict[str, object] = {}


def _script(client: redis.Redis, name: str):
    """The script, registered once (its SHA; EVALSHA after its first use), run on `client`."""
    if name not in _registered:
        _registered[name] = client.register_script(source(name))
    return functools.partial(_registered[name], client=client)


def today(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")


def renews_in(now: float) -> str:
    """When a day's budget renews, in words: "at 00:00 UTC, in 5 h 12 min"."""
    moment = dt.datetime.fromtimestamp(now, dt.UTC)
    midnight = (moment + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    minutes = max(1, int((midnight - moment).total_seconds() // 60))
    hours, minutes = divmod(minutes, 60)
    return f"at 00:00 UTC, in {hours} h {minutes} min" if hours else f"at 00:00 UTC, in {minutes} min"


def reserve(client: redis.Redis, person: str, *, daily_pusd: int, want_pusd: int, least_pusd: int,
            now: float) -> dict:
    """Reserve a turn's budget against the person's day: {"person", "day", "pusd"} (what was granted), or
    DailyBudgetSpent with when it renews."""
    day = today(now)
    granted, amount = _script(client, "daily_reserve")(
        keys=[person_day_spend(person, day)], args=[daily_pusd, want_pusd, least_pusd, DAY_TTL_S])
    if not int(granted):
        raise DailyBudgetSpent(money(pusd_to_usd(int(amount))), money(pusd_to_usd(daily_pusd)), renews_in(now))
    return {"person": person, "day": day, "pusd": int(amount)}


def release(client: redis.Redis, daily: dict, turn_id: str) -> None:
    """A reservation whose turn was never sent (refused, or a double submit): given back, under a marker of its
    own (the turn's is its real ending's, which a double submit's refusal must not take)."""
    settle(client, daily, f"{turn_id}:unsent:{uuid.uuid4().hex[:12]}", 0)


def settle(client: redis.Redis, daily: dict | None, turn_id: str, spent_pusd: int) -> None:
    """The turn's reservation replaced by what it spent, once; a Redis problem is logged, never raised (an
    ending has been written: the reservation then lapses with the day)."""
    if not daily or not daily.get("person") or not daily.get("day"):
        return
    try:
        _script(client, "daily_settle")(
            keys=[person_day_spend(daily["person"], daily["day"]), turn_settled(turn_id)],
            args=[-int(daily.get("pusd") or 0), max(0, int(spent_pusd)), DAY_TTL_S])
    except redis.RedisError as exc:
        log.warning("turn %s: its spend could not be settled against its person's day: %s", turn_id, exc)


def spent_of(spend: dict | None) -> int:
    """What a turn's spend (the state's `spend`) counts against a day: spent, and a call in flight at its worst."""
    if not spend:
        return 0
    return int(spend.get("pusd") or 0) + int(spend.get("in_flight_pusd") or 0)


def day_left(client: redis.Redis, person: str, daily_pusd: int, now: float) -> int:
    """What is left of the person's day (picodollars), for the page."""
    spent, reserved = client.hmget(person_day_spend(person, today(now)), "spent", "reserved")
    return daily_pusd - int(spent or 0) - int(reserved or 0)
