"""The current_time tool: the date and time in an IANA time zone."""

from __future__ import annotations

import re
import zoneinfo
from datetime import datetime
from functools import lru_cache

from agent.tools.registry import ToolError

MAX_TIMEZONE_CHARS = 64
_TIMEZONE_PATTERN = re.compile(r"^[A-Za-z]+(?:[/_+\-][A-Za-z0-9]+)*$")


@lru_cache(maxsize=1)
def _timezones_by_lowercase() -> dict[str, str]:
    # available_timezones() scans tzdata on every call; names are compared case-insensitively.
    return {name.lower(): name for name in zoneinfo.available_timezones()}


def current_time(timezone: str = "UTC") -> str:
    """The current date and time in an IANA time zone.

    Args:
        timezone: an IANA time zone name such as "Asia/Tokyo", "Europe/Paris" or "UTC"
    """
    name = timezone.strip()
    shown = repr(timezone[:MAX_TIMEZONE_CHARS]) + ("..." if len(timezone) > MAX_TIMEZONE_CHARS else "")
    # The pattern refuses paths ("../", "/etc/passwd") before the name reaches zoneinfo's file lookup.
    if len(name) > MAX_TIMEZONE_CHARS or not _TIMEZONE_PATTERN.match(name):
        raise ToolError(f"{shown} is not a valid time zone name; use an IANA name such as 'Asia/Tokyo' or 'UTC'")
    known = _timezones_by_lowercase()
    key = known.get(name.lower())
    if key is None:
        cities = [zone for zone in known.values() if zone.lower().rsplit("/", 1)[-1] == name.lower()]
        hint = f"did you mean {cities[0]!r}? " if len(cities) == 1 else ""
        raise ToolError(f"unknown time zone {shown}; {hint}use an IANA name such as 'Asia/Tokyo' or 'UTC'")
    now = datetime.now(zoneinfo.ZoneInfo(key))
    offset = now.strftime("%z")  # "+0900"
    return f"{now:%Y-%m-%d %H:%M:%S} {now.tzname()} ({key}, UTC{offset[:3]}:{offset[3:5]})"
