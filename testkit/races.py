"""Two processes interleaved at a pause point (paging/pause_points.py), for tests/faults/test_races.py.

    held = Held.start(ctx, "commit-record-read", target, args)   # child 1 runs until the pause point
    held.lock_is_held(store)                                       # is the store's writer lock held there?
    ... run child 2 (before or after releasing, as the lock allows) ...
    held.release(); held.result()

No sleeps: each step waits on an Event or on a process's end.
"""
from __future__ import annotations

import errno
import fcntl
import os
import queue
from dataclasses import dataclass
from typing import Any, Callable

_WAIT_S = 240.0  # a spawned child imports torch and transformers first; this only bounds a broken run


def _held_child(point: str, reached, go, target: Callable[..., Any], args: tuple, out) -> None:
    """In the child: pause once at `point` (say so, wait for `go`), run `target(*args)`, report what it returned."""
    from paging.pause_points import set_hook

    def hold() -> None:
        set_hook(point, None)  # once
        reached.set()
        go.wait(_WAIT_S)

    set_hook(point, hold)
    try:
        out.put({"ok": True, "value": target(*args)})
    except Exception as exc:  # noqa: BLE001  (reported to the test, which judges it)
        out.put({"ok": False, "error": type(exc).__name__, "message": str(exc)})


def _child(target: Callable[..., Any], args: tuple, out) -> None:
    try:
        out.put({"ok": True, "value": target(*args)})
    except Exception as exc:  # noqa: BLE001
        out.put({"ok": False, "error": type(exc).__name__, "message": str(exc)})


@dataclass
class Child:
    process: Any
    out: Any

    @classmethod
    def start(cls, ctx, target: Callable[..., Any], args: tuple) -> "Child":
        out = ctx.Queue()
        p = ctx.Process(target=_child, args=(target, args, out))
        p.start()
        return cls(p, out)

    def result(self) -> dict[str, Any]:
        try:
            return self.out.get(timeout=_WAIT_S)
        except queue.Empty:
            return {"ok": False, "error": "no result", "message": f"exit code {self.process.exitcode}"}
        finally:
            self.process.join(30)
            if self.process.is_alive():
                self.process.kill()


@dataclass
class Held(Child):
    go: Any = None

    @classmethod
    def start_held(cls, ctx, point: str, target: Callable[..., Any], args: tuple) -> "Held":
        """Start `target(*args)` in a child and wait until it reaches `point` (AssertionError if it never does)."""
        reached, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
        p = ctx.Process(target=_held_child, args=(point, reached, go, target, args, out))
        p.start()
        if not reached.wait(_WAIT_S):
            p.kill()
            raise AssertionError(f"the child never reached pause point {point!r}")
        return cls(p, out, go)

    def release(self) -> None:
        self.go.set()


def writer_lock_is_held(store: str) -> bool:
    """Whether another process holds the store's writer lock (flock on data.mdb, paging/store_lock.py)."""
    fd = os.open(os.path.join(store, "data.mdb"), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # (closing drops the flock if it was taken)
    return False


# ----------------------------------------------------------------------------- what the children run
def open_and_audit(store: str) -> list[str]:
    """Open the store as `check` does and return what it finds wrong (its damage, then its audit)."""
    from paging import PageStore, StoreConfig

    with PageStore(store, StoreConfig(allow_damaged=True, host_budget_bytes=0)) as s:
        return s.lmdb_tier.damage + s.lmdb_tier.audit()


def delete_manifest(store: str, artifact_id: str) -> bool:
    from paging import PageStore, StoreConfig

    with PageStore(store, StoreConfig(host_budget_bytes=0)) as s:
        return s.delete_manifest(artifact_id)


def deposit_with(model: str, store: str, text: str) -> str:
    """Deposit `text` with `model` into `store`; the artifact id."""
    from paging import PageStore, StoreConfig
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.models.loading import load_model

    lm = load_model(model)
    with PageStore(store, StoreConfig(host_budget_bytes=0)) as s:
        return deposit(lm, text, s, page_size=8).artifact_id


def model_fingerprint(model: str) -> str:
    from tieredkv.models.loading import load_model

    return load_model(model).fingerprint
