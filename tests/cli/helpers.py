"""Running the CLI in-process from a test."""
from __future__ import annotations

import json
from typing import NamedTuple

from tieredkv.cli import main


class CliRun(NamedTuple):
    code: int
    data: dict | None  # stdout parsed as JSON, None if it is not JSON
    out: str
    err: str


def run(capsys, *argv) -> CliRun:
    """`tieredkv ARGV...`: its exit code, its stdout as JSON (if it is) and as text, its stderr."""
    code = main(list(argv))
    out = capsys.readouterr()
    try:
        data = json.loads(out.out)
    except ValueError:
        data = None
    return CliRun(code, data, out.out, out.err)
