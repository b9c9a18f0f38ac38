"""The sidebar's tool sources: what the workers published, and the tools the next turn may use.

The choice is names only: a worker runs tools from its own config, never from the page.
"""

from __future__ import annotations

import redis
import streamlit as st

from agent.text.markdown import inert
from agent.tools.catalogue import read_catalogue
from agent.tools.notes import notes_path, read_notes

CHOSEN_KEY = "sb_tools"  # the multiselect's session key: the tool names chosen
OFFERED_KEY = "sb_tools_offered"  # every tool name the catalogue listed when the sidebar was drawn


def chosen(session) -> tuple[str, ...] | None:
    """The next turn's tools: None (every tool its worker has) unless some were left out."""
    picked, offered = session.get(CHOSEN_KEY), session.get(OFFERED_KEY)
    if picked is None or offered is None or set(picked) >= set(offered):
        return None
    return tuple(picked)


ASKS_MARK = "✋"  # a tool that asks a person before it runs


def asks_first(tool: dict, approve_tools: tuple[str, ...] = ()) -> bool:
    """A tool asks a person first when its source marks it so (the catalogue's `needs_approval`, absent
    from older catalogues) or when the settings name it (AGENT_APPROVE_TOOLS)."""
    return tool.get("needs_approval") is True or tool.get("name") in approve_tools


def tool_help(tool: dict, approve_tools: tuple[str, ...] = ()) -> str:
    """One tool in its source's help text; what the server says of it is untrusted, shown inert."""
    mark = f" {ASKS_MARK} (asks first: runs only once you approve it)" if asks_first(tool, approve_tools) else ""
    return f"{inert(tool['name'])}{mark}: {inert(tool.get('description'))}"


def render_tool_sources(client: redis.Redis, sb=None, *, approve_tools: tuple[str, ...] = ()) -> None:
    """List each tool source with its tools (or why it has none), and a choice of tools for the next turn,
    into `sb` (the sidebar's settings, or the sidebar itself). A tool that asks a person first is marked."""
    sb = st.sidebar if sb is None else sb
    sb.subheader("Tools")
    try:
        sources = read_catalogue(client)
    except redis.RedisError:
        sources = []
    if not sources:
        sb.caption("The workers have not listed their tools yet.")
        return
    names, asking = [], set()
    for source in sources:  # what a server says (descriptions, errors) is untrusted text: shown inert
        tools = [t for t in source.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
        names.extend(t["name"] for t in tools)
        asking.update(t["name"] for t in tools if asks_first(t, approve_tools))
        asks = sum(asks_first(t, approve_tools) for t in tools)
        sb.caption(f"**{inert(source.get('name'))}** ({inert(source.get('kind'))}): {len(tools)} tool(s)"
                   + (f", {asks} {ASKS_MARK} ask{'s' * (asks == 1)} first" if asks else ""),
                   help="\n\n".join(tool_help(t, approve_tools) for t in tools) or None)
        if source.get("error"):
            sb.warning(f"{inert(source.get('name'))}: {inert(source['error'])}", icon="🧰")
    session = st.session_state
    if session.get(OFFERED_KEY) != names:  # a new catalogue: new tools start chosen, gone ones drop out
        previous = session.get(OFFERED_KEY) or []
        kept = [n for n in session.get(CHOSEN_KEY, names) if n in names]
        session[CHOSEN_KEY] = kept + [n for n in names if n not in previous and n not in kept]
        session[OFFERED_KEY] = names
    sb.multiselect("Tools the next message may use", names, key=CHOSEN_KEY,
                   format_func=lambda name: f"{name} {ASKS_MARK}" if name in asking else name,
                   help="Names only: each worker runs tools from its own config file (mcp.json, AGENT_TOOLS). "
                        f"{ASKS_MARK} marks a tool that asks you first.")


def render_notes(sb=None, person: str | None = None) -> None:
    """The demo's add_note file, under the settings: the visible effect of a tool a person approved. Nothing
    is drawn until a note exists (the notes of this machine's data directory, where its workers write).
    With sign-in, `person`'s own notes only (the id of the person signed in); else those of turns with no owner."""
    try:
        notes = read_notes(person=person)
    except (OSError, ValueError):
        return
    if not notes:
        return
    sb = st.sidebar if sb is None else sb
    where = "yours" if person else f"in `{notes_path().name}`"
    sb.caption(f"📝 **Notes** (`add_note`, {len(notes)} latest, {where})",
               help="Each line was written by the add_note tool after a person approved it"
                    + (", in a turn of yours: nobody else signed in here sees them." if person else "."))
    sb.code("\n".join(notes), language=None, wrap_lines=True)
