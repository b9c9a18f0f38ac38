"""What the parts of one turn share: its settings, clocks, spend, publishing, writer and stop requests."""

from __future__ import annotations

from dataclasses import dataclass

from agent.settings import TurnConfig
from agent.spend import Spend
from agent.turn.policies import Clocks, Publishing
from agent.turn.stop_watch import StopRequests
from agent.turn.writer import StateWriter


@dataclass(frozen=True)
class TurnContext:
    """The turn's collaborators, given once to the loop, its model calls and its tool runs."""

    config: TurnConfig
    budget: Clocks  # the deadline (or none, safeguards off)
    publishing: Publishing  # when the state is written
    writer: StateWriter  # the writes
    stops: StopRequests  # the user's Stop
    spend: Spend  # the fourth clock: the turn's budget in tokens and US dollars, and what it has spent
