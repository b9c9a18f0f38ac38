"""The sidebar's tool sources: what the workers published, and the tools the next turn may use.

The choice is names only: a worker runs tools from its own config, never from the page.
"""

from __future__ import annotations

import redis
import streamlit as st

from agent.text.markdown import inert
from agent.tools.catalogue import read_catalogue

CHOSEN_KEY = "sb_tools"  # the multiselect's session key: the tool names chosen
OFFERED_KEY = "sb_tools_offered"  # every tool name the catalogue listed when the sidebar was drawn


def chosen(session) -> tuple[str, ...] | None:
    """The next turn's tools: None (every tool its worker has) unless some were left out."""
    picked, offered = session.get(CHOSEN_KEY), session.get(OFFERED_KEY)
    if picked is None or offered is None or set(picked) >= set(offered):
        return None
    return tuple(picked)


def render_tool_sources(client: redis.Redis, sb=None) -> None:
    """List each tool source with its tools (or why it has none), and a choice of tools for the next turn,
    into `sb` (the sidebar's settings, or the sidebar itself)."""
    sb = st.sidebar if sb is None else sb
    sb.subheader("Tools")
    try:
        sources = read_catalogue(client)
    except redis.RedisError:
        sources = []
    if not sources:
        sb.caption("The workers have not listed their tools yet.")
        return
    names = []
    for source in sources:  # what a server says (descriptions, errors) is untrusted text: shown inert
        tools = [t for t in source.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]
        names.extend(t["name"] for t in tools)
        sb.caption(f"**{inert(source.get('name'))}** ({inert(source.get('kind'))}): {len(tools)} tool(s)",
                   help="\n\n".join(f"{inert(t['name'])}: {inert(t.get('description'))}" for t in tools) or None)
        if source.get("error"):
            sb.warning(f"{inert(source.get('name'))}: {inert(source['error'])}", icon="🧰")
    session = st.session_state
    if session.get(OFFERED_KEY) != names:  # a new catalogue: new tools start chosen, gone ones drop out
        previous = session.get(OFFERED_KEY) or []
        kept = [n for n in session.get(CHOSEN_KEY, names) if n in names]
        session[CHOSEN_KEY] = kept + [n for n in names if n not in previous and n not in kept]
        session[OFFERED_KEY] = names
    sb.multiselect("Tools the next message may use", names, key=CHOSEN_KEY,
                   help="Names only: each worker runs tools from its own config file (mcp.json, AGENT_TOOLS).")
