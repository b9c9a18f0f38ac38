"""`python -m agent ask [--conversation ID] [--json] MESSAGE`: one turn through the same queue,
workers and state as the page, followed until `done`.

Exit status: 0 when the turn ended `done`; 1 when it ended failed, timed_out or cancelled;
2 for bad usage or configuration (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

import redis

from agent import services
from agent.queue import BadMessage, clean_message, get_queue, new_id, running_workers, submit_turn
from agent.settings import Settings, SettingsError
from agent.store import TurnInFlight
from agent.watch import lost_worker_check

EXIT_DONE, EXIT_ENDED_BADLY, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m agent")
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="ask one question and follow the turn until it is done")
    ask.add_argument("--conversation", help="continue this conversation id (default: a new one)")
    ask.add_argument("--json", action="store_true", help="print each state as one JSON object a line")
    ask.add_argument("message")
    args = parser.parse_args(argv)
    # A SIGTERM (a supervisor, `timeout`) stops the CLI like Ctrl-C: its Redis and workers stop too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return ask_and_follow(settings, args.message, args.conversation, as_json=args.json)
    except services.ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except redis.RedisError as exc:
        print(f"error: Redis failed: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    finally:
        services.shutdown()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def ask_and_follow(settings: Settings, message: str, conversation_id: str | None, *, as_json: bool) -> int:
    try:
        message = clean_message(message)  # before starting anything
    except BadMessage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # Its workers may pick up other clients' turns on the same Redis: on exit, let those finish.
    svc = services.ensure(settings, drain=True)
    store = svc.store(settings)
    queue_connection = svc.queue_connection()
    queue = get_queue(queue_connection)
    conversation_id = conversation_id or new_id()
    try:
        turn_id = submit_turn(store, queue, conversation_id, message, settings.turn)
    except BadMessage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TurnInFlight as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ENDED_BADLY
    if not as_json:
        print(f"conversation {conversation_id}, turn {turn_id}", file=sys.stderr)
    seen_version = None
    state = None
    printed_messages = 0
    hinted = False
    while True:
        # Wakes as soon as the worker writes; the poll interval bounds each wait.
        version = store.wait_version(conversation_id, seen_version, settings.poll_interval_ms)
        if version != seen_version:
            state = store.read_since(conversation_id, state)
            if state is None:
                print("error: the conversation expired before the turn ended", file=sys.stderr)
                return EXIT_ENDED_BADLY
            seen_version = state["version"]
            if as_json:
                print(json.dumps(state, ensure_ascii=False), flush=True)
            else:
                printed_messages = _print_new(state, printed_messages)
            # Our turn's ending: the current state, or its summary if another turn has started since.
            ended = state["status"] if state["done"] and state["turn_id"] == turn_id else next(
                (t["status"] for t in state["turns"] if t.get("turn_id") == turn_id), None)
            if ended is not None:
                return EXIT_DONE if ended == "done" else EXIT_ENDED_BADLY
        else:
            lost_worker_check(store, queue_connection, conversation_id, state)  # writes the ending if so
            if not hinted and state is not None and state["status"] == "queued" and not running_workers(queue):
                print("waiting for a worker: none is running (AGENT_WORKERS=0?); start one with "
                      "`python worker.py`", file=sys.stderr, flush=True)
                hinted = True


def _print_new(state: dict, printed: int) -> int:
    history = state["history"]
    for message in history[printed:]:
        role = message.get("role")
        if role == "user":
            continue
        if role == "tool":
            print(f"  [tool] {message.get('content', '')}", flush=True)
        elif message.get("tool_calls"):
            for call in message["tool_calls"]:
                fn = call.get("function", {})
                print(f"  [calls {fn.get('name')}] {fn.get('arguments')}", flush=True)
        else:
            print(message.get("content") or "", flush=True)
    if state["done"]:
        print(f"[{state['status']}]", file=sys.stderr, flush=True)
    return len(history)
