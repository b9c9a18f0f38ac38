"""The command line: `python -m agent ask | list | show | export | ...` (agent/cli/main.py)."""
