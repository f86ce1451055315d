"""Named points where a test holds a process, to interleave it with another one deterministically.

    pause_point("commit-record-read")   the store has read its commit record, not yet LMDB's state
    pause_point("meta-read")            set_meta_if_absent has read the value, not yet written it

A test installs a hook in the process it starts (`set_hook(name, fn)`, typically `fn` = set one
multiprocessing.Event and wait on another); without one a pause point does nothing. NOTE: each point
sits inside the lock that makes its step atomic, so a test that holds a process there can show that
no other process gets in between (tests/faults/test_races.py).
"""
from __future__ import annotations

from typing import Callable

_hooks: dict[str, Callable[[], None]] = {}


def set_hook(name: str, fn: Callable[[], None] | None) -> None:
    """Run `fn` at pause point `name` in this process (None: remove it)."""
    if fn is None:
        _hooks.pop(name, None)
    else:
        _hooks[name] = fn


def pause_point(name: str) -> None:
    hook = _hooks.get(name)
    if hook is not None:
        hook()
