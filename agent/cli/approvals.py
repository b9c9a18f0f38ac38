"""`python -m agent approve ID --request R` and `deny ID --request R`: answer request R of a parked turn.

An answer names the request it answers, so a command run twice never answers a request its person never
saw (a reply that asks twice parks on a second request as soon as the first is answered). `ask` and `show`
print the request's id. A bare `approve ID` on a terminal shows the pending request, as the tool would
receive it, and asks y/N; without a terminal it is refused, saying to pass `--request`.

Exit status 0 when the answer was taken (the turn goes on: a worker continues it); 1 when the person said
no at the prompt (nothing was answered); 2 with one line on stderr when there is nothing to answer: no such
conversation, R is not the pending request, or R was answered already (by whom, and how). The continuation
runs on whatever pool serves the queue (the page's, an `ask` that waits for it, `python worker.py`); this
command starts none.
"""

from __future__ import annotations

import argparse
import re
import sys

from agent.contract import Outcome, Status
from agent.hosting import services
from agent.queue import get_queue
from agent.settings import Settings
from agent.text.plain_text import terminal_safe
from agent.text.visible import shown_json_text
from agent.turn.approvals import BY_CLI, answer, not_pending

EXIT_OK, EXIT_DECLINED_AT_PROMPT, EXIT_USAGE = 0, 1, 2
COMMANDS = {"approve": Outcome.APPROVED, "deny": Outcome.DENIED}
REQUEST_ID_RE = re.compile(r"[0-9a-f]{1,64}")
PROMPTS = {"approve": "Approve this call (it runs)? [y/N] ", "deny": "Decline this call (it does not run)? [y/N] "}


def _request_id(value: str) -> str:
    if not REQUEST_ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not a request id: {ascii(value[:40])}; `python -m agent show ID` "
                                         "prints the pending request's id")
    return value


def add_parsers(sub, conversation_id_type) -> None:
    for name, words in (("approve", "approve the tool call a turn is waiting on (it runs)"),
                        ("deny", "decline the tool call a turn is waiting on (the model is told)")):
        parser = sub.add_parser(name, help=words)
        parser.add_argument("conversation", type=conversation_id_type)
        parser.add_argument("--request", type=_request_id, metavar="R",
                            help="the id of the request this answers (`ask` and `show` print it); without it, "
                                 "a terminal shows the pending request and asks y/N")


def run(args, settings: Settings) -> int:
    request_id = args.request
    if request_id is None and not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(f"error: `{args.command}` without --request needs a terminal to show the request and ask y/N: run "
              f"`python -m agent show {args.conversation}` to see the request and its id, then `python -m agent "
              f"{args.command} {args.conversation} --request R`", file=sys.stderr)
        return EXIT_USAGE
    store = services.ensure(settings, workers=0).store(settings)
    if request_id is None:
        state = store.read_meta(args.conversation)
        request = (state or {}).get("approval") or {}
        if state is None or state["done"] or state["status"] != Status.AWAITING_APPROVAL or request.get("answer"):
            print(terminal_safe(not_pending(store, args.conversation, state).message), file=sys.stderr)
            return EXIT_USAGE
        show_request(args.conversation, request)
        try:
            said = input(PROMPTS[args.command])
        except EOFError:
            said = ""
        if said.strip().lower() not in ("y", "yes"):
            print("Nothing was answered.", file=sys.stderr)
            return EXIT_DECLINED_AT_PROMPT
        request_id = request["id"]  # the request shown, and no other (a newer one is not answered unseen)
    answered = answer(store, get_queue(store.redis), args.conversation, COMMANDS[args.command], BY_CLI,
                      request_id=request_id)
    print(terminal_safe(answered.message), file=sys.stdout if answered.taken else sys.stderr)
    return EXIT_OK if answered.taken else EXIT_USAGE


def show_request(conversation_id: str, request: dict) -> None:
    """The pending request, as its tool would receive it, before the prompt."""
    print(terminal_safe(f"Conversation {conversation_id} waits for request {request['id']}: the model wants to run "
                        f"{request['name']} with these arguments, exactly as the tool will receive them:"))
    print(terminal_safe(shown_json_text(request.get("arguments") or "{}")), flush=True)
