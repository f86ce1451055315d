"""Verifiers: programs that accept or reject a solution. The library stores only what one accepts.

A verifier is anything with `name` and `check(problem, solution) -> Verdict` (a plain callable
returning a bool works too, through `as_verifier`). Its *identity* is recorded next to every
verdict: the name, the SHA-256 of its source (`inspect.getsource`) and, where the source does not
say everything (an answer key, a tolerance), a declared `version`.

    v = AnswerKeyVerifier({"What is the capital of Velmora?": "Quellmar"})
    v.check("what is the capital of  velmora?", "It is Quellmar.")   # Verdict(accepted=True, ...)
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import operator
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from tieredkv.errors import TieredKVError


class VerifierSpecError(TieredKVError, TypeError):
    """An object that is neither a Verifier nor a callable was given as a verifier."""


class VerifierIdentityError(TieredKVError, TypeError):
    """A verifier whose source cannot be read and that declares no version."""


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "reason": self.reason}


@runtime_checkable
class Verifier(Protocol):
    name: str

    def check(self, problem: str, solution: str) -> Verdict: ...


def normalize_text(text: str) -> str:
    """NFKC, casefold, whitespace runs collapsed to one space, ends stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _verdict(out: Any) -> Verdict:
    if isinstance(out, Verdict):
        return out
    if isinstance(out, tuple) and len(out) == 2:
        return Verdict(bool(out[0]), str(out[1]))
    return Verdict(bool(out), "accepted" if out else "rejected")


class FunctionVerifier:
    """A callable `fn(problem, solution) -> bool | Verdict | (bool, reason)` as a Verifier."""

    def __init__(self, fn: Callable[[str, str], Any], *, name: str | None = None, version: str | None = None):
        self.fn, self.version = fn, version
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)

    def check(self, problem: str, solution: str) -> Verdict:
        return _verdict(self.fn(problem, solution))

    def source_object(self) -> Any:
        return self.fn


def as_verifier(obj: Any) -> Verifier:
    """A Verifier as is; a plain callable wrapped in FunctionVerifier."""
    if isinstance(obj, Verifier):
        return obj
    if callable(obj):
        return FunctionVerifier(obj)
    raise VerifierSpecError(f"a verifier needs `name` and `check(problem, solution)`, or is a callable; "
                            f"got {obj!r:.80}")


def verifier_identity(verifier: Any) -> dict[str, Any]:
    """{"name", "source_sha256", "version"}: what a verdict is recorded against.

    NOTE: the source of a class does not cover the data an instance holds (an answer key), so
    data-driven verifiers declare `version` (e.g. a hash of their data); it is recorded too.
    """
    v = as_verifier(verifier)
    version = getattr(v, "version", None)
    target = v.source_object() if hasattr(v, "source_object") else type(v)
    try:
        source_sha = hashlib.sha256(inspect.getsource(target).encode("utf-8")).hexdigest()
    except (OSError, TypeError):
        if version is None:
            raise VerifierIdentityError(
                f"cannot read the source of verifier {v.name!r} (defined interactively?); declare a `version` "
                "string (FunctionVerifier(fn, version=...)) so its verdicts can be attributed") from None
        source_sha = None
    return {"name": v.name, "source_sha256": source_sha, "version": None if version is None else str(version)}


# ----------------------------------------------------------------------------- ready-made verifiers
class AnswerKeyVerifier:
    """Accepts a solution that contains the expected answer of its problem (both normalized).

    `answers` maps problem text (any spelling: keys are normalized) to the answer text. Problems
    not in the key are rejected.
    """

    name = "answer-key"

    def __init__(self, answers: Mapping[str, str]):
        blank = [q for q, a in answers.items() if not normalize_text(a)]
        if blank:  # "" is in every solution: such an answer would accept anything
            raise TieredKVError(f"the answer key gives {len(blank)} problems an empty answer (first: "
                                f"{blank[0][:60]!r}), which every solution contains; give each problem its answer")
        self.answers = {normalize_text(q): a for q, a in answers.items()}
        blob = json.dumps(sorted(self.answers.items()), ensure_ascii=False).encode("utf-8")
        self.version = "key-sha256:" + hashlib.sha256(blob).hexdigest()

    def check(self, problem: str, solution: str) -> Verdict:
        expected = self.answers.get(normalize_text(problem))
        if expected is None:
            return Verdict(False, "problem not in the answer key")
        if normalize_text(expected) in normalize_text(solution):
            return Verdict(True, f"contains {expected!r}")
        return Verdict(False, f"does not contain {expected!r}")


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_INT = re.compile(r"-?\d[\d,]*")


def _eval_int(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_int(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_int(node.left), _eval_int(node.right))
    raise ValueError("only integers with + - * are supported")


def arithmetic_answer(problem: str) -> int | None:
    """The value of the integer expression in `problem` ("What is 12 + 7 * 3?"), or None if there is none."""
    m = re.search(r"(-?\d+(?:\s*[-+*x×]\s*-?\d+)+)", problem)
    if m is None:
        return None
    expr = m.group(1).replace("×", "*").replace("x", "*")
    try:
        return _eval_int(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError):
        return None


class ArithmeticVerifier:
    """Accepts a solution whose last integer equals the value of the problem's + - * expression."""

    name = "arithmetic"
    version = "last-integer-v1"

    def check(self, problem: str, solution: str) -> Verdict:
        expected = arithmetic_answer(problem)
        if expected is None:
            return Verdict(False, "no integer expression in the problem")
        found = _INT.findall(solution)
        if not found:
            return Verdict(False, "no integer in the solution")
        got = int(found[-1].replace(",", ""))
        return Verdict(got == expected, f"{got} {'==' if got == expected else '!='} {expected}")


def load_verifier(spec: str) -> Verifier:
    """A verifier from a command-line spec: `arithmetic`, `answer-key:FILE.json` (a JSON object problem ->
    answer), or `package.module:name` (a Verifier class, instance or a plain function)."""
    import importlib

    if spec == "arithmetic":
        return ArithmeticVerifier()
    if spec.startswith("answer-key:"):
        return AnswerKeyVerifier(_answer_key(spec.split(":", 1)[1]))
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise TieredKVError(f"unknown verifier {spec!r}: use `arithmetic`, `answer-key:FILE.json` or "
                            "`package.module:name`")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise TieredKVError(f"cannot load verifier {spec!r}: {e}") from None
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as e:
            raise TieredKVError(f"verifier {spec!r} is a class that cannot be made without arguments ({e}); name an "
                                "instance or a function instead") from None
    return as_verifier(obj)


def _answer_key(name: str) -> dict[str, str]:
    """The JSON object problem -> answer in file `name`, or a TieredKVError that says what is wrong."""
    import os
    import stat

    try:
        if not name or not stat.S_ISREG(os.stat(name).st_mode):  # (a FIFO would block the read forever)
            raise TieredKVError(f"answer-key:{name}: give a regular JSON file (answer-key:FILE.json)")
        with open(name, "rb") as f:
            answers = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise TieredKVError(f"answer-key:{name}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise TieredKVError(f"answer-key:{name} is not a JSON text file ({e}); it must hold a JSON object "
                            "mapping each problem to its answer") from None
    if not isinstance(answers, dict):
        raise TieredKVError(f"{name} must hold a JSON object mapping each problem to its answer")
    return {str(k): str(v) for k, v in answers.items()}
