"""Corrupted bytes are caught, typed and never served: artifact files and LMDB values.

Fast cases; bench/fault_suite.py runs the same checks exhaustively (every header bit, more payload
bits, every truncation offset) and records the counts in docs/RELIABILITY.md.
"""
from __future__ import annotations

import random
import shutil

import pytest
import torch

from paging import PageStore
from testkit.faults import (
    PAGE_SIZE,
    corpus_text,
    header_flip_outcomes,
    hostile_outcomes,
    lmdb_flip_outcome,
    parse_outcome,
    payload_flip_outcomes,
    store_config,
    truncation_outcomes,
)
from tieredkv.artifacts.artifact import deposit
from tieredkv.artifacts.file_format import PREFIX, ArtifactIntegrityError
from tieredkv.artifacts.portable import export_artifact, import_artifact, read_header
from tieredkv.models.loading import load_model

TYPED = {"ArtifactFormatError", "ArtifactTruncatedError", "ArtifactVersionError", "ArtifactIntegrityError"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("corrupt")
    with PageStore(root / "s", store_config()) as store:
        art = deposit(load_model("tiny-llama"), corpus_text(3 * PAGE_SIZE + 7, seed=3), store, page_size=PAGE_SIZE)
        export_artifact(store, art.artifact_id, root / "a.tkva")
    torch.set_num_threads(threads)
    data = (root / "a.tkva").read_bytes()
    return {"root": root, "store": root / "s", "art": art, "data": data, "header": read_header(root / "a.tkva")}


def test_the_untouched_file_verifies(source):
    assert parse_outcome(source["data"]) == "ok"


def test_a_flipped_bit_in_every_header_byte_is_detected(source):
    outcomes = header_flip_outcomes(source["data"], all_bits=False)
    assert len(outcomes) == source["header"].data_offset
    assert set(outcomes) <= TYPED, sorted(set(outcomes) - TYPED)


def test_flipped_payload_bits_are_detected(source):
    outcomes = payload_flip_outcomes(source["data"], 48, seed=0)
    assert set(outcomes) == {"ArtifactIntegrityError"}


def test_a_payload_flip_leaves_the_target_store_untouched(source, tmp_path):
    from testkit.faults import flipped

    h = source["header"]
    bad = tmp_path / "bad.tkva"
    bad.write_bytes(flipped(source["data"], 8 * (h.data_offset + h.pages[-1].begin + 100)))  # the last page
    with PageStore(tmp_path / "dst", store_config()) as dst:
        with pytest.raises(ArtifactIntegrityError, match="page 3"):
            import_artifact(bad, dst)
        assert dst.lmdb_tier.num_pages == 0 and dst.list_manifests() == [] and dst.get_meta("model_fingerprint") is None


def test_truncation_at_every_header_offset_is_a_typed_error(source):
    end = source["header"].data_offset
    rng = random.Random(0)
    offsets = list(range(end + 1)) + rng.sample(range(end + 1, len(source["data"])), 32)
    outcomes = truncation_outcomes(source["data"], offsets)
    assert set(outcomes[PREFIX.size:]) == {"ArtifactTruncatedError"}  # the size check, before any data is read
    assert set(outcomes) <= TYPED


def test_hostile_headers_are_refused_before_allocating(source):
    for r in hostile_outcomes(source["data"]):
        assert r["outcome"] in TYPED and r["bounded"], r  # never the claimed sizes (up to 2^63)


def test_flipped_bits_in_lmdb_values_are_detected_and_never_served(source, tmp_path):
    pristine = tmp_path / "pristine"
    shutil.copytree(source["store"], pristine)
    rng = random.Random(1)
    keys = source["art"].page_keys
    results = []
    for i in range(16):
        key = keys[i % len(keys)]
        with PageStore(pristine, store_config()) as store:
            size = len(store.lmdb_tier.get_raw(key))
        # half in the framing and header, half anywhere (mostly payload)
        bit = rng.randrange(8 * 700) if i % 2 else rng.randrange(8 * size)
        results.append(lmdb_flip_outcome(pristine, tmp_path / "work", key, bit))
    assert all(r == {"detected": True, "served": False, "quarantined": True} for r in results), results
