"""The commit record: what the store's last commit held, kept outside LMDB's B-tree.

LMDB checksums nothing. One flipped bit in the current meta page of data.mdb can point the main
tree at an older snapshot (or at no tree at all) and LMDB opens it without a word; a truncated
data.mdb maps pages that are not there (SIGBUS on the first read). The record lets the store
tell, at open and in `check`:

    <store>/tieredkv.commit   sha256(data) hex | data        (framing.seal_value)
    data = {"txnid": N, "exact": true, "entries": {"pages": .., "manifests": .., ...},
            "manifests": ["<artifact id>", ...]}

It is rewritten after every committed write transaction, under the writer lock (store_lock.py),
from the state that transaction committed. Comparing it with the store as opened:

    store txnid <  record txnid                -> rolled back (older snapshot, older copy of the file)
    store txnid == record txnid and exact      -> every entry count and the artifact list must be equal
    store txnid >= record txnid                -> every artifact of the record must still be there

NOTE: the record only ever claims less than LMDB made durable: it is written after the commit
returned (LMDB fsyncs), so a crash between the two leaves an older record, never a false alarm.
That is why the post-commit write is not fsynced: losing it to a power cut leaves the previous
record, which is still a lower bound. The one write that must be durable is the one before a
transaction that removes an artifact (`forget`): the record drops the artifact first, so that a
crash between the two never reports a deleted artifact as lost.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from safefiles import AtomicFile, read_regular

from .framing import open_value, seal_value

RECORD_NAME = "tieredkv.commit"
_MAX_RECORD_BYTES = 64 << 20  # the artifact ids of a very large store; a bigger file is not a record


@dataclass(frozen=True)
class CommitRecord:
    txnid: int
    entries: dict[str, int]
    manifests: tuple[str, ...]
    exact: bool = True  # False: written ahead of a transaction that may not have committed

    def to_bytes(self) -> bytes:
        data = {"txnid": self.txnid, "exact": self.exact, "entries": self.entries,
                "manifests": list(self.manifests)}
        return seal_value(json.dumps(data, sort_keys=True).encode())

    @classmethod
    def from_bytes(cls, raw: bytes) -> "CommitRecord | None":
        """The record, or None when its checksum or structure is wrong (a torn or damaged file)."""
        data = open_value(raw)
        if data is None:
            return None
        try:
            d = json.loads(data)
            rec = cls(int(d["txnid"]), {str(k): int(v) for k, v in d["entries"].items()},
                      tuple(str(m) for m in d["manifests"]), bool(d["exact"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return rec

    def without(self, artifact_id: str) -> "CommitRecord":
        return CommitRecord(self.txnid, self.entries, tuple(m for m in self.manifests if m != artifact_id),
                            exact=False)


def record_path(store_dir: str) -> str:
    return os.path.join(store_dir, RECORD_NAME)


def read_record(store_dir: str) -> tuple[CommitRecord | None, str | None]:
    """(record, note): (None, None) when there is none; (None, why) when it is unreadable (damage: the
    store cannot be compared with what it committed, and the record is not replaced)."""
    try:  # NOTE: a regular file only: a FIFO here would hang the read, a symlink read another file
        raw = read_regular(record_path(store_dir), _MAX_RECORD_BYTES)
    except (FileNotFoundError, NotADirectoryError):  # (a store path that is a file: LMDB says so)
        return None, None
    except OSError as exc:
        return None, f"the commit record could not be read ({exc})"
    rec = CommitRecord.from_bytes(raw)
    if rec is None:  # NOTE: not a crash: the record is replaced by a rename, never written in place
        return None, (f"the commit record {record_path(store_dir)} failed its checksum: it was altered or "
                      f"damaged, so whether data.mdb rolled back cannot be checked")
    return rec, None


def write_record(store_dir: str, record: CommitRecord, *, durable: bool = False) -> None:
    """Replace the record atomically (a new temp file, never one that exists, then a rename). Call it
    holding the writer lock."""
    with AtomicFile(record_path(store_dir), durable=durable) as f:
        f.write(record.to_bytes())


def compare(record: CommitRecord, txnid: int, entries: dict[str, int], manifests: list[str]) -> list[str]:
    """What the store as opened lacks compared with its record; [] when it is consistent."""
    problems: list[str] = []
    lost = sorted(set(record.manifests) - set(manifests))
    if txnid < record.txnid:
        problems.append(f"LMDB opened transaction {txnid}, but transaction {record.txnid} was committed: the store "
                        f"rolled back to an older snapshot (a damaged meta page in data.mdb, or an older copy of "
                        f"the file)")
    elif txnid == record.txnid and record.exact:
        diffs = [f"{name} {record.entries[name]} -> {entries.get(name)}" for name in sorted(record.entries)
                 if entries.get(name) != record.entries[name]]
        extra = sorted(set(manifests) - set(record.manifests))
        if diffs or extra:
            problems.append(f"at transaction {txnid} the store committed other contents than it shows now "
                            f"({'; '.join(diffs + [f'{len(extra)} artifacts not committed' for _ in extra[:1]])}): "
                            f"data.mdb was damaged")
    if lost:
        more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
        problems.append(f"{len(lost)} committed artifacts are gone: {', '.join(lost[:5])}{more}")
    return problems
