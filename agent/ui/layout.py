"""The page a full run draws: the conversation's finished turns, the input, the sidebar, and the places
where the follower (agent/ui/follower.py) draws the turn in flight and Stop."""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st

from agent.conversation.turns import TurnView, split_turns
from agent.deadline import TOOL_CUT_SLACK_S
from agent.settings import Settings
from agent.ui import actions, approval, callbacks, follower, render, sidebar, signin, tool_sources
from agent.ui import conversations as conversations_ui
from agent.ui import state as ui
from agent.ui.guard import drawn_or_said
from agent.ui.streamlit_internals import children_drawn

EXAMPLES = (
    "What is 17*23, and what time is it in Tokyo?",
    "How does the deadline work?",
    "Please be slow 5 seconds, then tell me the time in Paris.",
)
LEAD = (
    "You are watching an AI assistant answer with tools, live: each step appears as it happens, and "
    "whatever goes wrong (a model that hangs, a tool that is slow), the reply always comes back in time."
)
HOW_IT_WORKS = (
    "Each message starts a **turn** that runs as a job on a queue, in a worker process, under three clocks: "
    "every model call has its own **timeout**; the turn stops itself at its **deadline**; and the queue kills "
    "the job at its **job timeout**, a margin later. The turn writes its progress after every step, so you "
    "see each tool call as it lands, and it always says how it ended. Try a scenario from the sidebar "
    "(*hang*, *slow tool*) to watch the clocks at work."
)

CLOCK_RULES = f"""\
deadline     = job start + job timeout - margin
call timeout = min(call cap, time left before the deadline)
tool limit   = min(tool cap, time left - minimum call - {TOOL_CUT_SLACK_S:g} s)
no model call starts with less than the minimum call left"""
CLOCK_RULES_MARKDOWN = "\n".join(f"- `{rule}`" for rule in CLOCK_RULES.splitlines())


def page(settings: Settings, be: ui.Backend) -> None:
    session = st.session_state
    conversation, result = ui.open_conversation(st.query_params.get(ui.CID_PARAM), session, be.store,
                                                be.queue_connection, settings.state_ttl_s)
    cid = conversation.id
    state = result.state
    phase = ui.phase_of(state)  # a parked turn is in flight (Stop, no input) but drawn by this run
    in_flight = phase != ui.IDLE
    # An admin reading someone else's conversation: shown as it is, with nothing that would change it.
    read_only = state is not None and not be.store.owns(state)
    _header(conversation, state)
    # A new chat's input is sent first: the browser loads its code (a chunk of its own) while the rest of
    # the page arrives, not after it, and the first screen is ready about half a second sooner. Streamlit
    # pins it to the bottom wherever it is called; its config is the settings' session values, read before
    # their widgets are drawn.
    input_first = state is None
    if input_first:
        _chat_input(settings, be, cid, phase, sidebar.next_turn(settings.turn)[0], read_only)
        _let_the_input_draw_alone()
    # The conversation's places, in the order they show, filled out of order: Stop first, then the turn
    # in flight, then the finished turns, then the rest of the page.
    turns_box, live_box, stop_box = st.container(), st.container(), st.container()
    if in_flight and not read_only:
        with stop_box:
            follower.stop_control(settings, be, state)
    top, config, config_error = _sidebar(settings, be)
    # Streamlit pins the input to the bottom wherever it is called. A run that starts a turn turns it off
    # before it shows the turn; one that ends a turn empties the turn's frame before it turns it back on:
    # the page never shows a turn in flight with the input on.
    if in_flight:
        _chat_input(settings, be, cid, phase, config, read_only)
    # Then the turn in flight (or, when it has ended, its frame emptied).
    if state is not None:  # a conversation others can reach (its link): follow it, in flight or idle
        session[follower.HANDOFF_KEY] = state
    with live_box:  # a new chat too: its first turn then finds the follower's component already loaded
        follower.follow(settings, be, cid, state["turn_id"] if state is not None else None, phase)
    if not in_flight and not input_first:
        _chat_input(settings, be, cid, phase, config, read_only)
    # The finished turns right after the turn in flight: a turn that moves between the two (it parks, is
    # answered, or ends) leaves one place as it reaches the other, in the same moment, not shown twice (or
    # not at all) while the sidebar's list is drawn between them.
    with turns_box:
        if state is None or not state["history"]:
            _empty_chat(settings, be, cid)
        else:
            turns = split_turns(state)
            # A regenerate or an edit in flight leaves its parent drawn as it was, compact (it was not the
            # latest turn): drawn in full, its steps and chart would reach the browser just before the new
            # answer's first words, and hold them back.
            branch_in_flight = phase == ui.LIVE and len(state.get("siblings") or []) > 1
            _finished_turns(cid, turns[:-1] if phase == ui.LIVE else turns,
                            None if read_only else _request_drawer(be, cid, state),
                            actions.MessageActions(settings, be, cid, state, read_only=read_only),
                            last_in_full=not branch_in_flight)
        _over_what_is_left(turns_box)
    _conversation_links(settings, be, top, cid, state, read_only)
    if result.lost:
        st.toast("The worker running this turn was lost; its ending has been written.", icon="🛑")

    _flash(session)
    _input_caption(phase, config, config_error, read_only)
    if in_flight:  # everything is drawn: the follower's next run follows the turn as soon as this one ends
        follower.follow_at_once(settings, phase)


TURNS_DRAWN_KEY = "agent_turns_drawn"  # how many elements the session's last full run drew among the finished turns


def _over_what_is_left(turns_box) -> None:
    """An empty element over each place of the finished turns that the run before drew and this one did not (a
    turn answered after it parked goes back into the follower's frame; the examples give way to the first
    turn; another conversation is shorter): the browser keeps an element no run has drawn over until the run
    finishes, so it showed the turn twice until then. Empty elements are never shown."""
    session = st.session_state
    drawn = children_drawn(turns_box)
    if drawn is None:
        return
    for _ in range(session.get(TURNS_DRAWN_KEY, 0) - drawn):
        st.empty()
    session[TURNS_DRAWN_KEY] = drawn  # what lies past it is empty: nothing a later run must cover


INPUT_ALONE_S = 0.05  # seconds a new chat's run pauses after its input, so the browser draws it in a render of its own


def _let_the_input_draw_alone() -> None:
    """A short pause after a new chat's input, before the rest of the page. The browser draws the elements
    that arrive together in one render, in the order of its tree (the sidebar's before the input's); alone,
    the input asks for its code first instead of queueing behind the sidebar widgets' (measured: the first
    screen ready 0.2-0.5 s sooner). A new chat's runs only: the page's first, and a settings change before
    the first message."""
    time.sleep(INPUT_ALONE_S)


def _header(conversation: ui.Conversation, state: dict | None) -> None:
    st.title("⏱️ An agent that always finishes")
    st.markdown(LEAD)
    with st.expander("How it works", expanded=state is None):
        st.markdown(HOW_IT_WORKS)
        # Inline code, not a code block: the first screen does not wait for the browser to load its code
        # renderer (a chunk of its own); the follower's first tick loads it (follower.preload_renderers).
        st.markdown(CLOCK_RULES_MARKDOWN)
    if conversation.notice:
        st.query_params.pop(ui.CID_PARAM, None)
        st.info(conversation.notice, icon="🔎")
        st.toast(f"That conversation {conversation.gone}: this is a new chat.", icon="🔎")


def _sidebar(settings: Settings, be: ui.Backend):
    """First in the sidebar: a new chat and the conversations to come back to (its place, filled after
    the input is drawn), then the next turn's settings: (that place, the next turn's config, its error)."""
    top = st.sidebar.container()
    st.sidebar.divider()
    settings_box = sidebar.settings_box()
    config, config_error = sidebar.render_sidebar(settings.turn, settings_box)
    tool_sources.render_tool_sources(be.store.redis, settings_box, approve_tools=settings.turn.approve_tools)
    tool_sources.render_notes(person=be.person.id if be.person is not None else None)
    return top, config, config_error


def _conversation_links(settings: Settings, be: ui.Backend, top, cid: str, state: dict | None,
                        read_only: bool = False) -> None:
    if be.person is not None:
        signin.account(top, be.person, be.store.redis)
    top.button("🗨️ New chat", on_click=callbacks.new_chat, width="stretch")
    conversations_ui.render_conversations(top, be.store, cid, exists=state is not None,
                                          show_list=settings.show_conversations, mine=not read_only)
    if state is not None and st.query_params.get(ui.CID_PARAM) != cid:
        st.query_params[ui.CID_PARAM] = cid  # the first message makes the chat a link: reload and tabs follow it


INPUT_PLACEHOLDERS = {ui.IDLE: "Ask something that needs a tool…", ui.LIVE: "Wait for the reply, or press Stop…",
                      ui.PARKED: "Answer the request above, or press Stop…"}


def _chat_input(settings: Settings, be: ui.Backend, cid: str, phase: str, config, read_only: bool = False) -> None:
    st.chat_input(
        "Read-only: someone else's conversation" if read_only else INPUT_PLACEHOLDERS[phase],
        key=callbacks.INPUT_KEY,
        disabled=phase != ui.IDLE or config is None or read_only,
        on_submit=callbacks.on_send,
        args=(settings, be, cid),
    )


def _input_caption(phase: str, config, config_error: str | None, read_only: bool = False) -> None:
    if read_only:
        st.caption("👁️ Read-only: this conversation belongs to someone else. As an admin you can read it, "
                   "download it and watch it, but not write to it, stop it, answer it, rename it or delete it.")
    elif phase == ui.PARKED:
        st.caption("✋ The input is off while the assistant waits for your answer: approve or deny the request "
                   "above, or press **Stop** to end the turn.")
    elif phase == ui.LIVE:
        st.caption("✋ The input is off while this reply is being written: one turn at a time. "
                   "Press **Stop** to end it early.")
    elif config is None:
        st.caption(f"✋ Fix the settings in the sidebar to send a message: {config_error}")


def _empty_chat(settings: Settings, be: ui.Backend, cid: str) -> None:
    st.markdown("##### Try one of these")
    for index, example in enumerate(EXAMPLES):
        st.button(example, key=f"example-{index}", on_click=callbacks.send_text, args=(settings, be, cid, example))


def _request_drawer(be: ui.Backend, cid: str, state: dict | None) -> Callable[[], None] | None:
    """What draws a parked turn's request inside it (None when nothing waits for an answer)."""
    request = approval.parked_request(state) if state is not None else None
    if request is None:
        return None
    now = ui.now()
    return lambda: approval.request_card(be, cid, request, now)


def _finished_turns(cid: str, turns: list[TurnView], request: Callable[[], None] | None = None,
                    message_actions: actions.MessageActions | None = None, *, last_in_full: bool = True) -> None:
    """Drawn once per full run. Past RECENT_TURNS, earlier turns wait behind a button, so a full run
    (the one that ends each turn) costs the same at turn 30 and turn 300. A parked turn (the last) is
    drawn here too, with its request (`request` draws it)."""
    hidden = 0 if st.session_state.get(callbacks.SHOW_ALL_KEY) == cid else max(0, len(turns) - render.RECENT_TURNS)
    if hidden:
        st.button(f"Show {hidden} earlier turn{'s' * (hidden != 1)}", key="show-earlier",
                  on_click=callbacks.show_all, args=(cid,))
    for index, turn in enumerate(turns[hidden:], start=hidden):
        with drawn_or_said(f"turn {index + 1}"):
            last = index == len(turns) - 1
            render.render_turn(turn, latest=last and last_in_full, request=request if last else None,
                               actions=message_actions)
    render.render_conversation_cost(turns)


def new_chat_button() -> None:
    """Offered under a sentence that says this page could not be drawn."""
    st.button("🗨️ New chat", key="new-chat-after-error", on_click=callbacks.new_chat)


def _flash(session) -> None:
    """A refusal (or a note on what just happened) stays, with the unsent text, until it is dismissed or
    a message is sent."""
    flash = session.get(ui.FLASH_KEY)
    if not flash:
        return
    kind, text, unsent = flash
    with st.container(border=True):
        alert, icon = {"info": (st.info, "ℹ️"), "warning": (st.warning, "✋")}.get(kind, (st.error, "✋"))
        alert(text, icon=icon)
        if unsent and unsent.strip():
            st.caption("Your message, not sent (copy it from here):")
            st.code(unsent, language=None, wrap_lines=True)
        st.button("Dismiss", key="dismiss-flash", on_click=callbacks.dismiss_flash)
