"""Drawing the conversation: messages, one expander per tool step, endings, the clocks."""

from __future__ import annotations

import json
from collections.abc import Callable

import streamlit as st

from agent import tracing
from agent.contract import (
    CurrentStep,
    ErrorKind,
    Kind,
    Outcome,
    Role,
    State,
    Status,
    Step,
    TurnSummary,
    safeguards_on,
)
from agent.conversation.turns import TurnView
from agent.conversation.well_formed import Malformed, number, parse_json
from agent.conversation.words import KIND_HEADLINES, status_words
from agent.prices import PUSD_PER_USD
from agent.providers.streaming import token_count
from agent.spend import money, spend_words, spent_text, total
from agent.text.markdown import inert, safe_markdown
from agent.text.visible import visible, visible_json
from agent.ui.guard import drawn_or_said
from agent.ui.timeline import cost_label, timeline_chart

RECENT_TURNS = 10  # finished turns a full run draws; earlier ones wait behind a button


def _seconds(value) -> str:
    value = number(value)
    if value is None:  # unknown, or not a number at all (a hand-written state)
        return "?"
    if value < 0.001:
        return "<1 ms"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _parsed_arguments(arguments):
    """A tool call's arguments as JSON when they are JSON this page can draw (nested at most
    MAX_DEPTH deep: `[[[…]]]` a thousand deep is text), else Malformed."""
    if not isinstance(arguments, str):
        raise Malformed("not text")
    return parse_json(arguments)


def _pretty_arguments(arguments) -> str:
    """Indented, each character a reader would not see (a bidirectional override, a zero-width space) as
    its escape (agent/text/visible.py)."""
    try:
        return visible_json(_parsed_arguments(arguments))
    except Malformed:
        return visible(arguments) if isinstance(arguments, str) else ""


def _short_arguments(arguments) -> str:
    try:
        parsed = _parsed_arguments(arguments)
    except Malformed:
        return visible(str(arguments if arguments is not None else "")[:40])
    if isinstance(parsed, dict):
        text = ", ".join(f"{v}" if len(parsed) == 1 else f"{k}={v}" for k, v in parsed.items())
    else:
        text = str(parsed)
    return visible(text if len(text) <= 48 else text[:45] + "…")


TOOL_ICONS = {Outcome.OK: "🔧", Outcome.STOPPED: "⏹️"}  # any other outcome: ⚠️


def tool_status_label(step: Step, *, safeguards: bool = True) -> str:
    icon = TOOL_ICONS.get(step["outcome"], "⚠️")
    took = _seconds(step["duration_s"])
    timeout = step["timeout_s"]
    limit = f" of its {_seconds(timeout)} timeout" if timeout is not None and safeguards else ""
    name, arguments = inert(step["name"]), inert(_short_arguments(step.get("arguments")))
    return f"{icon} **{name}**({arguments}) · {took}{limit}"


def render_tool_step(step: Step, *, expanded: bool, safeguards: bool = True) -> None:
    # An expander, not st.status: Streamlit sleeps 50 ms in every st.status it draws, which made a
    # poll's cost grow with the number of tool steps on screen.
    with st.expander(tool_status_label(step, safeguards=safeguards), expanded=expanded):
        left, right = st.columns(2)
        with left:
            st.caption("Arguments")
            st.code(_pretty_arguments(step.get("arguments") or "{}"), language="json")
        with right:
            st.caption("Result")
            st.code(step.get("result") or "", language=None, wrap_lines=True)
        st.caption(tool_step_caption(step, safeguards=safeguards))


def tool_step_caption(step: Step, *, safeguards: bool = True) -> str:
    took = _seconds(step["duration_s"])
    if step["outcome"] == Outcome.STOPPED:
        return f"Stopped at your request after {took}."
    if step["outcome"] == Outcome.SKIPPED:  # calls answered without running: no time limit was given
        return f"Not run: {inert(step.get('detail') or 'no time was left')}."
    if not safeguards:
        return f"Took {took}; safeguards were off, so it had no time limit of its own."
    timeout_s, remaining_s, kept_s = step.get("timeout_s"), step.get("remaining_s"), number(step.get("kept_s")) or 0.0
    capped = timeout_s is not None and remaining_s is not None and timeout_s < remaining_s - kept_s - 0.01
    if capped:
        why = "the tool cap; more was left before the deadline"
    elif kept_s:
        why = f"the time left before the deadline, less {_seconds(kept_s)} kept for the last model call"
    else:
        why = "the time left before the deadline"
    return f"Took {took}; it was given {_seconds(timeout_s)} ({why})."


def model_step_caption(step: Step, *, safeguards: bool = True) -> str:
    kind, outcome = step["kind"], step["outcome"]
    took, timeout = _seconds(step["duration_s"]), _seconds(step["timeout_s"])
    left = step.get("remaining_s")
    left_text = f", {_seconds(left)} left before the deadline" if left is not None and safeguards else ""
    detail = inert(step.get("detail") or "")  # a provider's error text: untrusted
    if kind == Kind.SKIP:
        return f"⏭️ Model call not started: {detail or 'too little time left'}."
    if kind == Kind.RETRY:
        return f"↻ Waited {took} before {inert(step.get('name'))} ({detail or 'retry'})."
    if kind == Kind.RESUME:
        return f"🔁 Resume {step.get('attempt')}: {detail}; the gap lasted {took}."
    if kind == Kind.APPROVAL:
        return approval_caption(step)
    attempt = step.get("attempt") or 1
    name = f"Model call ({inert(step.get('name'))})" + (f", try {attempt}" if attempt > 1 else "")
    if step.get("unstreamed"):  # asked again plainly: why, in the words the turn recorded
        name += f", asked without streaming ({inert(step['unstreamed'])})"
    if step.get("turns_not_sent"):  # the history cap: what the model saw is not the whole conversation
        name += f" (sent without the {step['turns_not_sent']} earliest turns: AGENT_MAX_HISTORY_SENT_BYTES)"
    if outcome == Outcome.TIMEOUT:
        return f"⏱️ {name} hit its {timeout} timeout{left_text}: {detail}"
    if outcome == Outcome.ERROR:
        cost = cost_label(step)
        return f"⚠️ {name} failed after {took}: {detail}" + (f" Cost: {dollars(cost)}." if cost else "")
    if outcome == Outcome.STOPPED:
        return f"⏹️ {name} stopped at your request after {took}."
    tokens = tokens_text(*step_tokens(step))
    tokens = f" {tokens}." if tokens else ""
    if cost := cost_label(step):
        tokens += f" Cost: {dollars(cost)}."
    if not safeguards:
        return f"🧠 {name}: {took} (safeguards off: no timeout of its own).{tokens}"
    return f"🧠 {name}: {took} of its {timeout} timeout{left_text}.{tokens}"


APPROVAL_ICONS = {Outcome.APPROVED: "✅", Outcome.DENIED: "🚫", Outcome.EXPIRED: "⌛"}


def approval_caption(step: Step) -> str:
    """Who answered a request to run a tool, and how: an expiry reads as nobody answering, never as a
    decline. The wait ran outside both jobs' clocks: no job ran while a person read."""
    name, outcome = inert(step.get("name")), step.get("outcome")
    took = _seconds(step.get("duration_s"))
    by = inert(step.get("answered_by") or "")
    icon = APPROVAL_ICONS.get(outcome, "✋")
    if outcome == Outcome.EXPIRED:
        return (f"{icon} Nobody answered the request to run **{name}** within {took}: it expired, so the tool "
                "was not run (not declined). No job ran while it waited.")
    verb = {Outcome.APPROVED: "Approved", Outcome.DENIED: "Declined"}.get(outcome, inert(outcome or "Answered"))
    after = ("the tool ran in a new job, on a fresh set of clocks" if outcome == Outcome.APPROVED
             else "the model was told a person declined it, and answered without it")
    return f"{icon} {verb} {by}: **{name}**, after {took} of waiting (no job ran meanwhile); {after}."


def step_tokens(step: Step) -> tuple[int | None, int | None]:
    """A model call's input and output tokens, as its provider reported them (None: not reported)."""
    usage = step.get("usage")
    if not isinstance(usage, dict):
        return None, None
    return token_count(usage.get("input_tokens")), token_count(usage.get("output_tokens"))


def tokens_text(input_tokens: int | None, output_tokens: int | None) -> str:
    if input_tokens is None and output_tokens is None:
        return ""
    parts = [f"{value:,} {label}" for value, label in ((input_tokens, "in"), (output_tokens, "out"))
             if value is not None]
    return "Tokens: " + ", ".join(parts)


def render_turn(turn: TurnView, *, latest: bool, request: Callable[[], None] | None = None, actions=None,
                branch: Callable[[], None] | None = None):
    """One turn: the user's message, then the assistant's steps as they landed, then the ending.

    The latest turn (and the one in flight) is drawn in full. An earlier one is drawn compact: its
    tool calls on one line, the reply and the ending, with the steps and charts behind a toggle, so
    a full run sends a few elements per earlier turn instead of dozens. A turn in flight ends with
    the text being written, in a placeholder that is returned so the page can grow it alone. A parked
    turn's request for approval (`request` draws it) goes inside the turn, after the call that asked.
    `actions` (agent/ui/actions.py's MessageActions, for a finished turn a full run draws) draws each message's
    actions under it, the branch picker beside the person's, and the editor in place of a message being edited.
    Without it, `branch` (the turn in flight's picker, its arrows off) is drawn under the person's message."""
    messages = turn.messages
    if messages and messages[0].get("role") == Role.USER:
        with st.chat_message(Role.USER):
            if actions is None:
                st.markdown(safe_markdown(messages[0].get("content")))
                if branch is not None:
                    branch()
            else:
                actions.user_message(turn)
        messages = messages[1:]
    if not messages and not turn.steps and not turn.in_flight:
        return None
    with st.chat_message(Role.ASSISTANT):
        if latest or turn.in_flight:
            _full_body(turn, messages, expanded=latest)
        else:
            _compact_body(turn, messages)
        if request is not None:
            request()
        if not turn.in_flight:
            if actions is not None:
                actions.row(turn, Role.ASSISTANT)
            return None
        slot = st.empty()
        render_live_text(slot, turn.live)
        return slot


def render_live_text(slot, live: dict | None) -> None:
    """The reply as written so far (untrusted text, like any reply), or nothing."""
    text = (live or {}).get("text")
    if not text:
        slot.empty()
        return
    attempt = live.get("attempt") or 1
    with slot.container():
        st.markdown(safe_markdown(text))
        st.caption("✍️ Writing…" + (f" (try {attempt}: the earlier try's text was dropped)" if attempt > 1 else ""))


def _is_ending_text(reply: dict, summary: TurnSummary) -> bool:
    """An ending written as a reply is shown as the ending's banner, not twice."""
    return bool(reply.get("content")) and reply.get("content") == (summary.get("error") or {}).get("message")


def _full_body(turn: TurnView, messages: list[dict], *, expanded: bool) -> None:
    summary = turn.summary
    safeguards = safeguards_on(summary.get("config"))
    assistant = [m for m in messages if m.get("role") == Role.ASSISTANT]
    replies = iter(assistant)
    shown = 0
    for step in turn.steps:
        if step["kind"] == Kind.TOOL:
            render_tool_step(step, expanded=expanded, safeguards=safeguards)
            continue
        st.caption(model_step_caption(step, safeguards=safeguards))
        _partial_text(step)
        if step["kind"] == Kind.MODEL and step["outcome"] == Outcome.OK:
            reply = next(replies, None)
            shown += reply is not None
            if reply and reply.get("content"):
                st.markdown(safe_markdown(reply.get("content")))
    for reply in assistant[shown:]:  # endings written without a step (deadline, stop, lost worker)
        if reply.get("content") and not _is_ending_text(reply, summary):
            st.markdown(safe_markdown(reply.get("content")))
    if not turn.in_flight:  # the live part of a turn in flight is drawn by the page, below
        render_ending(summary)
        render_turn_cost(summary)
        render_turn_clocks(turn, expanded=expanded)


def _partial_text(step: Step) -> None:
    """What a call that was cut (timeout, error, Stop) had written: shown, never part of the history."""
    partial = step.get("partial_text")
    if partial and (step["outcome"] != Outcome.OK or step["kind"] == Kind.RESUME):
        with st.container(border=True):
            st.markdown(safe_markdown(partial))
            st.caption("The text this call had written when it was cut off by the lost worker; the model never "
                       "got it back." if step["kind"] == Kind.RESUME else
                       "The text this call had written when it was cut off; the model never got it back.")


def tools_line(steps: list[Step]) -> str:
    """Every tool run (and every answer to a request to run one) of a turn on one line, for a compact turn."""
    return " · ".join(_tool_item(s) for s in steps if s["kind"] in (Kind.TOOL, Kind.APPROVAL))


def _tool_item(step: Step) -> str:
    if step["kind"] == Kind.APPROVAL:
        words = {Outcome.APPROVED: "approved", Outcome.DENIED: "declined", Outcome.EXPIRED: "expired"}
        return f"{APPROVAL_ICONS.get(step['outcome'], '✋')} {inert(step['name'])} {words.get(step['outcome'], '')}"
    icon = TOOL_ICONS.get(step["outcome"], "⚠️")
    return f"{icon} {inert(step['name'])}({inert(_short_arguments(step.get('arguments')))})"


def _compact_body(turn: TurnView, messages: list[dict]) -> None:
    summary = turn.summary
    line = tools_line(turn.steps)
    if line:
        st.caption(line)
    for reply in messages:
        if reply.get("role") == Role.ASSISTANT and reply.get("content") and not _is_ending_text(reply, summary):
            st.markdown(safe_markdown(reply.get("content")))
    render_ending(summary)
    render_turn_cost(summary)
    _turn_details(turn)


@st.fragment
def _turn_details(turn: TurnView) -> None:
    """An earlier turn's steps and clocks, drawn only when asked (the toggle reruns this fragment alone)."""
    with drawn_or_said("this turn's steps"):
        _turn_details_body(turn)


def _turn_details_body(turn: TurnView) -> None:
    summary = turn.summary
    if not st.toggle("Steps and clocks", key=f"details-{turn.key}"):
        return
    safeguards = safeguards_on(summary.get("config"))
    for step in turn.steps:
        if step["kind"] == Kind.TOOL:
            render_tool_step(step, expanded=False, safeguards=safeguards)
        else:
            st.caption(model_step_caption(step, safeguards=safeguards))
            _partial_text(step)
    render_turn_clocks(turn, expanded=True)


def render_ending(summary: TurnSummary) -> None:
    status = summary.get("status")
    error = summary.get("error") or {}
    message = inert(error.get("message") or "")  # may quote a provider's error text
    if status == Status.DONE:
        return
    headline = KIND_HEADLINES.get(error.get("kind"))
    if headline:
        st.error(f"**{headline}.** {message}", icon="🛑")
    elif status == Status.TIMED_OUT:
        st.warning(f"**{status_words(status)}.** {message}", icon="⏱️")
    elif status == Status.CANCELLED:
        st.info(f"**{status_words(status)}.** {message}", icon="⏹️")
    else:
        st.error(f"**{status_words(status)}.** {message}", icon="❌")
    if not safeguards_on(summary.get("config")):
        st.caption(
            "Safeguards were off for this turn: it had no deadline of its own and wrote nothing until it "
            "ended, so the page could not show any step while it ran. With safeguards on, the same turn "
            "stops itself before the job timeout and reports each step as it lands."
        )


def dollars(text: str) -> str:
    """Amounts in US dollars as Markdown shows them: a `$` escaped, so two on a line never open math."""
    return text.replace("$", "\\$")


def render_turn_cost(summary: TurnSummary) -> None:
    """The turn's cost, against its budget when it had one (the fourth clock)."""
    spend = summary.get("spend") if isinstance(summary.get("spend"), dict) else None
    if words := spend_words(spend):
        checked = " (checked only after each call: safeguards off)" if spend.get("checked") == "after each call" \
            and (spend.get("budget_usd") is not None or spend.get("budget_tokens") is not None) else ""
        st.caption(f"💵 This turn cost {dollars(words)}{checked}.")


def render_conversation_cost(turns: list[TurnView]) -> None:
    """What the conversation's ended turns cost in all, once two or more have a cost."""
    spent = total([turn.summary.get("spend") for turn in turns if not turn.in_flight])
    if spent["turns"] >= 2:
        cost = f"{money(spent['usd'])} ({spent['tokens']:,} tokens)" if spent["usd"] is not None else \
            f"{spent['tokens']:,} tokens"
        st.caption(f"💵 This conversation so far: {dollars(cost)} over {spent['turns']} turns.")


def money_bar(state: State) -> tuple[float, str] | None:
    """The money bar beside the time bar: its fill (spent, the call in flight at its worst case included, of
    the budget) and its words (spent, left, kept for the answer); None when the turn has no spend yet. A turn
    without a budget gets its cost so far, fill 0."""
    spend = state.get("spend") if isinstance(state.get("spend"), dict) else None
    if not spend or spend.get("tokens") is None:
        return None
    priced = spend.get("usd") is not None
    flight = ""
    if spend.get("in_flight_tokens"):
        at_most = money((spend.get("in_flight_pusd") or 0) / PUSD_PER_USD) if priced else \
            f"{spend['in_flight_tokens']:,} tokens"
        flight = f" · the call in flight: {at_most} at most"
    fills, left = [], []
    if spend.get("budget_usd") is not None and priced:
        spent_usd = spend["usd"] + (spend.get("in_flight_pusd") or 0) / PUSD_PER_USD
        fills.append(spent_usd / max(spend["budget_usd"], 1e-12))
        left.append(f"{money(max(0.0, spend['budget_usd'] - spent_usd))} left")
        if spend.get("reserve_usd"):
            left.append(f"{money(spend['reserve_usd'])} of it kept for the answer")
    if spend.get("budget_tokens") is not None:
        spent_tokens = spend["tokens"] + (spend.get("in_flight_tokens") or 0)
        fills.append(spent_tokens / max(spend["budget_tokens"], 1))
        left.append(f"{max(0, spend['budget_tokens'] - spent_tokens):,} tokens left")
        if spend.get("reserve_tokens") and spend.get("budget_usd") is None:
            left.append(f"{spend['reserve_tokens']:,} of them kept for the answer")
    spent = spent_text(spend)
    if not fills:  # no budget: no max_tokens either, so the call in flight has no "at most"
        return 0.0, f"{spent} spent · no budget"
    checked = " · checked only after each call (safeguards off)" if spend.get("checked") == "after each call" else ""
    return max(0.0, min(1.0, max(fills))), f"{spent} spent{flight} · {' · '.join(left)}{checked}"


def clocks_caption(summary: TurnSummary, steps: list[Step]) -> str:
    """One sentence per clock, each a point in time after the job started, never two durations in a row."""
    started, ended = summary.get("started_at"), summary.get("ended_at")
    deadline, kill = summary.get("deadline_at"), summary.get("job_timeout_at")
    if not started or not ended:
        return ""
    sentences = [f"The job ran for **{_seconds(ended - started)}**."]
    if deadline:
        against = _against_deadline(ended, deadline, steps)
        sentences.append(f"Its own deadline was at {_seconds(deadline - started)}: {against}")
    if kill:
        killed = (summary.get("error") or {}).get("kind") == ErrorKind.JOB_TIMEOUT
        verb = "killed it" if killed else "would have killed it"
        sentences.append(f"The queue {verb} at {_seconds(kill - started)}.")
    waits = [s for s in steps if s["kind"] == Kind.APPROVAL]
    if waits:  # the clocks above are the last job's: the turn ran in one job more than it waited
        waited = sum(number(s.get("duration_s")) or 0.0 for s in waits)
        sentences.append(f"Before it, the turn waited **{_seconds(waited)}** for a person's answer, outside any job's "
                         f"clocks, in {len(waits) + 1} jobs in all.")
    calls = sum(1 for s in steps if s["kind"] == Kind.MODEL)
    # Refused or never-run calls are recorded as one step each batch, not as tool runs.
    not_runs = (Outcome.REFUSED, Outcome.SKIPPED)
    tools = sum(1 for s in steps if s["kind"] == Kind.TOOL and s["outcome"] not in not_runs)
    if steps:
        sentences.append(f"{calls} model call{'s' * (calls != 1)}, {tools} tool run{'s' * (tools != 1)}.")
        counted = [step_tokens(s) for s in steps if s["kind"] == Kind.MODEL]
        totals = [sum(c[i] for c in counted if c[i] is not None) if any(c[i] is not None for c in counted) else None
                  for i in (0, 1)]
        if any(total is not None for total in totals):
            sentences.append(f"{tokens_text(*totals)} in all.")
    elif not safeguards_on(summary.get("config")):
        sentences.append("No step was recorded: with safeguards off the job writes only when it ends.")
    return " ".join(sentences)


CUT_KINDS = {Kind.MODEL: "model call", Kind.TOOL: "tool run", Kind.RETRY: "retry wait"}
SAME_INSTANT_S = 0.01  # seconds: two clock readings this close are one instant in a caption


def _against_deadline(ended: float, deadline: float, steps: list[Step]) -> str:
    """When the turn ended against its deadline. A step whose timeout ran to the deadline is cut there, and
    the cut takes a few ms to land: the ending after it is that latency, not a deadline overrun, said so."""
    spare = deadline - ended
    if spare >= 0:
        return f"it ended **{_seconds(spare)}** early."
    cut = next((s for s in reversed(steps) if _ran_to_deadline(s, deadline)), None)
    if cut is None:
        return f"it ended **{_seconds(-spare)}** late."
    what = CUT_KINDS.get(cut["kind"], "step")
    return (f"the {what} running then was cut at its {_seconds(cut['timeout_s'])} timeout, which ran to the "
            f"deadline, and the ending was written **{_seconds(-spare)}** after it: the time a cut takes.")


def _ran_to_deadline(step: Step, deadline: float) -> bool:
    """The step ran to the end of a timeout that reached the deadline (it was given all the time left)."""
    started, ended = number(step.get("started_at")), number(step.get("ended_at"))
    timeout_s = number(step.get("timeout_s"))
    if started is None or ended is None or not timeout_s:
        return False
    limit = started + timeout_s
    return limit >= deadline - SAME_INSTANT_S and ended >= limit - SAME_INSTANT_S


@st.cache_data(max_entries=512, show_spinner=False)
def finished_chart_spec(steps_json: str, summary_json: str, zoom: bool) -> dict | None:
    """A finished turn's timeline never changes: built once, not on every run of the page."""
    return timeline_chart(json.loads(steps_json), json.loads(summary_json), zoom=zoom)


def render_turn_clocks(turn: TurnView, *, expanded: bool) -> None:
    summary, steps = turn.summary, turn.steps
    if not summary.get("started_at"):
        st.caption("This turn ended before a worker started it, so no clock ran.")
        return
    with st.expander("⏱️ The three clocks for this turn", expanded=expanded):
        _clock_charts(summary, steps, turn.key)


@st.fragment
def _clock_charts(summary: TurnSummary, steps: list[Step], key: str) -> None:
    """One chart (Vega takes the browser a while to draw), zoomed on request: the toggle reruns
    this fragment alone."""
    with drawn_or_said("this turn's clocks"):
        _clock_charts_body(summary, steps, key)


def _clock_charts_body(summary: TurnSummary, steps: list[Step], key: str) -> None:
    if steps:  # a turn that recorded no step (safeguards off, killed) has nothing to chart
        zoom = st.toggle("Zoom in on the steps", key=f"zoom-{key}")
        spec = finished_chart_spec(json.dumps(steps), json.dumps(summary), zoom)
        if spec is not None:
            st.vega_lite_chart(spec, width="stretch")
    st.caption(clocks_caption(summary, steps))
    trace_id = tracing.trace_id(summary.get("trace_parent"))
    if trace_id:
        st.caption(f"🔭 OpenTelemetry trace `{trace_id}`: the model calls, tool runs, tokens and clocks of this "
                   "turn, in your trace viewer.")


def budget_text(state: State, now: float) -> tuple[float, str]:
    """The budget bar's fill (0..1 of the time to the deadline) and its words."""
    started, deadline, kill = state.get("started_at"), state.get("deadline_at"), state.get("job_timeout_at")
    started = started or now  # a running turn always has one; a hand-written state may not
    used = max(0.0, now - started)
    if deadline:
        span = max(deadline - started, 1e-6)
        kills = f" · the queue kills the job in {_seconds(max(0.0, kill - now))}" if kill else ""
        text = f"{_seconds(used)} used · the deadline is in {_seconds(max(0.0, deadline - now))}{kills}"
        return max(0.0, min(1.0, used / span)), text
    if kill:  # safeguards off: no deadline, only the queue's kill
        span = max(kill - started, 1e-6)
        return max(0.0, min(1.0, used / span)), (f"{_seconds(used)} used · no deadline (safeguards off) · "
                                       f"the queue kills the job in {_seconds(max(0.0, kill - now))}")
    return 0.0, f"{_seconds(used)} used"


def current_step_text(current: CurrentStep | None, now: float) -> str | None:
    if not current or not current.get("kind"):
        return None
    elapsed = max(0.0, now - (current.get("started_at") or now))
    timeout = current.get("timeout_s")
    limit = f" of its {_seconds(timeout)} timeout" if timeout else ""
    name = inert(current.get("name"))
    what = {Kind.MODEL: f"Calling the model ({name})", Kind.TOOL: f"Running the tool {name}",
            Kind.RETRY: f"Waiting before a retry ({name})"}.get(current["kind"], inert(current["kind"]))
    return f"{what}: {_seconds(elapsed)}{limit}"
