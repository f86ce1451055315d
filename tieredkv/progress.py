"""Progress bars (tqdm on stderr) for long work; silent when asked or when stderr is not a terminal."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from tqdm import tqdm


@contextlib.contextmanager
def token_bar(desc: str, *, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """Yields `update(done_tokens, total_tokens)`; shows tokens/s."""
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if quiet:
            return
        if bar is None:
            bar = tqdm(total=total, desc=desc, unit="tok", unit_scale=True, file=sys.stderr, leave=False)
        bar.n = done
        bar.refresh()

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


@contextlib.contextmanager
def count_bar(desc: str, total: int, *, unit: str, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    bar = None if quiet else tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)

    def update(done: int, _total: int) -> None:
        if bar is not None:
            bar.n = done
            bar.refresh()

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()
