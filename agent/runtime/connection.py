"""Redis clients. State writes get their own client with short timeouts, so a stalled write
cannot eat the deadline margin (RQ gives its own connection a socket timeout of ~415 s)."""

from __future__ import annotations

from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

STATE_SOCKET_TIMEOUT_S = 2.0  # seconds for one state read or write
STATE_CONNECT_TIMEOUT_S = 2.0  # seconds
STATE_RETRIES = 1  # redis-py 8 retries 10 times by default: one stalled write could then take 20 s


def state_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=STATE_SOCKET_TIMEOUT_S,
        socket_connect_timeout=STATE_CONNECT_TIMEOUT_S,
        health_check_interval=15,
        retry=Retry(NoBackoff(), STATE_RETRIES),
    )


def queue_client(url: str) -> redis.Redis:
    """For RQ, which sets its own socket timeout on the worker side."""
    return redis.Redis.from_url(url, socket_connect_timeout=STATE_CONNECT_TIMEOUT_S)


def describe(url: str) -> str:
    """The URL without its password, for messages and logs."""
    scheme, _, rest = url.partition("://")
    if "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    rest = rest.split("?", 1)[0]
    return f"{scheme}://{rest}"


def url_secrets(url: str) -> tuple[str, ...]:
    """The passwords a Redis URL holds (its user info's, its `password=` parameter's), each as written in
    the URL and decoded: what `describe` leaves out, for a guard that masks them wherever they would show."""
    parts = urlsplit(url)
    found = [parts.password or "", *parse_qs(parts.query).get("password", [])]
    spellings = {form for secret in found if secret for form in (secret, unquote(secret), quote(secret, safe=""))}
    return tuple(sorted(spellings, key=len, reverse=True))  # longest first: no shorter form masks half of one


def is_disk_error(exc: BaseException) -> bool:
    """Redis refused a write because it cannot save to disk (MISCONF), also when a Lua script's write was refused."""
    return isinstance(exc, redis.ResponseError) and "MISCONF " in str(exc)


def is_memory_error(exc: BaseException) -> bool:
    """Redis refused a write because its memory is full (used memory over `maxmemory`, nothing it may
    evict): redis-py raises OutOfMemoryError, or, from inside a Lua script, a ResponseError quoting `-OOM`."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or (
        isinstance(exc, redis.ResponseError) and "command not allowed when used memory" in str(exc))


def redis_problem(exc: BaseException) -> str:
    """A Redis error in words for a person. A MISCONF or OOM refusal reaches us wrapped in a Lua script's
    error ("Error running script ... -MISCONF ..."): it is said plainly, with the first sentence of Redis's reason."""
    text = str(exc) or type(exc).__name__
    if is_memory_error(exc):
        return ("Redis is full: out of memory (OOM: it holds its maxmemory, AGENT_REDIS_MAXMEMORY_MB for the "
                "embedded one, with nothing it may evict) and refuses writes until memory is freed: delete "
                "conversations you no longer need, or raise the limit")
    if not is_disk_error(exc):
        return text
    reason = text.split("MISCONF ", 1)[1].split(". ", 1)[0].rstrip(".")
    return (f"Redis could not save to disk (MISCONF): {reason}; it refuses every write until it can "
            "(check its disk space and its log)")
