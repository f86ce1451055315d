"""Helpers shared by the CLI command modules: the model and store arguments, argparse types that
validate numbers, and reading user files with one-line errors."""
from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path
from typing import Any

from tieredkv.errors import TieredKVError


class InputError(TieredKVError):
    """A file, path or value given on the command line cannot be used as given."""


def model_arg(p: argparse.ArgumentParser, default: str = "smollm2") -> None:
    p.add_argument("--model", default=default, help="smollm2 (embedded), tiny-llama|tiny-qwen2|tiny-mistral|"
                   "tiny-gemma2|tiny-gemma3|tiny-gpt2, or a local HF model directory (default: %(default)s)")


def store_args(p: argparse.ArgumentParser, artifact: str | None = None) -> None:
    """--store (required) and, when `artifact` is "required" or "optional", --artifact."""
    p.add_argument("--store", required=True, help="store directory")
    if artifact is not None:
        p.add_argument("--artifact", required=artifact == "required",
                       help="artifact id or unique prefix" + ("" if artifact == "required" else " (default: all)"))


def open_store(path: str, *, must_exist: bool = False, **kw):
    """A PageStore; a shared remote tier is used when $TIEREDKV_REMOTE names one (redis://host:port/db).

    `must_exist`: refuse a path that holds no store (commands that only read or check one), instead of
    creating an empty store at a mistyped path.
    """
    from paging import PageStore, StoreConfig
    from paging.commit_record import RECORD_NAME

    # a commit record without data.mdb is a store whose data is gone: PageStore says so (StoreIntegrityError)
    if must_exist and not (Path(path) / "data.mdb").is_file() and not (Path(path) / RECORD_NAME).is_file():
        what = "is a file, not a store directory" if Path(path).is_file() else (
            "is a directory without a store (no data.mdb)" if Path(path).is_dir() else "does not exist")
        raise InputError(f"--store {path} {what}; give the directory of an existing store (deposit or import "
                         "creates one)")
    kw.setdefault("remote_from_env", True)
    return PageStore(path, StoreConfig(**kw))


def print_json(obj: Any, as_json: bool = True) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True) if as_json else obj)


# ----------------------------------------------------------------------------- argparse types
def int_at_least(minimum: int):
    """An argparse type: an int >= `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text}")
        return value
    parse.__name__ = f"int >= {minimum}"
    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)


def fraction(text: str) -> float:
    """An argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """Usage errors are one line (the command, the problem, where to look), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


# ----------------------------------------------------------------------------- user files
def regular_file(path: str, what: str) -> Path:
    """`path` as a Path if it is a regular file (not a directory, FIFO or device), else InputError."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise InputError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{what} {path} is a directory; give a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {path} is not a regular file (a FIFO, socket or device); give a file")
    if not os.access(p, os.R_OK):
        raise InputError(f"{what} {path} is not readable by this user")
    return p


def read_text_file(path: str, what: str = "file") -> str:
    """The UTF-8 text of a regular file, or InputError that says what is wrong with it."""
    data = regular_file(path, what).read_bytes()
    if b"\0" in data:
        raise InputError(f"{what} {path} is binary (it holds NUL bytes); give a UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); convert "
                         "it to UTF-8 first") from None
