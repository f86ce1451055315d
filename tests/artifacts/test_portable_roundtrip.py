"""Export / import: one verified, deterministic file; nothing enters a store before it all verifies."""
from __future__ import annotations

import json
import os

import pytest
import torch

from paging import Page, PageConflictError, PageStore
from paging.errors import CorruptPageError
from paging.page import FORMAT_VERSION, payload_digest
from testkit.faults import (
    PAGE_SIZE,
    continuation_logits,
    corpus_text,
    flip_lmdb_value_bit,
    rewrite_header,
    store_config,
)
from tieredkv.artifacts.artifact import deposit, graft, load_pages
from tieredkv.artifacts.file_format import FILE_VERSION, PREFIX, ArtifactFormatError, ArtifactVersionError
from tieredkv.artifacts.portable import export_artifact, import_artifact, read_header, verify_file
from tieredkv.errors import ArtifactNotFoundError, DomainMismatchError, ModelMismatchError, TieredKVError
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain, sha256_tensor


@pytest.fixture(scope="module")
def exported(lm, tmp_path_factory):
    """A store with one deposit (3 full pages + a partial one) and its exported file."""
    root = tmp_path_factory.mktemp("portable")
    with PageStore(root / "src", store_config()) as store:
        art = deposit(lm, corpus_text(3 * PAGE_SIZE + 11, seed=1), store, page_size=PAGE_SIZE)
        summary = export_artifact(store, art.artifact_id, root / "a.tkva")
    return {"root": root, "store": root / "src", "art": art, "path": root / "a.tkva", "summary": summary,
            "bytes": (root / "a.tkva").read_bytes()}


def _store_contents(path) -> tuple[int, list[str], str | None]:
    with PageStore(path, store_config()) as store:
        return store.lmdb_tier.num_pages, store.list_manifests(), store.get_meta("model_fingerprint")


def test_round_trip_grafts_byte_identical_logits(lm, exported, tmp_path):
    art = exported["art"]
    cont = lm.codec.encode(" and so on.")
    with PageStore(exported["store"], store_config()) as src:
        want = sha256_tensor(continuation_logits(lm, graft(lm, art, src), cont, art.num_tokens, PAGE_SIZE))
        src_pages = [p.to_bytes() for p in load_pages(src, art)]
    with PageStore(tmp_path / "dst", store_config()) as dst:
        got_art = import_artifact(exported["path"], dst)
        assert got_art == art
        assert [p.to_bytes() for p in load_pages(dst, got_art)] == src_pages
        assert dst.get_meta("model_fingerprint") == lm.fingerprint  # a fresh store is bound on import
        got = sha256_tensor(continuation_logits(lm, graft(lm, art, dst), cont, art.num_tokens, PAGE_SIZE))
        again = export_artifact(dst, art.artifact_id, tmp_path / "again.tkva")
    assert got == want
    assert (tmp_path / "again.tkva").read_bytes() == exported["bytes"]  # store -> file -> store -> file
    assert again["file_sha256"] == exported["summary"]["file_sha256"]


def test_export_is_deterministic_and_atomic(exported, tmp_path):
    with PageStore(exported["store"], store_config()) as store:
        s1 = export_artifact(store, exported["art"].artifact_id[:8], tmp_path / "x.tkva")  # unique prefix
        s2 = export_artifact(store, exported["art"].artifact_id, tmp_path / "x.tkva")
    assert (tmp_path / "x.tkva").read_bytes() == exported["bytes"]
    assert s1 == {**s2} and s1["file_bytes"] == len(exported["bytes"])
    assert os.listdir(tmp_path) == ["x.tkva"]  # no temp file left behind


def test_header_is_self_describing(exported):
    h = read_header(exported["path"])
    art = exported["art"]
    assert h.version == FILE_VERSION and h.artifact == art
    assert h.artifact.root_sha256 == art.page_keys[-1] and h.artifact.fingerprint == art.fingerprint
    assert h.artifact.domain == art.domain and h.manifest == art.to_json()
    assert [s.nbytes for s in h.pages] and h.token_ids.nbytes == 4 * art.num_tokens
    assert h.file_nbytes == len(exported["bytes"])
    raw = exported["bytes"][PREFIX.size:h.data_offset]
    header = json.loads(raw)
    assert sorted(header) == ["data_nbytes", "format", "format_version", "header_sha256", "manifest", "pages",
                              "token_ids"]
    assert raw == json.dumps(header, sort_keys=True, separators=(",", ":")).encode()  # canonical, no clock
    ends = [0] + [s.end for s in [h.token_ids, *h.pages]]
    assert [s.begin for s in [h.token_ids, *h.pages]] == ends[:-1]  # contiguous, in order
    assert verify_file(exported["path"]).header_sha256 == h.header_sha256


def test_import_twice_and_over_an_equal_deposit_is_a_no_op(lm, exported, tmp_path):
    with PageStore(tmp_path / "dst", store_config()) as dst:
        deposit(lm, corpus_text(3 * PAGE_SIZE + 11, seed=1), dst, page_size=PAGE_SIZE)  # same pages
        import_artifact(exported["path"], dst)
        import_artifact(exported["path"], dst)
        assert dst.list_manifests() == [exported["art"].artifact_id]
        assert dst.lmdb_tier.num_pages == len(exported["art"].page_keys)


def test_wrong_model_is_refused_and_nothing_is_written(exported, tmp_path):
    other = load_model("tiny-qwen2")
    with PageStore(tmp_path / "bound", store_config()) as dst:
        dst.set_meta("model_fingerprint", other.fingerprint)
        with pytest.raises(ModelMismatchError, match="Load the matching model") as e:
            import_artifact(exported["path"], dst)
        assert e.value.expected == exported["art"].fingerprint and e.value.actual == other.fingerprint
    with PageStore(tmp_path / "free", store_config()) as dst:
        with pytest.raises(ModelMismatchError):
            import_artifact(exported["path"], dst, expected_fingerprint=other.fingerprint)
    assert _store_contents(tmp_path / "bound") == (0, [], other.fingerprint)
    assert _store_contents(tmp_path / "free") == (0, [], None)


def test_other_determinism_domain_is_refused_with_the_reason(lm, exported, tmp_path):
    here = determinism_domain(lm.model, lm.fingerprint, PAGE_SIZE)
    assert exported["art"].domain == here
    elsewhere = {**here, "num_threads": here["num_threads"] + 7, "torch": "0.0-other"}
    with PageStore(tmp_path / "dst", store_config()) as dst:
        with pytest.raises(DomainMismatchError, match=r"torch: .*num_threads: 1 -> 8") as e:
            import_artifact(exported["path"], dst, expected_domain=elsewhere)
        assert "allow_domain_mismatch" in str(e.value)
        assert dst.lmdb_tier.num_pages == 0 and dst.list_manifests() == []
        import_artifact(exported["path"], dst, expected_domain=elsewhere, allow_domain_mismatch=True)
        assert dst.list_manifests() == [exported["art"].artifact_id]


@pytest.mark.parametrize("where", ["prefix", "legacy", "header", "manifest", "page"])
def test_wrong_format_version_is_refused_with_the_reason(exported, tmp_path, where):
    data = exported["bytes"]
    if where == "prefix":
        bad = PREFIX.pack(b"TKVA", FILE_VERSION + 1, PREFIX.unpack_from(data)[2]) + data[PREFIX.size:]
        match = f"format version {FILE_VERSION + 1}; this build reads version {FILE_VERSION}"
    elif where == "legacy":  # a version 1 file (SHA-256 page digests): refused at the prefix, saying what to do
        bad = PREFIX.pack(b"TKVA", 1, PREFIX.unpack_from(data)[2]) + data[PREFIX.size:]
        match = r"version 1 \(SHA-256 page digests\); this build reads version 2 — import it with the tieredkv"
    elif where == "header":
        bad = rewrite_header(data, lambda h: h.update(format_version=FILE_VERSION + 1))
        match = "disagrees with the prefix version"
    elif where == "manifest":
        bad = rewrite_header(data, lambda h: h["manifest"].update(format=99))
        match = "manifest format 99; this build reads 1"
    else:  # a page's own framing says the next version; its digest still matches the file's header
        h = read_header(exported["path"])
        s = h.pages[1]
        page = bytearray(data[h.data_offset + s.begin:h.data_offset + s.end])
        page[4] = FORMAT_VERSION + 1

        def patch(hdr):
            hdr["pages"][1]["blake3"] = payload_digest(page)
        bad = rewrite_header(data, patch)
        off = h.data_offset + s.begin
        bad = bad[:off] + bytes(page) + bad[off + len(page):]
        match = f"page format version {FORMAT_VERSION + 1}"
    path = tmp_path / "v.tkva"
    path.write_bytes(bad)
    with PageStore(tmp_path / "dst", store_config()) as dst:
        with pytest.raises(ArtifactFormatError, match=match) as e:
            import_artifact(path, dst)
        assert dst.lmdb_tier.num_pages == 0 and dst.list_manifests() == []
    if where != "page":
        assert isinstance(e.value, ArtifactVersionError)


def test_conflicting_stored_page_is_an_alarm_before_anything_is_written(lm, exported, tmp_path):
    art = exported["art"]
    with PageStore(exported["store"], store_config()) as src:
        real = src.get(art.page_keys[2])
    zeros = [torch.zeros(real.layout.num_kv_heads, real.num_tokens, real.layout.head_dim)] * real.layout.num_layers
    fake = Page.seal(real.layout, real.fingerprint, real.parent_key, real.start, real.token_ids, zeros, zeros)
    assert fake.key == real.key and fake.payload != real.payload
    with PageStore(tmp_path / "dst", store_config()) as dst:
        dst.put(fake)
        with pytest.raises(PageConflictError, match="determinism domain"):
            import_artifact(exported["path"], dst)
        assert dst.lmdb_tier.num_pages == 1 and dst.list_manifests() == []


def test_export_never_ships_a_corrupt_page(exported, tmp_path):
    import shutil

    store_path = tmp_path / "s"
    shutil.copytree(exported["store"], store_path)
    flip_lmdb_value_bit(store_path, exported["art"].page_keys[1], 8 * 500 + 3)
    with PageStore(store_path, store_config()) as store:
        with pytest.raises(CorruptPageError):
            export_artifact(store, exported["art"].artifact_id, tmp_path / "out.tkva")
        assert store.lmdb_tier.num_quarantined == 1
        with pytest.raises(ArtifactNotFoundError, match="no artifact"):
            export_artifact(store, "nope", tmp_path / "out.tkva")
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_errors_are_typed(exported, tmp_path):
    (tmp_path / "junk").write_bytes(b"PK\x03\x04 not an artifact at all")
    with pytest.raises(ArtifactFormatError, match="not a tieredkv artifact"):
        read_header(tmp_path / "junk")
    assert issubclass(ArtifactFormatError, TieredKVError)
