"""Open a file that must be a regular file: ``open_regular(path)`` / ``read_regular(path, limit)``.

    os.open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)   a symlink as the last component: ELOOP
    os.fstat(fd)                                                 not S_ISREG (FIFO, device, directory): refused

NOTE: O_NONBLOCK is what keeps a FIFO put in place of a file from hanging the open (a FIFO opened
for reading blocks until a writer appears); the check is made on the descriptor itself (fstat), so
nothing can be swapped in between the check and the read. For a regular file O_NONBLOCK changes
nothing. Reads are bounded: a file larger than the caller's limit is refused, not loaded.
"""

from __future__ import annotations

import errno
import os
import stat


class UnsafeFileError(OSError):
    """A file is not what it must be: a symlink, a FIFO, a device or a directory where a regular file
    belongs, or larger than a bounded read allows. The message names the path and what to do."""


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device node")


def _refuse(path: str | os.PathLike, what: str, error: type[Exception]) -> Exception:
    return error(f"{os.fspath(path)} is {what}, not a regular file; remove it (or put the regular file it "
                 f"should be in its place) and run again")


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY, mode: int = 0o644, *,
                 error: type[Exception] = UnsafeFileError) -> int:
    """A descriptor of `path`, which must be a regular file reached without following a symlink.

    `flags` as for os.open (add O_CREAT | O_EXCL for a new temporary file). Refused with `error`:
    a symlink, a FIFO, a device, a directory. Other OSErrors (missing file, EACCES, EROFS) pass as
    they are, for the caller to judge.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "a symlink", error) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO opened to write, a directory
            raise _refuse(path, _kind(os.lstat(path).st_mode), error) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, _kind(st.st_mode), error)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike, limit: int, *, error: type[Exception] = UnsafeFileError) -> bytes:
    """The whole of `path` (a regular file, see `open_regular`), refused with `error` past `limit` bytes."""
    with os.fdopen(open_regular(path, error=error), "rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise error(f"{os.fspath(path)} is larger than {limit} bytes, more than such a file ever holds; it was "
                    f"replaced or damaged: remove it (or restore it) and run again")
    return raw
