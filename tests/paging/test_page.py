"""Page identity, sealing and the wire format: exact bytes, and every corruption caught."""

from __future__ import annotations

import json
import struct
import tracemalloc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paging import (
    FORMAT_VERSION,
    ROOT_KEY,
    CorruptPageError,
    LayoutMismatchError,
    Page,
    PageLayout,
    PagingError,
    page_key,
)
from paging.page import MAX_HEADER_NBYTES, _header_digest

FP = "ab" * 32


def make_page(dtype: str = "float32", *, num_tokens: int = 3, start: int = 0,
              parent: str = ROOT_KEY, layers: int = 2, heads: int = 2, head_dim: int = 4,
              page_size: int = 4, seed: int = 0) -> tuple[Page, list, list]:
    layout = PageLayout(layers, heads, head_dim, dtype, page_size)
    g = torch.Generator().manual_seed(seed)
    # keys[l], values[l]: [Hkv, T, D]
    ks = [torch.randn(heads, num_tokens, head_dim, generator=g).to(layout.torch_dtype)
          for _ in range(layers)]
    vs = [torch.randn(heads, num_tokens, head_dim, generator=g).to(layout.torch_dtype)
          for _ in range(layers)]
    ids = [(start + 100 + i) % 50_000 for i in range(num_tokens)]
    return Page.seal(layout, FP, parent, start, ids, ks, vs), ks, vs


# -- layout ---------------------------------------------------------------------------
def test_layout_sizes():
    lay = PageLayout(2, 3, 8, "bfloat16", 16)
    assert lay.itemsize == 2 and lay.torch_dtype is torch.bfloat16
    assert lay.layer_nbytes(5) == 2 * 3 * 5 * 8 * 2
    assert lay.token_nbytes == 2 * lay.layer_nbytes(1)
    assert lay.payload_nbytes(16) == 16 * lay.token_nbytes
    assert PageLayout.from_dict(lay.to_dict()) == lay


@pytest.mark.parametrize("bad", [
    dict(num_layers=0), dict(head_dim=-1), dict(page_size=True), dict(num_kv_heads=2.0),
    dict(dtype="int8"),
])
def test_layout_rejects_garbage(bad):
    d = PageLayout(1, 1, 4, "float32", 4).to_dict() | bad
    with pytest.raises(LayoutMismatchError):
        PageLayout(**d)
    with pytest.raises(LayoutMismatchError):
        PageLayout.from_dict(d)


def test_layout_from_dict_rejects_wrong_fields():
    d = PageLayout(1, 1, 4, "float32", 4).to_dict()
    with pytest.raises(LayoutMismatchError):
        PageLayout.from_dict({**d, "extra": 1})
    with pytest.raises(LayoutMismatchError):
        PageLayout.from_dict([1, 2])


# -- identity -------------------------------------------------------------------------
def test_page_key_matches_spec_and_is_deterministic():
    ids = [5, 7, 2**31 - 1]
    manual = __import__("hashlib").sha256(
        bytes.fromhex(FP) + bytes.fromhex(ROOT_KEY) + struct.pack("<qI", 8, 3)
        + struct.pack("<3i", *ids)).hexdigest()
    assert page_key(FP, ROOT_KEY, ids, 8) == manual == page_key(FP, ROOT_KEY, tuple(ids), 8)


def test_page_key_sensitive_to_every_input():
    base = page_key(FP, ROOT_KEY, [1, 2, 3], 0)
    variants = [
        page_key("cd" * 32, ROOT_KEY, [1, 2, 3], 0),
        page_key(FP, "11" * 32, [1, 2, 3], 0),
        page_key(FP, ROOT_KEY, [1, 2, 4], 0),
        page_key(FP, ROOT_KEY, [1, 2], 0),
        page_key(FP, ROOT_KEY, [2, 1, 3], 0),
        page_key(FP, ROOT_KEY, [1, 2, 3], 1),
    ]
    assert len({base, *variants}) == len(variants) + 1


@pytest.mark.parametrize("args", [
    ("AB" * 32, ROOT_KEY, [1], 0), ("ab" * 31, ROOT_KEY, [1], 0), (FP, "x" * 64, [1], 0),
    (FP, ROOT_KEY, [2**31], 0), (FP, ROOT_KEY, [1], -1),
])
def test_page_key_validates(args):
    with pytest.raises(PagingError):
        page_key(*args)


def test_chain_parent_changes_child():
    p0, _, _ = make_page(start=0)
    a, _, _ = make_page(start=4, parent=p0.key)
    b, _, _ = make_page(start=4, parent=ROOT_KEY)
    assert a.key != b.key and a.parent_key == p0.key


# -- seal / round trip ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_round_trip_byte_and_tensor_equal(dtype):
    page, ks, vs = make_page(dtype)
    buf = page.to_bytes()
    back = Page.from_bytes(buf, expected_key=page.key)
    assert back == page and back.to_bytes() == buf
    assert back.payload == page.payload and back.nbytes == page.layout.payload_nbytes(3)
    for layer, (k, v) in enumerate(back.kv()):
        assert k.dtype == page.layout.torch_dtype and tuple(k.shape) == (2, 3, 4)
        assert torch.equal(k, ks[layer]) and torch.equal(v, vs[layer])
        k1, v1 = back.layer_kv(layer)
        assert torch.equal(k1, ks[layer]) and torch.equal(v1, vs[layer])
    assert Page.from_bytes(memoryview(buf)) == page
    assert Page.from_bytes(bytearray(buf)) == page


def test_payload_layout_is_k_then_v_per_layer():
    page, ks, vs = make_page("float32")
    expected = b"".join(t.numpy().astype("<f4").tobytes()
                        for pair in zip(ks, vs) for t in pair)
    assert page.payload == expected


def test_seal_accepts_batch_dim_and_noncontiguous():
    layout = PageLayout(1, 2, 4, "float32", 4)
    k = torch.randn(1, 2, 3, 4)
    v = torch.randn(2, 4, 3).transpose(1, 2)  # non-contiguous [Hkv, T, D]
    page = Page.seal(layout, FP, ROOT_KEY, 0, [1, 2, 3], [k], [v])
    k2, v2 = page.layer_kv(0)
    assert torch.equal(k2, k[0]) and torch.equal(v2, v)


def test_layer_kv_is_fresh_and_writable(recwarn):
    page, ks, _ = make_page()
    k, _ = page.layer_kv(0)
    k.add_(1.0)  # must not touch the immutable payload, must not warn
    assert torch.equal(page.layer_kv(0)[0], ks[0])
    assert not [w for w in recwarn if "not writable" in str(w.message)]
    with pytest.raises(IndexError):
        page.layer_kv(2)


@pytest.mark.parametrize("mutate", [
    lambda k, v, ids: (k[:1], v, ids),                              # wrong layer count
    lambda k, v, ids: ([k[0].double(), k[1]], v, ids),              # wrong dtype
    lambda k, v, ids: ([k[0][:, :2], k[1]], v, ids),                # wrong T
    lambda k, v, ids: (k, v, ids + [1, 2]),                         # T > page_size
    lambda k, v, ids: ([t[:, :0] for t in k], [t[:, :0] for t in v], []),  # empty
])
def test_seal_rejects_bad_shapes(mutate):
    _, ks, vs = make_page()
    k, v, ids = mutate(ks, vs, [1, 2, 3])
    with pytest.raises(LayoutMismatchError):
        Page.seal(PageLayout(2, 2, 4, "float32", 4), FP, ROOT_KEY, 0, ids, k, v)


@settings(max_examples=25, deadline=None)
@given(layers=st.integers(1, 2), heads=st.integers(1, 2), head_dim=st.sampled_from([4, 8]),
       dtype=st.sampled_from(["float32", "float16", "bfloat16"]), data=st.data())
def test_round_trip_property(layers, heads, head_dim, dtype, data):
    page_size = data.draw(st.sampled_from([4, 8]))
    t = data.draw(st.integers(1, page_size))
    page, ks, vs = make_page(dtype, num_tokens=t, layers=layers, heads=heads,
                             head_dim=head_dim, page_size=page_size,
                             start=data.draw(st.integers(0, 2**40)))
    back = Page.from_bytes(page.to_bytes(), expected_key=page.key)
    assert back.to_bytes() == page.to_bytes()
    assert all(torch.equal(k, a) and torch.equal(v, b)
               for (k, v), a, b in zip(back.kv(), ks, vs))


# -- corruption -----------------------------------------------------------------------
def _header_end(buf: bytes) -> int:
    return 16 + struct.unpack_from("<Q", buf, 8)[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_header_byte_flip_is_detected(dtype):
    page, _, _ = make_page(dtype)
    buf = page.to_bytes()
    for i in range(_header_end(buf)):
        for mask in (0x01, 0x02, 0x20, 0x80, 0xFF):
            bad = bytearray(buf)
            bad[i] ^= mask
            with pytest.raises(CorruptPageError):
                Page.from_bytes(bytes(bad))


def test_every_payload_byte_flip_is_detected():
    page, _, _ = make_page()
    buf = page.to_bytes()
    for i in range(_header_end(buf), len(buf)):
        bad = bytearray(buf)
        bad[i] ^= 1 << (i % 8)
        with pytest.raises(CorruptPageError, match="payload"):
            Page.from_bytes(bytes(bad), expected_key=page.key)


def test_truncation_anywhere_is_detected():
    page, _, _ = make_page()
    buf = page.to_bytes()
    for n in list(range(_header_end(buf) + 1)) + [len(buf) - 1, len(buf) - 7]:
        with pytest.raises(CorruptPageError):
            Page.from_bytes(buf[:n])
    with pytest.raises(CorruptPageError):
        Page.from_bytes(buf + b"\0")


def test_wrong_expected_key_and_version():
    page, _, _ = make_page()
    buf = page.to_bytes()
    with pytest.raises(CorruptPageError) as info:
        Page.from_bytes(buf, expected_key="11" * 32)
    assert info.value.key == "11" * 32
    bad = buf[:4] + struct.pack("<I", FORMAT_VERSION + 1) + buf[8:]
    with pytest.raises(CorruptPageError) as info:
        Page.from_bytes(bad)
    assert f"version {FORMAT_VERSION + 1}" in info.value.reason
    assert f"version {FORMAT_VERSION}" in info.value.reason


@pytest.mark.parametrize("header_len", [2**64 - 1, 2**40, MAX_HEADER_NBYTES + 1,
                                        MAX_HEADER_NBYTES])
def test_huge_header_len_rejected_without_allocating(header_len):
    buf = b"TKVP" + struct.pack("<IQ", FORMAT_VERSION, header_len) + b"{}" * 8
    tracemalloc.start()
    try:
        with pytest.raises(CorruptPageError):
            Page.from_bytes(buf)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


def _frame(header: dict | str | bytes, payload: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else (
        header if isinstance(header, str) else json.dumps(
            header, sort_keys=True, separators=(",", ":"))).encode()
    return b"TKVP" + struct.pack("<IQ", FORMAT_VERSION, len(raw)) + raw + payload


def _signed(fields: dict) -> dict:
    return {**fields, "header_sha256": _header_digest(fields)}


def test_malicious_headers_are_rejected():
    page, _, _ = make_page()
    good = {k: v for k, v in json.loads(page.to_bytes()[16:_header_end(page.to_bytes())])
            .items() if k != "header_sha256"}
    cases = [
        _frame("[" * 100_000 + "]" * 100_000),                      # deep nesting
        _frame(b"\xff\xfe{}"),                                        # not utf-8
        _frame("[1, 2]"),                                             # not an object
        _frame(_signed({**good, "layout": {**good["layout"], "dtype": "int8"}}),
               page.payload),                                         # unknown dtype
        _frame(_signed({**good, "token_ids": [1, 2, 3, 4, 5]}), page.payload),  # > page_size
        _frame(_signed({**good, "start": 1.5}), page.payload),        # wrong type
        _frame(_signed({**good, "token_ids": [True, 2, 3]}), page.payload),
        _frame(_signed({**good, "layout": {**good["layout"], "num_layers": 2**40}}),
               page.payload),                                         # absurd geometry
        _frame(json.dumps(_signed(good), sort_keys=True), page.payload),  # not canonical
        _frame(json.dumps({**_signed(good), "start": float("nan")}, sort_keys=True,
                          separators=(",", ":")), page.payload),   # NaN constant
    ]
    for buf in cases:
        with pytest.raises(CorruptPageError):
            Page.from_bytes(buf)
    # control: the same construction with the genuine fields parses
    assert Page.from_bytes(_frame(_signed(good), page.payload)) == page


# -- the payload digest -----------------------------------------------------------------
def _as_version_1(page: Page) -> bytes:
    """`page` framed as version 1 wrote it: `payload_sha256` in the header, its own header digest intact."""
    import hashlib

    from paging.framing import canonical_json, pack_prefix
    fields = {**page._header_fields(), "payload_sha256": hashlib.sha256(page.payload).hexdigest()}
    del fields["payload_blake3"]
    fields["header_sha256"] = _header_digest(fields)
    header = canonical_json(fields)
    return pack_prefix(b"TKVP", 1, len(header)) + header + page.payload


def test_payload_digest_is_blake3_of_the_payload():
    import blake3

    page, _, _ = make_page()
    assert FORMAT_VERSION == 2
    assert page.payload_blake3 == blake3.blake3(page.payload).hexdigest()
    assert Page.from_bytes(page.to_bytes()) == page


def test_version_1_page_is_refused_not_misread():
    page, _, _ = make_page()
    with pytest.raises(CorruptPageError, match="page format version 1 .SHA-256 payload digests.; this build reads "
                                               "version 2: re-deposit its text with this build"):
        Page.from_bytes(_as_version_1(page), expected_key=page.key)
