"""`python -m agent list [--json] [--owner WHO]`, `show ID [--json] [--owner WHO]`, `branches ID [--json]`,
`switch ID TURN` and `export ID [--format md|json] [--output FILE] [--all-branches]`.

`branches` draws the conversation's tree of turns (agent/conversation/tree.py): one line per turn, indented by its
depth, with its place among its siblings ("2 / 3"), its status and its first words; `*` marks the branch shown.
`--json` prints the tree as one object, which `show --json` adds to the state as `branches`. `switch` shows the
branch through a turn, down to its latest turn (exit 1 while a turn is in flight: Stop it first).

They read what the page and `ask` stored, through the same Redis (the embedded one is started,
without workers, when REDIS_URL is unset). Exit status 0, or 2 for bad usage, an id that names no
conversation, or an export that --output or stdout cannot take (one line on stderr), as `ask`. Titles and
messages are untrusted text: on a terminal, what it would act on is printed as an escape; an export
to a file is written as the export made it (agent/cli/output_file.py: whole or not at all, never through
a symbolic link).

The command line is the machine's operator (it holds the Redis password): it reads every conversation.
`--owner` (an email someone signed in with, or a person's id) narrows `list` and `show` to one person's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from agent.cli.output_file import OutputRefused, write_whole
from agent.contract import Role, Status
from agent.conversation import export, people, tree
from agent.conversation.errors import ConversationGone, NoSuchTurn, TurnInFlight
from agent.conversation.listing import DEFAULT_PAGE, info, list_conversations, retention_words
from agent.conversation.person_store import PersonStore
from agent.conversation.store import Store
from agent.conversation.turns import split_turns
from agent.hosting import services
from agent.settings import Settings
from agent.text.plain_text import plain_text, terminal_safe
from agent.text.visible import shown_json_text

EXIT_OK, EXIT_ENDED_BADLY, EXIT_USAGE = 0, 1, 2
MAX_LIST = 10_000  # the most `list --limit` prints


def add_parsers(sub, conversation_id_type) -> None:
    listing = sub.add_parser("list", help="the stored conversations, most recent first")
    listing.add_argument("--json", action="store_true", help="one JSON object a line, one per conversation")
    listing.add_argument("--limit", type=_limit, default=DEFAULT_PAGE, help=f"how many (default {DEFAULT_PAGE})")
    listing.add_argument("--filter", default=None, help="only those whose title contains this text")
    listing.add_argument("--owner", default=None, help=OWNER_HELP)
    show = sub.add_parser("show", help="one conversation, as text (or its stored state with --json)")
    show.add_argument("conversation", type=conversation_id_type)
    show.add_argument("--json", action="store_true", help="the stored state object")
    show.add_argument("--owner", default=None, help=OWNER_HELP)
    branches = sub.add_parser("branches", help="one conversation's tree of turns, and which branch is shown")
    branches.add_argument("conversation", type=conversation_id_type)
    branches.add_argument("--json", action="store_true", help="the tree as one JSON object")
    switch = sub.add_parser("switch", help="show the branch through a turn (down to its latest turn)")
    switch.add_argument("conversation", type=conversation_id_type)
    switch.add_argument("turn", help="a turn of the branch to show (`branches` lists them)")
    exporting = sub.add_parser("export", help="one conversation as a Markdown or JSON file")
    exporting.add_argument("conversation", type=conversation_id_type)
    exporting.add_argument("--format", choices=export.FORMATS, default="md", help="md (the default) or json")
    exporting.add_argument("--output", type=Path, default=None, help="write to this file (default: stdout)")
    exporting.add_argument("--all-branches", action="store_true",
                           help="Markdown: every branch, one after another (default: the branch shown)")


OWNER_HELP = "only a signed-in person's: the email they signed in with, or their id"


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value[:40]!r}") from None
    if not 1 <= number <= MAX_LIST:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_LIST:,}")
    return number


def run(args, settings: Settings) -> int:
    store = services.ensure(settings, workers=0).store(settings)
    owner = getattr(args, "owner", None)
    if owner is not None:
        person_id = people.find(store.redis, owner)
        if person_id is None:
            print(terminal_safe(f"error: nobody has signed in as {owner[:80]!r}"), file=sys.stderr)
            return EXIT_USAGE
        store = PersonStore(store, person_id)
    if args.command == "list":
        return _list(store, args)
    state = store.read(args.conversation)
    if state is None:
        if owner is not None:
            print(terminal_safe(f"error: {owner[:80]} has no conversation {args.conversation}"), file=sys.stderr)
            return EXIT_USAGE
        how = "was deleted" if store.was_deleted(args.conversation) else (
            f"was not found (conversations are kept for {retention_words(settings.state_ttl_s)} after their last "
            "message)")
        print(f"error: conversation {args.conversation} {how}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "switch":
        return _switch(store, args)
    if args.command == "branches":
        return _branches(store.branches(args.conversation), as_json=args.json)
    row = info(store, args.conversation)
    title = row.title if row else None
    if args.command == "show":
        if args.json:  # the stored state, and the tree as `branches --json` prints it
            _out(json.dumps({**state, "branches": store.branches(args.conversation)}, ensure_ascii=False),
                 escape=True)
        else:
            _show(state, title, people.describe(store.redis, state.get("owner")))
        return EXIT_OK
    if args.format == "json":  # the state, and the whole tree beside it
        text = export.to_json(state, tree.whole(store.redis, args.conversation, store.branches(args.conversation)))
    elif args.all_branches:
        tips = tree.leaves(store.branches(args.conversation))
        states = [state if tip == state["turn_id"] else store.read(args.conversation, tip=tip) for tip in tips]
        text = export.branches_to_markdown([s for s in states if s is not None], title)
    else:
        text = export.to_markdown(state, title)
    try:
        if args.output is not None:
            write_whole(args.output, text.encode("utf-8"))
        else:
            _to_stdout(text.rstrip("\n"))
    except OutputRefused as exc:
        print(terminal_safe(f"error: {exc}").replace("\n", "\\n"), file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _switch(store: Store, args) -> int:
    try:
        tip = store.switch(args.conversation, args.turn)
    except TurnInFlight as exc:
        print(terminal_safe(f"error: {exc}"), file=sys.stderr)
        return EXIT_ENDED_BADLY
    except (NoSuchTurn, ConversationGone) as exc:
        print(terminal_safe(f"error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    _out(f"showing the branch through {args.turn}, down to turn {tip}", escape=True)
    return EXIT_OK


def _branches(drawn: dict | None, *, as_json: bool) -> int:
    if drawn is None:
        return EXIT_USAGE
    if as_json:
        _out(json.dumps(drawn, ensure_ascii=False), escape=True)
        return EXIT_OK
    for turn in drawn["turns"]:
        siblings = turn["siblings"]
        place = f" ({siblings.index(turn['turn_id']) + 1} / {len(siblings)})" if len(siblings) > 1 else ""
        mark = "*" if turn["shown"] else " "
        _out(f"{mark} {'  ' * turn['depth']}{turn['turn_id']}{place} [{turn['status']}] {turn['first_words']}",
             escape=True)
    return EXIT_OK


def _to_stdout(text: str) -> None:
    """The export on stdout, or OutputRefused when stdout cannot take it (a full disk); a closed pipe ends
    the command quietly (agent/cli/main.py), as for any listing."""
    try:
        _out(text, escape=sys.stdout.isatty())
    except BrokenPipeError:
        raise
    except OSError as exc:
        # What stayed in stdout's buffer would fail again at exit, a second line on stderr: dropped.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        why = exc.strerror or type(exc).__name__
        raise OutputRefused(f"cannot write to standard output: {why[:1].lower()}{why[1:]}") from None


def _list(store: Store, args) -> int:
    listing = list_conversations(store, limit=args.limit, text=args.filter)
    for row in listing.conversations:
        if args.json:
            _out(json.dumps(row.to_dict(), ensure_ascii=False), escape=True)
        else:
            flight = " [awaiting approval]" if row.awaiting_approval else " [in flight]" if row.in_flight else ""
            _out(f"{row.conversation_id}  {_when(row.updated_at)}  {row.turns} turn{'s' * (row.turns != 1)}"
                 f"{flight}  {row.title}", escape=True)
    if not args.json and not listing.conversations:
        print("no conversations" + (" match that filter" if args.filter else ""), file=sys.stderr)
    return EXIT_OK


def _show(state, title: str | None, owner: str | None = None) -> None:
    _out(f"# {title or state['conversation_id']}  ({state['conversation_id']})", escape=True)
    if owner:
        _out(f"owner: {owner}", escape=True)
    for turn in split_turns(state):
        for message in turn.messages:
            role = message.get("role")
            if role == Role.USER:
                _out(f"\nyou: {message.get('content') or ''}", escape=True)
            elif role == Role.TOOL:
                _out(f"  [tool] {message.get('content') or ''}", escape=True)
            else:
                for call in message.get("tool_calls") or []:
                    function = call.get("function") or {}
                    arguments = shown_json_text(str(function.get("arguments") or "{}"), indent=None)
                    _out(f"  [calls {function.get('name')}] {arguments}", escape=True)
                if message.get("content"):
                    _out(plain_text(message["content"]), escape=True)
        summary = turn.summary or {}
        turn_id = summary.get("turn_id") or ""
        siblings = summary.get("siblings") or (state.get("siblings") if turn.current else None) or []
        status = f"[{summary.get('status')}]"
        if len(siblings) > 1 and turn_id in siblings:  # a fork: which of its branches this is
            status += f" (turn {turn_id}, branch {siblings.index(turn_id) + 1} of {len(siblings)})"
        _out(status, escape=True)
    request = state.get("approval")
    if state.get("status") == Status.AWAITING_APPROVAL and request and not request.get("answer"):
        cid, rid = state["conversation_id"], request["id"]
        _out(f"[approval needed] request {rid}: {request['name']} with "
             f"{shown_json_text(request['arguments'], indent=None)}: `python -m agent approve {cid} --request {rid}` "
             f"or `deny {cid} --request {rid}`, before {_when(request['expires_at'])}", escape=True)


def _out(text: str, *, escape: bool) -> None:
    print(terminal_safe(text) if escape else text, flush=True)


def _when(epoch_s: float) -> str:
    return dt.datetime.fromtimestamp(epoch_s).strftime("%Y-%m-%d %H:%M")
