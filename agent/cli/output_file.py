"""A file the CLI writes (`export --output`): written whole or not at all, never through a symbolic link.

A regular file (or a new one) is written to a temporary file beside it, then renamed over it: a full
disk or any other failure leaves the destination as it was, and a rename replaces a link that appears
meanwhile instead of writing where it points. A symbolic link at the destination is refused (its
target may be any file the user can write, picked by whoever made the link); so is a folder. A device
or a pipe (`/dev/null`, a FIFO) is written to as it is: nothing can be renamed over one.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

NEW_FILE_MODE = 0o666  # as open() creates a file, less the umask
NAME_CHARS = 200  # of the destination's name in the temporary file's (a name has at most 255 bytes)
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputRefused(Exception):
    """The destination cannot be written; the message says why, in one line, and that nothing was written."""


def write_whole(path: Path, data: bytes) -> None:
    """`data` as the whole content of `path`, or OutputRefused with nothing written."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise _refused(path, exc) from None
    if found is not None and stat.S_ISLNK(found.st_mode):
        raise OutputRefused(f"{path} is a symbolic link, which is not followed: name the file itself")
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise OutputRefused(f"{path} is a folder: name a file")
    if found is not None and not stat.S_ISREG(found.st_mode):
        _write_special(path, data)
    else:
        _replace(path, data, None if found is None else stat.S_IMODE(found.st_mode))


def _replace(path: Path, data: bytes, mode: int | None) -> None:
    folder = path.parent
    if not folder.is_dir():
        raise OutputRefused(f"cannot write {path}: the folder {folder} does not exist")
    temporary = folder / f".{path.name[:NAME_CHARS]}.{secrets.token_hex(6)}.partial"
    try:
        descriptor = os.open(temporary, _OPEN_NEW, NEW_FILE_MODE if mode is None else mode)
    except OSError as exc:
        raise _refused(path, exc) from None
    try:
        try:
            if mode is not None:
                os.fchmod(descriptor, mode)  # the file keeps its permissions (the umask is not applied twice)
            _write_all(descriptor, data)
            os.fsync(descriptor)  # a full disk may only say so here
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise _refused(path, exc) from None


def _write_special(path: Path, data: bytes) -> None:
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _refused(path, exc) from None
    try:
        _write_all(descriptor, data)
    except OSError as exc:
        raise _refused(path, exc, whole=False) from None
    finally:
        os.close(descriptor)


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view):]


def _refused(path: Path, exc: OSError, *, whole: bool = True) -> OutputRefused:
    why = exc.strerror or type(exc).__name__
    return OutputRefused(f"cannot write {path}: {why[:1].lower()}{why[1:]}"
                         + ("; nothing was written" if whole else ""))
