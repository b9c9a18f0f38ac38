"""A stop signal that reaches a worker just after a job is not lost (agent/hosting/worker_classes.py,
KeepsTheStopRequest): RQ raises StopRequested from the handler when the worker is not busy, and its
own `perform_job` catches everything, so the request must live on as the work loop's stop flag."""

from __future__ import annotations

import pytest
from rq.exceptions import StopRequested
from rq.worker import WorkerStatus

from agent.hosting.worker_classes import WORKER_CLASSES
from agent.runtime.connection import queue_client


@pytest.mark.parametrize("kind", sorted(WORKER_CLASSES))
def test_a_stop_raised_where_rq_swallows_it_still_stops_the_work_loop(private_redis, kind):
    worker = WORKER_CLASSES[kind](["q"], connection=queue_client(private_redis.url))
    worker._state = WorkerStatus.IDLE  # as after RQ's handle_job_success, still inside perform_job
    try:
        worker._shutdown()  # what RQ's SIGTERM handler calls
    except StopRequested:
        pass  # swallowed, as perform_job's bare `except` does
    else:
        pytest.fail("an idle worker's warm stop raises StopRequested (RQ's behaviour this relies on)")
    assert worker._stop_requested, "the loop checks this flag before it takes the next job"

