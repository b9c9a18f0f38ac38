"""The worker pool's log file: rotated by size, and fed by the pool itself and by its workers' output.

Workers (and the MCP servers they start, whose stderr is the worker's) write to a pipe; the pool
relays each line into one RotatingFileHandler, so a chatty worker or server fills at most
(1 + LOG_BACKUPS) x LOG_MAX_BYTES of the disk it shares with Redis. One process writes the file,
so rotation is safe.
"""

from __future__ import annotations

import logging
import logging.handlers
import threading
from pathlib import Path
from typing import BinaryIO

LOG_MAX_BYTES = 10 * 1024 * 1024  # bytes in one log file before it is rotated
LOG_BACKUPS = 3  # rotated files kept beside it (pool.log.1 ... pool.log.3); older ones are deleted
RELAY_LINE_BYTES = 16 * 1024  # a worker's line longer than this is relayed in pieces
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

relayed = logging.getLogger("agent.runtime.workers")


class PassThrough(logging.Formatter):
    """The pool's own records formatted; a worker's relayed line written as it came (it has its own stamp)."""

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage() if getattr(record, "relayed", False) else super().format(record)


def log_to_rotating_file(path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> None:
    """Send this process's logging to `path`, rotated at max_bytes with `backups` old files kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.setFormatter(PassThrough(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def relay(stream: BinaryIO, label: str) -> threading.Thread:
    """A daemon thread that logs each line of `stream` (a worker's stdout and stderr) until it closes."""

    def run() -> None:
        with stream:
            for line in iter(lambda: stream.readline(RELAY_LINE_BYTES), b""):
                text = line.decode("utf-8", errors="replace").rstrip("\n")
                relayed.info("[%s] %s", label, text, extra={"relayed": True})

    thread = threading.Thread(target=run, name=f"relay-{label}", daemon=True)
    thread.start()
    return thread
