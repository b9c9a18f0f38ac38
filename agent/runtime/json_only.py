"""RQ reads and writes JSON in every process of this product, whatever serializer a caller passes.

RQ's default serializer is pickle, and loading a job unpickles its fields (meta, data, result, a
result's return value): whoever can write one key to Redis runs code in whoever loads that job.
This project passes JSONSerializer wherever it builds an RQ object, but not every caller does:
RQ itself builds some without one (an execution's job, a job's queue position), `rq info` reads
its queues and cleans their registries with the default whatever `--serializer` says, and
rq-dashboard reads with the default on its job page and in requeue, delete and empty. A
serializer cannot be declared to those, so RQ's default (pickle) serializer class itself is made
JSON here: no path through RQ can unpickle. `agent.queue` installs it on import, so every process
that builds a queue, a job or a worker has it before it loads anything.
"""

from __future__ import annotations

from rq import serializers


def install() -> None:
    """Make RQ's default serializer (also named PickleSerializer and "pickle") the JSON one; idempotent."""
    pickle_class = serializers.DefaultSerializer
    pickle_class.dumps = staticmethod(serializers.JSONSerializer.dumps)
    pickle_class.loads = staticmethod(serializers.JSONSerializer.loads)
