"""PageIndex.save / load: round trip and every stale case."""

import json

import numpy as np
import pytest

from index import SUMMARY_METHODS, IndexStaleError, PageIndex, summarize

L, H, T, D = 2, 2, 8, 8
GEOM = dict(num_layers=L, num_heads=H, dim=D)


def _index(method: str, num_pages: int = 12) -> PageIndex:
    rng = np.random.default_rng(0)
    index = PageIndex(L, H, D, method, 3)
    for page_id in range(0, 3 * num_pages, 3):
        keys = rng.standard_normal((L, H, T, D)).astype(np.float32)
        index.add(page_id, np.stack([summarize(keys[l], method, 3) for l in range(L)]))
    return index


def _queries() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((H, 4, D)).astype(np.float32)


@pytest.mark.parametrize("method", SUMMARY_METHODS)
def test_round_trip_identical_results(tmp_path, method):
    index = _index(method)
    path = tmp_path / "idx" / "pages.faiss"
    index.save(path)
    loaded = PageIndex.load(path, **GEOM, method=method, num_repr=3,
                            expected_page_ids=index.page_ids())
    assert loaded.page_ids() == index.page_ids()
    for layer in range(L):
        for a, b in zip(index.search(layer, _queries(), 5, exclude={3}),
                        loaded.search(layer, _queries(), 5, exclude={3})):
            assert a.tobytes() == b.tobytes()
    # saving again gives the same bytes, and no temp files are left behind
    first = path.read_bytes()
    loaded.save(path)
    assert path.read_bytes() == first
    assert sorted(p.name for p in path.parent.iterdir()) == ["pages.faiss", "pages.faiss.json"]


def test_loaded_index_stays_mutable(tmp_path):
    index = _index("minmax")
    index.save(tmp_path / "i")
    loaded = PageIndex.load(tmp_path / "i", **GEOM, method="minmax", num_repr=3)
    loaded.remove(0)
    loaded.add(1000, np.zeros((L, H, 2, D), np.float32))
    assert 1000 in loaded and 0 not in loaded
    assert (loaded.search(0, _queries(), 40)[0] != 0).all()


def test_missing_files(tmp_path):
    with pytest.raises(IndexStaleError, match="rebuild"):
        PageIndex.load(tmp_path / "nope", **GEOM, method="repr", num_repr=3)
    _index("repr").save(tmp_path / "i")
    (tmp_path / "i").unlink()
    with pytest.raises(IndexStaleError):
        PageIndex.load(tmp_path / "i", **GEOM, method="repr", num_repr=3)


@pytest.mark.parametrize("offset", [0, 100, -1])
def test_flipped_byte(tmp_path, offset):
    path = tmp_path / "i"
    _index("repr").save(path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IndexStaleError, match="sha256"):
        PageIndex.load(path, **GEOM, method="repr", num_repr=3)


def test_corrupt_sidecar_and_unreadable_faiss(tmp_path):
    path = tmp_path / "i"
    _index("mean").save(path)
    side = tmp_path / "i.json"
    meta = json.loads(side.read_text())
    side.write_text("{not json")
    with pytest.raises(IndexStaleError, match="sidecar"):
        PageIndex.load(path, **GEOM, method="mean", num_repr=3)
    # a blob whose sha matches its sidecar but that faiss cannot parse
    import hashlib
    garbage = b"\x00" * sum(meta["blob_sizes"])
    path.write_bytes(garbage)
    meta["sha256"] = hashlib.sha256(garbage).hexdigest()
    side.write_text(json.dumps(meta))
    with pytest.raises(IndexStaleError, match="faiss"):
        PageIndex.load(path, **GEOM, method="mean", num_repr=3)


@pytest.mark.parametrize("change", [
    dict(num_layers=3), dict(num_heads=1), dict(dim=16), dict(method="minmax"), dict(num_repr=4),
])
def test_different_geometry(tmp_path, change):
    _index("repr").save(tmp_path / "i")
    args = {**GEOM, "method": "repr", "num_repr": 3, **change}
    with pytest.raises(IndexStaleError, match="saved for"):
        PageIndex.load(tmp_path / "i", **args)


@pytest.mark.parametrize("expected", [range(0, 33, 3), range(0, 39, 3), [0, 3, 6, 999]])
def test_different_expected_page_ids(tmp_path, expected):
    _index("repr").save(tmp_path / "i")
    with pytest.raises(IndexStaleError, match="expected pages"):
        PageIndex.load(tmp_path / "i", **GEOM, method="repr", num_repr=3,
                       expected_page_ids=expected)
