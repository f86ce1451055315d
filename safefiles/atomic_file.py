"""One rule for writing a file so that no reader ever sees it torn: ``with AtomicFile(p) as f``.

The bytes go to ``.p.<pid>.<rand>.tmp`` next to ``p``; on success the temp file is fsynced, renamed
over ``p`` and the directory fsynced. On any error the temp file is removed and ``error`` raised; a
killed writer leaves only its temp file (never a torn ``p``), which the next writer of ``p`` removes.
Only a regular file (or nothing) is ever replaced: os.replace over a symlink, FIFO or device node
would swap the node itself (as root, ``-o /dev/null`` would replace the system's /dev/null).

Used by the index files (index/), the store's commit record (paging/) and portable artifact files
(tieredkv.artifacts.portable); it lives in this neutral package, below all three, so they share it.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def check_target(path: Path, error: type[Exception] = OSError) -> None:
    """Raise `error` unless `path` is a regular file or does not exist yet (in an existing directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise error(f"cannot write {path}: the directory {path.parent} does not exist") from None
        return
    if stat.S_ISREG(st.st_mode):
        return
    kind = ("a symlink" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
            else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a device node")
    raise error(f"refusing to write {path}: it is {kind}, not a regular file; give a new or regular "
                "file name (or `-o -` for standard output)")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(path: Path) -> list[str]:
    """Remove temp files of `path` left by writers that no longer run (killed mid-write)."""
    removed, head = [], f".{path.name}."
    for name in os.listdir(path.parent):
        parts = name[len(head):].split(".") if name.startswith(head) else []
        if len(parts) == 3 and parts[0].isdigit() and parts[2] == "tmp" and not _pid_running(int(parts[0])):
            try:
                os.unlink(path.parent / name)
                removed.append(str(path.parent / name))
            except FileNotFoundError:
                pass
    return removed


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not supported on this platform
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AtomicFile:
    """``with AtomicFile(p, error=E) as f``: write ``p`` whole or not at all (see the module doc)."""

    def __init__(self, path: str | os.PathLike, error: type[Exception] = OSError, *, durable: bool = True) -> None:
        self.path = Path(path)
        self.error = error
        self.durable = durable  # False: no fsync (a crash may leave the previous file, never a torn one)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")

    def __enter__(self):
        check_target(self.path, self.error)
        remove_stale_temps(self.path)
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise self.error(f"cannot create {self.tmp}: {exc}") from exc
        self.f = os.fdopen(fd, "wb")
        return self.f

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.f.flush()
                if self.durable:
                    os.fsync(self.f.fileno())
            self.f.close()
            if exc_type is None:
                check_target(self.path, self.error)
                os.replace(self.tmp, self.path)
                if self.durable:
                    fsync_dir(self.path.parent)
        except self.error:
            self._discard()
            raise
        except OSError as err:
            self._discard()
            raise self.error(f"cannot write {self.path}: {err}; no file was left") from err
        finally:
            if exc_type is not None:
                self._discard()
        if isinstance(exc, OSError) and not isinstance(exc, self.error):
            raise self.error(f"cannot write {self.path}: {exc}; no file was left") from exc

    def _discard(self) -> None:
        try:
            self.f.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
