"""`python -m agent ask [--conversation ID] [--json] [--tools a,b] MESSAGE`: one turn through the same queue,
workers and state as the page, followed until `done`. `regenerate ID [--turn TURN]` and `edit ID TURN MESSAGE`
start a turn beside TURN (a new answer to its message, or a new message in its place) and follow it the same way.
`list [--json]`, `show ID [--json]` and
`export ID [--format md|json]` read the stored conversations (agent/cli/conversations.py); `approve ID`
and `deny ID` answer a parked turn's request for approval (agent/cli/approvals.py); `tools [--json]`
lists the tools the workers offer, and which ask a person first (agent/cli/tools.py).

Exit status: 0 when the turn ended `done`; 1 when it ended failed, timed_out or cancelled, or when
Redis went away (or refused writes: a full disk or memory) for longer than the turn's clocks; 2 for
bad usage or configuration, a conversation that was not found or cannot be read included, or
services that could not start (one line on stderr, nothing sent): an embedded Redis that runs but
does not answer is waited for first, for AGENT_REDIS_WAIT seconds (said on stderr), and left running;
141, without a word, when stdout's reader left (`| head`), as for any Unix tool.

Output: each version prints only what it added. Text: the reply's text as it is written, then the
turn's new messages, Markdown emphasis dropped; a text cut off or stopped mid-way is marked so, and
each model call's tokens go to stderr. `--json`: one JSON object a line; every line but the last is
a delta (`"delta": true`: the small fields of the state, and the history, steps and turn summaries
appended since the line before, as `new_history` from index `history_from`, and so on; the live
text as `live` without its text, and `live_delta`, its characters from index `live_from`); the last
line is the whole stored state object (`"delta": false`). A turn of thousands of steps prints
kilobytes per step, not the whole state again on every version.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace

import redis

from agent.cli import approvals as approvals_cli
from agent.cli import conversations as conversations_cli
from agent.cli import tools as tools_cli
from agent.cli.output import JsonLines, TextLines
from agent.contract import Role, State, Status
from agent.conversation.errors import ConversationFull, ConversationGone, NoSuchTurn, StoreFull, TurnInFlight
from agent.conversation.keys import CONVERSATION_ID_RE, is_conversation_id
from agent.conversation.listing import retention_words
from agent.conversation.store import Store
from agent.conversation.turns import split_turns
from agent.conversation.well_formed import UnreadableState
from agent.conversation.words import EXIT_ENDED_BADLY, exit_status
from agent.hosting import services
from agent.hosting.lost_worker import lost_worker_check
from agent.queue import BadMessage, clean_message, get_queue, new_id, running_workers, submit_turn
from agent.runtime.connection import describe, is_disk_error, is_memory_error, redis_problem
from agent.settings import Settings, settings_for_command
from agent.text.plain_text import terminal_safe
from agent.text.visible import shown_json_text
from agent.tools.registry import TOOL_NAME

EXIT_USAGE = 2
EXIT_READER_LEFT = 128 + signal.SIGPIPE  # 141: what a shell reports for a tool that stopped at a closed pipe
# Redis errors that pass (a pause, a restart, a failover, loading its data after a restart): retried.
# So is a Redis out of memory (is_memory_error): it still serves reads, and takes writes again once
# memory is freed, while the turn goes on.
TRANSIENT_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
# Seconds past the turn's job timeout (or past the outage's start, if later) before the CLI stops
# waiting for Redis: room for a restart, yet a bound on a CLI that follows a turn nobody can finish.
REDIS_OUTAGE_GRACE_S = 10.0
REDIS_RETRY_PAUSE_S = 0.5  # seconds between attempts while Redis is away
# Seconds a turn may wait for a worker before the CLI says none is running: a pool this command
# just started takes a moment to register its workers.
WORKER_HINT_AFTER_S = 5.0
SHOWN_ID_CHARS = 40  # characters of a refused id repeated in its error line
SHOWN_ERROR_CHARS = 300  # characters of an unexpected error's line


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m agent")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="ask one question and follow the turn until it is done")
    ask.add_argument("--conversation", type=_conversation_id,
                     help="continue this conversation id (default: a new one)")
    ask.add_argument("--json", action="store_true",
                     help="print each version as one JSON object a line: what changed, then the whole final state")
    ask.add_argument("--tools", type=_tool_names,
                     help="offer only these tools, comma-separated (default: every tool the workers have)")
    ask.add_argument("message")
    regenerate = sub.add_parser("regenerate",
                                help="a new answer for a turn, on a branch of its own (followed as `ask`)")
    regenerate.add_argument("conversation", type=_conversation_id)
    regenerate.add_argument("--turn", default=None, help="the turn to answer again (default: the last one shown)")
    regenerate.add_argument("--json", action="store_true", help="as `ask --json`")
    edit = sub.add_parser("edit", help="a turn's message replaced, on a branch of its own (followed as `ask`)")
    edit.add_argument("conversation", type=_conversation_id)
    edit.add_argument("turn", help="the turn whose message is replaced (`branches` lists them)")
    edit.add_argument("message")
    edit.add_argument("--json", action="store_true", help="as `ask --json`")
    conversations_cli.add_parsers(sub, _conversation_id)
    approvals_cli.add_parsers(sub, _conversation_id)
    tools_cli.add_parser(sub)
    args = parser.parse_args(argv)
    # A SIGTERM (a supervisor, `timeout`) stops the CLI like Ctrl-C: its Redis and workers stop too.
    _interrupted.clear()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    settings = settings_for_command()
    if settings is None:
        return EXIT_USAGE
    if getattr(args, "tools", None) is not None:
        settings = replace(settings, turn=settings.turn.with_changes(tools=args.tools))
    try:
        if args.command in approvals_cli.COMMANDS:
            return approvals_cli.run(args, settings)
        if args.command == tools_cli.COMMAND:
            return tools_cli.run(args, settings)
        if args.command in BRANCHING:
            return branch_and_follow(settings, args)
        if args.command != "ask":
            return conversations_cli.run(args, settings)
        return ask_and_follow(settings, args.message, args.conversation, as_json=args.json)
    except services.ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except redis.RedisError as exc:  # not bad usage: Redis refused (a full disk) or failed mid-way
        print(f"error: Redis failed: {redis_problem(exc)}", file=sys.stderr)
        return EXIT_ENDED_BADLY
    except UnreadableState as exc:  # became unreadable while sending or following
        print(terminal_safe(f"error: {exc}; leave out --conversation to start a new one"), file=sys.stderr)
        return EXIT_ENDED_BADLY
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout's reader left (`| head`): a listing ends there, quietly
        return reader_left()
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback (what was stored may be anything)
        print(terminal_safe(f"error: {type(exc).__name__}: {exc}"[:SHOWN_ERROR_CHARS]), file=sys.stderr)
        return EXIT_ENDED_BADLY
    finally:
        services.shutdown()


# Set by the handler below. Python runs a signal handler between any two bytecodes, finalisers included,
# and a KeyboardInterrupt raised inside a finaliser is printed and dropped: the flag is not.
_interrupted = threading.Event()


def _interrupt(signum, frame):
    _interrupted.set()
    raise KeyboardInterrupt


def reader_left() -> int:
    """Exit as a Unix tool whose pipe closed does, without a word: stdout goes to /dev/null first, so that
    what is left in its buffer does not fail again at exit (Python's docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_READER_LEFT


def raise_if_interrupted() -> None:
    """A Ctrl-C or SIGTERM whose KeyboardInterrupt was lost (see `_interrupted`) stops the CLI here."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


def _tool_names(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    if not all(TOOL_NAME.match(name) for name in names):
        raise argparse.ArgumentTypeError(f"tool names are letters, digits, '_' and '-', separated by commas: {value!r}")
    return names


def _conversation_id(value: str) -> str:
    if not is_conversation_id(value):
        # ascii(): a newline, an escape sequence or a byte that is not UTF-8 is shown, not acted on.
        shown = ascii(value[:SHOWN_ID_CHARS])
        if len(value) > SHOWN_ID_CHARS:
            shown += f"... ({len(value):,} characters)"
        raise argparse.ArgumentTypeError(
            f"not a conversation id: {shown}; an id is 1 to 64 letters, digits, '-' or '_' "
            f"({CONVERSATION_ID_RE.pattern})")
    return value


BRANCHING = ("regenerate", "edit")


def branch_and_follow(settings: Settings, args) -> int:
    """`regenerate` (the turn's own message again) and `edit` (a new one): a new turn beside it, with its parent,
    followed as `ask` follows one."""
    edited = None
    if args.command == "edit":
        try:
            edited = clean_message(args.message)  # before starting anything
        except BadMessage as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    svc = services.ensure(settings, drain=True)
    store = svc.store(settings)
    refused = _refuse_unknown(store, settings, args.conversation)
    if refused is not None:
        return refused
    turn = args.turn or store.read(args.conversation)["turn_id"]
    message = edited if edited is not None else _message_of(store, args.conversation, turn)
    if message is None:
        print(terminal_safe(f"error: conversation {args.conversation} has no turn {turn[:SHOWN_ID_CHARS]!r}: "
                            f"`python -m agent branches {args.conversation}` lists its turns"), file=sys.stderr)
        return EXIT_USAGE
    return ask_and_follow(settings, message, args.conversation, as_json=args.json, branch_of=turn, services_=svc)


def _message_of(store: Store, conversation_id: str, turn_id: str) -> str | None:
    """The message a turn answers: from its record, or (a conversation of the flat shape, not yet moved into the
    tree) from the state's turns."""
    message = store.turn_message(conversation_id, turn_id)
    if message is None:
        state = store.read(conversation_id)
        message = next((view.messages[0] for view in split_turns(state) if view.summary.get("turn_id") == turn_id
                        and view.messages and view.messages[0].get("role") == Role.USER), None)
    return None if message is None else str(message.get("content") or "")


def ask_and_follow(settings: Settings, message: str, conversation_id: str | None, *, as_json: bool,
                   branch_of: str = "", services_=None) -> int:
    try:
        message = clean_message(message)  # before starting anything
    except BadMessage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Its workers may pick up other clients' turns on the same Redis: on exit, let those finish.
    svc = services_ or services.ensure(settings, drain=True)
    store = svc.store(settings)
    # The store's client, not RQ's usual one (no socket timeout): the CLI only enqueues and reads job
    # status, and a Redis that stops answering must not hang it past the turn's clocks.
    queue_connection = store.redis
    queue = get_queue(queue_connection)
    outage = Outage(describe(svc.redis_url), settings.turn.job_timeout_s)
    if conversation_id is not None:
        refused = _refuse_unknown(store, settings, conversation_id)
        if refused is not None:
            return refused
    continuing = conversation_id is not None
    conversation_id = conversation_id or new_id()
    turn_id = new_id()  # the same id on a retry: a submit that landed is not sent twice
    failed = _send(store, queue, outage, settings, conversation_id, turn_id, message, must_exist=continuing,
                   branch_of=branch_of)
    if failed is not None:
        return failed
    if not as_json:
        print(f"conversation {conversation_id}, turn {turn_id}", file=sys.stderr)
    follower = Follower(store, queue_connection, queue, conversation_id, turn_id, settings.poll_interval_ms, as_json)
    return _follow(follower, outage)


def _refuse_unknown(store: Store, settings: Settings, conversation_id: str) -> int | None:
    """The exit status when the conversation to continue cannot be sent into; None when it can."""
    try:
        # The small fields whole, not just the version, as the page does: a state that cannot be read
        # is said, and nothing is sent into it.
        unknown = store.read_meta(conversation_id) is None
    except UnreadableState as exc:
        print(terminal_safe(f"error: {exc}; nothing was sent: leave out --conversation to start a new one"),
              file=sys.stderr)
        return EXIT_USAGE
    if unknown:
        # As the page does: an unknown id is not quietly made a new conversation under that name.
        print(_not_found(store, settings, conversation_id), file=sys.stderr)
        return EXIT_USAGE
    return None


def _send(store: Store, queue, outage: Outage, settings: Settings, conversation_id: str, turn_id: str,
          message: str, *, must_exist: bool, branch_of: str = "") -> int | None:
    """Submit the turn, retried while Redis is away; the exit status when it was not sent, else None."""
    while True:
        try:
            submit_turn(store, queue, conversation_id, message, settings.turn, turn_id=turn_id,
                        must_exist=must_exist, branch_of=branch_of)
            break
        except NoSuchTurn as exc:
            print(terminal_safe(f"error: {exc}"), file=sys.stderr)
            return EXIT_USAGE
        except BadMessage as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except ConversationGone:  # expired or deleted between the check above and the send
            print(_not_found(store, settings, conversation_id), file=sys.stderr)
            return EXIT_USAGE
        except (ConversationFull, StoreFull) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ENDED_BADLY
        except TurnInFlight as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ENDED_BADLY
        except (*TRANSIENT_REDIS_ERRORS, redis.ResponseError) as exc:
            if isinstance(exc, redis.ResponseError) and not is_memory_error(exc):
                if not is_disk_error(exc):
                    raise
                print(f"error: {redis_problem(exc)}. Nothing was sent.", file=sys.stderr)
                return EXIT_ENDED_BADLY
            if outage.gives_up(exc, None):
                print(outage.sentence(conversation_id, "while sending the message (it may not have been sent)"),
                      file=sys.stderr)
                return EXIT_ENDED_BADLY
            time.sleep(REDIS_RETRY_PAUSE_S)
    outage.clear()
    return None


def _follow(follower: Follower, outage: Outage) -> int:
    """Follow the turn until it ends, retried while Redis is away; its exit status."""
    while True:
        raise_if_interrupted()
        try:
            ended = follower.step()
        except (*TRANSIENT_REDIS_ERRORS, redis.ResponseError) as exc:
            if isinstance(exc, redis.ResponseError) and not is_memory_error(exc):
                if not is_disk_error(exc):
                    raise
                # Only the ending of a turn past its clocks is written from here; Redis refused it.
                print(f"error: {redis_problem(exc)}. This turn's ending could not be recorded; it will be once "
                      f"Redis can write again (open the page with ?c={follower.conversation_id}).", file=sys.stderr)
                return EXIT_ENDED_BADLY
            if outage.gives_up(exc, follower.state):
                print(outage.sentence(follower.conversation_id, "while following the turn; the turn may still finish"),
                      file=sys.stderr)
                return EXIT_ENDED_BADLY
            time.sleep(REDIS_RETRY_PAUSE_S)
            continue
        outage.clear()
        if ended is not None:
            return ended


def _not_found(store: Store, settings: Settings, conversation_id: str) -> str:
    if store.was_deleted(conversation_id):
        return f"error: conversation {conversation_id} was deleted; nothing was sent: leave out --conversation " \
               "to start a new one"
    return (f"error: conversation {conversation_id} was not found (conversations are kept for "
            f"{retention_words(settings.state_ttl_s)} after their last message); nothing was sent: leave out "
            "--conversation to start a new one")


@dataclass
class Outage:
    """Redis errors in a row: how long they have lasted, and when the CLI stops waiting.

    It gives up no later than the turn's job timeout plus REDIS_OUTAGE_GRACE_S (counted from the
    outage's start for a turn that has not started yet, or one already past its clocks): by then
    the turn has ended, or will never end by itself."""

    where: str
    job_timeout_s: float
    since: float | None = None  # time.time() of the first error in a row
    last_error: str = ""
    refusing: bool = False  # the last error was Redis refusing writes (out of memory), not a lost connection

    def gives_up(self, exc: BaseException, state: State | None) -> bool:
        now = time.time()
        if self.since is None:
            self.since = now
        self.last_error = redis_problem(exc)
        self.refusing = is_memory_error(exc)
        job_timeout_at = (state and state["job_timeout_at"]) or self.since + self.job_timeout_s
        return now >= max(job_timeout_at, self.since) + REDIS_OUTAGE_GRACE_S

    def clear(self) -> None:
        self.since = None

    def sentence(self, conversation_id: str, what: str) -> str:
        lasted = time.time() - (self.since or time.time())
        trouble = f"Redis at {self.where} refused writes" if self.refusing else \
            f"lost the connection to Redis at {self.where}"
        return (f"error: {trouble} for {lasted:.0f} s {what} "
                f"({self.last_error}): run `python -m agent ask --conversation {conversation_id} MESSAGE` "
                f"later to continue it, or open the page with ?c={conversation_id} to see it.")


@dataclass
class Follower:
    """Follows one turn, printing what each new version added. `step` may raise a Redis error at any
    point before it prints: a retry then does the same step again, and nothing is printed twice."""

    store: Store
    queue_connection: redis.Redis
    queue: object
    conversation_id: str
    turn_id: str
    poll_interval_ms: int
    as_json: bool
    state: State | None = None
    hinted: bool = False
    told_request: str = ""  # the id of the request for approval last told on stderr
    started: float = field(default_factory=time.monotonic)
    printer: JsonLines | TextLines = field(init=False)

    def __post_init__(self) -> None:
        self.printer = JsonLines(self.turn_id) if self.as_json else TextLines(self.turn_id)

    def gone(self) -> int:
        how = "was deleted" if self.store.was_deleted(self.conversation_id) else "expired"
        print(f"error: the conversation {how} before the turn ended", file=sys.stderr)
        return EXIT_ENDED_BADLY

    def step(self) -> int | None:
        """One wait for a new version; the exit status once our turn has ended, else None."""
        seen = self.state["version"] if self.state else None
        # Wakes as soon as the worker writes; the poll interval bounds each wait.
        version = self.store.wait_version(self.conversation_id, seen, self.poll_interval_ms)
        if version is None:  # it existed when the turn was sent: deleted or expired since, even before a first read
            return self.gone()
        if version == seen:
            # Nothing new: is anyone still going to write? If not, this writes the ending.
            lost_worker_check(self.store, self.queue_connection, self.conversation_id, self.state)
            self.hint_if_no_worker()
            return None
        state = self.store.read_since(self.conversation_id, self.state)
        if state is None:
            return self.gone()
        # Our turn's ending: the current state, or its summary if another turn has started since.
        ended = state["status"] if state["done"] and state["turn_id"] == self.turn_id else next(
            (t["status"] for t in state["turns"] if t["turn_id"] == self.turn_id), None)
        self.printer.print(state, final=ended is not None)
        self.tell_request(state)
        self.state = state
        if ended is None:
            return None
        if not self.as_json:
            spend = state.get("spend") if state["turn_id"] == self.turn_id else next(
                (t.get("spend") for t in state["turns"] if t["turn_id"] == self.turn_id), None)
            self.printer.print_tokens(spend)
            print(f"[{ended}]", file=sys.stderr, flush=True)
        return exit_status(ended)

    def tell_request(self, state: State) -> None:
        """Once per request: what the parked turn waits for, and how to answer it (stderr)."""
        request = state.get("approval")
        if (state["status"] != Status.AWAITING_APPROVAL or not request or request.get("answer")
                or request["id"] == self.told_request):
            return
        self.told_request = request["id"]
        wait_s = max(0.0, request["expires_at"] - time.time())
        print(terminal_safe(f"[approval needed] request {request['id']}: the model wants to run {request['name']} "
                            f"with {shown_json_text(request['arguments'], indent=None)}"), file=sys.stderr, flush=True)
        print(terminal_safe(f"  answer with `python -m agent approve {self.conversation_id} --request {request['id']}` "
                            f"or `python -m agent deny {self.conversation_id} --request {request['id']}` (or on the "
                            f"page); it expires in {wait_s:.0f} s"), file=sys.stderr, flush=True)

    def hint_if_no_worker(self) -> None:
        """Once, a turn still queued after WORKER_HINT_AFTER_S with no worker running says how to start one."""
        if (not self.hinted and time.monotonic() - self.started > WORKER_HINT_AFTER_S
                and self.state is not None and self.state["status"] == Status.QUEUED
                and not running_workers(self.queue)):
            print("waiting for a worker: none is running (AGENT_WORKERS=0?); start one with "
                  "`python worker.py`", file=sys.stderr, flush=True)
            self.hinted = True
