"""Persistent tier: every page in LMDB on local disk, verified on every read.

Sub-databases::

    pages       page key (64 ascii hex)  -> Page.to_bytes()
    manifests   artifact id (utf-8)      -> sha256(data) hex (64 ascii) | data
    quarantine  page key                 -> raw bytes that failed verification
    meta        name (utf-8)             -> value (utf-8); internal names start "__paging"

NOTE (py-lmdb rules, see docs/REFERENCES.md): never writemap (full disk -> SIGBUS); one
environment per path per process; every transaction in `with`, bytes copied out before
it ends; grow the map only with no transaction open (hence `_lock`); open after fork.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import random
import re
import shutil
import sys
import threading
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import lmdb

from safefiles import open_regular

from .commit_record import CommitRecord, compare, read_record, write_record
from .errors import (
    REBUILD_HINT,
    CorruptPageError,
    ManifestNotFoundError,
    PageConflictError,
    PagingError,
    StoreClosedError,
    StoreCorruptedError,
    StoreFullError,
    StoreIntegrityError,
    StoreReadOnlyError,
)
from .framing import body_len, open_value, seal_value
from .page import FORMAT_VERSION, Page, format_note, is_valid_page
from .pause_points import pause_point
from .store_lock import WriterLock
from .tier import Tier

T = TypeVar("T")
_OPEN_PATHS: set[str] = set()
_OPEN_LOCK = threading.Lock()
_PAYLOAD_NBYTES = b"__paging.payload_nbytes"
_FORMAT = b"__paging.format_version"
_KEY_BATCH = 1024
_MAX_WRITE_ATTEMPTS = 16
_DISK_SLACK = 16 << 20  # free bytes under which an I/O error means "disk full"
_MIN_DATA_NBYTES = 2 * 4096  # LMDB's two meta pages
MAX_MAP_SIZE = sys.maxsize  # py-lmdb takes a size_t; past it a raw OverflowError
_EXTEND_PIECE = 1 << 20  # zeros written past the end of data.mdb in pieces of this size (see _extend_file)
_EXTEND_SLACK = 64 << 10  # plus 1/64 of the values: room for the B-tree pages a transaction adds
_RESTORE_HINT = (f"{REBUILD_HINT}; if this state is intended (an older backup put back on purpose), delete "
                 "its tieredkv.commit file to accept it as it is")


_PAGE_KEY = re.compile(rb"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class Freed:
    """What `LMDBTier.free_unreferenced` did: whether the manifest was there, the pages freed (payload
    bytes), and the remaining manifests it could not read (while there are any, no page is freed)."""

    found: bool
    page_keys: tuple[str, ...]
    nbytes: int
    unreadable: tuple[str, ...]


def _is_page_key(raw: bytes) -> bool:
    return _PAGE_KEY.fullmatch(raw) is not None


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# LMDB's own word that data.mdb is damaged (it checksums nothing: it says so only when it trips over a bad
# page). At open, a damaged meta page can also read as a map size this machine cannot map, or a bigger one.
_DAMAGED = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.BadTxnError,
            lmdb.VersionMismatchError, lmdb.PanicError)
_DAMAGED_AT_OPEN = _DAMAGED + (lmdb.MapResizedError, lmdb.MemoryError)


def _damaged(path: str, exc: lmdb.Error) -> StoreCorruptedError:
    return StoreCorruptedError(f"LMDB finds store {path} damaged ({exc}): a B-tree or meta page of data.mdb "
                               f"was altered — {REBUILD_HINT}")


def _store_path(path: str | os.PathLike) -> str:
    """`path` as given, refused if blank (it would open the current directory as the store)."""
    path = os.fspath(path)
    if isinstance(path, bytes):  # NOTE: every name joined to it below is str; a bytes path would mix the two
        raise PagingError(f"store path {path!r} is bytes; give it as a str or pathlib.Path (os.fsdecode(path))")
    if not path.strip():
        raise PagingError(f"store path {path!r} is blank; give the directory of the store (it is created if missing)")
    return path


def _holds_nothing(path: str) -> bool:
    """No store at `path` yet: no data.mdb, or an empty one (LMDB starts a new store in either)."""
    data = os.path.join(path, "data.mdb")
    return not os.path.exists(data) or os.path.getsize(data) == 0


def _maps_when_asked_less(path: str) -> bool:
    """Whether LMDB opens the store at `path` with a small map: if so, the map size asked for was too big for
    this machine; if not, its meta page asks for a map no machine makes (it was damaged)."""
    try:
        lmdb.open(path, map_size=1 << 20, subdir=True, max_dbs=4, readonly=True, lock=False).close()
    except lmdb.Error:
        return False
    return True


_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def _why_not_writable(path: str) -> str | None:
    """Why the files of the store at `path` cannot be opened for writing (None: they can). Each must be a
    regular file (safefiles.open_regular: a symlink or a FIFO is refused, never followed or waited on)."""
    for name, flags in (("data.mdb", os.O_RDWR), ("lock.mdb", os.O_RDWR | os.O_CREAT)):
        try:
            os.close(open_regular(os.path.join(path, name), flags))
        except OSError as exc:
            if exc.errno not in _NOT_WRITABLE:
                raise
            return (f"{'a read-only file system' if exc.errno == errno.EROFS else 'no permission to write'} "
                    f"({name}: {exc.strerror})")
    return None


def _key_text(raw: bytes) -> str:
    """A stored key as text; bytes that are not UTF-8 (damaged) are shown as \\xNN escapes."""
    return raw.decode("utf-8", "backslashreplace") if raw else "(an empty key)"


def _disk_free(path: str) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def _is_disk_full(exc: lmdb.Error, path: str, nbytes_hint: int) -> bool:
    """ENOSPC, or an I/O error while the disk has (almost) no room left.

    NOTE: without writemap, LMDB reports a short write on a full disk as EIO, not ENOSPC.
    """
    if isinstance(exc, lmdb.DiskError) or "No space left" in str(exc):
        return True
    return _disk_free(path) < 2 * nbytes_hint + _DISK_SLACK


class LMDBTier(Tier):
    """Every page, persistent. `put` never returns False: it raises StoreFullError."""

    name = "lmdb"

    def __init__(self, path: str | os.PathLike, *, map_size: int = 1 << 30,
                 max_map_size: int | None = None, readonly: bool = False,
                 readahead: bool = True, allow_damaged: bool = False, readonly_fallback: bool = False) -> None:
        """Open (or create) the store at `path`.

        A store whose files cannot be opened for writing (a read-only file system, a directory this user
        may not write) opens read-only with `readonly_fallback` (LMDB without its lock file: nothing can
        write there either), else StoreReadOnlyError; it is never taken for a damaged one.

        Refused with StoreIntegrityError: a data.mdb shorter than its committed pages (it was
        truncated; reading it would SIGBUS), or contents that do not match the commit record
        (commit_record.py). With `allow_damaged=True` (for `check`) a store that does not match its
        record opens read-only in effect: `damage` says what is wrong and every write is refused.
        """
        top = MAX_MAP_SIZE if max_map_size is None else max_map_size
        if not 0 < map_size <= top <= MAX_MAP_SIZE:
            raise PagingError(f"need 0 < map_size <= max_map_size <= {MAX_MAP_SIZE}, got {map_size}, "
                              f"{max_map_size}")
        self.path = os.path.realpath(_store_path(path))
        self.max_map_size = max_map_size
        self.readonly = readonly
        self._readonly_fallback = readonly_fallback
        self.verified_reads = 0
        self.corrupt_detected = 0
        self.quarantined = 0
        self.damage: list[str] = []
        self.record_note: str | None = None
        self._lock = threading.RLock()
        self._pid = os.getpid()
        with _OPEN_LOCK:
            if self.path in _OPEN_PATHS:
                raise PagingError(
                    f"LMDB store {self.path} is already open in this process; LMDB forbids "
                    f"opening one path twice — share the open PageStore/LMDBTier instead")
            _OPEN_PATHS.add(self.path)
        self._env = None
        self._writer: WriterLock | None = None
        is_new = _holds_nothing(self.path)
        try:
            self._open(map_size, readahead, allow_damaged)
        except BaseException as exc:
            if self._writer is not None:
                self._writer.close()
            if self._env is not None:
                self._env.close()
            self._unregister()
            typed = self._open_error(exc, map_size, is_new)
            if typed is None:
                raise
            raise typed from exc
        self._closed = False

    def _open_error(self, exc: BaseException, map_size: int, is_new: bool) -> PagingError | None:
        """The typed error for `exc`, raised while opening; None: raise `exc` as it is."""
        if isinstance(exc, lmdb.MemoryError) and (is_new or _maps_when_asked_less(self.path)):
            return PagingError(f"this machine cannot map lmdb_map_size={map_size} bytes for store {self.path} "
                               f"({exc}) — give a smaller lmdb_map_size (the map grows as pages are written)")
        # (a plain lmdb.Error at open: py-lmdb's own check of the file's header, "data format vN")
        if ((isinstance(exc, _DAMAGED_AT_OPEN) or type(exc) is lmdb.Error)
                and os.path.exists(os.path.join(self.path, "data.mdb"))):
            return _damaged(self.path, exc)
        if isinstance(exc, lmdb.Error):
            return PagingError(f"cannot open LMDB store {self.path}: {exc}")
        if isinstance(exc, OSError) and not isinstance(exc, PagingError):
            return PagingError(f"cannot open store {self.path}: {exc.strerror or exc} — give a "
                               f"directory this process can create and write")
        return None

    def _open(self, map_size: int, readahead: bool, allow_damaged: bool) -> None:
        record, self.record_note = read_record(self.path)
        self.damage = [self.record_note] if self.record_note else []
        if self.damage and not allow_damaged:
            raise StoreIntegrityError(f"store {self.path}: {self.damage[0]} — {_RESTORE_HINT}")
        data = os.path.join(self.path, "data.mdb")
        if (record is not None or self.damage) and (not os.path.exists(data)
                                                    or os.path.getsize(data) < _MIN_DATA_NBYTES):
            size = os.path.getsize(data) if os.path.exists(data) else None
            what = (f"committed transaction {record.txnid} with {len(record.manifests)} artifacts" if record
                    else "has a commit record")
            raise StoreIntegrityError(
                f"store {self.path} {what}, but its data.mdb is {'missing' if size is None else f'{size} bytes'}: "
                f"it was deleted or truncated — {_RESTORE_HINT}")
        existed = os.path.exists(data)
        lock = self._can_lock(existed)
        if not self.readonly:
            os.makedirs(self.path, exist_ok=True)
        self._env = lmdb.open(self.path, map_size=map_size, subdir=True, max_dbs=4,
                              writemap=False, sync=True, metasync=True, readahead=readahead,
                              lock=lock, readonly=self.readonly)
        self._check_size()  # NOTE: before the first read of the map: a short file is SIGBUS
        self._writer = WriterLock(self.path)
        self._env.reader_check()  # clear reader slots of killed processes
        with self._lock, self._writer.hold():
            self._dbs = self._open_dbs(record)
            record, note, state = self._record_and_state()
        if note is not None:
            self.damage = [note]
        elif record is not None:
            self.damage = compare(record, *state)
        if self.damage and not allow_damaged:
            raise StoreIntegrityError(f"store {self.path} does not match its commit record: "
                                      f"{'; '.join(self.damage)} — {_RESTORE_HINT}")
        if not self.damage:
            self._check_format()
            if record is None and existed and not self.readonly:
                with self._writer.hold():  # a store made before commit records (or its record deleted)
                    write_record(self.path, self._record_now())
                self.record_note = ("no commit record existed (a store from an older build, or its "
                                    "tieredkv.commit was deleted), so nothing could be compared; a new one "
                                    "was started from the store as it is")

    def _can_lock(self, existed: bool) -> bool:
        """Whether LMDB may use its lock file: False when the store cannot be written and is opened read-only
        (`readonly_fallback`); StoreReadOnlyError when it cannot be written and must be."""
        why = _why_not_writable(self.path) if existed else None
        if why is None:
            return True
        if not self._readonly_fallback and not self.readonly:
            raise StoreReadOnlyError(f"store {self.path} cannot be written: {why} — copy it to a writable "
                                     f"directory to write to it; check, stats and export read it as it is")
        self.readonly = True
        return False

    def _used_nbytes(self) -> int:
        """Where LMDB's last committed page ends in data.mdb."""
        return (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]

    def _check_size(self) -> None:
        need = self._used_nbytes()
        have = os.path.getsize(os.path.join(self.path, "data.mdb"))
        if have < need:
            raise StoreIntegrityError(
                f"store {self.path}: data.mdb is {have} bytes but its last committed page ends at byte "
                f"{need} (transaction {self._env.info()['last_txnid']}): the file was truncated and cannot be read — "
                f"{_RESTORE_HINT}")

    def _open_dbs(self, record: CommitRecord | None) -> dict:
        """The four sub-databases; created only in a store that never committed any."""
        names = ("pages", "manifests", "quarantine", "meta")
        try:
            return {name: self._env.open_db(name.encode(), create=False) for name in names}
        except lmdb.NotFoundError:
            if record is not None:
                raise StoreIntegrityError(
                    f"store {self.path} committed transaction {record.txnid} with {len(record.manifests)} "
                    f"artifacts, but LMDB finds no page database in data.mdb: its tree is damaged (a meta "
                    f"page) — {_RESTORE_HINT}") from None
            if self.readonly:
                raise PagingError(f"{self.path} holds no tieredkv store (no page database); open it "
                                  f"writable to create one") from None
        return {name: self._env.open_db(name.encode(), create=True) for name in names}

    def _state(self, txn: lmdb.Transaction | None = None) -> tuple[int, dict[str, int], list[str]]:
        """(txnid, entries per sub-database, artifact ids) as `txn` (or a fresh read) sees them."""
        if txn is None:
            with self._env.begin() as txn:
                return self._state(txn)
        entries = {name: txn.stat(db)["entries"] for name, db in self._dbs.items()}
        cur = txn.cursor(db=self._dbs["manifests"])
        manifests = [_key_text(k) for k in cur.iternext(keys=True, values=False)]
        return txn.id(), entries, manifests

    def _record_now(self, txn: lmdb.Transaction | None = None) -> CommitRecord:
        txnid, entries, manifests = self._state(txn)
        return CommitRecord(txnid, entries, tuple(manifests))

    def audit(self) -> list[str]:
        """What the store lacks compared with its commit record (see commit_record.py), and bookkeeping
        of its own that does not parse; [] if nothing."""
        found = set(self.damage)
        try:
            _ = self.nbytes  # read for its check: a counter that does not parse raises StoreCorruptedError
        except StoreCorruptedError as exc:
            found.add(str(exc))
        with self._lock, self._writer.hold():
            record, note, state = self._record_and_state()
        if note is not None:
            found.add(note)
        elif record is not None:
            found |= set(compare(record, *state))
        return sorted(found)

    def _record_and_state(self) -> tuple[CommitRecord | None, str | None, tuple[int, dict[str, int], list[str]] | None]:
        """(record, note, state): the commit record and LMDB's state as of the same commit (state None when
        there is no record); a record that cannot be read is (None, why, None) and sets `record_note`. Call it
        holding the writer lock.

        NOTE: under the writer lock no transaction commits between the two reads. Without it, a process
        that deletes an artifact in between (record rewritten without it, then the commit) leaves this one
        with the older record and the newer state: a committed artifact reported lost.
        """
        record, note = read_record(self.path)
        if note is not None:
            self.record_note = note
            return None, note, None
        pause_point("commit-record-read")
        return record, None, None if record is None else self._read(self._state)

    # -- plumbing ---------------------------------------------------------------------
    def _check_format(self) -> None:
        with self._env.begin(db=self._dbs["meta"]) as txn:
            stored = txn.get(_FORMAT)
        if stored is None and not self.readonly:
            self._write(lambda txn: txn.put(_FORMAT, str(FORMAT_VERSION).encode(),
                                            db=self._dbs["meta"]))
        elif stored is not None and stored != str(FORMAT_VERSION).encode():
            raise PagingError(f"store {self.path} holds page format {stored.decode()!r}; this build reads "
                              f"{FORMAT_VERSION} ({format_note(stored)}) — re-deposit into a new store or "
                              "open it with the build that wrote it")

    def _unregister(self) -> None:
        with _OPEN_LOCK:
            _OPEN_PATHS.discard(self.path)

    def reader_check(self) -> int:
        """Free reader slots left by killed processes; returns how many were freed."""
        return self._env.reader_check()

    def _check_process(self) -> None:
        if getattr(self, "_closed", False):
            raise StoreClosedError(f"LMDB store {self.path} was closed; open it again (a new PageStore) to use it")
        if os.getpid() != self._pid:
            raise PagingError(f"LMDB store {self.path} was opened in process {self._pid} and "
                              f"used in {os.getpid()} after fork(); open it in the child "
                              f"(use the multiprocessing 'spawn' context)")

    def _read(self, fn: Callable[[lmdb.Transaction], T], *, buffers: bool = False) -> T:
        # buffers=True: `fn` gets zero-copy views into the map, valid only until it returns
        self._check_process()
        with self._lock:
            self._writer.check_files()
            try:
                try:
                    with self._env.begin(buffers=buffers) as txn:
                        return fn(txn)
                except lmdb.MapResizedError:  # another process grew the map: adopt its size
                    self._env.set_mapsize(0)
                except lmdb.ReadersFullError:  # maybe slots of killed processes
                    self._env.reader_check()
                with self._env.begin(buffers=buffers) as txn:
                    return fn(txn)
            except _DAMAGED as exc:
                raise _damaged(self.path, exc) from exc

    @contextlib.contextmanager
    def views(self, keys: Sequence[str]) -> Iterator[list[memoryview | None]]:
        """Zero-copy, UNVERIFIED views of the stored values of `keys` (None where absent), all from
        one read transaction, for readers that verify while they copy (restore.py).

        NOTE: the views point into the memory map and are valid only inside the `with` block: copy
        out of them there, and let none escape. The block holds this tier's lock (the map cannot be
        resized under the views); other threads may read the views meanwhile, but must not call
        this tier. Report what fails verification with `quarantine`, successes with `note_verified`.
        """
        with self.view_reader() as view:
            yield [view(k) for k in keys]

    @contextlib.contextmanager
    def view_reader(self) -> Iterator[Callable[[str], memoryview | None]]:
        """`views`, one key at a time: a function from a key to its zero-copy, UNVERIFIED view (None
        where absent), all from one read transaction, so that workers can start on the first value
        while later ones are looked up. The same NOTE as `views` holds."""
        self._check_process()
        with self._lock:
            self._writer.check_files()
            try:
                txn = self._env.begin(buffers=True)
            except (lmdb.MapResizedError, lmdb.ReadersFullError) as exc:  # as in `_read`
                if isinstance(exc, lmdb.MapResizedError):
                    self._env.set_mapsize(0)
                else:
                    self._env.reader_check()
                txn = self._env.begin(buffers=True)
            with txn:
                db = self._dbs["pages"]

                def view(key: str) -> memoryview | None:
                    try:
                        return txn.get(key.encode(), db=db)
                    except _DAMAGED as exc:
                        raise _damaged(self.path, exc) from exc
                yield view

    def note_verified(self, num_pages: int) -> None:
        """Count pages that a reader of `views` verified (stats()["integrity"]["verified_reads"])."""
        self.verified_reads += num_pages

    def quarantine(self, key: str, raw: bytes) -> bool:
        """A reader found `raw` (the bytes stored under `key`, copied out of `views`) corrupt: move it
        to quarantine, as `get` does. True if it was moved."""
        return self._quarantine(key, raw)

    def _write(self, fn: Callable[[lmdb.Transaction], T], nbytes_hint: int = 0, *,
               forget_manifest: str | None = None) -> T:
        """Run `fn` in one write transaction; on MapFullError grow the map and retry.

        The aborted attempt leaves nothing behind, so a batch is all-or-nothing. The transaction
        holds the writer lock (store_lock.py) from begin to commit, and the commit record is
        rewritten under it; `forget_manifest` (a transaction that deletes that artifact) drops it
        from the record durably before the transaction starts.
        """
        if self.readonly:
            raise PagingError(f"store {self.path} is open read-only; reopen it writable")
        if self.damage:
            raise StoreIntegrityError(f"store {self.path} does not match its commit record "
                                      f"({'; '.join(self.damage)}); nothing is written to it — {_RESTORE_HINT}")
        self._check_process()
        with self._lock, self._writer.hold():
            if forget_manifest is not None:
                record, _ = read_record(self.path)
                if record is not None and forget_manifest in record.manifests:
                    write_record(self.path, record.without(forget_manifest), durable=True)
            if nbytes_hint:
                self._extend_file(nbytes_hint)
            for _ in range(_MAX_WRITE_ATTEMPTS - 1):
                try:
                    with self._env.begin(write=True) as txn:
                        out = fn(txn)
                        record = self._record_now(txn)  # what this transaction commits
                except lmdb.MapResizedError:
                    self._env.set_mapsize(0)
                except lmdb.ReadersFullError:
                    self._env.reader_check()
                except lmdb.MapFullError:
                    self._grow(nbytes_hint)
                except _DAMAGED as exc:
                    raise _damaged(self.path, exc) from exc
                except lmdb.Error as exc:
                    if _is_disk_full(exc, self.path, nbytes_hint):
                        raise StoreFullError(
                            f"disk full while writing to {self.path} "
                            f"({_disk_free(self.path)} bytes free); nothing was written — "
                            f"free disk space or move the store") from exc
                    raise PagingError(f"LMDB write to {self.path} failed ({exc}); the "
                                      f"transaction was rolled back") from exc
                else:
                    # NOTE: the id LMDB committed, read after the commit (still under the writer lock):
                    # a transaction that changed nothing commits nothing, and txn.id() would overstate it
                    record = dataclasses.replace(record, txnid=self._env.info()["last_txnid"])
                    try:
                        write_record(self.path, record)
                    except OSError:
                        pass  # NOTE: the older record stays: a lower bound, never a false alarm
                    return out
            raise StoreFullError(f"write to {self.path} still did not fit after "
                                 f"{_MAX_WRITE_ATTEMPTS} map resizes; nothing was written")

    def _extend_file(self, nbytes: int) -> None:
        """Write zeros past the end of data.mdb, in 1 MB pieces, where a transaction of `nbytes` will
        append its pages, so that LMDB's commit overwrites pages already in the page cache.

        NOTE: LMDB writes a page run of several MB with one writev; the kernel (ext4, Linux 6.x) caches
        it in 2 MB folios, and on VMs that report free memory to the host (Firecracker, this project's
        CI) a 2 MB folio costs a host fault to fill the first time: about 90 MB/s, against about
        5 GB/s for the same bytes written in 1 MB pieces (lab/NOTEBOOK.md, "Deposit"). Only bytes
        past the end of the file are written (LMDB never reads past its last committed page), never
        past the map; a failure (disk full) is left to LMDB's own write to report.
        """
        path = os.path.join(self.path, "data.mdb")
        want = min(self._used_nbytes() + nbytes + nbytes // 64 + _EXTEND_SLACK, self.map_size)
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            return
        try:
            size = os.fstat(fd).st_size
            zeros = memoryview(bytes(_EXTEND_PIECE))
            while size < want:
                written = os.pwrite(fd, zeros[:min(_EXTEND_PIECE - size % _EXTEND_PIECE, want - size)], size)
                if written <= 0:
                    break
                size += written
        except OSError:
            pass
        finally:
            os.close(fd)

    def _grow(self, nbytes_hint: int) -> None:
        cur = self.map_size
        new = max(2 * cur, cur + 2 * nbytes_hint + (1 << 20))
        if self.max_map_size is not None:
            new = min(new, self.max_map_size)
        if new <= cur:
            raise StoreFullError(
                f"LMDB map of {self.path} is full at max_map_size={cur} bytes; nothing was "
                f"written — raise max_map_size, remove documents (`tieredkv rm`, which keeps the pages other "
                f"documents share; never remove pages by hand), or use a new store")
        try:
            self._env.set_mapsize(new)
        except lmdb.Error as exc:
            raise StoreFullError(f"cannot grow LMDB map of {self.path} to {new} bytes "
                                 f"({exc}); nothing was written — free disk space") from exc

    def _add_payload(self, txn: lmdb.Transaction, delta: int) -> None:
        meta = self._dbs["meta"]
        cur = self._payload_count(txn.get(_PAYLOAD_NBYTES, b"0", db=meta))
        txn.put(_PAYLOAD_NBYTES, str(max(0, cur + delta)).encode(), db=meta)

    def _quarantine_in(self, txn: lmdb.Transaction, key: str, raw: bytes) -> bool:
        """Move `raw` from pages to quarantine if it is still what pages holds."""
        k = key.encode()
        txn.put(k, raw, db=self._dbs["quarantine"])
        if txn.get(k, db=self._dbs["pages"]) != raw:
            return False
        txn.delete(k, db=self._dbs["pages"])
        self._add_payload(txn, -body_len(raw))
        return True

    def _quarantine(self, key: str, raw: bytes) -> bool:
        self.corrupt_detected += 1
        if self.readonly or self.damage:
            return False
        moved = self._write(lambda txn: self._quarantine_in(txn, key, raw))
        self.quarantined += int(moved)
        return moved

    # -- pages ------------------------------------------------------------------------
    def put(self, page: Page) -> bool:
        return self.put_many([page])[0]

    def put_many(self, pages: Iterable[Page]) -> list[bool]:
        """Write every page in one transaction (all or nothing).

        Same key + same bytes is a no-op. Same key + other bytes raises PageConflictError
        (nothing written) unless the stored bytes fail verification, in which case they
        are quarantined and replaced.
        """
        items = [(p.key.encode(), p.to_bytes()) for p in pages]
        db = self._dbs["pages"]
        replaced: list[str] = []

        def txn_fn(txn: lmdb.Transaction) -> list[bool]:
            replaced.clear()
            added = 0
            for k, value in items:
                old = txn.get(k, db=db)
                if old == value:
                    continue
                if old is not None:
                    if is_valid_page(old, k.decode()):
                        raise PageConflictError(
                            f"page {k.decode()} is stored with different bytes: the same "
                            f"token chain produced different KV — check the determinism "
                            f"domain (model, dtype, device, versions, chunk schedule)")
                    self._quarantine_in(txn, k.decode(), old)
                    replaced.append(k.decode())
                txn.put(k, value, db=db)
                added += body_len(value)
            self._add_payload(txn, added)
            return [True] * len(items)

        out = self._write(txn_fn, nbytes_hint=sum(len(v) for _, v in items))
        self.corrupt_detected += len(replaced)
        self.quarantined += len(replaced)
        return out

    def get_raw(self, key: str) -> bytes | None:
        """Stored bytes of `key`, unverified (for check / export)."""
        return self._read(lambda txn: txn.get(key.encode(), db=self._dbs["pages"]))

    def get(self, key: str) -> Page | None:
        """The verified page, or None. Corrupt bytes are quarantined and re-raised."""
        def read(txn: lmdb.Transaction) -> tuple[Page | None, tuple[CorruptPageError, bytes] | None]:
            # NOTE: verified on the zero-copy view, inside the transaction; then one copy of the
            # payload (not a copy of the value and a second one of its payload)
            view = txn.get(key.encode(), db=self._dbs["pages"])
            if view is None:
                return None, None
            try:
                return Page.from_bytes(view, expected_key=key), None
            except CorruptPageError as exc:
                return None, (exc, bytes(view))

        page, failed = self._read(read, buffers=True)
        if failed is not None:
            exc, raw = failed
            self._quarantine(key, raw)
            raise exc
        if page is not None:
            self.verified_reads += 1
        return page

    def contains(self, key: str) -> bool:
        return self._read(lambda txn: txn.get(key.encode(), db=self._dbs["pages"])
                          is not None)

    def remove(self, key: str) -> bool:
        def txn_fn(txn: lmdb.Transaction) -> bool:
            raw = txn.get(key.encode(), db=self._dbs["pages"])
            if raw is None:
                return False
            txn.delete(key.encode(), db=self._dbs["pages"])
            self._add_payload(txn, -body_len(raw))
            return True
        return self._write(txn_fn)

    def _iter_keys(self, db_name: str) -> Iterator[bytes]:
        """Keys in order, read in short transactions of `_KEY_BATCH` keys."""
        last: bytes | None = None
        while True:
            def batch(txn: lmdb.Transaction) -> list[bytes]:
                cur = txn.cursor(db=self._dbs[db_name])
                if last is None:
                    ok = cur.first()
                else:
                    ok = cur.set_range(last)
                    if ok and cur.key() == last:
                        ok = cur.next()
                out: list[bytes] = []
                while ok and len(out) < _KEY_BATCH:
                    out.append(cur.key())
                    ok = cur.next()
                return out
            keys = self._read(batch)
            yield from keys
            if len(keys) < _KEY_BATCH or (last is not None and keys[-1] <= last):
                return  # NOTE: the second test ends a walk over keys whose order was damaged on disk
            last = keys[-1]

    def keys(self) -> Iterator[str]:
        """Page keys; a key whose bytes are not a page key (damaged on disk) is left to `check`."""
        return (k.decode("ascii") for k in self._iter_keys("pages") if _is_page_key(k))

    def quarantined_keys(self) -> list[str]:
        return [_key_text(k) for k in self._iter_keys("quarantine")]

    def get_quarantined(self, key: str) -> bytes | None:
        return self._read(lambda txn: txn.get(key.encode(), db=self._dbs["quarantine"]))

    @property
    def num_pages(self) -> int:
        return self._read(lambda txn: txn.stat(self._dbs["pages"])["entries"])

    @property
    def num_quarantined(self) -> int:
        return self._read(lambda txn: txn.stat(self._dbs["quarantine"])["entries"])

    @property
    def nbytes(self) -> int:
        """Payload bytes of the stored pages (a counter kept in the same transactions)."""
        return self._payload_count(self._read(lambda txn: txn.get(_PAYLOAD_NBYTES, b"0", db=self._dbs["meta"])))

    def _payload_count(self, raw: bytes) -> int:
        if not (isinstance(raw, bytes) and raw.isdigit() and len(raw) < 20):
            raise StoreCorruptedError(
                f"store {self.path}: its payload byte counter ({_PAYLOAD_NBYTES.decode()}) reads {raw[:40]!r}, not a "
                f"count: the store's bookkeeping was altered — {REBUILD_HINT}")
        return int(raw)

    @property
    def disk_nbytes(self) -> int:
        """Size of data.mdb on disk."""
        return os.path.getsize(os.path.join(self.path, "data.mdb"))

    @property
    def map_size(self) -> int:
        return self._env.info()["map_size"]

    def check(self, sample: float = 1.0, seed: int = 0) -> dict:
        """Re-verify a `sample` fraction of the pages; quarantine the corrupt ones.

        A stored key that is not a page key (its bytes were damaged on disk) is always checked:
        its value is moved to quarantine under "damaged-key:<hex of the key>" and reported.
        """
        if not 0.0 <= sample <= 1.0:
            raise PagingError(f"check sample must be in [0, 1], got {sample}")
        rng = random.Random(seed)
        checked = ok = 0
        bad: list[str] = []
        damaged_keys: list[str] = []
        for raw_key in list(self._iter_keys("pages")):
            if not _is_page_key(raw_key):
                checked += 1
                damaged_keys.append(_key_text(raw_key))
                self._quarantine_damaged_key(raw_key)
                continue
            key = raw_key.decode("ascii")
            if sample < 1.0 and rng.random() >= sample:
                continue
            raw = self.get_raw(key)
            if raw is None:
                continue  # removed meanwhile
            checked += 1
            if is_valid_page(raw, key):
                ok += 1
            else:
                self._quarantine(key, raw)
                bad.append(key)
        return {"checked": checked, "ok": ok, "corrupt": len(bad) + len(damaged_keys), "quarantined_keys": bad,
                "damaged_keys": damaged_keys}

    def _quarantine_damaged_key(self, raw_key: bytes) -> None:
        self.corrupt_detected += 1
        if self.readonly or self.damage:
            return

        def txn_fn(txn: lmdb.Transaction) -> None:
            cur = txn.cursor(db=self._dbs["pages"])  # NOTE: a cursor: get/delete refuse an empty key
            if not cur.set_range(raw_key) or cur.key() != raw_key:
                return
            value = cur.value()
            txn.put(b"damaged-key:" + raw_key.hex().encode()[:400], value, db=self._dbs["quarantine"])
            cur.delete()
            self._add_payload(txn, -body_len(value))
        self._write(txn_fn)
        self.quarantined += 1

    # -- manifests and meta -----------------------------------------------------------
    @staticmethod
    def _id(artifact_id: str) -> bytes:
        if not isinstance(artifact_id, str) or not artifact_id:
            raise PagingError(f"artifact id must be a non-empty str, got {artifact_id!r}")
        k = artifact_id.encode("utf-8")
        if len(k) > 511:
            raise PagingError(f"artifact id is {len(k)} bytes; LMDB keys are at most 511")
        return k

    def put_manifest(self, artifact_id: str, data: bytes) -> None:
        """Store `data` under `artifact_id`. Same bytes again is a no-op; other bytes
        raise PageConflictError (delete_manifest first to replace it)."""
        k = self._id(artifact_id)
        value = seal_value(data)
        db = self._dbs["manifests"]

        def txn_fn(txn: lmdb.Transaction) -> None:
            old = txn.get(k, db=db)
            if old == value:
                return
            if old is not None:
                raise PageConflictError(
                    f"manifest {artifact_id!r} exists with other bytes; delete_manifest "
                    f"first if replacing it is intended")
            txn.put(k, value, db=db)
        self._write(txn_fn, nbytes_hint=len(value))

    def get_manifest(self, artifact_id: str) -> bytes:
        k = self._id(artifact_id)
        raw = self._read(lambda txn: txn.get(k, db=self._dbs["manifests"]))
        if raw is None:
            raise ManifestNotFoundError(
                f"no manifest {artifact_id!r} in {self.path}; list_manifests() shows what "
                f"is stored — deposit or import the artifact first")
        data = open_value(raw)
        if data is None:
            self.corrupt_detected += 1
            raise CorruptPageError(artifact_id, "manifest sha256 mismatch")
        return data

    def list_manifests(self) -> list[str]:
        """Artifact ids; an id whose bytes are not UTF-8 (damaged on disk) is left to `check`."""
        return [k.decode("utf-8") for k in self._iter_keys("manifests") if k and _is_utf8(k)]

    def damaged_manifest_keys(self) -> list[str]:
        """Manifest keys that are empty or not UTF-8 (shown escaped); `check` reports them."""
        return [_key_text(k) for k in self._iter_keys("manifests") if not (k and _is_utf8(k))]

    def delete_manifest(self, artifact_id: str) -> bool:
        k = self._id(artifact_id)
        return self._write(lambda txn: txn.delete(k, db=self._dbs["manifests"]), forget_manifest=artifact_id)

    def free_unreferenced(self, artifact_id: str | None, pages_of: Callable[[bytes], Sequence[str]], *,
                          keep: frozenset[str] = frozenset(), meta_names: Sequence[str] = (),
                          dry_run: bool = False) -> Freed:
        """In one write transaction: delete manifest `artifact_id` (None: none, a garbage collection) and the
        meta entries `meta_names`, then the pages no remaining manifest lists and `keep` does not hold: the
        deleted manifest's pages, or with `artifact_id` None every stored page.

        `pages_of(manifest data)` lists a manifest's page keys (ValueError if it cannot tell). NOTE: the
        reference counts are derived from the manifests inside the transaction that frees the pages (the
        writer lock keeps other writers' manifests out meanwhile), never kept as counters that could drift;
        while a remaining manifest cannot be read no page is freed (its references are unknown).
        `dry_run`: the same answer from a read transaction, nothing changed.
        """
        aid = None if artifact_id is None else self._id(artifact_id)

        def txn_fn(txn: lmdb.Transaction) -> Freed:
            referenced, unreadable, candidates = set(keep), [], None
            for k, raw in txn.cursor(db=self._dbs["manifests"]):
                data = open_value(raw)
                try:
                    keys = pages_of(data) if data is not None else None
                except ValueError:
                    keys = None
                if k == aid:
                    candidates = set(keys or ())
                elif keys is None:
                    unreadable.append(_key_text(k))
                else:
                    referenced.update(keys)
            if aid is None:
                candidates = {k.decode("ascii") for k in txn.cursor(db=self._dbs["pages"]).iternext(values=False)
                              if _is_page_key(k)}
            freed, nbytes = [], 0
            for key in sorted((candidates or set()) - referenced) if not unreadable else ():
                raw = txn.get(key.encode(), db=self._dbs["pages"])
                if raw is None:
                    continue
                freed.append(key)
                nbytes += body_len(raw)
                if not dry_run:
                    txn.delete(key.encode(), db=self._dbs["pages"])
            found = candidates is not None
            if not dry_run:
                self._add_payload(txn, -nbytes)
                if aid is not None:
                    txn.delete(aid, db=self._dbs["manifests"])
                for name in meta_names:
                    txn.delete(name.encode("utf-8"), db=self._dbs["meta"])
            return Freed(found, tuple(freed), nbytes, tuple(unreadable))
        if dry_run:
            return self._read(txn_fn)
        return self._write(txn_fn, forget_manifest=artifact_id)

    def get_meta(self, name: str) -> str | None:
        raw = self._read(lambda txn: txn.get(name.encode("utf-8"), db=self._dbs["meta"]))
        try:
            return None if raw is None else raw.decode("utf-8")
        except UnicodeDecodeError:
            raise StoreCorruptedError(f"store {self.path}: its meta value {name!r} is not UTF-8 ({raw[:40]!r}): it "
                                      f"was altered on disk") from None

    def set_meta(self, name: str, value: str) -> None:
        if not isinstance(name, str) or not name or name.startswith("__paging"):
            raise PagingError(f"meta name {name!r} is empty or reserved (\"__paging*\")")
        if not isinstance(value, str):
            raise PagingError(f"meta values are str, got {type(value).__name__}")
        self._write(lambda txn: txn.put(name.encode("utf-8"), value.encode("utf-8"),
                                        db=self._dbs["meta"]))

    def set_meta_if_absent(self, name: str, value: str) -> str:
        """Set meta `name` to `value` unless it has a value; either way return the value it holds after. The
        read and the write are one write transaction (compare-and-set): of two processes that both find it
        unset, one sets it and the other gets that value back."""
        if not isinstance(name, str) or not name or name.startswith("__paging"):
            raise PagingError(f"meta name {name!r} is empty or reserved (\"__paging*\")")
        if not isinstance(value, str):
            raise PagingError(f"meta values are str, got {type(value).__name__}")

        def cas(txn: lmdb.Transaction) -> bytes:
            held = txn.get(name.encode("utf-8"), db=self._dbs["meta"])
            pause_point("meta-read")
            if held is None:
                held = value.encode("utf-8")
                txn.put(name.encode("utf-8"), held, db=self._dbs["meta"])
            return bytes(held)
        raw = self._write(cas)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise StoreCorruptedError(f"store {self.path}: its meta value {name!r} is not UTF-8 ({raw[:40]!r}): it "
                                      f"was altered on disk") from None

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self._env.close()
            self._writer.close()
        finally:
            self._unregister()

    def __enter__(self) -> "LMDBTier":
        return self

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
