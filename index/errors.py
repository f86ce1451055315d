"""Errors raised by the index package."""

from __future__ import annotations


class IndexStaleError(Exception):
    """A saved page index cannot be used as it is: the file is missing or corrupt, or it was
    built for another geometry, summary method or set of pages.

    NOTE: this is an expected condition, not a bug. The page store is the source of truth;
    the caller rebuilds the index from it (a fresh ``PageIndex`` plus ``add`` for every stored
    page) and saves it again. Named so as not to shadow the builtin ``IndexError``.
    """
