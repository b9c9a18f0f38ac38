"""A turn whose worker is lost anywhere between RQ taking its job off the queue and the turn's first write is
queued again, once, and runs on the clocks it was sent with; the same for the continuation after an answer. A
loss after the first write resumes inside the turn's own clocks, as before.

The loss is swept across every seam (tests/seams/sitecustomize.py, loaded by the pool's processes alone):
RQ's take of the job (`dequeued`: in RQ's intermediate queue, no execution yet), its execution recorded
(`execution`: the worker's current job, RQ's status still queued), RQ's start (`rqstarted`: status started,
the turn not yet claimed), the turn's claim (`claimed`: watched, no clocks yet), and its first write
(`published`); for the turn's first job, for the continuation after an approval, and for the job a turn that
began is resumed by (whose own loss, before its first write, resumes the turn again inside its clocks); by
SIGKILL (its supervisor,
or RQ for a work horse, sees it die) and by SIGSTOP (nobody sees it: the watch finds it, and the frozen job,
woken once the turn was handed over, must write nothing); on simple and forking workers.

Real Redis (this test's own), a real pool, the demo model on loopback, and no front end (nobody calls the
lost-worker check: the pool's watch alone finds what no supervisor sees).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.contract import Outcome, Status
from agent.queue import get_queue, new_id
from agent.turn import approvals
from harness import pools
from harness.processes import kill
from tests.conftest import CANARY_KEY, FAST, ROOT, ask
from tests.test_resume import assert_every_call_answered_once, resume_steps, turn_messages

SEAMS = ROOT / "tests" / "seams"
POINTS = ("dequeued", "execution", "rqstarted", "claimed", "published")
BEGUN = {"published"}  # the points after the turn's first write: resumed inside its clocks
WORKERS = 6
IN_FLIGHT = 3  # turns at a time: frozen workers hold their slot until the turn is handed over
CLOCKS = FAST.with_changes(job_timeout_s=20, deadline_margin_s=3.0, call_timeout_cap_s=5.0, min_call_s=0.5)
MARGIN_S = 1.0  # seconds of slack on every time bound
# Seconds from the loss to the first write of the job the turn was handed to, by what finds it (plus a job's start):
SEEN_DEATH_S = 1.5  # its supervisor (or RQ, for a work horse) sees it die: handed over at once (deaths.py)
LIMBO_S = 3.0 + 1.0 + 1.0  # left in RQ's intermediate queue: the grace (LIMBO_GRACE_S) and the watch's look
LAPSE_S = 3.0 + 1.0 + 1.0  # claimed, then silent: the heartbeat's TTL and the watch's look
UNCLAIMED_S = 5.0 + 3.0 + 1.0  # started by RQ, never claimed: the stranded look's period and the grace
TURN_S = 45.0  # seconds a turn may take from its submission to its end (two clocks' worth, and the hand-over)


@dataclass(frozen=True)
class Seam:
    point: str
    which: str  # "first", "cont" or "resume"
    how: str  # "kill" or "stop"

    def conversation_id(self) -> str:
        return f"seam-{self.point}-{self.which}-{self.how}-{new_id()[:8]}"

    @property
    def bound_s(self) -> float:
        if self.point == "dequeued" or (self.point == "execution" and self.how == "stop"):
            return LIMBO_S + MARGIN_S
        if self.how == "kill":
            return SEEN_DEATH_S + MARGIN_S
        return (UNCLAIMED_S if self.point == "rqstarted" else LAPSE_S) + MARGIN_S


def seams() -> list[Seam]:
    only = os.environ.get("SEAMS_ONLY")  # e.g. "claimed-resume-stop": one seam, when looking into it
    return [seam for seam in _all_seams() if not only or only == f"{seam.point}-{seam.which}-{seam.how}"]


def _all_seams() -> list[Seam]:
    return [Seam(point, which, how) for point in POINTS for which in ("first", "cont", "resume")
            for how in ("kill", "stop")]


@dataclass
class Followed:
    seam: Seam
    conversation_id: str
    submitted_at: float = 0.0
    answered: bool = False
    woken: bool = False
    final: dict | None = None
    lost: tuple[float, int, str] | None = None  # (when, pid, how) the hook wrote


@pytest.fixture
def seam_pool(private_redis, tmp_path):
    """Start a pool whose processes load the kill points; everything is stopped at the end, frozen workers
    woken first."""
    started: list[pools.PoolHandle] = []
    marks = tmp_path / "marks"
    marks.mkdir()

    def start(worker_class: str) -> Path:
        env = {"OPENAI_API_KEY": CANARY_KEY, "ANTHROPIC_API_KEY": CANARY_KEY, "PYTHONPATH": str(SEAMS),
               "SEAM_DIR": str(marks)}
        started.append(pools.start_pool(private_redis.url, WORKERS, tmp_path / "pool.log", worker_class=worker_class,
                                        env=env, queue_connection=private_redis.queue_connection))
        return marks

    try:
        yield start
    finally:
        kill(frozen_pids(marks), signal.SIGCONT)
        for handle in started:
            pools.stop_pool(handle, private_redis.url)


def frozen_pids(marks: Path) -> list[int]:
    return [int(line.split()[1]) for path in marks.glob("*") if (line := path.read_text()) and "stop" in line]


def lost_mark(marks: Path, conversation_job: str) -> tuple[float, int, str] | None:
    path = marks / conversation_job
    if not path.exists() or not (text := path.read_text()):
        return None
    when, pid, how = text.split()
    return float(when), int(pid), how


def follow(private_redis, marks: Path, todo: list[Seam]) -> list[Followed]:
    """Run the seams, IN_FLIGHT at a time, as a person would: answer a parked turn's request (approve), and
    wake a frozen worker once its turn has been handed over (its resume step written)."""
    store, queue = private_redis.store, get_queue(private_redis.queue_connection)
    waiting, running, ended = list(todo), [], []
    while waiting or running:
        while waiting and len(running) < IN_FLIGHT:
            seam = waiting.pop(0)
            config = CLOCKS.with_changes(approve_tools=("calculator",) if seam.which == "cont" else ())
            running.append(Followed(seam, ask(store, queue, "what is 6*7?", config, seam.conversation_id()),
                                    submitted_at=time.monotonic()))
        for followed in list(running):
            state = store.read(followed.conversation_id)
            if time.monotonic() - followed.submitted_at > TURN_S:  # stuck: reported with the others, at the end
                followed.final = state
                running.remove(followed)
                ended.append(followed)
                continue
            job = f"turn-{state['turn_id']}" + ("-resume-1" if followed.seam.which == "resume" else "")
            followed.lost = followed.lost or lost_mark(marks, job) or (
                state["approval"] and state["approval"].get("job_id")
                and lost_mark(marks, state["approval"]["job_id"]))
            request = state["approval"]
            if state["status"] == Status.AWAITING_APPROVAL and request and not request.get("answer"):
                assert approvals.answer(store, queue, followed.conversation_id, Outcome.APPROVED, approvals.BY_CLI,
                                        request_id=request["id"]).taken
                followed.answered = True
            last = 2 if followed.seam.which == "resume" else 1  # the attempt that follows the frozen job
            handed_over = any(step["attempt"] == last for step in resume_steps(state))
            if followed.lost and followed.lost[2] == "stop" and not followed.woken and handed_over:
                kill([followed.lost[1]], signal.SIGCONT)  # handed over: the frozen job wakes, and must do nothing
                followed.woken = True
            if state["done"]:
                followed.final = state
                running.remove(followed)
                ended.append(followed)
        time.sleep(0.05)
    return ended


def check(followed: Followed) -> None:
    seam, final = followed.seam, followed.final
    where = f"{seam}: {final['status']} {final['error']} {final['history'][-1]}"
    assert final["done"], f"{seam}: not ended {TURN_S:g} s after it was sent ({final['status']}, {final['job_id']})"
    assert followed.lost is not None, f"{seam}: the kill point was never reached"
    lost_at = followed.lost[0]
    assert final["status"] == Status.DONE and final["error"] is None, where
    steps = resume_steps(final)  # handed over once (a resume's job lost too: twice)
    hand_overs = 2 if seam.which == "resume" else 1
    # (A resume's job lost before its first write never wrote its step: the job after it writes the one step.)
    written = [2] if seam.which == "resume" and seam.point not in BEGUN else list(range(1, hand_overs + 1))
    assert final["attempt"] == hand_overs and [s["attempt"] for s in steps] == written, where
    step = steps[-1]
    began = seam.point in BEGUN or seam.which == "resume"
    queued_again = "took this turn from the queue was lost before" in step["detail"]
    assert queued_again != began, (seam, step["detail"])
    if queued_again:
        before = "going on after the answer" if seam.which == "cont" else "starting this reply"
        assert before in step["detail"], (seam, step["detail"])
        # The clocks it was sent with, counted from the start of the job that ran it (as RQ's are).
        assert final["started_at"] > lost_at, (seam, final["started_at"], lost_at)
        assert final["job_timeout_at"] == pytest.approx(final["started_at"] + CLOCKS.job_timeout_s, abs=0.01)
        assert final["deadline_at"] == pytest.approx(final["job_timeout_at"] - CLOCKS.deadline_margin_s, abs=0.01)
    else:
        assert final["started_at"] < lost_at, "resumed inside the clocks it began with"
    assert step["ended_at"] - lost_at <= seam.bound_s, (seam, round(step["ended_at"] - lost_at, 2), seam.bound_s)
    assert final["updated_at"] < final["job_timeout_at"], "the final write lands before the job timeout"
    assert "were left" not in final["history"][-1]["content"]
    assert_every_call_answered_once(final["history"])
    messages = turn_messages(final)
    assert [m["role"] for m in messages].count("user") == 1
    assert len([m for m in messages if m["role"] == "assistant" and m.get("content")]) == 1, messages
    assert "42" in messages[-1]["content"], messages[-1]
    if seam.which == "cont":
        assert followed.answered
        assert [s["kind"] for s in final["steps"] if s["kind"] in ("approval", "resume")] == ["approval", "resume"]


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_a_turn_lost_at_any_seam_before_its_first_write_is_queued_again_once_on_its_clocks(
        private_redis, seam_pool, worker_class):
    marks = seam_pool(worker_class)
    ended = follow(private_redis, marks, seams())
    versions = {f.conversation_id: f.final["version"] for f in ended if f.final["done"]}
    kill(frozen_pids(marks), signal.SIGCONT)  # every frozen job awake: none of them may write
    time.sleep(2.0)
    moved = {cid: (v, private_redis.store.read(cid)["version"]) for cid, v in versions.items()
             if private_redis.store.read(cid)["version"] != v}
    assert not moved, f"written after done: {moved}"
    problems = []
    for followed in ended:
        step = (resume_steps(followed.final) or [{}])[-1]
        print(followed.seam, followed.final["status"], round(step.get("ended_at", 0) - (followed.lost or [0])[0], 2),
              step.get("detail"), followed.final["error"])
        try:
            check(followed)
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)
    assert not private_redis.queue_connection.lrange(get_queue(private_redis.queue_connection).intermediate_queue_key,
                                                     0, -1), "a lost job left in RQ's intermediate queue"
