"""Helpers shared by the CLI command modules: the model and store arguments, argparse types that
validate numbers, and reading user files with one-line errors."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Iterator

from tieredkv.engine.tiered_config import MAX_PAGE_SIZE  # noqa: F401 - the CLI's bound is the config's
from tieredkv.errors import TieredKVError


class InputError(TieredKVError):
    """A file, path or value given on the command line cannot be used as given."""


DEFAULT_MODEL = "smollm2"


def model_arg(p: argparse.ArgumentParser, default: str | None = DEFAULT_MODEL, note: str | None = None) -> None:
    """--model; its default (DEFAULT_MODEL) is $TIEREDKV_MODEL when set."""
    if default == DEFAULT_MODEL:
        default = os.environ.get("TIEREDKV_MODEL", "").strip() or DEFAULT_MODEL
    p.add_argument("--model", default=default, type=model_name,
                   help="smollm2 (embedded), tiny-llama|tiny-qwen2|tiny-mistral|tiny-gemma2|tiny-gemma3|tiny-gpt2, "
                        "a local HF model directory, or a hub id (ORG/NAME) in the local Hugging Face cache, never "
                        "downloaded (" + (note or "default: %(default)s") + ")")


def store_args(p: argparse.ArgumentParser, artifact: str | None = None) -> None:
    """--store (required) and, when `artifact` is "required" or "optional", --artifact."""
    p.add_argument("--store", required=True, type=store_path, help="store directory")
    if artifact is not None:
        p.add_argument("--artifact", required=artifact == "required", type=artifact_ref,
                       help="artifact id or unique prefix" + ("" if artifact == "required" else " (default: all)"))


def open_store(path: str, *, must_exist: bool = False, **kw):
    """A PageStore; a shared remote tier is used when $TIEREDKV_REMOTE names one (redis://host:port/db).

    `must_exist`: refuse a path that holds no store (commands that only read or check one), instead of
    creating an empty store at a mistyped path.
    """
    from paging import PageStore, StoreConfig

    if must_exist:
        require_store(path)
    kw.setdefault("remote_from_env", True)
    return PageStore(path, StoreConfig(**kw))


def require_store(path: str) -> None:
    """Refuse a path that holds no store (cheap: nothing heavy is imported)."""
    from paging.commit_record import RECORD_NAME

    # a commit record without data.mdb is a store whose data is gone: PageStore says so (StoreIntegrityError)
    if not (Path(path) / "data.mdb").is_file() and not (Path(path) / RECORD_NAME).is_file():
        what = ("is a directory without a store (no data.mdb)" if Path(path).is_dir() else
                "is not a directory (a file, FIFO or device)" if os.path.lexists(path) else "does not exist")
        raise InputError(f"--store {path} {what}; give the directory of an existing store (deposit or import "
                         "creates one)")


class Refusal:
    """What `nothing_left_if_refused` yields: `refused()` marks a command that ends without an exception
    but without a result (exit 1), so what it created is removed all the same."""

    def __init__(self):
        self.failed = False

    def refused(self) -> None:
        self.failed = True


@contextlib.contextmanager
def nothing_left_if_refused(path: str) -> Iterator[Refusal]:
    """Around a command that may create a store at `path`: if the command fails (or marks itself
    `refused()`), what it created there is removed again, so a refused command leaves no empty or partial
    store behind. A store that was there before is left as it is (its own transactions keep it whole)."""
    p = Path(path)
    had_store = (p / "data.mdb").exists()
    before = set(os.listdir(p)) if p.is_dir() else None
    made = []  # the parents the command may create (`--store new/deep/kv` makes new/ and deep/), innermost first
    parent = p.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        made.append(parent)
        parent = parent.parent
    outcome = Refusal()

    def undo() -> None:
        if not had_store and before is None:
            shutil.rmtree(p, ignore_errors=True)
            for d in made:  # NOTE: only if empty: another command may have made a store beside ours meanwhile
                try:
                    os.rmdir(d)
                except OSError:
                    break
        elif not had_store:
            for name in set(os.listdir(p)) - before:
                target = p / name
                shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    try:
        yield outcome
    except BaseException:
        undo()
        raise
    if outcome.failed:
        undo()


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


def int_between(minimum: int, maximum: int):
    """An argparse type: an int in [`minimum`, `maximum`]."""
    at_least = int_at_least(minimum)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be an integer <= {maximum:,}, got {text}")
        return value
    parse.__name__ = f"int in [{minimum}, {maximum}]"
    return parse


MAX_NEW_TOKENS = 1 << 16  # a decode budget far above any answer: a typo's 10**20 is refused, not run


def utf8_text(text: str) -> str:
    """An argparse type: text that is UTF-8. NOTE: bytes that are not arrive from the shell as lone
    surrogates, which the tokenizer cannot encode (a bare UnicodeEncodeError later)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(f"is not UTF-8 text (character {exc.start} came from a byte that is not "
                                         "UTF-8); give UTF-8 text, or put it in a UTF-8 file") from None
    return text


def _not_blank(message: str):
    """An argparse type: any text that is not empty or blank; `message` ({text} the text given) otherwise."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(message.format(text=repr(text)))
        return text
    return parse


# a blank model would name the current directory, a blank artifact prefix match every artifact, and a blank
# store be the current directory (or a directory named by spaces)
model_name = _not_blank("must name a model (smollm2, tiny-llama, ...), a model directory or a hub id, got {text}")
artifact_ref = _not_blank("must be an artifact id or a prefix of one (`tieredkv stats` lists them), got an empty one")
store_path = _not_blank("must name a directory, got {text}")


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
        return data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is not text (editors add it)
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x}); convert "
                         "it to UTF-8 first") from None
