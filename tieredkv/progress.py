"""Progress bars (tqdm on stderr) for long work; silent when asked."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from tqdm import tqdm


@contextlib.contextmanager
def count_bar(desc: str, total: int | None = None, *, unit: str, quiet: bool = False,
              unit_scale: bool = False) -> Iterator[Callable[[int, int], None]]:
    """Yields `update(done, total)`. The bar appears on the first update (so a total that is only
    known then still works) and closes on exit."""
    bar = None

    def update(done: int, new_total: int) -> None:
        nonlocal bar
        if quiet:
            return
        if bar is None:
            bar = tqdm(total=total if total is not None else new_total, desc=desc, unit=unit,
                       unit_scale=unit_scale, file=sys.stderr, leave=False)
        bar.n = done
        bar.refresh()

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def token_bar(desc: str, *, quiet: bool = False):
    """A `count_bar` in tokens, showing tokens/s."""
    return count_bar(desc, unit="tok", unit_scale=True, quiet=quiet)
