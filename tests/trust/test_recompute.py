"""Trust, forgery: an artifact whose K/V were changed and whose every hash was recomputed.

Issue 16, case 7. Hashes catch corruption, not forgery: the forged file below imports with the same
id and root and grafts to other K/V. Spot re-computation (`import --verify-recompute`, `check
--recompute`) catches it, because a page is what the model computes from the pages before it.
"""
from __future__ import annotations

import json

import pytest
import torch

from paging import PageStore, StoreConfig
from testkit.trust_faults import cli_many, forge_file
from tieredkv.artifacts.artifact import deposit, graft
from tieredkv.artifacts.portable import export_artifact, import_artifact, read_header
from tieredkv.artifacts.recompute import RecomputeMismatchError, Recomputer, sample_pages
from tieredkv.question.corpus import python_reference

PAGE = 8
FORGED_PAGE = 5


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model):
    lm = tiny_model("tiny-llama")
    root = tmp_path_factory.mktemp("forgery")
    with PageStore(root / "s", StoreConfig()) as s:
        art = deposit(lm, python_reference()[:160], s, page_size=PAGE)
        export_artifact(s, art.artifact_id, root / "genuine.tkva")
    forge_file(root / "genuine.tkva", root / "forged.tkva", FORGED_PAGE)
    return lm, art, root


def test_case7_a_forged_file_passes_every_hash(files, tmp_path):
    """The threat, pinned: without recomputation the forged file imports as the genuine artifact."""
    lm, art, root = files
    with PageStore(tmp_path / "t", StoreConfig()) as t:
        forged = import_artifact(root / "forged.tkva", t)
        assert (forged.artifact_id, forged.root_sha256) == (art.artifact_id, art.root_sha256)
        got = graft(lm, forged, t)
    with PageStore(root / "s", StoreConfig()) as s:
        want = graft(lm, art, s)
    assert not torch.equal(got.layers[0].keys, want.layers[0].keys)


def test_case7_import_verify_recompute_refuses_the_forged_file(files, tmp_path):
    lm, art, root = files
    store = tmp_path / "t"
    forged, genuine, half = cli_many(
        ["import", str(root / "forged.tkva"), "--store", str(store), "--model", "tiny-llama", "--verify-recompute",
         "1", "--quiet"],
        ["import", str(root / "genuine.tkva"), "--store", str(store), "--model", "tiny-llama", "--verify-recompute",
         "1", "--quiet"],
        ["import", str(root / "genuine.tkva"), "--store", str(tmp_path / "u"), "--model", "tiny-llama",
         "--verify-recompute", "0.25", "--seed", "3", "--quiet"])
    lines = [line for line in forged["err"].splitlines() if line.strip()]
    assert forged["rc"] == 2 and len(lines) == 1, forged
    assert lines[0].startswith("tieredkv: error: RecomputeMismatchError: page 5 ")
    assert genuine["rc"] == 0, genuine  # nothing of the forged file was written before: the genuine one imports
    report = json.loads(genuine["out"])
    assert report["recompute"]["reproduced"] and report["recompute"]["fraction_recomputed"] == 1.0
    assert report["exactness"].startswith("same domain")
    partial = json.loads(half["out"])["recompute"]
    assert partial["reproduced"] and partial["recomputed_pages"] == sample_pages(len(art.page_keys), 0.25, 3)
    assert partial["fraction_recomputed"] == round(len(partial["recomputed_pages"]) / len(art.page_keys), 4)


def test_case7_check_recompute_finds_a_forged_artifact_in_a_store(files, tmp_path):
    lm, art, root = files
    with PageStore(tmp_path / "t", StoreConfig()) as t:
        import_artifact(root / "forged.tkva", t)  # imported by someone who did not recompute
    with PageStore(tmp_path / "u", StoreConfig()) as u:
        import_artifact(root / "genuine.tkva", u)
    bad, good, plain = cli_many(
        ["check", "--store", str(tmp_path / "t"), "--model", "tiny-llama", "--recompute", "1"],
        ["check", "--store", str(tmp_path / "u"), "--model", "tiny-llama", "--recompute", "1"],
        ["check", "--store", str(tmp_path / "t")])
    assert bad["rc"] == 1, bad
    report = json.loads(bad["out"])["recompute"]
    assert report["forged_artifacts"] == [art.artifact_id]
    assert report["artifacts"][0]["mismatches"] == [FORGED_PAGE]
    assert good["rc"] == 0 and json.loads(good["out"])["recompute"]["fraction_recomputed"] == 1.0
    assert plain["rc"] == 0  # hashes alone call the forged store healthy: that is why recomputation exists


def test_recompute_follows_the_pages_before_it_and_says_what_it_cannot_do(files, tiny_model):
    lm, art, root = files
    header = read_header(root / "forged.tkva")
    pages = []
    from tieredkv.artifacts.portable import verify_file

    verify_file(root / "forged.tkva", on_page=lambda i, p, b: pages.append(p))
    before = Recomputer(lm, header.artifact, 1.0)
    for p in pages[:FORGED_PAGE]:
        before.feed(p)  # the pages before the forged one reproduce
    assert before.checked == list(range(FORGED_PAGE))
    with pytest.raises(RecomputeMismatchError, match=f"page {FORGED_PAGE} "):
        before.feed(pages[FORGED_PAGE])
    qwen = tiny_model("tiny-qwen2")
    with pytest.raises(Exception, match="was made by model"):
        Recomputer(qwen, header.artifact, 1.0)
    moved = dict(header.artifact.domain, cpu="AuthenticAMD AMD EPYC 7B13")
    from dataclasses import replace

    with pytest.raises(Exception, match="another determinism domain"):
        Recomputer(lm, replace(header.artifact, domain=moved), 1.0)
