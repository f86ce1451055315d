"""The library of verified solutions: refusal, addressing, recurring recall, the flywheel, persistence.

tiny-llama (byte tokenizer, random weights): its generations are noise, so verifiers here are
chosen to accept or reject on purpose; what is pinned is the library's behaviour around them.
"""
from __future__ import annotations

import contextlib
import json

import pytest

from paging import PageStore, StoreConfig
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.errors import EmptyInputError
from tieredkv.library.entries import CorruptLibraryError, problem_sha256
from tieredkv.library.solutions import Library, SolutionRejectedError
from tieredkv.library.verifiers import (
    AnswerKeyVerifier,
    ArithmeticVerifier,
    FunctionVerifier,
    VerifierIdentityError,
    load_verifier,
    verifier_identity,
)

CONFIG = TieredConfig(local_pages=2, topk_pages=2)


def accept_nonempty(problem: str, solution: str) -> bool:
    return bool(solution.strip())


def reject_all(problem: str, solution: str) -> bool:
    return False


ACCEPT = FunctionVerifier(accept_nonempty)
REJECT = FunctionVerifier(reject_all)


@pytest.fixture
def lm(tiny_model):
    return tiny_model("tiny-llama")


@contextlib.contextmanager
def opened(lm, path, **kw):
    with PageStore(path, StoreConfig(host_budget_bytes=1 << 28)) as store:
        yield Library(lm, store, config=CONFIG, max_new_tokens=6, **kw)


# ----------------------------------------------------------------------------- addressing and verifiers
def test_problem_hash_normalizes_case_width_and_whitespace():
    h = problem_sha256("What is 12 + 7?")
    assert problem_sha256("  what IS\t12 +\n 7? ") == h
    assert problem_sha256("What is １２ + ７?") == h  # fullwidth digits: NFKC
    assert problem_sha256("WHAT IS 12 + 7?") == h
    assert problem_sha256("What is 12 + 8?") != h
    assert problem_sha256("What is 12+7?") != h  # whitespace is collapsed, not removed


def test_verifiers_and_their_identity(tmp_path):
    a = ArithmeticVerifier()
    assert a.check("What is 12 + 7 * 2?", "It is 26.").accepted
    assert not a.check("What is 12 + 7?", "18").accepted
    key = AnswerKeyVerifier({"Capital of Velmora?": "Quellmar"})
    assert key.check("capital of  velmora?", "It is QUELLMAR.").accepted
    assert not key.check("Capital of Korvia?", "Quellmar").accepted
    ident = verifier_identity(a)
    assert ident["name"] == "arithmetic" and len(ident["source_sha256"]) == 64 and ident["version"]
    assert verifier_identity(key)["version"] != verifier_identity(AnswerKeyVerifier({"x": "y"}))["version"]
    assert verifier_identity(accept_nonempty)["name"] == "accept_nonempty"
    ns: dict = {}
    exec("def f(p, s):\n    return True\n", ns)  # no source file: identity needs a declared version
    with pytest.raises(VerifierIdentityError):
        verifier_identity(ns["f"])
    assert verifier_identity(FunctionVerifier(ns["f"], version="v7"))["version"] == "v7"
    path = tmp_path / "key.json"
    path.write_text(json.dumps({"Q?": "A"}))
    assert load_verifier(f"answer-key:{path}").check("q?", "a").accepted
    assert load_verifier("tests.library.test_library:accept_nonempty").check("q", "x").accepted
    assert load_verifier("arithmetic").name == "arithmetic"


# ----------------------------------------------------------------------------- add
def test_add_refuses_what_the_verifier_rejects_and_deposits_nothing(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        with pytest.raises(SolutionRejectedError, match="18 != 19"):
            lib.add("What is 12 + 7?", "18", ArithmeticVerifier())
        assert len(lib) == 0 and lib.version == 0 and lib.get("What is 12 + 7?") is None
        assert lib.store.list_manifests() == [] and lib.store.stats()["lmdb"]["pages"] == 0
        with pytest.raises(EmptyInputError):
            lib.add("What is 12 + 7?", "  ", ACCEPT)


def test_add_records_verdict_verifier_and_artifact(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        entry = lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        assert entry.verdict == {"accepted": True, "reason": "19 == 19"}
        assert entry.verifier == verifier_identity(ArithmeticVerifier()) and entry.source == "add"
        assert entry.problem_sha256 == problem_sha256("what is 12 + 7?")
        assert entry.artifact_id in lib.store.list_manifests()
        assert lib.get("WHAT IS 12 + 7?") == entry and lib.version == 1
        assert lib.add("What is 12 + 7?", "19", ArithmeticVerifier()) == entry and lib.version == 1  # idempotent


# ----------------------------------------------------------------------------- solve
def test_recurring_problem_is_recalled_in_at_most_four_decode_tokens(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        entry = lib.add("What is 12 + 7?", "The answer is 19.", ArithmeticVerifier())
        r = lib.solve("  what is 12 +  7? ", ArithmeticVerifier())
        assert r.route == "recurring" and r.accepted and r.answer == "The answer is 19."
        assert 1 <= r.decode_tokens <= 4 and len(r.generated_ids) == r.decode_tokens
        assert r.prefill_tokens == 0 and r.grafted_tokens > 0 and r.artifact_id == entry.artifact_id
        assert not r.deposited and len(lib) == 1


def test_recurring_entry_that_no_longer_verifies_is_not_served(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        r = lib.solve("What is 12 + 7?", REJECT)
        assert r.route == "generated" and not r.accepted and not r.deposited


def test_new_problem_generates_verifies_deposits_then_recurs(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        first = lib.solve("Name a colour.", ACCEPT)
        assert first.route == "generated" and first.accepted and first.deposited
        assert first.grafted_tokens > 0  # the library document was grafted as context
        assert 1 <= first.decode_tokens <= 6 and first.prefill_tokens > 0
        entry = lib.get("name a colour.")
        assert entry is not None and entry.source == "solve" and entry.solution == first.answer
        assert entry.artifact_id == first.artifact_id and len(lib) == 2
        second = lib.solve("Name a colour.", ACCEPT)
        assert second.route == "recurring" and second.answer == first.answer and second.decode_tokens <= 4


def test_rejected_generation_is_not_deposited(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        version, manifests = lib.version, set(lib.store.list_manifests())
        r = lib.solve("What is 3 + 4?", REJECT)
        assert r.route == "generated" and not r.accepted and not r.deposited and r.artifact_id is None
        assert lib.version == version and len(lib) == 1
        assert set(lib.store.list_manifests()) - manifests == {lib.index.context()["artifact"]}  # context only


def test_empty_library_uses_the_bare_model(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        r = lib.solve("Name a colour.", ACCEPT, deposit=False)
        assert r.route == "generated" and r.grafted_tokens == 0 and not r.deposited and len(lib) == 0


def test_context_is_ingested_once_per_library_version(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        assert lib.prepare_context() > 0
        old = lib.index.context()["artifact"]
        assert lib.prepare_context() == 0  # grafted, not re-ingested
        lib.add("What is 2 + 2?", "4", ArithmeticVerifier())
        assert lib.prepare_context() > 0
        assert old not in lib.store.list_manifests()  # the superseded document is dropped
        assert "What is 2 + 2?" in lib.context_document()


# ----------------------------------------------------------------------------- persistence
def test_library_persists_across_reopening_the_store(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        gen = lib.solve("Name a colour.", ACCEPT)
        entries, version = lib.entries(), lib.version
        recalled = lib.solve("What is 12 + 7?", ArithmeticVerifier())
        assert lib.prepare_context() > 0  # the deposit made a new version: its document is ingested
    with opened(lm, tmp_path) as lib:
        assert lib.entries() == entries and lib.version == version
        again = lib.solve("What is 12 + 7?", ArithmeticVerifier())
        assert again.route == "recurring" and again.generated_ids == recalled.generated_ids
        assert lib.solve("Name a colour.", ACCEPT).answer == gen.answer
        assert lib.prepare_context() == 0  # the ingested document survived too
    with opened(lm, tmp_path, name="other") as other:
        assert len(other) == 0  # libraries are namespaced inside one store


def test_tampered_entry_is_detected(lm, tmp_path):
    with opened(lm, tmp_path) as lib:
        entry = lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        name = f"{lib.index.namespace}entry:{entry.problem_sha256}"
        lib.store.set_meta(name, lib.store.get_meta(name).replace('"19"', '"20"'))
        with pytest.raises(CorruptLibraryError, match="SHA-256"):
            lib.get("What is 12 + 7?")


def test_missing_pages_are_recomputed_from_the_verified_entry(lm, tmp_path):
    from tieredkv.artifacts.artifact import load_artifact

    with opened(lm, tmp_path) as lib:
        entry = lib.add("What is 12 + 7?", "19", ArithmeticVerifier())
        before = lib.solve("What is 12 + 7?", ArithmeticVerifier())
        for key in load_artifact(lib.store, entry.artifact_id).page_keys:
            assert lib.store.remove(key)
        after = lib.solve("What is 12 + 7?", ArithmeticVerifier())
        assert after.route == "recurring" and after.answer == "19"
        assert after.generated_ids == before.generated_ids  # the same bytes, recomputed


def test_cli_add_solve_list(tmp_path, capsys):
    from tieredkv.cli import main

    store = str(tmp_path / "kv")
    base = ["--model", "tiny-llama", "--store", store]
    assert main(["library", "add", *base, "--problem", "What is 12 + 7?", "--solution", "18",
                 "--verifier", "arithmetic"]) == 2
    assert "SolutionRejectedError" in capsys.readouterr().err
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"What is 12 + 7?": "an answer no model gives"}))
    deep = ["--model", "tiny-llama", "--store", str(tmp_path / "new" / "deep" / "kv")]
    for args in (base, deep):
        assert main(["library", "solve", *args, "--problem", "What is 12 + 7?", "--verifier", f"answer-key:{key}"]) == 1
        assert "NOT verified" in capsys.readouterr().err
    # an unverified solve leaves no store (was: a store holding nothing), nor the directories made for it
    assert not (tmp_path / "kv").exists() and not (tmp_path / "new").exists()
    assert main(["library", "add", *base, "--problem", "What is 12 + 7?", "--solution", "19",
                 "--verifier", "arithmetic"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["verdict"]["accepted"] and added["verifier"]["name"] == "arithmetic"
    assert main(["library", "solve", *base, "--problem", "what is 12 + 7?", "--verifier", "arithmetic", "--json"]) == 0
    solved = json.loads(capsys.readouterr().out)
    assert solved["route"] == "recurring" and solved["answer"] == "19" and solved["decode_tokens"] <= 4
    assert main(["library", "list", "--store", store, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["version"] == 1 and [e["problem"] for e in listed["entries"]] == ["What is 12 + 7?"]
    assert main(["library", "list", "--store", store]) == 0
    assert "1 verified entries" in capsys.readouterr().out
