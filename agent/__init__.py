"""A tool-using LLM agent whose queued turns always finish: the library behind app.py."""
