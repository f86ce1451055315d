"""In-memory tiers and the LRU policy: budgets are hard limits, eviction order is exact."""

from __future__ import annotations

import ast
import pathlib
import random

import pytest
import torch

from paging import ROOT_KEY, DeviceTier, HostTier, LRUPolicy, Page, PageLayout, PagingError

FP = "ab" * 32
LAYOUT = PageLayout(1, 1, 4, "float32", 4)  # 32 payload bytes per token


def make_page(i: int, num_tokens: int = 4) -> Page:
    g = torch.Generator().manual_seed(i)
    k = torch.randn(1, num_tokens, 4, generator=g)  # [Hkv, T, D]
    v = torch.randn(1, num_tokens, 4, generator=g)
    return Page.seal(LAYOUT, FP, ROOT_KEY, 4 * i, [i] * num_tokens, [k], [v])


# -- policy ---------------------------------------------------------------------------
def test_lru_victims_exact_order_and_pins():
    lru = LRUPolicy()
    for key in "abcd":
        lru.touch(key)
    lru.touch("a")  # order now b, c, d, a
    assert list(lru) == ["b", "c", "d", "a"]
    size = {"a": 10, "b": 10, "c": 5, "d": 20}.__getitem__
    assert lru.victims(10, size) == ["b"]
    assert lru.victims(11, size) == ["b", "c"]
    assert lru.victims(11, size, pinned={"b"}) == ["c", "d"]
    assert lru.victims(1000, size, pinned={"d"}) == ["b", "c", "a"]  # all it can
    assert lru.victims(0, size) == []
    lru.forget("c")
    lru.forget("zzz")  # unknown: no error
    assert list(lru) == ["b", "d", "a"] and len(lru) == 3 and "c" not in lru


# -- host tier ------------------------------------------------------------------------
def test_host_tier_budget_is_hard_and_put_returns_false():
    pages = [make_page(i) for i in range(5)]
    tier = HostTier(budget_bytes=3 * pages[0].nbytes + 7, pin_memory=False)
    assert [tier.put(p) for p in pages] == [True, True, True, False, False]
    assert tier.nbytes == 3 * pages[0].nbytes and tier.num_pages == 3
    assert tier.put(pages[0]) is True  # already present: no double count
    assert tier.nbytes == 3 * pages[0].nbytes
    assert tier.get(pages[1].key) == pages[1] and tier.get(pages[4].key) is None
    assert tier.remove(pages[1].key) and not tier.remove(pages[1].key)
    assert tier.put(pages[3]) and sorted(tier.keys()) == sorted(p.key for p in
                                                                 (pages[0], pages[2], pages[3]))
    assert pages[3].key in tier and len(tier) == 3


def test_host_tier_random_ops_never_exceed_budget():
    rng = random.Random(0)
    pages = [make_page(i, num_tokens=rng.randint(1, 4)) for i in range(20)]
    tier = HostTier(budget_bytes=300, pin_memory=False)
    for _ in range(300):
        p = rng.choice(pages)
        if rng.random() < 0.6:
            tier.put(p)
        else:
            tier.remove(p.key)
        assert tier.nbytes <= tier.budget_bytes
        assert tier.nbytes == sum(tier.get(k).nbytes for k in tier.keys())


def test_host_tier_rejects_bad_budget():
    with pytest.raises(PagingError):
        HostTier(-1)


# -- device tier ----------------------------------------------------------------------
def test_device_tier_budget_and_replacement():
    tier = DeviceTier(budget_bytes=100, device="cpu")
    a = (torch.zeros(4), torch.zeros(4))   # 32 bytes
    big = (torch.zeros(20),)               # 80 bytes
    assert tier.put(("p", 0), a) and tier.put(("p", 1), a) and tier.put(("p", 2), a)
    assert tier.nbytes == 96 and tier.num_entries == 3
    assert not tier.put(("q", 0), a)       # would be 128
    assert not tier.put(("p", 0), big)     # replacement would be 144: old kept
    assert tier.get(("p", 0))[0] is not None and tier.nbytes == 96
    assert tier.remove(("p", 1)) and tier.remove(("p", 2))
    assert tier.put(("p", 0), big) and tier.nbytes == 80  # replacement fits now
    assert tier.contains(("p", 0)) and list(tier.keys()) == [("p", 0)]
    tier.clear()
    assert tier.nbytes == 0 and tier.num_entries == 0 and tier.budget_bytes == 100


def test_device_tier_random_ops_never_exceed_budget():
    rng = random.Random(1)
    tier = DeviceTier(budget_bytes=256)
    for _ in range(500):
        key = (rng.randrange(8), rng.randrange(2))
        if rng.random() < 0.6:
            tier.put(key, (torch.zeros(rng.randint(1, 24)), torch.zeros(rng.randint(1, 24))))
        else:
            tier.remove(key)
        assert tier.nbytes <= tier.budget_bytes


# -- layering -------------------------------------------------------------------------
def test_paging_never_imports_models_or_index():
    root = pathlib.Path(__file__).resolve().parents[2] / "paging"
    files = sorted(root.glob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top not in {"tieredkv", "transformers", "index"}, (path, name)
