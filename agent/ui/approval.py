"""A tool that asks a person first, on the page: the parked turn's request (what the model wants to run,
with which arguments, until when) with Approve and Deny on it, and the status panel of a parked turn.

The request is drawn by the full run, never by the follower: a button inside a fragment that holds waits
for its run to end (PITFALLS.md), while a full run's button cuts the follower short and acts at once. The
state is the source of truth: every tab open on the conversation draws the same request, and a button
names the request's id, so a stale one can never answer a newer request. The countdown runs in the
browser (a few lines of script in an `st.iframe`, counting to the expiry; only two numbers are put in
it): a parked turn costs the server nothing per second.
"""

from __future__ import annotations

import datetime as dt

import redis
import streamlit as st

from agent.contract import TOOL_NAME, Approval, Outcome, Status
from agent.conversation.well_formed import number
from agent.conversation.words import STATUS_LABELS
from agent.runtime.connection import is_disk_error, is_memory_error, redis_problem
from agent.text.markdown import inert
from agent.text.visible import shown_json_text
from agent.turn import approvals
from agent.ui import state as ui

COUNTDOWN_HEIGHT_PX = 26
ARGUMENTS_HEIGHT_PX = 420  # long arguments scroll inside their block (all of them are there), the buttons stay near
ARGUMENTS_LINES = 18  # lines of arguments shown before their block scrolls

# The browser counts down from what was left when the page drew it: its own clock may differ from the
# server's, the time elapsed since does not. Only two numbers are put in; nothing else varies.
COUNTDOWN_HTML = """<div id="left" data-testid="approval-countdown"
 style="font-family: 'Source Sans Pro', sans-serif; font-size: 14px; color: #31333F;"></div>
<script>
const end = performance.now() + __LEFT_MS__;
const el = document.getElementById("left");
function words(s) { const m = Math.floor(s / 60); return (m ? m + " min " : "") + (s % 60) + " s"; }
function tick() {
  const s = Math.max(0, Math.ceil((end - performance.now()) / 1000));
  el.textContent = s > 0 ? "⌛ Expires in " + words(s) + " (at " + new Date(__EXPIRES_MS__).toLocaleTimeString()
    + " your time)" : "⌛ The request has expired: the turn goes on without the tool.";
  if (s > 0) setTimeout(tick, ((end - performance.now()) % 1000) || 1000);
}
tick();
</script>"""


def on_answer(be: ui.Backend, cid: str, request_id: str, decision: str) -> None:
    """Approve or Deny: the answer is taken once, whichever tab, command line or expiry comes first; a
    button that came second says how the request was answered instead."""
    session = st.session_state
    session.pop(ui.FLASH_KEY, None)
    try:
        by = f"by {be.person.name} on the page" if be.person is not None else approvals.BY_PAGE
        answered = approvals.answer(be.store, be.queue, cid, decision, by, request_id=request_id)
    except redis.RedisError as exc:
        # Nothing was recorded: the answer is taken in one script, and a failed enqueue after it is not raised.
        why = redis_problem(exc) if is_memory_error(exc) or is_disk_error(exc) else \
            f"Redis is not answering ({type(exc).__name__})"
        session[ui.FLASH_KEY] = ("error", f"The answer was not recorded: {why}. Try again.", None)
        return
    if not answered.taken or not answered.queued:
        session[ui.FLASH_KEY] = ("info", inert(answered.message), None)


def request_card(be: ui.Backend, cid: str, request: Approval, now: float) -> None:
    """The request, where the tool call is: the tool, its arguments (untrusted: a code block shows them
    inert), when it expires (the time in words, and a countdown in the browser), and the two buttons."""
    name = tool_name_markdown(request.get("name"))
    with st.container(border=True, key=f"approval-{request['id']}"):
        st.markdown(f"**✋ The assistant wants to run {name}.** It asks you first: nothing runs until you "
                    "answer.")
        st.caption(f"Request `{request_id_text(request['id'])}`, with these arguments, exactly as the tool will "
                   "receive them (each key once; characters you could not see are shown as escapes such as "
                   "`\\u202e`):")
        shown = shown_arguments(request.get("arguments"))
        st.code(shown, language="json", wrap_lines=True,
                height=ARGUMENTS_HEIGHT_PX if shown.count("\n") > ARGUMENTS_LINES or len(shown) > 2000 else "content")
        st.caption(expiry_text(request, now))
        expires_at = number(request.get("expires_at"))
        if expires_at is not None:
            st.iframe(countdown_html(expires_at, now), height=COUNTDOWN_HEIGHT_PX)
        approve, deny = st.columns(2)
        approve.button("✅ Approve", key=f"approve-{request['id']}", type="primary", width="stretch",
                       on_click=on_answer, args=(be, cid, request["id"], Outcome.APPROVED))
        deny.button("🚫 Deny", key=f"deny-{request['id']}", width="stretch",
                    on_click=on_answer, args=(be, cid, request["id"], Outcome.DENIED))


def countdown_html(expires_at: float, now: float) -> str:
    left_ms = max(0, round((expires_at - now) * 1000))
    return (COUNTDOWN_HTML.replace("__LEFT_MS__", str(left_ms))
            .replace("__EXPIRES_MS__", str(round(expires_at * 1000))))


def expiry_text(request: Approval, now: float) -> str:
    """The expiry as a time of day (UTC: the server's clock, said so) and what was left when drawn."""
    expires_at = number(request.get("expires_at"))
    if expires_at is None:
        return "It waits until you answer."
    at = dt.datetime.fromtimestamp(expires_at, dt.UTC).strftime("%H:%M:%S UTC")
    left = max(0.0, expires_at - now)
    left_words = f"{left / 60:.0f} min" if left >= 120 else f"{left:.0f} s"
    return (f"If nobody answers, the request expires at **{at}** ({left_words} from when this was drawn): "
            "the tool is then not run, and the assistant answers without it.")


def shown_arguments(arguments) -> str:
    """The request's arguments as the tool receives them (a request stores them so: approvals.py), with
    every character a reader would not see escaped, also in a state stored before it did."""
    return shown_json_text(arguments) if isinstance(arguments, str) else ""


def request_id_text(request_id) -> str:
    return "".join(ch for ch in str(request_id) if ch.isalnum())[:64]


def tool_name_markdown(name) -> str:
    """A tool's name as a code span when it is one a provider accepts (nothing in it a code span would
    show escaped); anything else a stored state holds, as inert text."""
    if isinstance(name, str) and TOOL_NAME.match(name):
        return f"`{name}`"
    return inert(name or "a tool")


def parked_status(state: dict, *, read_only: bool = False) -> None:
    """The status panel of a parked turn: no spinner, no budget bar, no queue place: no job runs. `read_only`:
    someone else's (an admin's look), whose request only its owner can answer."""
    request = state.get("approval") or {}
    name = tool_name_markdown(request.get("name"))
    with st.container(border=True):
        if read_only:
            st.markdown(f"**✋ Waiting for its owner's approval** to run {name}")
            st.caption("This conversation is read-only for you: it belongs to someone else, and only they can "
                       "answer its request for approval. No job is running meanwhile.")
            return
        st.markdown(f"**{STATUS_LABELS[Status.AWAITING_APPROVAL]}** to run {name}")
        st.caption("No job is running: the worker that asked was freed, and no clock of the turn runs while you "
                   "decide. Once you answer, the turn goes on in a new job with a fresh set of clocks.")


def parked_request(state: dict) -> Approval | None:
    """The pending request of a parked turn, or None (answered, or a state that holds none)."""
    request = state.get("approval")
    if ui.phase_of(state) != ui.PARKED or not isinstance(request, dict) or request.get("answer"):
        return None
    return request if isinstance(request.get("id"), str) else None
