"""The words a person reads for each status and ending kind, in one table: the page's labels, the
export's endings and the command line's exit status all come from here. Pure: no I/O.

The endings' own messages are built beside them, in agent/conversation/endings.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.contract import ErrorKind, Status

EXIT_DONE, EXIT_ENDED_BADLY = 0, 1  # the command line's exit status for a turn that ended


@dataclass(frozen=True)
class StatusWords:
    icon: str
    label: str  # the page's words, after the icon
    exported: str  # how an exported conversation says its turn ended (or had not yet)
    exit_status: int | None  # the command line's, once a turn ended so; None while in flight


STATUS_WORDS: dict[str, StatusWords] = {
    Status.QUEUED: StatusWords("⏳", "Waiting for a worker", "still waiting for a worker when exported", None),
    Status.RUNNING: StatusWords("⚙️", "Working on it", "still running when exported", None),
    Status.AWAITING_APPROVAL: StatusWords("✋", "Waiting for your approval", "still waiting for an approval when "
                                          "exported", None),
    Status.DONE: StatusWords("✅", "Answered", "answered", EXIT_DONE),
    Status.FAILED: StatusWords("❌", "Failed", "failed", EXIT_ENDED_BADLY),
    Status.TIMED_OUT: StatusWords("⏱️", "Ran out of time", "ran out of time", EXIT_ENDED_BADLY),
    Status.CANCELLED: StatusWords("⏹️", "Stopped", "stopped", EXIT_ENDED_BADLY),
}

# The page's label for each status, icon first.
STATUS_LABELS: dict[str, str] = {status: f"{words.icon} {words.label}" for status, words in STATUS_WORDS.items()}

# An ending kind the page names in its own words, before the ending's message.
KIND_HEADLINES: dict[str, str] = {ErrorKind.WORKER_LOST: "The worker was lost",
                                  ErrorKind.SHUTDOWN: "The app was stopped",
                                  ErrorKind.BUDGET: "The budget is spent"}


def status_words(status: str) -> str:
    """A status's label without its icon, for a box that shows its own; an unknown one as it is."""
    words = STATUS_WORDS.get(status)
    return words.label if words else status


def exported_words(status: str) -> str | None:
    """How an export says a turn ended; None for a status no table row names."""
    words = STATUS_WORDS.get(status)
    return words.exported if words else None


def exit_status(status: str) -> int:
    """The command line's exit status for a turn that ended with `status`."""
    words = STATUS_WORDS.get(status)
    return EXIT_DONE if words is not None and words.exit_status == EXIT_DONE else EXIT_ENDED_BADLY
