"""The page in headless Chromium, following turns in real time: how soon a streamed word shows, how
soon Stop is answered and ends the turn, how soon the page settles after a turn's final write, how
many writes a streaming turn makes, and what the page's drawing costs against the conversation's
length, on an idle machine and beside CPU hogs.

Each condition runs its own `streamlit run app.py` (embedded Redis, two workers) against a scripted
model on loopback that streams its reply word by word and notes when each word left it. Earlier
turns are written through the same queue and workers with the instant demo model, then the page is
reloaded on the conversation and a few turns are asked in the browser, as a person would.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from agent.conversation.store import Store
from agent.queue import get_queue, submit_turn
from agent.runtime.connection import queue_client, state_client
from agent.settings import Settings
from harness.follow import states
from harness.page import (
    STOP_WATCH_JS,
    WORD_WATCH_JS,
    WireLog,
    chromium,
    chromium_available,
    conversation_id,
    cpu_hogs,
    open_chat,
    page_server,
    send,
    stop_times,
    wait_settled,
    words_seen,
)
from harness.stats import summary
from harness.stream_model import StreamModel, page_env, stream_model_server, word

WORDS = 30  # words per measured reply
WORD_GAP_S = 0.1  # seconds between words: a reply streams for about 3 s
NEW_CHATS = 4  # replies timed in a new chat per condition, beside those in a running conversation
STOP_WORDS = 600  # a reply long enough to be stopped midway
STOP_AFTER_WORDS = 5  # Stop is clicked once this many words are on screen
POLL_INTERVAL_MS = 1000  # AGENT_POLL_INTERVAL_MS's default
SETTLE_TIMEOUT_S = 90  # seconds for one turn to settle before the benchmark gives up on it
STOP_LOST_S = 30  # seconds after which a Stop whose ending has not shown is clicked again (and reported)
PREPARE_TIMEOUT_S = 30  # seconds for one earlier turn (instant model) to end
PREPARE_WAIT_S = 0.5  # seconds each wait for that turn's next write may take
STATE_TTL_S = 3600  # seconds: nothing expires during a run


def question(n: int) -> str:
    return f"Tell me story number {n}."


def page_cost(lengths: tuple[int, ...], turns_per_length: int, hogs: tuple[int, ...], workdir: Path,
              progress, stops: int = 6, new_chats: int = NEW_CHATS) -> dict | None:
    """Per condition (number of CPU hogs): per conversation length, and Stop's figures."""
    if not chromium_available():
        progress("no chromium: the page section is skipped (apt-get install chromium)")
        return None
    conditions = {}
    for count in hogs:
        label = f"{count} CPU hogs" if count else "idle"
        progress(f"page in Chromium, {label}: lengths {', '.join(map(str, lengths))}, {new_chats} new chats, "
                 f"then {stops} stops")
        conditions[label] = _condition(lengths, turns_per_length, stops, count, workdir / f"hogs-{count}", new_chats)
    return {"lengths": list(lengths), "turns_per_length": turns_per_length, "conditions": conditions}


def _condition(lengths: tuple[int, ...], turns_per_length: int, stops: int, hog_count: int,
               directory: Path, new_chats: int = NEW_CHATS) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    model = StreamModel(words=WORDS, gap_s=WORD_GAP_S)
    server_of_model = stream_model_server(model)
    env = {**page_env(server_of_model), "AGENT_POLL_INTERVAL_MS": str(POLL_INTERVAL_MS),
           "AGENT_STATE_TTL": str(STATE_TTL_S)}
    rows, writes_per_s = [], []
    replies: list[tuple[bool, list[float]]] = []  # (in a new chat, each word's time to the screen, in order)
    try:
        with page_server(directory / "data", directory / "streamlit.log", env) as server, chromium() as browser:
            context = browser.new_context(viewport={"width": 1280, "height": 1000})
            context.add_init_script(WORD_WATCH_JS)
            context.add_init_script(STOP_WATCH_JS)
            page = context.new_page()
            wire = WireLog()
            wire.attach(page)
            open_chat(page, server.url)
            url = server.redis_url()
            store, queue = Store(state_client(url), STATE_TTL_S), get_queue(queue_client(url))
            instant = Settings.from_env({}).turn.with_changes(provider="demo", model="demo@0.05~0")
            cid, made = None, 0
            with cpu_hogs(hog_count):
                for length in lengths:
                    while cid and made < length - 1:  # earlier turns, through the queue, instantly
                        made += 1
                        _ask_directly(store, queue, cid, question(made), instant)
                    if cid:
                        open_chat(page, f"{server.url}?c={cid}")  # a fresh page on the longer conversation
                    settle, draws, sizes, updates, full_runs = [], [], [], [], []
                    for _ in range(turns_per_length):
                        made += 1
                        first = model.next_word
                        new_chat = cid is None
                        mark = len(wire.runs)
                        before = store.version(cid) if cid else 0
                        send(page, question(made), timeout_s=SETTLE_TIMEOUT_S)
                        cid = cid or conversation_id(page)
                        settled_at = wait_settled(page, word(first + WORDS - 1), timeout_s=SETTLE_TIMEOUT_S)
                        final = store.read_meta(cid)
                        settle.append(settled_at - final["updated_at"])
                        writes_per_s.append(_writes_per_s(final, before))
                        replies.append((new_chat, _reply_word_s(page, model, first)))
                        ticks = [r for r in wire.finished(mark, fragment=True) if r.draw_s is not None]
                        draws += [r.draw_s for r in ticks]
                        sizes += [r.draw_bytes for r in ticks]
                        updates += [b for r in ticks for b in r.update_bytes]
                        # The full run that ended the turn (the last of the turn's full runs).
                        full_runs += [r.duration_s for r in wire.finished(mark, fragment=False)[-1:]]
                    rows.append({
                        "turns": length,
                        "tick_draw_ms": summary(draws, scale=1000),
                        "tick_bytes": summary(sizes, digits=0),
                        "update_bytes": summary(updates, digits=0),
                        "full_run_ms": summary(full_runs, scale=1000),
                        "settle_s": summary(settle, digits=2),
                    })
                replies += [(True, words) for words in _new_chats(page, server.url, model, new_chats)]
                stop = _stops(page, model, stops, store)
            store.redis.close()
    finally:
        server_of_model.stop()
    return {"lengths": rows, **word_figures(replies), "writes_per_s": summary(writes_per_s, digits=1), **stop}


def word_figures(replies: list[tuple[bool, list[float]]]) -> dict:
    """Every word of every reply (the first included, new chats included), then the first word apart,
    and the new chats' words apart (ms)."""
    def words(keep) -> list[float]:
        return [s for new_chat, reply in replies if keep(new_chat) for s in reply]

    return {"word_to_screen_ms": summary(words(lambda _: True), scale=1000),
            "first_word_ms": summary([reply[0] for _, reply in replies if reply], scale=1000),
            "new_chat_word_ms": summary(words(lambda new_chat: new_chat), scale=1000),
            "new_chat_first_word_ms": summary([reply[0] for new_chat, reply in replies if new_chat and reply],
                                              scale=1000)}


def _reply_word_s(page, model: StreamModel, first: int) -> list[float]:
    """Each word of the reply that starts at word `first`: leaving the model to on screen (s), in order."""
    seen = words_seen(page)
    return [seen[word(n)] - model.sent[word(n)] for n in range(first, first + WORDS)
            if word(n) in seen and word(n) in model.sent]


def _new_chats(page, url: str, model: StreamModel, count: int) -> list[list[float]]:
    """`count` replies, each the first of a new chat (the page opened afresh, as a person starts one)."""
    replies = []
    for n in range(count):
        open_chat(page, url)
        first = model.next_word
        send(page, question(1000 + n), timeout_s=SETTLE_TIMEOUT_S)
        wait_settled(page, word(first + WORDS - 1), timeout_s=SETTLE_TIMEOUT_S)
        replies.append(_reply_word_s(page, model, first))
    return replies


def _stops(page, model: StreamModel, count: int, store: Store) -> dict:
    """Stop clicked mid-stream: click to "Stopping…", and click to the turn ended on screen (browser clock).
    A Stop whose ending has not shown after STOP_LOST_S is clicked again and listed (stops_clicked_again)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    acknowledged, ended, unanswered = [], [], []
    model.words = STOP_WORDS
    try:
        for n in range(count):
            first = model.next_word
            page.reload()  # a fresh click watch
            send(page, f"Tell me a very long story, number {n}.", timeout_s=SETTLE_TIMEOUT_S)
            page.get_by_text(word(first + STOP_AFTER_WORDS - 1)).first.wait_for(timeout=SETTLE_TIMEOUT_S * 1000)
            page.get_by_role("button", name="Stop").click()
            try:
                ended_at = wait_settled(page, "Stopped.", timeout_s=STOP_LOST_S)
            except PlaywrightTimeout:
                # As a person would: Stop again. Timed from the first click, and what the first left is kept.
                unanswered.append(_stop_not_seen(page, store))
                with contextlib.suppress(PlaywrightTimeout):
                    page.get_by_role("button", name="Stop").click(timeout=5000)
                ended_at = wait_settled(page, "Stopped.", timeout_s=SETTLE_TIMEOUT_S)
            clicked, answered = stop_times(page)
            if clicked is None:  # the click was not seen by the page's listener: nothing to time
                continue
            # Answered by "Stopping…", or by the ending itself when that replaced it before the browser's
            # observer saw it.
            acknowledged.append((answered or ended_at) - clicked)
            ended.append(ended_at - clicked)
    finally:
        model.words = WORDS
    return {"stop_acknowledged_ms": summary(acknowledged, scale=1000), "stop_ended_s": summary(ended, digits=2),
            "stops_clicked_again": unanswered}


def _stop_not_seen(page, store: Store) -> str:
    """What a Stop whose ending did not show within STOP_LOST_S left behind, for whoever reads the results."""
    clicked, answered = stop_times(page)
    meta = store.read_meta(conversation_id(page)) or {}
    text = page.evaluate("() => document.body.innerText")
    return (f"Stop clicked {'(seen by the page)' if clicked else '(not seen by the page)'}, "
            f"\"Stopping…\" {'shown' if answered else 'never shown'}; the stored turn: status "
            f"{meta.get('status')!r}, done {meta.get('done')!r}; the page's last text: {text[-600:]!r}")


def _writes_per_s(final: dict, version_before: int) -> float:
    """The turn's writes (versions) from the first after its begin to its final one, per second it ran."""
    writes = final["version"] - version_before - 1  # the begin write is the page's, not the turn's
    ran_s = max(final["updated_at"] - (final["started_at"] or final["updated_at"]), 1e-3)
    return writes / ran_s


def _ask_directly(store: Store, queue, cid: str, text: str, config) -> None:
    submit_turn(store, queue, cid, text, config)
    for state in states(store, cid, timeout_s=PREPARE_TIMEOUT_S, event_driven=True, interval_s=PREPARE_WAIT_S):
        if state is not None and state["done"]:
            return
    raise RuntimeError(f"an earlier turn did not end within {PREPARE_TIMEOUT_S} s")


def growth(section: dict, condition: str, figure: str) -> float | None:
    """p50 at the longest conversation over p50 at the shortest, for one condition."""
    rows = (section["conditions"].get(condition) or {}).get("lengths") or []
    if len(rows) < 2 or not rows[0][figure]["p50"] or rows[-1][figure]["p50"] is None:
        return None
    return round(rows[-1][figure]["p50"] / rows[0][figure]["p50"], 3)


# A follower run's start draws one component, well under a millisecond at any length: between two such
# figures a ratio is scheduling noise (0.1 against 0.3 ms), so time counts as growth only past this.
TICK_NOISE_MS = 1.0


def tick_added_ms(section: dict, condition: str) -> float | None:
    """p50 at the longest conversation minus p50 at the shortest, of a follower run's start (ms)."""
    rows = (section["conditions"].get(condition) or {}).get("lengths") or []
    if len(rows) < 2 or rows[0]["tick_draw_ms"]["p50"] is None or rows[-1]["tick_draw_ms"]["p50"] is None:
        return None
    return round(rows[-1]["tick_draw_ms"]["p50"] - rows[0]["tick_draw_ms"]["p50"], 2)


def tick_flat(results: dict) -> bool:
    """The page's cost while it follows does not grow with the conversation: a follower run's start
    (in time, within 1.5x or within the noise floor; in bytes, within 1.5x) and each write it draws
    (in bytes, within 1.5x)."""
    time_ok = (results.get("page_tick_growth") or 0) <= 1.5 or (results.get("page_tick_added_ms") or 0) <= TICK_NOISE_MS
    sizes = (results.get("page_tick_bytes_growth"), results.get("page_update_bytes_growth"))
    return time_ok and all((growth or 0) <= 1.5 for growth in sizes)


# The goals, per condition: (figure, statistic, idle goal, goal with hogs), None where none is set.
GOALS = (
    ("word_to_screen_ms", "p95", 200, 600),  # every word, the first of a reply and new chats included
    ("stop_acknowledged_ms", "p95", 300, None),
    ("stop_ended_s", "p95", 1.0, 2.0),
    ("settle_s", "p95", 0.3, 1.0),
    ("writes_per_s", "max", 12, 12),
)


def goals(section: dict) -> dict:
    """Each goal met or not, named `page_<figure>_<condition>`."""
    verdicts = {}
    for condition, figures in section["conditions"].items():
        idle = condition == "idle"
        for figure, stat, idle_goal, busy_goal in GOALS:
            goal = idle_goal if idle else busy_goal
            if goal is None:
                continue
            if figure == "settle_s":  # every length's p95
                values = [row["settle_s"][stat] for row in figures["lengths"]]
            else:
                values = [figures[figure][stat]]
            verdicts[f"page_{figure}_{condition.replace(' ', '_')}"] = all(v is not None and v <= goal for v in values)
    return verdicts
