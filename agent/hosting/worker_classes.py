"""The RQ worker classes the pool and worker.py run (`--class simple|fork|spawn`), and what they add to
RQ's: a stop signal is never lost, a worker waits while Redis is full instead of exiting, and a simple
worker holding a runaway tool thread is recycled."""

from __future__ import annotations

import logging
import os
import time

import redis
from rq import SimpleWorker, SpawnWorker, Worker

from agent.runtime.connection import is_memory_error, redis_problem
from agent.tools.running import abandoned_tools

log = logging.getLogger(__name__)

# Seconds the tool threads abandoned during a job get, once it has ended, to end by themselves
# before the worker is recycled (an MCP call or a late tool that returns just after its limit).
ABANDONED_GRACE_S = 0.5


class KeepsTheStopRequest:
    """A stop signal is never lost. RQ's warm stop, when the worker is not busy, raises StopRequested
    from the signal handler wherever the worker is; just after a job (its state already idle), that
    can be inside RQ's own `perform_job`, whose bare `except` takes it for the job's failure and goes
    on: the worker then waits for the next job, and a pool draining it waits minutes for nothing (seen
    once in the suite: an idle worker held its CLI for 90 s). The flag is set first, so the work loop
    stops before its next job even when the raise is swallowed."""

    def _shutdown(self):
        self._stop_requested = True
        super()._shutdown()


FULL_WAIT_FIRST_S = 1.0  # seconds a worker waits before trying again a write that a full Redis refused
FULL_WAIT_MAX_S = 30.0  # the longest such wait (doubled from FULL_WAIT_FIRST_S each time it is refused again)


class WaitsWhileRedisIsFull:
    """A worker that waits while Redis is full (maxmemory reached, noeviction: it refuses writes) instead
    of exiting. RQ's registration (`register_birth`) and its take of a job from the queue are writes: a
    worker that exited on them was restarted, refused again, and restarted, dozens of times a minute. The
    job stays on the queue meanwhile, and runs once Redis has room again (the endings of the turns in
    flight release their reservations, agent/conversation/room.py). A stop signal still stops it."""

    def register_birth(self):
        self._while_full(super().register_birth, "register")

    def dequeue_job_and_maintain_ttl(self, *args, **kwargs):
        return self._while_full(lambda: super(WaitsWhileRedisIsFull, self).dequeue_job_and_maintain_ttl(
            *args, **kwargs), "take a job")

    def _while_full(self, write, what: str):
        wait_s = FULL_WAIT_FIRST_S
        while True:
            try:
                return write()
            except redis.RedisError as exc:
                if not is_memory_error(exc):
                    raise
                if wait_s == FULL_WAIT_FIRST_S:
                    log.warning("worker %s (pid %s) could not %s: %s; it waits and tries again, every %g s at most",
                                self.name, os.getpid(), what, redis_problem(exc), FULL_WAIT_MAX_S)
            if getattr(self, "_stop_requested", False):
                raise SystemExit(0)  # asked to stop while it waited: nothing of RQ's was written yet
            time.sleep(wait_s)  # a stop signal's handler interrupts it (RQ's raises StopRequested when idle)
            wait_s = min(FULL_WAIT_MAX_S, wait_s * 2)


class RecyclesAfterAbandonedTools:
    """A worker that stops after a job when it holds tool threads that outlived their time.

    Python cannot kill a thread: a tool that spins past its timeout would run in this process for
    ever and slow every later turn. The job has made its final write by then; the worker stops
    warm (RQ's own stop flag, checked before it takes the next job) and exits with
    RECYCLE_EXIT_CODE, and its supervisor starts a fresh one."""

    recycling = False

    def execute_job(self, job, queue):
        try:
            return super().execute_job(job, queue)
        finally:
            held = abandoned_tools(ABANDONED_GRACE_S)
            if held:
                log.warning("recycling this worker (pid %s): job %s left %d abandoned tool thread(s) running "
                            "(%s); it stops now and its supervisor starts a fresh one", os.getpid(), job.id,
                            len(held), ", ".join(sorted(set(held))))
                self.recycling = True
                self._stop_requested = True  # RQ's warm stop: the work loop ends before the next job


class RecyclingSimpleWorker(KeepsTheStopRequest, WaitsWhileRedisIsFull, RecyclesAfterAbandonedTools, SimpleWorker):
    pass


class HandsOverAKilledHorse:
    """A forking (or spawning) worker whose work horse was killed mid-job: the turn it ran goes on on another
    worker at once (agent/hosting/deaths.py), not when the horse's heartbeat lapses. RQ then fails the job."""

    def handle_work_horse_killed(self, job, retpid, ret_val, rusage):
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        from agent.conversation.store import Store
        from agent.hosting.deaths import hand_over_dead_job
        from agent.runtime.connection import state_client
        from agent.settings import state_ttl_from_env

        how = f"signal {os.WTERMSIG(ret_val)}" if ret_val and os.WIFSIGNALED(ret_val) else f"status {ret_val}"
        store = Store(state_client(os.environ["REDIS_URL"]), state_ttl_from_env())
        try:
            hand_over_dead_job(store, self.connection, job.id, f"its work horse was killed ({how})")
        except redis.RedisError as exc:  # the pools' watch takes it from here, when the mark lapses
            log.info("job %s: its horse was killed; its turn is left to the watch: %s", job.id, redis_problem(exc))
        finally:
            store.redis.close()


class StoppingWorker(KeepsTheStopRequest, WaitsWhileRedisIsFull, HandsOverAKilledHorse, Worker):
    pass


class StoppingSpawnWorker(KeepsTheStopRequest, WaitsWhileRedisIsFull, HandsOverAKilledHorse, SpawnWorker):
    pass


# SimpleWorker runs the job in the worker's own process: no fork per job (a fork costs tens of
# milliseconds per turn), and the job timeout is still RQ's SIGALRM in that process. A killed
# job takes its worker with it; the pool starts a new one. See docs/benchmarks.md for the figures.
# Fork and spawn run tools in a child that exits after each job, so only "simple" ever recycles.
# The classes live here, not in worker_process.py: a spawned work horse imports its worker's class by
# name, which a class of a module run as __main__ could not give it.
WORKER_CLASSES = {"simple": RecyclingSimpleWorker, "fork": StoppingWorker, "spawn": StoppingSpawnWorker}
DEFAULT_WORKER_CLASS = "simple"
IN_PROCESS_CLASSES = {"simple"}  # the classes that run a job in the worker's own process, beside its MCP sessions
