"""Session fixtures: the embedded model is loaded once; tiny models are cheap and cached too.

TIEREDKV_CACHE is pinned here (only if unset) so that every subprocess a test starts finds the
same converted weights and cached fingerprints as the test process.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TIEREDKV_CACHE", str(Path.home() / ".cache" / "tieredkv"))

pytest_plugins = ["testkit.redis_server"]  # the redis_server fixture, for every test that names it


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M (float32), loaded once per session; skipped if the wheel is absent."""
    from tieredkv.errors import ModelNotFoundError
    from tieredkv.models.loading import load_model

    try:
        return load_model("smollm2")
    except ModelNotFoundError as exc:
        pytest.skip(f"embedded model unavailable: {exc}")


@pytest.fixture(scope="session")
def tiny_model():
    """`tiny_model(name)` -> a LoadedModel, built once per name per session (seeded, so identical)."""
    from tieredkv.models.loading import load_model

    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = load_model(name)
        return loaded[name]

    return get


@pytest.fixture(scope="module")
def lm():
    """tiny-llama, this module's own instance (TieredModel changes its attention function), run on one thread
    while the module's tests use it: tiny models on a shared 2-core box are 10x faster on one thread."""
    import torch

    from tieredkv.models.loading import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model("tiny-llama")
    torch.set_num_threads(threads)


@pytest.fixture
def make_store(tmp_path):
    """`make_store(path=None, config=StoreConfig())` -> an open PageStore (default path: a new directory under
    tmp_path). Every store it opened is closed at teardown, whatever the test did."""
    from paging import PageStore, StoreConfig

    opened = []

    def make(path=None, config: StoreConfig = StoreConfig()) -> PageStore:
        store = PageStore(tmp_path / f"store-{len(opened)}" if path is None else path, config)
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        store.close()
