"""The sidebar's conversations: this one (rename, delete, download) and the list to come back to.

The list is a page of the index (agent/conversation/listing.py): it costs the same with 10,000
conversations as with 10. Titles are untrusted text (a person's first message, or a rename): shown
inert and cut. `AGENT_SHOW_CONVERSATIONS=0` hides the list for a page several people can open; the
current conversation's own controls stay, since whoever has its link sees it anyway.
"""

from __future__ import annotations

import datetime as dt
import functools

import streamlit as st

from agent.conversation import export
from agent.conversation.listing import ConversationInfo, info, list_conversations
from agent.conversation.store import Store
from agent.text.markdown import inert
from agent.ui import state as ui

SIDEBAR_LIMIT = 20  # conversations the sidebar lists
FILTER_KEY = "conv_filter"
RENAME_KEY = "conv_rename"
CONFIRM_DELETE_KEY = "conv_confirm_delete"  # the id whose deletion is waiting for a confirmation
IN_FLIGHT_MARK = "⏳"
AWAITING_MARK = "✋"  # a turn parked on a request for approval: it waits for a person, not a worker


def render_conversations(sb, store: Store, cid: str, *, exists: bool, show_list: bool, mine: bool = True) -> None:
    """Into `sb` (a sidebar container): this conversation's controls (once it has a message; downloads only,
    unless it is `mine`), then the list (unless hidden)."""
    if exists:
        _this_conversation(sb, store, cid, mine)
    if not show_list:
        return
    sb.subheader("Conversations")
    text = sb.text_input("Filter by title", key=FILTER_KEY, placeholder="Filter by title…",
                         label_visibility="collapsed")
    listing = list_conversations(store, limit=SIDEBAR_LIMIT, text=text)
    if not listing.conversations:
        sb.caption("No conversation matches that filter." if text else "Your conversations will be listed here.")
    for row in listing.conversations:
        current = row.conversation_id == cid
        # The one shown now stands out (primary) and opening it again does nothing: a reopen would drop
        # this tab's unsent text.
        sb.button(row_label(row), key=f"conv-{row.conversation_id}", on_click=None if current else _open,
                  args=None if current else (row.conversation_id,), type="primary" if current else "secondary",
                  width="stretch", help="The conversation shown now" if current else "Open this conversation")
    shown = len(listing.conversations)
    if not listing.searched_all:
        sb.caption(f"Searched the latest titles only: {shown} found.")
    elif not text and listing.total > shown:
        sb.caption(f"The latest {shown} of {listing.total:,}. Filter by title to find older ones.")


def row_label(row: ConversationInfo) -> str:
    """A list row: the marker of a turn in flight, the title (inert), when, how many turns."""
    mark = f"{AWAITING_MARK} " if row.awaiting_approval else f"{IN_FLIGHT_MARK} " if row.in_flight else ""
    turns = f"{row.turns} turn{'s' * (row.turns != 1)}"
    return f"{mark}{inert(row.title) or 'Untitled'} · {when(row.updated_at)} · {turns}"


def when(epoch_s: float, now: float | None = None) -> str:
    """A list row's time: the hour today, the day and month this year, else the date."""
    moment = dt.datetime.fromtimestamp(epoch_s)
    today = dt.datetime.fromtimestamp(now) if now is not None else dt.datetime.now()
    if moment.date() == today.date():
        return moment.strftime("%H:%M")
    if moment.year == today.year:
        return moment.strftime("%d %b")
    return moment.strftime("%Y-%m-%d")


def _this_conversation(sb, store: Store, cid: str, mine: bool = True) -> None:
    row = info(store, cid)
    if row is None:
        return
    with sb.expander("This conversation", icon="🗂️"):
        st.caption(f"{inert(row.title) or 'Untitled'} · {row.turns} turn{'s' * (row.turns != 1)}")
        st.download_button("Download as Markdown", data=functools.partial(_export, store, cid, "md"),
                           file_name=f"{cid}.md", mime="text/markdown", on_click="ignore", key="download-md",
                           icon="⬇️", width="stretch", help="Messages, tool calls and results, how each turn ended")
        st.download_button("Download as JSON", data=functools.partial(_export, store, cid, "json"),
                           file_name=f"{cid}.json", mime="application/json", on_click="ignore", key="download-json",
                           icon="⬇️", width="stretch", help="The stored state: steps and clocks included")
        if not mine:
            return
        st.text_input("New title", key=RENAME_KEY, max_chars=200, placeholder="A new title…")
        st.button("Rename", key="rename", on_click=_rename, args=(store, cid), width="stretch")
        if st.session_state.get(CONFIRM_DELETE_KEY) != cid:
            st.button("🗑️ Delete…", key="delete", on_click=_ask_delete, args=(cid,), width="stretch")
            return
        flight = " Its reply in flight is stopped." if row.in_flight else ""
        st.warning(f"Delete this conversation for good? Every tab open on it will say it was deleted.{flight}")
        yes, no = st.columns(2)
        yes.button("Delete", key="delete-yes", type="primary", on_click=_delete, args=(store, cid), width="stretch")
        no.button("Cancel", key="delete-no", on_click=_cancel_delete, width="stretch")


def _export(store: Store, cid: str, fmt: str) -> str:
    """Built when the button is clicked, not on every run: a long conversation costs nothing until then."""
    state = store.read(cid)
    if state is None:
        return "This conversation has expired or was deleted.\n"
    if fmt == "json":
        return export.to_json(state)
    row = info(store, cid)
    return export.to_markdown(state, row.title if row else None)


# -- callbacks ---------------------------------------------------------------------------------------


def _open(cid: str) -> None:
    # A "Not sent" box stays, with its text: opening another conversation loses nothing typed.
    for key in (ui.VIEW_KEY, ui.STOPPING_KEY, CONFIRM_DELETE_KEY):
        st.session_state.pop(key, None)
    st.query_params[ui.CID_PARAM] = cid


def _rename(store: Store, cid: str) -> None:
    title = (st.session_state.get(RENAME_KEY) or "").strip()
    if not title:
        return
    if store.rename(cid, title):
        st.session_state[RENAME_KEY] = ""
        st.toast("Renamed.", icon="🗂️")
    else:  # expired, deleted, or not this person's: told alike
        st.toast("Not renamed: this conversation was not found.", icon="🔎")


def _ask_delete(cid: str) -> None:
    st.session_state[CONFIRM_DELETE_KEY] = cid


def _cancel_delete() -> None:
    st.session_state.pop(CONFIRM_DELETE_KEY, None)


def _delete(store: Store, cid: str) -> None:
    deleted = store.delete(cid)
    ui.new_chat(st.session_state)
    st.session_state.pop(CONFIRM_DELETE_KEY, None)
    st.query_params.pop(ui.CID_PARAM, None)
    # Said twice: a toast, and a note that stays until dismissed or a message is sent (a toast can be
    # dropped when another run starts at once, and this tab must never lose the chat without a word).
    said = ("The conversation was deleted. This is a new chat." if deleted
            else "That conversation was not found (it expired, or was deleted in another tab). This is a new chat.")
    st.session_state[ui.FLASH_KEY] = ("info", said, None)
    st.toast(said, icon="🗑️")
