"""`python -m agent tools [--json]`: the tools the workers offer, as they published them in Redis,
one a line: its name, its source, and "asks first" when a call waits for a person's approval (the
tool says so, or AGENT_APPROVE_TOOLS names it). Before any worker has published, the tools this
process has itself (the built-ins), said so on stderr. Exit status 0, or 2 as the rest of the CLI.
"""

from __future__ import annotations

import json
import sys

from agent.hosting import services
from agent.settings import APPROVE_TOOLS_VARIABLE, Settings
from agent.text.plain_text import terminal_safe
from agent.tools.catalogue import listed_tools, read_catalogue

EXIT_OK = 0
COMMAND = "tools"
ASKS_FIRST = "asks first"


def add_parser(sub) -> None:
    tools = sub.add_parser(COMMAND, help="the tools the workers offer, and which ask a person first")
    tools.add_argument("--json", action="store_true",
                       help="one JSON object a line: name, source, description, needs_approval")


def run(args, settings: Settings) -> int:
    store = services.ensure(settings, workers=0).store(settings)
    sources = read_catalogue(store.redis)
    if not sources:
        from agent.tools.sources import built_in_source  # imported here: only this case needs it

        print("no worker has published its tools yet (none has started on this Redis): these are the built-in "
              "tools only", file=sys.stderr)
        sources = [built_in_source()]
    _report_errors(sources)
    rows = listed_tools(sources, settings.turn.approve_tools)
    _print(rows, as_json=args.json)
    _report_unknown(rows, settings.turn.approve_tools)
    return EXIT_OK


def _print(rows: list[dict], *, as_json: bool) -> None:
    """One line per tool; what a server wrote is escaped before it reaches a terminal."""
    width = max((len(row["name"]) for row in rows), default=0)
    for row in rows:
        if as_json:
            line = json.dumps(row, ensure_ascii=False)
        else:
            line = f"{row['name']:<{width}}  {row['source']}" + (f"  {ASKS_FIRST}" if row["needs_approval"] else "")
        print(terminal_safe(line), flush=True)


def _report_errors(sources: list[dict]) -> None:
    """A source that failed (an MCP server that did not start) is said on stderr: its tools are missing."""
    for source in sources:
        if isinstance(source, dict) and source.get("error"):
            print(terminal_safe(f"tool source {source.get('name')}: {source['error']}"[:500]), file=sys.stderr)


def _report_unknown(rows: list[dict], approve_tools: tuple[str, ...]) -> None:
    """A name in AGENT_APPROVE_TOOLS that no worker offers is most likely a typo: said, never refused."""
    offered = {row["name"] for row in rows}
    unknown = [name for name in approve_tools if name not in offered]
    if unknown:
        print(f"{APPROVE_TOOLS_VARIABLE} names tools no worker offers: {', '.join(unknown)}", file=sys.stderr)
