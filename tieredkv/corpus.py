"""Offline text: the Python language reference that ships with every CPython (`pydoc_data.topics`)."""
from __future__ import annotations

import hashlib
from functools import lru_cache


@lru_cache(maxsize=1)
def python_reference() -> str:
    """About 465,000 characters of the Python language reference, in a stable topic order."""
    from pydoc_data.topics import topics

    return "\n\n".join(f"## {name}\n\n{topics[name].strip()}" for name in sorted(topics))


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
