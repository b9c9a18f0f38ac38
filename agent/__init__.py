"""A tool-using LLM agent whose queued turns always finish: the library behind app.py."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where app.py, mcp.json, README.md and .data/ are
