"""What a person can do with one message on the page: the per-message actions (a table, `ACTIONS`), the editor
an edit opens, and the branch picker ("‹ 2 / 3 ›") beside a turn that has siblings.

A per-message action is one `MessageAction` row: its button's label, the message it sits under (the person's
or the answer), whether it shows for a turn, and what its click does (a callback, run before the next full
run, so that run draws its outcome). Adding one takes this file (its row and its callback), the session logic
it calls when it writes (agent/ui/state.py, without Streamlit), a test and the docs (docs/page.md); see
docs/development.md.

Every branch is the conversation owner's: a page that reads someone else's conversation (an admin) draws no
action and a picker that only says where the turn is, since the branch shown is the conversation's, not the
viewer's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis
import streamlit as st

from agent.contract import Role
from agent.conversation.turns import TurnView
from agent.settings import Settings, SettingsError
from agent.text.markdown import safe_markdown
from agent.ui import sidebar
from agent.ui import state as ui

EDITING_KEY = "agent_editing"  # (conversation id, turn id) whose message this tab is editing
EDIT_TEXT_KEY = "agent_edit_text"  # the editor's text (a widget's key: it stays when a send is refused)


@dataclass(frozen=True)
class Place:
    """What an action needs to act: the page's settings and backend, the conversation, its state."""

    settings: Settings
    be: ui.Backend
    cid: str
    state: dict


@dataclass(frozen=True)
class MessageAction:
    key: str  # its buttons' keys: f"{key}-{turn key}"
    label: str
    role: str  # under which message: Role.USER (the person's) or Role.ASSISTANT (the answer)
    help: str
    on_click: Callable[[Place, TurnView], None]
    shown: Callable[[Place, TurnView], bool] = lambda place, turn: True


def _config(settings: Settings):
    try:
        return sidebar.next_turn_config(settings.turn), None
    except SettingsError as exc:
        return None, str(exc)


def _branch(place: Place, turn: TurnView, text: str | None, *, keep: bool) -> str | None:
    """A new turn beside `turn` (its parent's child), through the path every message takes (ui.send, then
    agent/queue.py's submit_turn). `keep`: a refusal keeps the text (an edit's); a regenerate's has none to keep."""
    config, error = _config(place.settings)
    be = place.be
    try:
        sent = ui.send(be.store, be.queue, st.session_state, place.cid, text, config, error, be.share,
                       be.daily_budget_usd, branch_of=turn_id(turn))
    except redis.RedisError as exc:
        st.session_state[ui.FLASH_KEY] = ("error", f"Not sent: Redis is not answering ({type(exc).__name__}).",
                                          text if keep else None)
        return None
    flash = st.session_state.get(ui.FLASH_KEY)
    if sent is None and flash and not keep:
        st.session_state[ui.FLASH_KEY] = (flash[0], flash[1], None)
    return sent


def regenerate(place: Place, turn: TurnView) -> None:
    _branch(place, turn, question(turn), keep=False)


def open_editor(place: Place, turn: TurnView) -> None:
    st.session_state[EDITING_KEY] = (place.cid, turn_id(turn))
    st.session_state[EDIT_TEXT_KEY] = question(turn) or ""


def send_edit(place: Place, turn: TurnView) -> None:
    """The edited message on a new branch; refused (a turn in flight: Stop first), the editor stays open with it."""
    if _branch(place, turn, st.session_state.get(EDIT_TEXT_KEY), keep=True) is not None:
        close_editor()


def close_editor(*_) -> None:
    st.session_state.pop(EDITING_KEY, None)
    st.session_state.pop(EDIT_TEXT_KEY, None)


def switch_to(place: Place, target: str) -> None:
    ui.switch(place.be.store, st.session_state, place.cid, target)


ACTIONS: tuple[MessageAction, ...] = (
    MessageAction("edit", "✏️ Edit", Role.USER, "Edit this message and send it: a new branch; this one stays",
                  open_editor),
    MessageAction("regenerate", "🔄 Regenerate", Role.ASSISTANT,
                  "Ask for another answer to this message: a new branch; this answer stays", regenerate),
)


def question(turn: TurnView) -> str | None:
    """The person's message a turn answers."""
    first = turn.messages[0] if turn.messages else None
    return str(first.get("content") or "") if first and first.get("role") == Role.USER else None


def turn_id(turn: TurnView) -> str:
    return turn.summary.get("turn_id") or ""


def siblings_of(turn: TurnView, state: dict) -> list[str]:
    """The turns sharing this turn's parent, itself included, oldest first (the state's own for its latest
    turn, whose summary may not be written yet)."""
    siblings = turn.summary.get("siblings")
    if siblings is None and turn.current:
        siblings = state.get("siblings")
    return list(siblings or [])


def picker(siblings: list[str], this: str) -> tuple[int, int, str | None, str | None]:
    """(its place, 1-based; how many; the sibling before; the sibling after) for "‹ 2 / 3 ›"."""
    if this not in siblings:
        return 1, max(1, len(siblings)), None, None
    at = siblings.index(this)
    before = siblings[at - 1] if at > 0 else None
    after = siblings[at + 1] if at + 1 < len(siblings) else None
    return at + 1, len(siblings), before, after


class MessageActions:
    """Draws the actions of the finished turns a full run draws (render.render_turn calls it)."""

    def __init__(self, settings: Settings, be: ui.Backend, cid: str, state: dict, *, read_only: bool):
        self.place = Place(settings, be, cid, state)
        self.read_only = read_only

    def editing(self, turn: TurnView) -> bool:
        return not self.read_only and st.session_state.get(EDITING_KEY) == (self.place.cid, turn_id(turn))

    def user_message(self, turn: TurnView) -> None:
        """The person's message: the editor when this tab edits it, else the message; then its row."""
        if self.editing(turn):
            self._editor(turn)
        else:
            st.markdown(safe_markdown(turn.messages[0].get("content")))
        self.row(turn, Role.USER)

    def _editor(self, turn: TurnView) -> None:
        key = turn.key
        st.text_area("Edit your message", key=EDIT_TEXT_KEY, label_visibility="collapsed", height=100)
        with st.container(horizontal=True, gap="small"):
            st.button("Send", key=f"edit-send-{key}", type="primary", on_click=send_edit, args=(self.place, turn))
            st.button("Cancel", key=f"edit-cancel-{key}", on_click=close_editor)
        st.caption("Sent as a new branch beside this one: the old branch stays (‹ › to go back to it).")

    def row(self, turn: TurnView, role: str) -> None:
        """The picker (the person's message of a turn with siblings) and the actions of one message, on one line."""
        siblings = siblings_of(turn, self.place.state) if role == Role.USER else []
        actions = [] if self.read_only or self.editing(turn) else [
            a for a in ACTIONS if a.role == role and a.shown(self.place, turn)]
        if len(siblings) < 2 and not actions:
            return
        with st.container(horizontal=True, gap="small", vertical_alignment="center", key=f"row-{role}-{turn.key}"):
            if len(siblings) >= 2:
                self._picker(turn, siblings)
            for action in actions:
                st.button(action.label, key=f"{action.key}-{turn.key}", help=action.help, type="tertiary",
                          on_click=action.on_click, args=(self.place, turn))

    def _picker(self, turn: TurnView, siblings: list[str]) -> None:
        draw_picker(turn, siblings, self.place if not self.read_only else None)


def draw_picker(turn: TurnView, siblings: list[str], place: Place | None,
                off_help: str = "Only the conversation's owner switches its branches") -> None:
    """"‹ 2 / 3 ›": its arrows switch branches, or are drawn off (`place` None) with `off_help` saying why."""
    at, count, before, after = picker(siblings, turn_id(turn))
    on = place is not None
    st.button("‹", key=f"branch-before-{turn.key}", type="tertiary", disabled=not on or before is None,
              help="The branch before this one" if on else off_help, on_click=switch_to, args=(place, before))
    st.markdown(f"**{at} / {count}**")
    st.button("›", key=f"branch-after-{turn.key}", type="tertiary", disabled=not on or after is None,
              help="The branch after this one" if on else off_help, on_click=switch_to, args=(place, after))


def in_flight_picker(turn: TurnView, state: dict) -> Callable[[], None] | None:
    """Where the turn in flight (a regenerate or an edit beside its siblings) sits, "‹ 2 / 3 ›" in text: the branch
    shown cannot change under a turn being written, so its arrows come when it ends (or is stopped). Text, not
    buttons: the follower draws the turn again within one run, and a widget may be drawn once a run."""
    siblings = siblings_of(turn, state)
    if len(siblings) < 2:
        return None
    at, count, _before, _after = picker(siblings, turn_id(turn))
    return lambda: st.caption(f"‹ **{at} / {count}** ›",
                              help="Other branches can be shown once this turn ends (or is stopped)")
