"""Deposit seals and writes pages on one background thread: in order, and an error is never lost."""
import threading

import pytest

from tieredkv.artifacts.artifact import Behind


def test_calls_run_in_order_on_one_other_thread():
    seen, threads = [], set()

    def work(i):
        seen.append(i)
        threads.add(threading.get_ident())

    with Behind(depth=2) as b:
        for i in range(20):
            b.submit(work, i)
    assert seen == list(range(20)) and threads and threading.get_ident() not in threads


def test_an_error_is_raised_and_stops_later_calls():
    seen = []

    def work(i):
        if i == 3:
            raise OSError("disk full")
        seen.append(i)

    with pytest.raises(OSError, match="disk full"):
        with Behind(depth=1) as b:
            for i in range(10):
                b.submit(work, i)
    assert seen == [0, 1, 2]


def test_an_error_in_the_caller_waits_for_running_calls():
    seen = []
    with pytest.raises(KeyError):
        with Behind() as b:
            b.submit(seen.append, 1)
            raise KeyError("caller")
    assert seen in ([], [1])  # cancelled or finished, never still running
