"""The store's own writer lock, independent of lock.mdb.

LMDB keeps writers apart with a mutex inside lock.mdb. Delete lock.mdb while a process has the
store open and the next process creates a new one: two writers, two mutexes, and each commits
over the other (an artifact vanishes, or keeps a manifest whose pages are gone). So every write
transaction also holds, for its whole life, an exclusive flock on data.mdb itself, and checks that
data.mdb and lock.mdb are still the files this process opened:

    with lock.hold():            # flock(data.mdb, LOCK_EX); both files still ours, else StoreLockError
        with env.begin(write=True) as txn: ...
        write the commit record  # (commit_record.py), still under the lock

NOTE: flock (not fcntl record locks): a POSIX record lock is dropped when *any* descriptor of the
file is closed by the process, and LMDB opens and closes its own; flock belongs to our descriptor.
Readers check the files too (`check_files`): a process whose lock.mdb was replaced is invisible to
the new writers' reader table, so they may reuse the pages it reads.
"""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from typing import Iterator

from .errors import StoreLockError


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class WriterLock:
    """flock on data.mdb around each write transaction; identity checks of data.mdb and lock.mdb."""

    def __init__(self, store_dir: str) -> None:
        self.store_dir = store_dir
        self._data = os.path.join(store_dir, "data.mdb")
        self._lockfile = os.path.join(store_dir, "lock.mdb")
        self._fd = os.open(self._data, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(self._fd)
        self._data_id = (st.st_dev, st.st_ino)
        self._lock_id = _identity(self._lockfile)
        self._depth = 0
        self._mutex = threading.RLock()

    def check_files(self) -> None:
        """Raise StoreLockError if data.mdb or lock.mdb is no longer the file opened at open."""
        for name, path, want in (("data.mdb", self._data, self._data_id), ("lock.mdb", self._lockfile, self._lock_id)):
            now = _identity(path)
            if now != want:
                what = "deleted" if now is None else "replaced by another file"
                raise StoreLockError(
                    f"{name} of store {self.store_dir} was {what} while this process had the store open; LMDB "
                    f"can no longer keep writers apart, so nothing more is read or written here — stop every "
                    f"process that uses the store, then open it again (`tieredkv check --store "
                    f"{self.store_dir}` shows what was committed)")

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the writer lock (re-entrant within the process)."""
        with self._mutex:
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                self.check_files()
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
