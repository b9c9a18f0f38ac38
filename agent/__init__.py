"""A tool-using LLM agent whose queued turns always finish: the library behind app.py."""

import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where app.py, mcp.json, README.md and .data/ are

# httpx imports its own command-line client (click and pygments, about 2 MiB a process) whenever those
# happen to be installed, and falls back to a stub when they are not; nothing here runs that client.
# Set before anything of the package imports httpx, so no worker or page process pays for it.
sys.modules.setdefault("httpx._main", None)
