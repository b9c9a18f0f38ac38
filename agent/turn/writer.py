"""One turn's writes: what is pending goes out with the next write, and a write that failed is
reconciled with what Redis really holds, so nothing is lost or written twice.

A Redis hiccup mid-turn keeps the messages and steps pending for the next write. A write that
timed out may still have landed (Redis paused past the socket timeout runs it when it resumes):
the next write then finds the history longer than expected, and if the new tail is this turn's
own pending messages, the write counts as done. The final write is retried within the margin.

The text a model call is writing (`live`) goes out from a side thread, at most once per
LIVE_WRITE_INTERVAL_S: the turn's thread only adds to a buffer, so a fast model is not a Redis write
per token, and a stalled Redis never holds a call past its clocks. A live write that fails is
dropped; the next one carries the whole text. The write that appends the completed message (or
records the cut call's step) clears it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import redis

from agent.contract import CurrentStep, LiveStatus, Message, Step, TurnDoc, make_step, turn_summary
from agent.conversation import daily
from agent.conversation.endings import Ending, charged_in_flight
from agent.conversation.errors import StoreError
from agent.conversation.store import Store
from agent.conversation.writes import LiveHead
from agent.runtime.connection import STATE_RETRIES, STATE_SOCKET_TIMEOUT_S, redis_problem
from agent.text.redaction import cut
from agent.text.surrogates import scrub
from agent.turn.exits import TurnClosed
from agent.turn.response_limits import MAX_CONTENT_CHARS

log = logging.getLogger(__name__)

FINAL_WRITE_RESERVE_S = 1.0  # seconds before the job timeout when final-write retries give up
WORST_STATE_WRITE_S = STATE_SOCKET_TIMEOUT_S * (STATE_RETRIES + 1)  # one write against a stalled Redis
FINAL_RETRY_FIRST_S, FINAL_RETRY_MAX_S = 0.1, 1.0  # seconds between final-write attempts, doubling
LIVE_WRITE_INTERVAL_S = 0.1  # seconds: a turn writes its live text at most this often
MAX_LIVE_CHARS = MAX_CONTENT_CHARS  # characters of live text written: no more than the history will keep


class LiveText:
    """One turn's live text: `start` a text, `add` deltas (the turn's thread), `end` it; a side thread
    per text writes it at most once per `interval_s`. `writes` counts the live writes that landed."""

    def __init__(self, store: Store, conversation_id: str, turn_id: str, interval_s: float = LIVE_WRITE_INTERVAL_S,
                 max_chars: int = MAX_LIVE_CHARS, writer_job: str = ""):
        self.store = store
        self.writer_job = writer_job  # the job writing it: refused once the turn was handed to another
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.interval_s = interval_s
        self.max_chars = max_chars
        self.writes = 0
        self.seq = 0  # the current (or last) text's seq: 1, 2, ... per turn
        self._lock = threading.Lock()
        self._head: LiveHead | None = None  # None: no text is being written
        self._sent: list[str] = []  # the text's parts already handed to a write
        self._unsent: list[str] = []  # parts added since
        self._chars = 0  # characters kept (at most max_chars)
        self._arrived = 0  # characters that arrived, kept or not
        self._landed_bytes: int | None = None  # bytes of this text that Redis holds (None: unknown)
        self._wake = threading.Event()
        self._last_write = 0.0  # time.monotonic() of the last live write, for every text of the turn
        self._refused = False  # the turn was ended elsewhere: no more live writes

    def start(self, message_index: int, attempt: int) -> Callable[[str], None]:
        """A fresh text for the message at `message_index`; returns the `on_text` that adds to it."""
        with self._lock:
            self.seq += 1
            self._head = LiveHead(turn_id=self.turn_id, message_index=message_index, attempt=attempt,
                                  status=LiveStatus.WRITING, seq=self.seq)
            self._sent, self._unsent, self._chars, self._arrived, self._landed_bytes = [], [], 0, 0, None
            self._wake = threading.Event()
        threading.Thread(target=self._write_loop, args=(self.seq, self._wake), name="live-text", daemon=True).start()
        return self.add

    def add(self, delta: str) -> None:
        """A text delta, as the provider passes it (whole characters)."""
        if not delta:
            return
        with self._lock:
            self._arrived += len(delta)
            if self._head is None or self._chars >= self.max_chars:
                return
            room = self.max_chars - self._chars
            # Cut where a page reads the start of what the whole reads (not inside `&#1150`), and
            # nothing after the cut is added: the text would go on from somewhere else.
            self._chars = self.max_chars if len(delta) > room else self._chars + len(delta)
            delta = scrub(cut(delta, room))
            self._unsent.append(delta)
        self._wake.set()

    def end(self) -> tuple[int, str, int]:
        """Stop writing the text; returns its seq (0: none was started), the text kept (at most
        max_chars) and how many characters arrived."""
        with self._lock:
            if self._head is None:
                return 0, "", 0
            self._head = None
            text = "".join(self._sent) + "".join(self._unsent)
            self._sent, self._unsent = [], []
            wake = self._wake
        wake.set()  # its thread sees the text ended and leaves
        return self.seq, text, self._arrived

    def _write_loop(self, seq: int, wake: threading.Event) -> None:
        while True:
            wake.wait()
            wait_s = self._last_write + self.interval_s - time.monotonic()
            if wait_s > 0:
                time.sleep(wait_s)  # coalesce: what arrives meanwhile goes out in this write
            with self._lock:
                wake.clear()
                if self._head is None or self._head["seq"] != seq or self._refused:
                    return
                head, landed = self._head, self._landed_bytes
                delta = "".join(self._unsent)
                self._sent.append(delta)
                self._unsent = []
                text = delta if landed is not None else "".join(self._sent)
            self._last_write = time.monotonic()
            self._write(seq, head, text, landed)

    def _write(self, seq: int, head: LiveHead, text: str, landed: int | None) -> None:
        try:
            outcome = self.store.write_live(self.conversation_id, self.turn_id, head, text, from_bytes=landed,
                                            writer=self.writer_job)
            if outcome == "lag":  # an earlier write was lost: the whole text instead
                with self._lock:
                    if self._head is None or self._head["seq"] != seq:
                        return  # the text has ended meanwhile
                    text = "".join(self._sent)
                outcome = self.store.write_live(self.conversation_id, self.turn_id, head, text, writer=self.writer_job)
                landed = None
        except StoreError:
            self._refused = True  # ended elsewhere: the turn's next publish says so
            return
        except redis.RedisError as exc:
            log.info("turn %s: live write dropped, the next one carries the whole text: %s", self.turn_id,
                     redis_problem(exc))
            with self._lock:
                if self.seq == seq:
                    self._landed_bytes = None
            return
        if outcome != "ok":
            return
        self.writes += 1
        with self._lock:
            if self.seq == seq:
                self._landed_bytes = (landed or 0) + len(text.encode())


class StateWriter:
    """Writes one turn's state: `doc` (the small fields), and the messages and steps not yet written."""

    def __init__(self, store: Store, conversation_id: str, turn_id: str, doc: TurnDoc, persisted_len: int,
                 clock: Callable[[], float], writer_job: str = "", turn_start: int | None = None):
        self.store = store
        self.writer_job = writer_job  # the job writing the turn ("": any): refused once another took it over
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.doc = doc
        self.persisted_len = persisted_len  # messages of the stored history (the path to this turn, this turn's)
        # where this turn's messages start in it (its person's message; default: the last one stored): the store
        # keeps each turn's messages in its own record, and checks how many this one has
        self.turn_start = persisted_len - 1 if turn_start is None else turn_start
        self.clock = clock
        self.pending_messages: list[Message] = []
        self.pending_steps: list[Step] = []
        self.step_index = 0  # steps recorded by this turn
        self.unconfirmed: list[tuple[int, int]] = []  # (messages, steps) held by writes that failed
        self.last_write_at = 0.0  # clock time of the last write that landed
        self.live = LiveText(store, conversation_id, turn_id, writer_job=writer_job)
        self.live_to_clear = 0  # the seq of an ended live text the next write clears (0: none)

    def add_message(self, message: Message) -> None:
        self.pending_messages.append(message)

    def add_step(self, kind: str, name: str, started_at: float, outcome: str, **extra) -> Step:
        self.step_index += 1
        step = make_step(self.turn_id, self.step_index, kind, name, started_at, self.clock(), outcome, **extra)
        self.pending_steps.append(step)
        return step

    def set_current(self, kind: str | None, name: str = "", timeout_s: float | None = None,
                    call_id: str | None = None) -> None:
        current = CurrentStep(kind=kind, name=name, started_at=self.clock(), timeout_s=timeout_s)
        if call_id is not None:
            current["call_id"] = call_id
        self.doc["current_step"] = None if kind is None else current

    def start_live(self, attempt: int) -> Callable[[str], None]:
        """A fresh live text for the message the call will add; returns the call's `on_text`."""
        return self.live.start(self.persisted_len + len(self.pending_messages), attempt)

    def end_live(self) -> tuple[str, int]:
        """The call is over: its live text stops and is cleared by the next write. Returns the text
        (at most MAX_LIVE_CHARS) and how many characters had arrived."""
        seq, text, arrived = self.live.end()
        if seq:
            self.live_to_clear = seq
        return text, arrived

    def since_last_write_s(self) -> float:
        return self.clock() - self.last_write_at

    def has_news(self) -> bool:
        """Steps not yet written, or a step that started after the last write."""
        current = self.doc.get("current_step") or {}
        return bool(self.pending_steps) or current.get("started_at", 0) > self.last_write_at

    def flush(self, *, done: bool = False, summary=None, reconciled: bool = False, durable: bool = False) -> None:
        """Write what is pending. A Redis hiccup mid-turn keeps it pending for the next write; with
        `durable` (or `done`) it is raised as well: the caller must know the write landed before it goes on."""
        try:
            self.store.publish(self.conversation_id, self.turn_id, self.doc, done=done,
                               new_messages=self.pending_messages, new_steps=self.pending_steps,
                               expected_turn_len=self.persisted_len - self.turn_start, summary=summary,
                               end_live=self.live_to_clear, writer=self.writer_job)
        except StoreError as exc:
            if exc.reason == "CONFLICT" and not reconciled and self._landed_already():
                self.flush(done=done, summary=summary, reconciled=True, durable=durable)
                return
            raise TurnClosed(str(exc)) from exc
        except redis.RedisError as exc:
            # It may still land (a timed-out write that Redis runs later): remember what it held.
            self.unconfirmed.append((len(self.pending_messages), len(self.pending_steps)))
            if done or durable:
                raise
            log.warning("turn %s: state write failed, kept for the next write: %s", self.turn_id, redis_problem(exc))
            return
        self.persisted_len += len(self.pending_messages)
        self.pending_messages = []
        self.pending_steps = []
        self.unconfirmed = []
        self.live_to_clear = 0
        self.last_write_at = self.clock()

    def _landed_already(self) -> bool:
        """True when the turn's messages "moved" only by our own pending messages.

        Only this job appends to its turn's messages, so if the new tail is our own pending
        messages, a write that timed out landed: count it as written instead of giving up the turn."""
        try:
            landed = self.store.turn_messages_since(self.conversation_id, self.turn_id,
                                                    self.persisted_len - self.turn_start)
        except redis.RedisError:
            return False
        if not landed or landed != json.loads(json.dumps(self.pending_messages[: len(landed)])):
            return False
        log.warning("turn %s: a write that timed out had landed; carrying on", self.turn_id)
        # The batch that landed is one of the failed attempts: its steps landed with its messages.
        steps_landed = next((n_steps for n_messages, n_steps in self.unconfirmed if n_messages == len(landed)), 0)
        self.pending_steps = self.pending_steps[steps_landed:]
        self.unconfirmed = []
        self.persisted_len += len(landed)
        self.pending_messages = self.pending_messages[len(landed):]
        return True

    def write_ending(self, ending: Ending, job_timeout_at: float) -> bool:
        """The final write (done), retried briefly if Redis hiccups, giving up just before the queue's kill.
        False when it was refused: the turn was ended, or resumed, elsewhere."""
        self.set_current(None)
        now = self.clock()
        self.doc.update(status=ending.status, error=ending.error, ended_at=now)
        # A call the provider never answered (the queue's alarm or a cold stop cut it): billed, perhaps.
        self.doc["spend"] = charged_in_flight(self.doc.get("spend"))
        summary = turn_summary(self.turn_id, self.doc, now)
        give_up_at = job_timeout_at - FINAL_WRITE_RESERVE_S
        delay = FINAL_RETRY_FIRST_S
        while True:
            try:
                self.flush(done=True, summary=summary)
                daily.settle(self.store.redis, (self.doc.get("config") or {}).get("daily"), self.turn_id,
                             daily.spent_of(self.doc.get("spend")))
                return True
            except TurnClosed:
                return False
            except redis.RedisError as exc:
                # A retry that could still be blocked when the queue's alarm fires is not started.
                if time.time() + delay + WORST_STATE_WRITE_S >= give_up_at:
                    # The job then ends without its ending: a front end's lost-worker check writes one
                    # as soon as Redis takes writes again (a job that finished with a running state).
                    log.error("turn %s: final write failed, leaving the ending to the front ends: %s",
                              self.turn_id, redis_problem(exc))
                    return True  # not refused: the front ends write it
                time.sleep(delay)
                delay = min(delay * 2, FINAL_RETRY_MAX_S)
