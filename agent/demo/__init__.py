"""The `demo` provider: an offline, deterministic scripted model behind an OpenAI-compatible server on loopback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.demo.scenarios import Scenario, UnknownModelError, model_names, parse_model_name

if TYPE_CHECKING:
    from agent.demo.model import respond
    from agent.demo.server import DemoServer

__all__ = ["DemoServer", "Scenario", "UnknownModelError", "model_names", "parse_model_name", "respond"]


def __getattr__(name: str) -> object:
    # Imported lazily so `python -m agent.demo.server` does not find the module already imported, and
    # so a worker, which only names the demo model (agent/providers/demo.py), never loads the model.
    if name == "DemoServer":
        from agent.demo.server import DemoServer

        return DemoServer
    if name == "respond":
        from agent.demo.model import respond

        return respond
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
