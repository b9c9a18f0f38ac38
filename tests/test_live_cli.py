"""The CLI's view of a live text, as pure logic on states: settled plain text printed once as it is
written, cut and stopped texts marked, `--json` deltas that reassemble to the text. (The CLI against
real workers and a streaming server is in test_cli.py.)"""

from __future__ import annotations

import json
import random

from agent.cli.main import Follower
from agent.cli.output import JsonLines, TextLines, calls_text
from agent.text.plain_text import PlainTextStream, plain_text

TURN = "t1"


def streamed(text: str, cuts: list[int]) -> str:
    """What a PlainTextStream gives out for `text` fed in pieces ending at `cuts`, then finished."""
    stream = PlainTextStream()
    out = [stream.feed(text[:cut]) for cut in cuts]
    return "".join(out) + stream.finish(text)


def test_streamed_plain_text_is_the_whole_texts_plain_text_however_the_text_is_cut():
    rng = random.Random(20261202)
    words = ["391", "is", "the", "**answer**", "_here_", "`a*b`", "x*y", "snake_case", "\\*", "wörd", "**two words**"]
    for _ in range(500):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(1, 4))]
        text = "\n".join(lines)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 12))))
        assert streamed(text, cuts) == plain_text(text), (text, cuts)


def test_words_without_markers_come_out_as_they_arrive_and_a_marker_holds_its_line_back():
    stream = PlainTextStream()
    assert stream.feed("Seventeen times twe") == "Seventeen times "
    assert stream.feed("Seventeen times twenty-three is **3") == "twenty-three is "
    assert stream.feed("Seventeen times twenty-three is **391**, as") == ""
    assert stream.feed("Seventeen times twenty-three is **391**, as asked.\nNext") == "391, as asked.\n"
    assert stream.finish("Seventeen times twenty-three is **391**, as asked.\nNext line.") == "Next line."


def follower(as_json: bool) -> Follower:
    return Follower(None, None, None, "c1", TURN, 1000, as_json)


def state(version: int, history: list, live: dict | None = None, steps: list = (), done: bool = False) -> dict:
    return {"version": version, "done": done, "status": "done" if done else "running", "turn_id": TURN,
            "history": history, "steps": list(steps), "turns": [], "live": live}


def live(text: str, attempt: int = 1) -> dict:
    return {"turn_id": TURN, "message_index": 1, "attempt": attempt, "text": text, "status": "writing"}


USER = {"role": "user", "content": "What is 17*23?"}


class StoreAt:
    """A store whose conversation has one new version: `state` (what a follower's step reads)."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def wait_version(self, conversation_id, seen, timeout_ms):
        return self.state["version"]

    def read_since(self, conversation_id, before):
        return self.state


def test_the_json_deltas_reassemble_to_the_text_and_a_retry_starts_again_at_zero(capsys):
    f = JsonLines(TURN)
    versions = [state(1, [USER]), state(2, [USER], live("Three words")), state(3, [USER], live("Three words then")),
                state(4, [USER]), state(5, [USER], live("Fresh", attempt=2)), state(6, [USER], live("Fresh text.", 2)),
                state(7, [USER, {"role": "assistant", "content": "Fresh text."}])]
    for s in versions:
        f.print(s, final=False)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    texts: dict[int, str] = {}
    for line in lines:
        assert "text" not in (line["live"] or {})
        if line["live"]:
            attempt = line["live"]["attempt"]
            texts[attempt] = texts.get(attempt, "")[: line["live_from"]] + line["live_delta"]
    assert texts == {1: "Three words then", 2: "Fresh text."}
    assert [line["live_from"] for line in lines if line["live"]] == [0, 11, 0, 5]
    assert texts[2] == lines[-1]["new_history"][-1]["content"]


def test_text_mode_prints_the_reply_once_as_it_is_written_and_marks_a_cut_text(capsys):
    f = TextLines(TURN)
    cut_step = {"turn_id": TURN, "kind": "model", "index": 1, "outcome": "timeout", "partial_text": "Three words then",
                "partial_chars": 16}
    answer = "The **answer** is 391."
    ok_step = {"turn_id": TURN, "kind": "model", "index": 3, "outcome": "ok",
               "usage": {"input_tokens": 120, "output_tokens": 9}}
    for s in [state(1, [USER]), state(2, [USER], live("Three words")), state(3, [USER], None, [cut_step]),
              state(4, [USER], live("The **ans", 2), [cut_step]),
              state(5, [USER, {"role": "assistant", "content": answer}], None, [cut_step, ok_step], done=True)]:
        f.print(s)
    out, err = capsys.readouterr()
    assert out == "Three words then\n  [cut off: the call timed out: 16 characters had arrived]\nThe answer is 391.\n"
    assert "[attempt 2: the reply starts again]" in err
    assert "[model call 2: 120 tokens in, 9 out]" in err  # the second call, though the turn's third step


def test_text_mode_numbers_model_calls_as_a_person_counts_them_not_by_step(capsys):
    # Steps number tool runs and retry waits too: model calls 1, 3 and 5 by step were the turn's three calls.
    def model(index: int, tokens_in: int | None = None) -> dict:
        usage = {"usage": {"input_tokens": tokens_in, "output_tokens": 1}} if tokens_in else {}
        return {"turn_id": TURN, "kind": "model", "index": index, "outcome": "ok", **usage}

    steps = [model(1, 10), {"turn_id": TURN, "kind": "tool", "index": 2, "outcome": "ok"}, model(3, 20),
             {"turn_id": TURN, "kind": "retry", "index": 4, "outcome": "ok"},
             {**model(5, 30), "unstreamed": "the streamed reply was empty"}]
    f = follower(as_json=False)
    f.store = StoreAt(state(2, [USER, {"role": "assistant", "content": "Done."}], None, steps, done=True))
    assert f.step() == 0  # the turn's end: its steps, then the token total
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("[model call")] == [
        "[model call 1: 10 tokens in, 1 out]", "[model call 2: 20 tokens in, 1 out]",
        "[model call 3: asked without streaming: the streamed reply was empty]", "[model call 3: 30 tokens in, 1 out]"]
    assert "[tokens this turn: 60 in, 3 out, over 3 model calls]" in err


def test_the_token_total_says_how_many_calls_reported_when_not_all_did():
    assert calls_text(3, 3) == "over 3 model calls"
    assert calls_text(1, 1) == "over 1 model call"
    assert calls_text(3, 2) == "over 3 model calls, 2 of them reporting tokens"


def test_text_mode_keeps_a_streamed_texts_escape_sequences_inert(capsys):
    f = TextLines(TURN)
    for s in [state(1, [USER]), state(2, [USER], live("Look \x1b]0;owned\x07 here ")),
              state(3, [USER, {"role": "assistant", "content": "Look \x1b]0;owned\x07 here now"}], done=True)]:
        f.print(s)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b" in out and out.endswith("here now\n")
