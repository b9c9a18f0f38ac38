"""SIGTERM and SIGINT recorded for a process's main loop to read: the handler only appends.

Not a threading.Event: a handler runs in the main thread, and Event.set() there, while the main
thread is inside Event.wait() on the same Event (holding its lock), waits on that lock for ever. Seen:
a pool that never stopped, and a CLI waiting 90 s for it. A loop that sleeps is cut short by the
signal, and reads the list when it wakes."""

from __future__ import annotations

import signal


def record_stop_signals() -> list[int]:
    """Install the handlers; the returned list grows by one entry per SIGTERM or SIGINT received."""
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: received.append(number))
    return received
