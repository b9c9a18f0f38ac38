"""`python -m agent approve ID` and `deny ID`: answer the request for approval a parked turn holds.

Exit status 0 when the answer was taken (the turn goes on: a worker continues it), or 2 with one line
on stderr when there is nothing to answer: no such conversation, a turn not waiting for an approval, or
a request answered already (by whom, and how). The continuation runs on whatever pool serves the queue
(the page's, an `ask` that waits for it, `python worker.py`); this command starts none.
"""

from __future__ import annotations

import sys

from agent.contract import Outcome
from agent.hosting import services
from agent.queue import get_queue
from agent.settings import Settings
from agent.text.plain_text import terminal_safe
from agent.turn.approvals import BY_CLI, answer

EXIT_OK, EXIT_USAGE = 0, 2
COMMANDS = {"approve": Outcome.APPROVED, "deny": Outcome.DENIED}


def add_parsers(sub, conversation_id_type) -> None:
    for name, words in (("approve", "approve the tool call a turn is waiting on (it runs)"),
                        ("deny", "decline the tool call a turn is waiting on (the model is told)")):
        parser = sub.add_parser(name, help=words)
        parser.add_argument("conversation", type=conversation_id_type)


def run(args, settings: Settings) -> int:
    store = services.ensure(settings, workers=0).store(settings)
    answered = answer(store, get_queue(store.redis), args.conversation, COMMANDS[args.command], BY_CLI)
    print(terminal_safe(answered.message), file=sys.stdout if answered.taken else sys.stderr)
    return EXIT_OK if answered.taken else EXIT_USAGE
