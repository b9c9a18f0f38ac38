"""The sidebar for walkthroughs: provider and model, the demo scenario, the clocks, safeguards.

`next_turn_config` builds (and validates) the TurnConfig from the widgets' session keys, so the
send callback and the sidebar agree on what the next turn runs with.
"""

from __future__ import annotations

import streamlit as st

from agent.demo.scenarios import (
    DEFAULT_STREAM_CPS,
    MAX_STREAM_CPS,
    SCENARIO_LATENCIES_S,
    Scenario,
    UnknownModelError,
    parse_model_name,
)
from agent.providers import registry
from agent.providers.demo import DEMO
from agent.settings import MAX_BUDGET_USD, MIN_BUDGET_TOKENS, SettingsError, TurnConfig
from agent.ui import tool_sources

SCENARIOS = {  # the picker's order and the plain-words description of each
    "healthy": "answers quickly and uses the tools your message asks for",
    "slow": "every model response takes a few seconds, so the budget runs down",
    "hang": "the model's server never answers: each call's timeout ends it",
    "flaky": "a 429 then a 500 first: the turn retries, with backoff, inside its budget",
    "trickle": "the reply arrives one byte a second: the total call timeout cuts it off",
    "slow-tool": "the model asks the `wait` tool for 30 s: the tool stops at the deadline",
    "verbose": "the model's answers go on and on: a budget's max_tokens cuts them, inside the budget",
}
PRESETS = {
    # Short enough that "hang" ends in seconds: deadline at 15 s, queue kill at 20 s.
    "stakeholder": {"job_timeout_s": 20, "deadline_margin_s": 5.0, "call_timeout_cap_s": 8.0, "min_call_s": 2.0},
}

DEMO_CLOCKS_OFFER_S = 30  # seconds: on a longer job timeout, choosing a slow scenario offers the demo clocks

K = {  # widget keys
    "provider": "sb_provider",
    "scenario": "sb_scenario",
    "latency": "sb_latency_s",
    "stream_cps": "sb_stream_cps",
    "model": "sb_model",
    "job_timeout_s": "sb_job_timeout_s",
    "deadline_margin_s": "sb_deadline_margin_s",
    "call_timeout_cap_s": "sb_call_timeout_cap_s",
    "min_call_s": "sb_min_call_s",
    "naive": "sb_safeguards_off",
    "budget_usd": "sb_budget_usd",
    "budget_tokens": "sb_budget_tokens",
}


# The next turn's settings live in the URL too (only where they differ from the defaults), so a
# reload or a shared link keeps them. Each parameter: (widget, parse a string or raise ValueError).
URL_PARAMS = {
    "provider": ("provider", lambda v: _one_of(v, registry.names())),
    "scenario": ("scenario", lambda v: _one_of(v, SCENARIOS)),
    "latency": ("latency", lambda v: _number(v, 0.0, 600.0)),
    "writing": ("stream_cps", lambda v: _number(v, 0.0, MAX_STREAM_CPS)),
    "model": ("model", lambda v: _text(v, 200)),
    "job_timeout": ("job_timeout_s", lambda v: int(_number(v, 1, 3600, whole=True))),
    "margin": ("deadline_margin_s", lambda v: _number(v, 0.0, 3600.0)),
    "call_cap": ("call_timeout_cap_s", lambda v: _number(v, 0.0, 3600.0)),
    "min_call": ("min_call_s", lambda v: _number(v, 0.0, 3600.0)),
    "safeguards": ("naive", lambda v: {"off": True, "on": False}[v]),
    "budget_usd": ("budget_usd", lambda v: _number(v, 0.0, MAX_BUDGET_USD)),
    "budget_tokens": ("budget_tokens", lambda v: int(_number(v, 0, 10**9, whole=True))),
}


def _one_of(value: str, allowed) -> str:
    if value not in allowed:
        raise ValueError(value)
    return value


def _number(value: str, low: float, high: float, *, whole: bool = False) -> float:
    number = float(value)
    if not low <= number <= high or (whole and number != int(number)):
        raise ValueError(value)
    return number


def _text(value: str, limit: int) -> str:
    if not value.strip() or len(value) > limit or not value.isprintable():
        raise ValueError(value)
    return value.strip()


def _url_value(name: str, value) -> str:
    if name == "safeguards":
        return "off" if value else "on"
    return f"{value:g}" if isinstance(value, float) else str(value)


def defaults(base: TurnConfig) -> dict:
    """Each widget's starting value, from the environment's settings."""
    try:
        scenario = parse_model_name(base.model) if base.provider == DEMO.name else Scenario()
    except UnknownModelError:
        scenario = Scenario()
    return {
        K["provider"]: base.provider,
        K["scenario"]: scenario.name if scenario.name in SCENARIOS else "healthy",
        K["latency"]: float(scenario.latency_s),
        K["stream_cps"]: float(scenario.stream_cps),
        K["model"]: base.model if base.provider != DEMO.name else _first_typed_model(),
        K["job_timeout_s"]: int(base.job_timeout_s),
        K["deadline_margin_s"]: float(base.deadline_margin_s),
        K["call_timeout_cap_s"]: float(base.call_timeout_cap_s),
        K["min_call_s"]: float(base.min_call_s),
        K["naive"]: not base.safeguards,
        K["budget_usd"]: float(base.budget_usd or 0.0),
        K["budget_tokens"]: int(base.budget_tokens or 0),
    }


def init_defaults(base: TurnConfig, params=None) -> None:
    """The widgets start from the URL where it names a valid value, else from the environment's
    settings (once per browser session). A value the URL gets wrong is ignored, not an error."""
    ss = st.session_state
    params = st.query_params if params is None else params
    start = defaults(base)
    env_start = dict(start)
    from_url = set()
    for name, (widget, parse) in URL_PARAMS.items():
        raw = params.get(name)
        if raw is not None and K[widget] not in ss:
            try:
                start[K[widget]] = parse(raw)
                from_url.add(widget)
            except (ValueError, KeyError):
                pass
    if "latency" not in from_url:  # a link that names a scenario runs it at its latency, as the picker sets it
        start[K["latency"]] = _scenario_latency(start[K["scenario"]], env_start)
    for key, value in start.items():
        ss.setdefault(key, value)


def sync_url(base: TurnConfig, params=None) -> None:
    """Write the widgets that differ from the defaults into the URL; drop the others."""
    ss = st.session_state
    params = st.query_params if params is None else params
    start = defaults(base)
    start[K["latency"]] = _scenario_latency(ss.get(K["scenario"], start[K["scenario"]]), start)
    for name, (widget, _) in URL_PARAMS.items():
        value = ss.get(K[widget])
        if value is None or value == start[K[widget]]:
            if name in params:
                del params[name]
        elif params.get(name) != _url_value(name, value):
            params[name] = _url_value(name, value)


def _scenario_latency(scenario: str, start: dict) -> float:
    """The latency a scenario runs at when none is set: the environment's for the scenario it names, else
    the scenario's own (what the picker sets, and what a link that names only the scenario means)."""
    if scenario == start[K["scenario"]]:
        return start[K["latency"]]
    return float(SCENARIO_LATENCIES_S.get(scenario, start[K["latency"]]))


def _set_clocks(config: TurnConfig) -> None:
    start = defaults(config)
    for name in ("job_timeout_s", "deadline_margin_s", "call_timeout_cap_s", "min_call_s"):
        st.session_state[K[name]] = start[K[name]]


def _apply_preset(values: dict) -> None:
    for name, value in values.items():
        st.session_state[K[name]] = value


def _scenario_changed() -> None:
    st.session_state[K["latency"]] = float(SCENARIO_LATENCIES_S[st.session_state[K["scenario"]]])


def _first_typed_model() -> str:
    """The model box's value while the demo is chosen (its scenario picks its model): the default
    model of the first provider whose model is typed in."""
    return next(spec.default_model for spec in registry.PROVIDERS.values() if spec is not DEMO)


def _base_url(provider: str, base: TurnConfig) -> str | None:
    spec = registry.PROVIDERS[provider]
    if spec.served_by_pool:
        return None
    if provider == base.provider and base.base_url:
        return base.base_url
    return spec.configured_url()


def key_status(provider: str) -> str | None:
    """'set' / 'not set' for the provider's API key (never the key itself); None when none is needed."""
    spec = registry.PROVIDERS[provider]
    if spec.key_variable is None:
        return None
    return "set" if spec.key() else "not set"


def next_turn_config(base: TurnConfig) -> TurnConfig:
    """The config the next turn will be enqueued with. Raises SettingsError with a readable reason."""
    ss = st.session_state
    provider = ss.get(K["provider"], base.provider)
    spec = registry.PROVIDERS[provider]
    if provider == DEMO.name:
        scenario = ss.get(K["scenario"], "healthy")
        latency = ss.get(K["latency"], SCENARIO_LATENCIES_S.get(scenario, 0.05))
        if not 0 <= float(latency) <= 600:
            raise SettingsError("model latency", "must be between 0 and 600 seconds")
        stream_cps = ss.get(K["stream_cps"], DEFAULT_STREAM_CPS)
        if not 0 <= float(stream_cps) <= MAX_STREAM_CPS:
            raise SettingsError("writing speed", f"must be between 0 and {MAX_STREAM_CPS:g} characters a second")
        model = Scenario(scenario, float(latency), float(stream_cps)).model_name
    else:
        model = (ss.get(K["model"]) or spec.default_model).strip()
    base_url = _base_url(provider, base)
    if spec.key_missing(base_url):
        raise SettingsError(spec.key_variable, "is not set (environment or .streamlit/secrets.toml)")
    return base.with_changes(
        provider=provider,
        model=model,
        base_url=base_url,
        job_timeout_s=int(ss.get(K["job_timeout_s"], base.job_timeout_s)),
        deadline_margin_s=float(ss.get(K["deadline_margin_s"], base.deadline_margin_s)),
        call_timeout_cap_s=float(ss.get(K["call_timeout_cap_s"], base.call_timeout_cap_s)),
        min_call_s=float(ss.get(K["min_call_s"], base.min_call_s)),
        safeguards=not ss.get(K["naive"], False),
        tools=tool_sources.chosen(ss),
        budget_usd=float(ss.get(K["budget_usd"], base.budget_usd or 0.0)) or None,  # 0: no budget
        budget_tokens=int(ss.get(K["budget_tokens"], base.budget_tokens or 0)) or None,
    )


SETTINGS_LABEL = "⚙️ Settings for the next message"


def next_turn(base: TurnConfig) -> tuple[TurnConfig | None, str | None]:
    """The next turn's config, or None and the reason it is invalid, from the session's settings (their
    defaults set first): what the settings' widgets show, whether or not they are drawn yet."""
    init_defaults(base)
    try:
        return next_turn_config(base), None
    except SettingsError as exc:
        return None, str(exc)


def settings_box():
    """The next turn's settings, in a popover of the sidebar: the browser draws its widgets only once it
    is opened. Drawn open, they were about a third of the first screen's excess over a minimal chat app
    (an expander's closed body is drawn all the same)."""
    return st.sidebar.popover(SETTINGS_LABEL, width="stretch")


def render_sidebar(base: TurnConfig, sb=None) -> tuple[TurnConfig | None, str | None]:
    """Draw the settings into `sb` (settings_box() unless given) and what they amount to below it in the
    sidebar; return the next turn's config, or None and the reason it is invalid."""
    init_defaults(base)
    sb = settings_box() if sb is None else sb
    sb.caption("These settings apply to the next message you send; a turn keeps the settings it was sent with.")
    _model_settings(sb, base)
    _clock_settings(sb, base)
    _budget_settings(sb)
    sb.subheader("Safeguards")
    sb.toggle("Safeguards off (the naive loop)", key=K["naive"])
    sync_url(base)
    sb = st.sidebar  # what the settings amount to shows without opening them
    config, error = next_turn(base)
    if st.session_state[K["naive"]]:
        sb.warning(
            "**Safeguards off**: no deadline of its own, every call and tool gets a huge timeout, and "
            "the state is written once, at the end. Try it with *hang* or *slow tool*: the page sees "
            "nothing until the queue's job timeout kills the job. The page still tells you how it ended."
        )
    if error:
        sb.error(f"These settings cannot be used: {error}")
    elif config is not None and config.safeguards:
        deadline_s = config.job_timeout_s - config.deadline_margin_s
        sb.caption(
            f"The turn stops itself **{deadline_s:g} s** after its job starts (the deadline); the queue would "
            f"kill it at **{config.job_timeout_s} s**. Each model call gets at most "
            f"**{config.call_timeout_cap_s:g} s**, and none starts with less than **{config.min_call_s:g} s** left; "
            f"each tool run gets at most **{config.tool_timeout_cap_s:g} s** (`AGENT_TOOL_TIMEOUT_CAP`)."
        )
    if config is not None:
        sb.caption(budget_caption(config))
    return config, error


def budget_caption(config: TurnConfig) -> str:
    """The fourth clock in words: the next turn's budget, and the model's price (or that it has none)."""
    price = config.price
    priced = (f"This model costs ${price['input']:g} / ${price['cached_input']:g} / ${price['output']:g} per million "
              "input / cached / output tokens." if price else
              "This model has no price, so a turn can have a token budget only (add one in `AGENT_PRICES`).")
    budgets = [part for part in (f"${config.budget_usd:g}" if config.budget_usd else "",
                                 f"{config.budget_tokens:,} tokens" if config.budget_tokens else "") if part]
    if not budgets:
        return f"💵 No budget: the turn's cost is shown, not limited. {priced}".replace("$", "\\$")
    how = ("checked only after each call (safeguards off)" if not config.safeguards else
           "never exceeded: each call asks for no more than what remains, less a reserve kept for the answer")
    return f"💵 Budget **{' and '.join(budgets)}** a turn, {how}. {priced}".replace("$", "\\$")


def _budget_settings(sb) -> None:
    sb.subheader("Budget")
    left, right = sb.columns(2)
    left.number_input("US dollars a turn", min_value=0.0, max_value=MAX_BUDGET_USD, step=0.01, format="%.4f",
                      key=K["budget_usd"], help="The most one turn may cost (0: no budget). Needs a model with "
                                                "a price.")
    right.number_input("Tokens a turn", min_value=0, max_value=10**9, step=1000, key=K["budget_tokens"],
                       help=f"The most input + output tokens one turn may use (0: no budget; at least "
                            f"{MIN_BUDGET_TOKENS:,} otherwise).")


def _model_settings(sb, base: TurnConfig) -> None:
    sb.subheader("Model")
    provider = sb.selectbox("Provider", registry.names(), key=K["provider"],
                            format_func=lambda p: registry.PROVIDERS[p].label or p)
    if provider == DEMO.name:
        sb.selectbox("Scenario", list(SCENARIOS), key=K["scenario"], on_change=_scenario_changed,
                     format_func=lambda s: s.replace("-", " "))
        sb.caption(SCENARIOS[st.session_state[K["scenario"]]].capitalize() + ".")
        if st.session_state[K["scenario"]] != "healthy" and st.session_state[K["job_timeout_s"]] > DEMO_CLOCKS_OFFER_S:
            sb.info(f"On these clocks this scenario can take up to {st.session_state[K['job_timeout_s']]} s to "
                    "end. The demo clocks show the same story in seconds.", icon="⏱️")
            sb.button("Use the demo clocks", key="offer-demo-clocks", on_click=_apply_preset,
                      args=(PRESETS["stakeholder"],), width="stretch")
        sb.number_input("Model latency (s)", min_value=0.0, max_value=600.0, step=0.5, key=K["latency"],
                        help="How long the demo model thinks before each reply. 1 s makes each step easy to follow.")
        sb.number_input("Writing speed (characters/s)", min_value=0.0, max_value=MAX_STREAM_CPS, step=10.0,
                        key=K["stream_cps"],
                        help="How fast the demo model writes its answer, which the page shows as it is written. "
                             "0 writes it all at once; a long answer is written faster, in 4 s at most.")
    else:
        sb.text_input("Model", key=K["model"])
        sb.caption(f"API key: **{key_status(provider)}** · base URL: `{_base_url(provider, base)}`")


def _clock_settings(sb, base: TurnConfig) -> None:
    sb.subheader("Clocks")
    left, right = sb.columns(2)
    left.button("Demo clocks", on_click=_apply_preset, args=(PRESETS["stakeholder"],), width="stretch",
                help="Job timeout 20 s, margin 5 s, call cap 8 s, minimum 2 s: the hang scenario ends in seconds.")
    right.button("Defaults", on_click=_set_clocks, args=(base,), width="stretch",
                 help="The clocks from the environment (AGENT_JOB_TIMEOUT and friends).")
    sb.number_input("Job timeout (s)", min_value=1, max_value=3600, step=5, key=K["job_timeout_s"],
                    help="The queue's limit: RQ kills the job when it passes. Whole seconds.")
    sb.number_input("Deadline margin (s)", min_value=0.0, max_value=3600.0, step=1.0, key=K["deadline_margin_s"],
                    help="deadline = job start + job timeout − margin. Kept free for the final write.")
    sb.number_input("Call timeout cap (s)", min_value=0.0, max_value=3600.0, step=1.0, key=K["call_timeout_cap_s"],
                    help="The most one model call gets: min(cap, time left before the deadline).")
    sb.number_input("Minimum for a call (s)", min_value=0.0, max_value=3600.0, step=0.5, key=K["min_call_s"],
                    help="With less than this left before the deadline, no model call starts.")
