"""Kill points for tests/test_handover_seams.py: loaded (as `sitecustomize`) by the processes of a pool started
with this folder on PYTHONPATH and SEAM_DIR set, and nowhere else.

A turn names where its job's process dies in its conversation id: `seam-<point>-<which>-<how>-<random>`, with
<point> one of POINTS (from RQ taking the job off the queue to the turn's first write), <which> `first` (the
turn's first job), `cont` (the continuation after an answer) or `resume` (the job a turn that began is resumed
by: the turn's first job is killed just after its first write, then its resume at <point>), <how> `kill`
(SIGKILL: its supervisor, or RQ for a work horse, sees it die) or `stop` (SIGSTOP: frozen, nobody sees it die;
the test wakes it later). The
process that reaches the point in such a job writes SEAM_DIR/<job id> ("<epoch> <pid> <how>"), once per job
(so the job the turn is handed to runs through), and signals itself.
"""

from __future__ import annotations

import os
import re
import signal
import time

POINTS = ("dequeued", "execution", "rqstarted", "claimed", "published")
# Later in a turn (tests/test_branch_property.py sweeps them on branch turns, with `first`): as a tool starts to
# run, and at the turn's final write (its ending about to be written).
LATER_POINTS = ("tool", "final")
SEAM_DIR = os.environ.get("SEAM_DIR")
FIRST_JOB = re.compile(r"turn-[0-9a-f]+")


def hit(point: str, job_id: str, conversation_id: str) -> None:
    parts = str(conversation_id).split("-")
    if len(parts) < 5 or parts[0] != "seam":
        return
    which, how = parts[2], parts[3]
    if which == "resume":  # the first job dies just after its first write; its resume, at the point
        if FIRST_JOB.fullmatch(job_id) and point == "published":
            how = "kill"
        elif not (job_id.endswith("-resume-1") and parts[1] == point):
            return
    elif parts[1] != point or not (FIRST_JOB.fullmatch(job_id) if which == "first" else "-approval-" in job_id):
        return
    try:
        fd = os.open(os.path.join(SEAM_DIR, job_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.write(fd, f"{time.time()!r} {os.getpid()} {how}".encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)


def current_job():
    from rq import get_current_job

    job = get_current_job()
    return (job.id, job.args[0]) if job is not None and job.args else ("", "")


def patch_agent() -> None:
    """The product's own points, patched once the worker (or work horse) has the product imported."""
    from agent import tools
    from agent.conversation.flags import Flags
    from agent.turn.loop import Turn

    if getattr(Turn, "_seams", False):
        return
    Turn._seams = True
    name = "claim" if hasattr(Flags, "claim") else "claim_turn"  # (claim_turn: the code before claim.lua)
    claim = getattr(Flags, name)

    def claiming(self, *args, **kwargs):
        outcome = claim(self, *args, **kwargs)
        if outcome in ("ok", True):
            hit("claimed", *current_job())
        return outcome

    setattr(Flags, name, claiming)
    start = Turn.start

    def starting(self):
        model = start(self)
        hit("published", *current_job())
        return model

    Turn.start = starting
    finish, run_tool = Turn.finish, tools.run_tool

    def finishing(self, ending):
        hit("final", *current_job())
        return finish(self, ending)

    def running_tool(*args, **kwargs):
        hit("tool", *current_job())
        return run_tool(*args, **kwargs)

    Turn.finish, tools.run_tool = finishing, running_tool


def install() -> None:
    from rq.worker.base import BaseWorker

    dequeue, prepare_execution, prepare_job_execution = (
        BaseWorker.dequeue_job_and_maintain_ttl, BaseWorker.prepare_execution, BaseWorker.prepare_job_execution)

    def dequeuing(self, *args, **kwargs):
        result = dequeue(self, *args, **kwargs)
        if result is not None and result[0].args:
            hit("dequeued", result[0].id, result[0].args[0])
        return result

    def preparing(self, job):
        execution = prepare_execution(self, job)
        if job.args:
            hit("execution", job.id, job.args[0])
        return execution

    def starting(self, job, *args, **kwargs):
        prepare_job_execution(self, job, *args, **kwargs)
        patch_agent()
        if job.args:
            hit("rqstarted", job.id, job.args[0])

    BaseWorker.dequeue_job_and_maintain_ttl = dequeuing
    BaseWorker.prepare_execution = preparing
    BaseWorker.prepare_job_execution = starting


if SEAM_DIR:
    install()
