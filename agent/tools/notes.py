"""The add_note tool: one line appended to the notes file in the data directory, a person asked first.

Whose notes: with sign-in, each person's own file (`notes/<person id>.txt`), the person being the owner
of the conversation whose turn runs the tool (agent/tools/acting_for.py: read by the job from the state,
never from the model); a turn with no owner (the local playground, the command line) writes `notes.txt`.

It is the demonstration of a tool that changes something: it says `needs_approval = True`, so a
turn that calls it waits for Approve or Deny, and `safe_to_repeat = False`, so a turn resumed after
its worker was lost never writes the same note twice. Every line is `<UTC time> <text>`: one line
per note whatever the text holds, so that a line number is a note number.
"""

from __future__ import annotations

import fcntl
import os
import unicodedata
from datetime import UTC, datetime
from pathlib import Path

from agent.runtime.embedded_redis import data_dir
from agent.tools import acting_for
from agent.tools.registry import ToolError

NOTES_FILE = "notes.txt"  # the notes of turns with no owner
PEOPLES_NOTES_DIR = "notes"  # a signed-in person's: <person id>.txt in it
MAX_NOTE_CHARS = 500  # characters of one note; a longer text is cut, and the confirmation says so
MAX_NOTES_BYTES = 1024 * 1024  # the file's bound: past it, a note is refused rather than the disk filled
DEFAULT_SHOWN_NOTES = 20  # the last notes read_notes gives the page


def notes_path(person: str | None = None) -> Path:
    """Where the notes are kept, in the data directory (AGENT_DATA_DIR, or .data/): notes.txt, or a person's
    own file, notes/<person id>.txt. ValueError for a person id of another shape (it names a file)."""
    if person is None:
        return data_dir() / NOTES_FILE
    if not acting_for.PERSON_ID_RE.fullmatch(person):
        raise ValueError(f"not a person id: {person[:40]!r}")
    return data_dir() / PEOPLES_NOTES_DIR / f"{person}.txt"


def add_note(text: str) -> str:
    """Add a note to the user's notes file, as one line with the time.

    Args:
        text: the note, one sentence or a few (at most 500 characters are kept)
    """
    line, cut = _one_line(text)
    person = acting_for.person()
    try:
        path = notes_path(person)
    except ValueError:
        raise ToolError("this turn's owner is not a person this tool can keep notes for: no note was added") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    number = _append(path, f"{stamp} {line}\n".encode())
    shortened = f" (cut to its first {MAX_NOTE_CHARS} characters)" if cut else ""
    return f"Added note {number} to {'your notes' if person else NOTES_FILE}{shortened}."


add_note.needs_approval = True  # it writes: a person says yes first
add_note.safe_to_repeat = False  # a second run after a lost worker would add the note twice


def read_notes(limit: int = DEFAULT_SHOWN_NOTES, person: str | None = None) -> list[str]:
    """The last `limit` notes of `person` (None: the notes of turns with no owner), oldest first, for the page
    to show; none when there is no notes file yet."""
    if limit <= 0:
        return []
    try:
        with notes_path(person).open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - MAX_NOTES_BYTES))  # a file grown by hand is read from its end only
            tail = file.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return tail.splitlines()[-limit:]


def _one_line(text: str) -> tuple[str, bool]:
    """The note as one line: every run of white space (newlines included) one space, control characters
    dropped, at most MAX_NOTE_CHARS; and whether it was cut. An empty note is refused."""
    kept = "".join(c for c in text if c.isspace() or unicodedata.category(c) != "Cc")
    line = " ".join(kept.split())  # str.split() knows every line break splitlines() does
    if not line:
        raise ToolError("the note is empty: send the text to write down")
    if len(line) <= MAX_NOTE_CHARS:
        return line, False
    return line[: MAX_NOTE_CHARS - 1].rstrip() + "…", True


def _append(path: Path, data: bytes) -> int:
    """Append one line under a lock (two workers may write at once); the line's number in the file."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size + len(data) > MAX_NOTES_BYTES:
            raise ToolError(f"the notes file is full ({MAX_NOTES_BYTES // 1024} KiB): the note was not added; "
                            f"clear {path.relative_to(data_dir())} in the data directory to make room")
        content = os.pread(fd, size, 0)
        if content and not content.endswith(b"\n"):  # a last line edited by hand without its end
            data = b"\n" + data
        os.write(fd, data)
        return content.count(b"\n") + data.count(b"\n")
    finally:
        os.close(fd)  # also releases the lock
