"""The tools this project ships, in the order they are offered to the model."""

from __future__ import annotations

from agent.tools.arithmetic import calculator
from agent.tools.clock import current_time
from agent.tools.docs import search_docs
from agent.tools.notes import add_note
from agent.tools.waiting import wait

BUILT_INS = [calculator, current_time, search_docs, wait, add_note]
