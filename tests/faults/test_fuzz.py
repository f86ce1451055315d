"""Property: the artifact parser, fed arbitrary bytes or mutated valid files, raises only its typed error."""
from __future__ import annotations

import io

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paging import PageStore
from testkit.faults import PAGE_SIZE, corpus_text, mutate, store_config
from tieredkv.artifacts.artifact import deposit
from tieredkv.artifacts.file_format import MAGIC, PREFIX, ArtifactFormatError
from tieredkv.artifacts.portable import export_artifact, verify_file
from tieredkv.models.loading import load_model

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Valid(bytes):
    def __repr__(self) -> str:  # hypothesis prints its arguments; 40 kB of them helps no one
        return f"<valid artifact file, {len(self)} bytes>"


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fuzz")
    with PageStore(root / "s", store_config()) as store:
        art = deposit(load_model("tiny-llama"), corpus_text(2 * PAGE_SIZE + 5, seed=9), store, page_size=PAGE_SIZE)
        export_artifact(store, art.artifact_id, root / "a.tkva")
    torch.set_num_threads(threads)
    return Valid((root / "a.tkva").read_bytes())


def parses_or_typed_error(data: bytes) -> bool:
    """True if `data` verified, False if it was refused with ArtifactFormatError; anything else raises."""
    try:
        verify_file(io.BytesIO(data))
        return True
    except ArtifactFormatError:
        return False


@SETTINGS
@given(st.binary(max_size=4096))
def test_arbitrary_bytes(data):
    assert not parses_or_typed_error(data)


@SETTINGS
@given(st.binary(max_size=2048), st.integers(0, 1 << 64 - 1))
def test_arbitrary_header_behind_a_valid_prefix(body, claimed_len):
    for n in (len(body), claimed_len):
        assert not parses_or_typed_error(PREFIX.pack(MAGIC, 1, n) + body)


@st.composite
def mutations(draw, size: int):
    kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]))
    pos = draw(st.integers(0, size - 1))
    if kind == "flip":
        return kind, pos, draw(st.integers(0, 7))
    if kind == "set":
        return kind, pos, draw(st.integers(0, 255))
    if kind == "insert":
        return kind, pos, draw(st.binary(min_size=1, max_size=16))
    if kind == "delete":
        return kind, pos, draw(st.integers(1, 64))
    if kind == "truncate":
        return kind, pos, None
    return kind, pos, draw(st.integers(0, size - 1))  # copy 32 bytes from elsewhere


@SETTINGS
@given(st.data())
def test_mutated_valid_file(valid, data):
    ms = data.draw(st.lists(mutations(len(valid)), min_size=1, max_size=3))
    mutated = valid
    for m in ms:
        mutated = mutate(mutated, m)
    verified = parses_or_typed_error(mutated)
    assert verified == (mutated == bytes(valid))  # only the unchanged file verifies


def test_the_valid_file_verifies(valid):
    assert parses_or_typed_error(valid)
