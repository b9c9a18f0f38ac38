"""Environment -> one validated settings object, with documented defaults and units.

Which providers exist, and the variables each reads, is agent.providers.registry: none is named here.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from agent.contract import TOOL_NAME
from agent.conversation.store import DEFAULT_MAX_CONVERSATION_BYTES
from agent.deadline import LOST_GRACE_S
from agent.hosts import host_name
from agent.prices import PRICES_VARIABLE, Price, PriceFileError, load_prices, price_for
from agent.providers import registry
from agent.providers.spec import ProviderSpec
from agent.runtime.embedded_redis import DEFAULT_MAXMEMORY_MB as DEFAULT_REDIS_MAXMEMORY_MB
from agent.runtime.embedded_redis import DEFAULT_REDIS_WAIT_S

DEFAULT_JOB_TIMEOUT_S = 120  # seconds; RQ enforces whole seconds
DEFAULT_DEADLINE_MARGIN_S = 20.0  # seconds
DEFAULT_CALL_TIMEOUT_CAP_S = 60.0  # seconds
DEFAULT_CONNECT_TIMEOUT_S = 10.0  # seconds
DEFAULT_MIN_CALL_S = 5.0  # seconds
DEFAULT_MAX_STEPS = 8  # model round-trips per turn
DEFAULT_MAX_RESUMES = 2  # times a turn whose worker was lost is resumed on another (agent/turn/resume.py)
DEFAULT_TOOL_TIMEOUT_CAP_S = 60.0  # seconds: the most one tool run gets, like a model call's cap
ADMINS_VARIABLE = "AGENT_ADMINS"  # emails of signed-in people who may read (not change) everyone's conversations
MAX_TURNS_PER_USER_VARIABLE = "AGENT_MAX_TURNS_PER_USER"  # a signed-in person's turns in flight at most
DEFAULT_MAX_TURNS_PER_USER = 2
APPROVE_TOOLS_VARIABLE = "AGENT_APPROVE_TOOLS"  # tools that ask a person first, as the model sees their names
APPROVAL_TIMEOUT_VARIABLE = "AGENT_APPROVAL_TIMEOUT"
DEFAULT_APPROVAL_TIMEOUT_S = 600.0  # seconds a request to approve a tool call waits before it expires
# A parked turn holds its conversation's state (and a person's attention) until then: past a week it is forgotten.
MAX_APPROVAL_TIMEOUT_S = 7 * 24 * 3600.0  # seconds
# A person's conversations, not a polling key: kept this long after their last write (AGENT_STATE_TTL).
DEFAULT_STATE_TTL_S = 30 * 24 * 3600  # seconds (30 days)
SHOW_CONVERSATIONS_VARIABLE = "AGENT_SHOW_CONVERSATIONS"  # 0: the page lists no conversations (a shared page)
MAX_CONVERSATION_BYTES_VARIABLE = "AGENT_MAX_CONVERSATION_BYTES"
# What one turn sends the model of its history: past it, the oldest turns are left out of what is sent
# (never out of what is stored), and the model call's step says how many. ~125k tokens of English.
DEFAULT_MAX_HISTORY_SENT_BYTES = 500_000  # bytes
REDIS_MAXMEMORY_VARIABLE = "AGENT_REDIS_MAXMEMORY_MB"
DEFAULT_POLL_INTERVAL_MS = 1000  # milliseconds
# A page run must finish well inside the interval, or every refresh cuts the one before short.
MIN_POLL_INTERVAL_MS = 250  # milliseconds
DEFAULT_WORKERS = 2
MCP_START_TIMEOUT_VARIABLE = "AGENT_MCP_START_TIMEOUT"
DEFAULT_MCP_START_TIMEOUT_S = 20.0  # seconds an MCP server gets to start and list its tools (mcp-server-time: ~2 s)
REDIS_WAIT_VARIABLE = "AGENT_REDIS_WAIT"
# The names the page answers at, besides the address it is bound to and AGENT_ALLOWED_HOSTS: any
# other Host header is a browser sent here by a name someone else controls (DNS rebinding).
DEFAULT_ALLOWED_HOSTS = ("127.0.0.1", "localhost", "::1")
ALLOWED_HOSTS_VARIABLE = "AGENT_ALLOWED_HOSTS"
# The fourth clock (agent/spend.py): unset, no budget.
BUDGET_TOKENS_VARIABLE = "AGENT_TURN_BUDGET_TOKENS"
BUDGET_USD_VARIABLE = "AGENT_TURN_BUDGET_USD"
DAILY_BUDGET_VARIABLE = "AGENT_USER_DAILY_BUDGET_USD"
MIN_BUDGET_TOKENS = 1000  # tokens: less cannot hold one request with its tools and an answer
MAX_BUDGET_USD = 1000.0  # US dollars: more is a typo (and past what Redis's Lua counts exactly in picodollars)


class SettingsError(ValueError):
    """A configuration value is missing or inconsistent; the message names the variable."""

    def __init__(self, variable: str, problem: str):
        self.variable = variable
        super().__init__(f"{variable}: {problem}")


@dataclass(frozen=True)
class TurnConfig:
    """What a turn runs with, fixed when it is enqueued and stored beside it (never secrets)."""

    provider: str = registry.DEFAULT.name
    model: str = registry.DEFAULT.default_model
    base_url: str | None = None
    job_timeout_s: int = DEFAULT_JOB_TIMEOUT_S
    deadline_margin_s: float = DEFAULT_DEADLINE_MARGIN_S
    call_timeout_cap_s: float = DEFAULT_CALL_TIMEOUT_CAP_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    min_call_s: float = DEFAULT_MIN_CALL_S
    max_steps: int = DEFAULT_MAX_STEPS
    safeguards: bool = True
    # Tools: each run gets min(cap, time left); `tools` names the ones offered (None: all the worker has).
    tool_timeout_cap_s: float = DEFAULT_TOOL_TIMEOUT_CAP_S
    tools: tuple[str, ...] | None = None
    # The most of the conversation's history one model call is sent (bytes of JSON); oldest turns go first.
    max_history_sent_bytes: int = DEFAULT_MAX_HISTORY_SENT_BYTES
    max_resumes: int = DEFAULT_MAX_RESUMES  # a turn whose worker was lost goes on on another this many times
    # Tools that ask a person first, besides those that say so themselves (agent/tools/registry.needs_approval),
    # and how long a request waits for an answer before it expires.
    approve_tools: tuple[str, ...] = ()
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S
    # A signed-in person's fair share of the workers (their turns queued or running at once; 0: none), which
    # the continuation after an answer counts against too (agent/queue.py submit_turn, agent/turn/approvals.py).
    share: int = 0
    # The fourth clock: the turn's budget (None: none of that kind), and the price it is charged at, fixed
    # with it (None: the model has none, so only a token budget); agent/spend.py.
    budget_tokens: int | None = None
    budget_usd: float | None = None
    price: dict | None = None
    # With sign-in and AGENT_USER_DAILY_BUDGET_USD: the part of its person's day reserved for the turn
    # ({"person", "day", "pusd"}), settled against what it spent when it ends (agent/conversation/daily.py).
    daily: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> TurnConfig:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if known.get("tools") is not None:
            known["tools"] = tuple(known["tools"])  # JSON has lists
        if known.get("approve_tools") is not None:
            known["approve_tools"] = tuple(known["approve_tools"])
        return cls(**known)

    def with_changes(self, **changes) -> TurnConfig:
        if ("model" in changes or "provider" in changes) and "price" not in changes:
            price = price_for(changes.get("model", self.model), extra_prices())
            changes["price"] = price.to_dict() if price is not None else None
        config = replace(self, **changes)
        validate_clocks(config)
        validate_budget(config)
        return config


@dataclass(frozen=True)
class Settings:
    redis_url: str | None
    turn: TurnConfig
    state_ttl_s: int
    poll_interval_ms: int
    workers: int
    allowed_hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS
    redis_wait_s: float = DEFAULT_REDIS_WAIT_S
    show_conversations: bool = True
    max_conversation_bytes: int = DEFAULT_MAX_CONVERSATION_BYTES
    admins: frozenset[str] = frozenset()  # emails (lower-cased) or person ids of who may read every conversation
    max_turns_per_user: int = DEFAULT_MAX_TURNS_PER_USER  # a signed-in person's turns in flight at most
    daily_budget_usd: float | None = None  # with sign-in: what one person's turns may spend in a day (UTC)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, bound_address: str | None = None) -> Settings:
        """The settings `env` (default: this process's environment) gives; `bound_address` is the
        address the page's server listens on, which it answers at too."""
        env = os.environ if env is None else env
        spec = _provider(env)
        model = env.get("AGENT_MODEL", "").strip() or spec.default_model
        base_url = None if spec.served_by_pool else _server_url(spec, env)
        turn = TurnConfig(
            provider=spec.name,
            model=model,
            base_url=base_url,
            job_timeout_s=_whole_seconds(env, "AGENT_JOB_TIMEOUT", DEFAULT_JOB_TIMEOUT_S),
            deadline_margin_s=_seconds(env, "AGENT_DEADLINE_MARGIN", DEFAULT_DEADLINE_MARGIN_S),
            call_timeout_cap_s=_seconds(env, "AGENT_CALL_TIMEOUT_CAP", DEFAULT_CALL_TIMEOUT_CAP_S),
            connect_timeout_s=_seconds(env, "AGENT_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT_S),
            min_call_s=_seconds(env, "AGENT_MIN_CALL_SECONDS", DEFAULT_MIN_CALL_S),
            max_steps=_integer(env, "AGENT_MAX_STEPS", DEFAULT_MAX_STEPS, minimum=1),
            tool_timeout_cap_s=_seconds(env, "AGENT_TOOL_TIMEOUT_CAP", DEFAULT_TOOL_TIMEOUT_CAP_S),
            max_history_sent_bytes=_integer(env, "AGENT_MAX_HISTORY_SENT_BYTES", DEFAULT_MAX_HISTORY_SENT_BYTES,
                                            minimum=1000),
            max_resumes=_integer(env, "AGENT_MAX_RESUMES", DEFAULT_MAX_RESUMES, minimum=0),
            approve_tools=tool_names(env, APPROVE_TOOLS_VARIABLE),
            approval_timeout_s=_seconds(env, APPROVAL_TIMEOUT_VARIABLE, DEFAULT_APPROVAL_TIMEOUT_S),
            budget_tokens=_optional_integer(env, BUDGET_TOKENS_VARIABLE, minimum=MIN_BUDGET_TOKENS),
            budget_usd=_dollars(env, BUDGET_USD_VARIABLE),
            price=_price(model, env),
        )
        validate_clocks(turn)
        validate_budget(turn)
        daily_budget_usd = _dollars(env, DAILY_BUDGET_VARIABLE)
        if daily_budget_usd is not None and turn.price is None:
            raise SettingsError(DAILY_BUDGET_VARIABLE, _no_price(model))
        mcp_start_timeout_s(env)  # used by the workers, refused here at start like the other durations
        redis_maxmemory_mb(env)  # used by the embedded Redis's config, refused here at start
        redis_url = env.get("REDIS_URL", "").strip() or None
        if redis_url and not redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError("REDIS_URL", "must start with redis://, rediss:// or unix://")
        return cls(
            redis_url=redis_url,
            turn=turn,
            state_ttl_s=state_ttl_s(env, turn),
            poll_interval_ms=_integer(
                env, "AGENT_POLL_INTERVAL_MS", DEFAULT_POLL_INTERVAL_MS, minimum=MIN_POLL_INTERVAL_MS
            ),
            workers=_integer(env, "AGENT_WORKERS", DEFAULT_WORKERS, minimum=0),
            allowed_hosts=allowed_hosts(env, bound_address),
            redis_wait_s=redis_wait_s(env),
            show_conversations=_switch(env, SHOW_CONVERSATIONS_VARIABLE, default=True),
            max_conversation_bytes=_integer(env, MAX_CONVERSATION_BYTES_VARIABLE, DEFAULT_MAX_CONVERSATION_BYTES,
                                            minimum=0),
            admins=admins(env),
            max_turns_per_user=_integer(env, MAX_TURNS_PER_USER_VARIABLE, DEFAULT_MAX_TURNS_PER_USER, minimum=1),
            daily_budget_usd=daily_budget_usd,
        )


def _provider(env: Mapping[str, str]) -> ProviderSpec:
    name = env.get("AGENT_PROVIDER", "").strip() or registry.DEFAULT.name
    spec = registry.find(name)
    if spec is None:
        raise SettingsError("AGENT_PROVIDER", f"must be one of {', '.join(registry.names())}, not {name!r}")
    return spec


def _server_url(spec: ProviderSpec, env: Mapping[str, str]) -> str:
    """The provider's configured server, refused when it is no http(s) URL or takes a key that is not set."""
    base_url = spec.configured_url(env) or ""
    if not base_url.startswith(("http://", "https://")):
        raise SettingsError(spec.url_variable, "must start with http:// or https://")
    if spec.key_missing(base_url, env):
        raise SettingsError(spec.key_variable,
                            f"is required for AGENT_PROVIDER={spec.name} (environment or secrets.toml)")
    return base_url


def validate_clocks(turn: TurnConfig) -> None:
    """Refuse clock settings that could never let a call finish before the queue kills the job."""
    if turn.job_timeout_s < 1:
        raise SettingsError("AGENT_JOB_TIMEOUT", "must be at least 1 second")
    if turn.deadline_margin_s <= 0:
        raise SettingsError("AGENT_DEADLINE_MARGIN", "must be more than 0")
    if turn.deadline_margin_s >= turn.job_timeout_s:
        raise SettingsError(
            "AGENT_DEADLINE_MARGIN",
            f"must be less than AGENT_JOB_TIMEOUT ({turn.deadline_margin_s:g} >= {turn.job_timeout_s})",
        )
    if turn.call_timeout_cap_s <= 0:
        raise SettingsError("AGENT_CALL_TIMEOUT_CAP", "must be more than 0")
    if turn.connect_timeout_s <= 0:
        raise SettingsError("AGENT_CONNECT_TIMEOUT", "must be more than 0")
    if turn.min_call_s <= 0:
        raise SettingsError("AGENT_MIN_CALL_SECONDS", "must be more than 0")
    if turn.min_call_s > turn.call_timeout_cap_s:
        raise SettingsError(
            "AGENT_MIN_CALL_SECONDS",
            f"must not exceed AGENT_CALL_TIMEOUT_CAP ({turn.min_call_s:g} > {turn.call_timeout_cap_s:g})",
        )
    if turn.job_timeout_s - turn.deadline_margin_s < turn.min_call_s:
        raise SettingsError(
            "AGENT_MIN_CALL_SECONDS",
            f"leaves no time for a call: the deadline is {turn.job_timeout_s - turn.deadline_margin_s:g} s after "
            f"the job starts (AGENT_JOB_TIMEOUT - AGENT_DEADLINE_MARGIN), less than {turn.min_call_s:g} s",
        )
    if turn.max_steps < 1:
        raise SettingsError("AGENT_MAX_STEPS", "must be at least 1")
    if turn.tool_timeout_cap_s <= 0:
        raise SettingsError("AGENT_TOOL_TIMEOUT_CAP", "must be more than 0")
    if not 0 < turn.approval_timeout_s <= MAX_APPROVAL_TIMEOUT_S:
        raise SettingsError(APPROVAL_TIMEOUT_VARIABLE, f"must be more than 0 and at most {MAX_APPROVAL_TIMEOUT_S:g} "
                            f"seconds (7 days), not {turn.approval_timeout_s:g}")


def validate_budget(turn: TurnConfig) -> None:
    """Refuse a budget that cannot be kept: a dollar budget for a model with no price, or one out of range."""
    if turn.budget_tokens is not None and turn.budget_tokens < MIN_BUDGET_TOKENS:
        raise SettingsError(BUDGET_TOKENS_VARIABLE, f"must be at least {MIN_BUDGET_TOKENS}, not {turn.budget_tokens}")
    if turn.budget_usd is not None:
        if not 0 < turn.budget_usd <= MAX_BUDGET_USD:
            raise SettingsError(BUDGET_USD_VARIABLE, f"must be more than 0 and at most {MAX_BUDGET_USD:g} US dollars, "
                                f"not {turn.budget_usd:g}")
        if turn.price is None and price_for(turn.model) is None:  # a config built without one: the shipped table's
            raise SettingsError(BUDGET_USD_VARIABLE, _no_price(turn.model))


def _no_price(model: str) -> str:
    return (f"the model {model!r} has no price, so a dollar budget cannot be kept: give it one in "
            f"{PRICES_VARIABLE}, or set {BUDGET_TOKENS_VARIABLE} instead")


def _price(model: str, env: Mapping[str, str]) -> dict | None:
    price = price_for(model, extra_prices(env))
    return price.to_dict() if price is not None else None


_price_files: dict[tuple[str, float], dict[str, Price]] = {}


def extra_prices(env: Mapping[str, str] | None = None) -> dict[str, Price]:
    """The prices AGENT_PRICES adds (read again when the file changes); refused at start when unreadable."""
    path = (os.environ if env is None else env).get(PRICES_VARIABLE, "").strip()
    if not path:
        return {}
    try:
        key = (path, os.stat(path).st_mtime)
    except OSError as exc:
        raise SettingsError(PRICES_VARIABLE, f"cannot read {path!r} ({exc.strerror or exc})") from None
    if key not in _price_files:
        try:
            _price_files[key] = load_prices(path)
        except PriceFileError as exc:
            raise SettingsError(PRICES_VARIABLE, str(exc)) from None
    return _price_files[key]


def state_ttl_s(env: Mapping[str, str], turn: TurnConfig) -> int:
    """AGENT_STATE_TTL, refused when a conversation could expire while its turn may still write: every
    write sets the TTL again, and the longest wait for the next is the job timeout, plus the grace after
    which a front end writes the ending of a turn whose worker was lost."""
    ttl_s = _integer(env, "AGENT_STATE_TTL", DEFAULT_STATE_TTL_S, minimum=1)
    least_s = least_state_ttl_s(turn)
    if ttl_s < least_s:
        raise SettingsError("AGENT_STATE_TTL", f"must be at least {least_s} seconds, the job timeout "
                            f"({turn.job_timeout_s} s) plus {LOST_GRACE_S:g} s for a lost worker's ending, "
                            f"or a conversation can expire mid-turn; not {ttl_s}")
    return ttl_s


def state_ttl_from_env() -> int:
    """AGENT_STATE_TTL for a worker or a supervisor, which the process that started it already checked."""
    try:
        return max(1, int(os.environ.get("AGENT_STATE_TTL") or DEFAULT_STATE_TTL_S))
    except ValueError:  # refused at start by the page or the CLI: never crash a job or a watch on it
        return DEFAULT_STATE_TTL_S


def least_state_ttl_s(turn: TurnConfig) -> int:
    """The shortest state TTL with which a turn on these clocks cannot lose its conversation mid-turn."""
    return math.ceil(turn.job_timeout_s + LOST_GRACE_S)


def mcp_start_timeout_s(env: Mapping[str, str]) -> float:
    """Seconds each MCP server gets, when a worker starts, to start and list its tools."""
    value = _seconds(env, MCP_START_TIMEOUT_VARIABLE, DEFAULT_MCP_START_TIMEOUT_S)
    if value <= 0:
        raise SettingsError(MCP_START_TIMEOUT_VARIABLE, "must be more than 0")
    return value


def redis_wait_s(env: Mapping[str, str]) -> float:
    """Seconds to wait for an embedded Redis that runs but does not answer, before giving up."""
    value = _seconds(env, REDIS_WAIT_VARIABLE, DEFAULT_REDIS_WAIT_S)
    if value <= 0:
        raise SettingsError(REDIS_WAIT_VARIABLE, "must be more than 0")
    return value


def tool_names(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Comma-separated tool names, as the model sees them (`calculator,time__get_current_time`), each once:
    checked against the rule every provider applies to a tool name, so a typo is refused at start."""
    names = [part.strip() for part in env.get(name, "").split(",") if part.strip()]
    bad = next((n for n in names if not TOOL_NAME.match(n)), None)
    if bad is not None:
        raise SettingsError(name, f"must be tool names (letters, digits, '_' and '-', at most 64 characters) "
                            f"separated by commas, not {bad[:80]!r}")
    return tuple(dict.fromkeys(names))


def redis_maxmemory_mb(env: Mapping[str, str] | None = None) -> int:
    """Megabytes the embedded Redis may hold; 0 = no limit."""
    return _integer(os.environ if env is None else env, REDIS_MAXMEMORY_VARIABLE, DEFAULT_REDIS_MAXMEMORY_MB,
                    minimum=0)


def _switch(env: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = _raw(env, name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise SettingsError(name, f"must be 1 or 0, not {raw!r}")


def _raw(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = _raw(env, name)
    if raw is None:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(name, f"must be a number of seconds, not {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise SettingsError(name, f"must be a finite, non-negative number of seconds, not {raw!r}")
    return value


def _optional_integer(env: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    if _raw(env, name) is None:
        return None
    return _integer(env, name, minimum, minimum=minimum)


def _dollars(env: Mapping[str, str], name: str) -> float | None:
    """An amount of US dollars, more than 0; unset: None."""
    raw = _raw(env, name)
    if raw is None:
        return None
    try:
        value = float(raw.removeprefix("$"))
    except ValueError:
        raise SettingsError(name, f"must be an amount of US dollars (0.05), not {raw!r}") from None
    if not math.isfinite(value) or not 0 < value <= MAX_BUDGET_USD:
        raise SettingsError(name, f"must be more than 0 and at most {MAX_BUDGET_USD:g} US dollars, not {raw!r}")
    return value


def _whole_seconds(env: Mapping[str, str], name: str, default: int) -> int:
    # RQ enforces the job timeout in whole seconds (14.9 becomes 14), so the deadline is
    # computed from the same whole number the queue will enforce.
    return math.floor(_seconds(env, name, default))


def _integer(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(name, f"must be a whole number, not {raw!r}") from None
    if value < minimum:
        raise SettingsError(name, f"must be at least {minimum}, not {value}")
    return value


def allowed_hosts(env: Mapping[str, str], bound_address: str | None) -> tuple[str, ...]:
    """The host names the page answers at: the defaults, the address the server is bound to (unless
    it is a wildcard), and AGENT_ALLOWED_HOSTS (comma-separated names or IP addresses)."""
    hosts = list(DEFAULT_ALLOWED_HOSTS)
    bound = host_name(bound_address or "")
    if bound and bound not in ("0.0.0.0", "::"):
        hosts.append(bound)
    for raw in env.get(ALLOWED_HOSTS_VARIABLE, "").split(","):
        if not raw.strip():
            continue
        name = host_name(raw.strip())
        if name is None:
            raise SettingsError(ALLOWED_HOSTS_VARIABLE,
                                f"must be host names or IP addresses separated by commas, not {raw.strip()!r}")
        hosts.append(name)
    return tuple(dict.fromkeys(hosts))


def admins(env: Mapping[str, str]) -> frozenset[str]:
    """AGENT_ADMINS: the people who may read every conversation, comma-separated: emails (ASCII, any case;
    only an email their provider vouched for counts) or person ids (`p` and 20 hex digits, shown in the
    sidebar and by `show`), for providers that do not verify emails."""
    names = set()
    for raw in env.get(ADMINS_VARIABLE, "").split(","):
        name = raw.strip()
        if not name:
            continue
        if re.fullmatch(r"p[0-9a-f]{20}", name):
            names.add(name)
        elif "@" in name and name.isascii() and not any(ch.isspace() for ch in name):
            names.add(name.lower())
        else:
            raise SettingsError(ADMINS_VARIABLE, "must be email addresses (ASCII) or person ids (p and 20 hex "
                                                 f"digits) separated by commas, not {name!r}")
    return frozenset(names)


def settings_for_command() -> Settings | None:
    """The environment's settings for a command (the CLI, worker.py, dashboard.py), or None once what
    is wrong has been said on stderr in one line (the command then exits 2)."""
    try:
        return Settings.from_env()
    except SettingsError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return None
