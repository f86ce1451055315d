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


# The QA demo's default document: the simple and compound statements of the language reference
# (about 11,000 SmolLM2 tokens, longer than the model's 8,192-token window).
DEFAULT_TOPICS = ("assert", "break", "class", "continue", "del", "exceptions", "for", "function", "global", "if",
                  "import", "lambda", "nonlocal", "pass", "raise", "return", "try", "while", "with", "yield")
DEFAULT_QUESTION = "What does the nonlocal statement do?"


def default_document() -> str:
    """A long, offline, versioned document: chosen topics of the Python language reference."""
    from pydoc_data.topics import topics

    return "\n\n".join(f"## The {name} statement\n\n{topics[name].strip()}" for name in DEFAULT_TOPICS
                       if name in topics)
