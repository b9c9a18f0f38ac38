"""Forged RQ jobs, as anyone who can write to Redis could plant them: each pickles one field that RQ
loads through its serializer (a job's meta, data and legacy result, a result's return value) into
code that leaves a canary file, and sits in the queue, in every registry of that queue, and as a
worker's current job. A reader that unpickles any of them leaves its canary in the directory named
here. (RQ 3 reads a job's exc_info and a result's exc_string as zlib text, never through the
serializer: nothing to unpickle there.)"""

from __future__ import annotations

import base64
import inspect
import os
import pickle
import shlex
import time
import zlib
from pathlib import Path

import redis
from rq import registry as rq_registry
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.worker import Worker
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from agent.queue import JOB_FUNCTION, QUEUE_NAME

CANARY_DIR_VARIABLE = "FORGED_JOBS_CANARY_DIR"  # where a forged failure callback, once run, leaves its canary
FIELDS = ("meta", "data", "result", "return_value")  # the fields, one forged job each
REGISTRY_CLASSES = tuple(cls for _, cls in inspect.getmembers(rq_registry, inspect.isclass)
                         if issubclass(cls, rq_registry.BaseRegistry) and cls.__module__ == rq_registry.__name__
                         and cls is not rq_registry.BaseRegistry)
LONG_AGO = 1.0  # a registry score long past: every cleanup takes the job as expired, abandoned


class _Touch:
    """Unpickling this runs `touch path` (as the reported forged job did)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


def canary_pickle(canary_dir: Path, name: str) -> bytes:
    return pickle.dumps(_Touch(canary_dir / name), protocol=pickle.HIGHEST_PROTOCOL)


def job_id(field: str) -> str:
    return f"forged-{field}"


def worker_name(field: str) -> str:
    return f"forged-worker-{field}"


def ran_callback(job, connection, *args) -> None:
    """A failure callback a forged job names: only a reader that runs any job's callback calls it."""
    Path(os.environ[CANARY_DIR_VARIABLE], f"callback-{job.id}").touch()


def plant(connection: redis.Redis, canary_dir: Path) -> list[str]:
    """(Re)write every forged job, its places and its worker; returns the job ids."""
    ids = []
    with connection.pipeline() as pipe:
        for field in FIELDS:
            ids.append(_plant_one(pipe, field, canary_dir))
        pipe.execute()
    return ids


def _plant_one(pipe, field: str, canary_dir: Path) -> str:
    forged_id = job_id(field)
    job = Job.create(JOB_FUNCTION, args=["c", "t"], id=forged_id, connection=pipe, serializer=JSONSerializer,
                     origin=QUEUE_NAME, description=f"forged job ({field})")
    mapping = {key: value for key, value in job.to_dict().items() if value is not None}
    mapping.update(status="started", failure_callback_name=f"{__name__}.{ran_callback.__name__}",
                   worker_name=worker_name(field))
    payload = canary_pickle(canary_dir, field)
    if field == "data":
        payload = zlib.compress(payload)  # as RQ stores it
    if field != "return_value":
        mapping[field] = payload
    pipe.delete(job.key, Result.get_key(forged_id))
    pipe.hset(job.key, mapping=mapping)
    result = {"type": Result.Type.SUCCESSFUL.value, "worker_name": worker_name(field),
              "return_value": base64.b64encode(payload if field == "return_value" else b"null")}
    pipe.xadd(Result.get_key(forged_id), result)
    queue_key = f"rq:queue:{QUEUE_NAME}"
    pipe.lrem(queue_key, 0, forged_id)
    pipe.rpush(queue_key, forged_id)
    pipe.sadd("rq:queues", queue_key)
    for cls in REGISTRY_CLASSES:
        pipe.zadd(cls.key_template.format(QUEUE_NAME), {_registry_entry(cls, forged_id): LONG_AGO})
    _plant_worker(pipe, field, forged_id)
    return forged_id


def _registry_entry(cls, forged_id: str) -> str:
    """The registry's member for the job: the started registry keeps `job id:execution id`."""
    if cls.parse_job_id is rq_registry.BaseRegistry.parse_job_id:
        return forged_id
    return f"{forged_id}:forged-execution"


def _plant_worker(pipe, field: str, forged_id: str) -> None:
    name = worker_name(field)
    key = Worker.redis_worker_namespace_prefix + name
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    pipe.hset(key, mapping={"birth": now, "last_heartbeat": now, "queues": QUEUE_NAME, "pid": 1,
                            "hostname": "forged", "state": "busy", "current_job": forged_id})
    pipe.sadd(REDIS_WORKER_KEYS, key)
    pipe.sadd(WORKERS_BY_QUEUE_KEY % QUEUE_NAME, key)
