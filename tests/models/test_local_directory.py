"""A local model directory's fingerprint, cached by file identity: hashed on the first load only, hashed again
when any file's size, mtime, ctime or inode changes, a file is added or removed, a library version changes, or
the cache entry is damaged; never taken from an entry that does not match."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tieredkv.models import fingerprint_cache, loading
from tieredkv.models.loading import load_model


def tiny_tokenizer():
    """A word-level HF tokenizer built offline: <unk> <s> </s> w0 .. w39 (ids below tiny-llama's vocab)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(40)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def save_tiny_model(directory: Path, name: str = "tiny-llama") -> Path:
    """A Hugging Face model directory (config, safetensors, tokenizer) of a seeded tiny model."""
    load_model(name).model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def count_hashing(monkeypatch) -> list[int]:
    """Each time the weights are really hashed (not a fingerprint already known), one entry is appended."""
    hashed, real = [], loading.fingerprint_model

    def spy(model, codec):
        if not getattr(model, "_tieredkv_fingerprint", None):
            hashed.append(1)
        return real(model, codec)

    monkeypatch.setattr(loading, "fingerprint_model", spy)
    return hashed


def hashed_fingerprint(path: Path) -> str:
    """The fingerprint of the directory's weights, hashed now (no cache)."""
    lm = load_model(str(path), quiet=True)
    lm.model._tieredkv_fingerprint = None
    return loading.fingerprint_model(lm.model, lm.codec)


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TIEREDKV_CACHE", str(tmp_path / "tkv"))
    return save_tiny_model(tmp_path / "model")


def _entry(path: Path) -> Path:
    (entry,) = (Path(os.environ["TIEREDKV_CACHE"]) / "fingerprints").glob("*.json")
    return entry


def _scale_weight(path: Path, factor: float, out: Path | None = None) -> None:
    """One weight of the directory scaled by `factor`, saved to `out` (default: over the directory's file)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    weights_path = path / "model.safetensors"
    with safe_open(str(weights_path), "pt") as f:
        meta = f.metadata()
    weights = load_file(str(weights_path))
    weights["model.layers.0.self_attn.k_proj.weight"] *= factor
    save_file(weights, str(out or weights_path), metadata=meta)


def test_the_second_load_of_an_unchanged_directory_does_not_hash(model_dir, monkeypatch):
    hashed = count_hashing(monkeypatch)
    first = load_model(str(model_dir), quiet=True).fingerprint
    assert len(hashed) == 1
    assert load_model(str(model_dir), quiet=True).fingerprint == first
    assert len(hashed) == 1
    assert first == hashed_fingerprint(model_dir)


def test_a_touched_file_is_hashed_again(model_dir, monkeypatch):
    first = load_model(str(model_dir), quiet=True).fingerprint
    hashed = count_hashing(monkeypatch)
    st = os.stat(model_dir / "config.json")
    os.utime(model_dir / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert load_model(str(model_dir), quiet=True).fingerprint == first
    assert len(hashed) == 1
    load_model(str(model_dir), quiet=True)
    assert len(hashed) == 1  # the new identity was recorded


def test_changed_weights_get_their_own_fingerprint(model_dir, monkeypatch):
    first = load_model(str(model_dir), quiet=True).fingerprint
    _scale_weight(model_dir, 1.5)
    hashed = count_hashing(monkeypatch)
    changed = load_model(str(model_dir), quiet=True).fingerprint
    assert len(hashed) == 1 and changed != first


def test_same_size_same_mtime_rewrite_is_caught_by_ctime(model_dir, monkeypatch):
    """Bytes rewritten in place (same inode, same size) with the mtime put back, as a careless copy tool might."""
    first = load_model(str(model_dir), quiet=True).fingerprint
    weights = model_dir / "model.safetensors"
    st = os.stat(weights)
    _scale_weight(model_dir, 2.0, model_dir.parent / "scaled")  # same size, other bytes
    weights.write_bytes((model_dir.parent / "scaled").read_bytes())  # in place: the inode stays
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(weights)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    hashed = count_hashing(monkeypatch)
    assert load_model(str(model_dir), quiet=True).fingerprint != first
    assert len(hashed) == 1


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_file_added_or_removed_is_hashed_again(model_dir, monkeypatch, change):
    load_model(str(model_dir), quiet=True)
    if change == "added":
        (model_dir / "README.md").write_text("notes")
    else:
        (model_dir / "generation_config.json").unlink()
    hashed = count_hashing(monkeypatch)
    load_model(str(model_dir), quiet=True)
    assert len(hashed) == 1


def test_another_library_version_is_hashed_again(model_dir, monkeypatch):
    import transformers

    load_model(str(model_dir), quiet=True)
    monkeypatch.setattr(transformers, "__version__", "0.0.0")
    hashed = count_hashing(monkeypatch)
    load_model(str(model_dir), quiet=True)
    assert len(hashed) == 1


def test_each_dtype_has_its_own_entry(model_dir, monkeypatch):
    f32 = load_model(str(model_dir), quiet=True).fingerprint
    bf16 = load_model(str(model_dir), dtype=torch.bfloat16, quiet=True).fingerprint
    hashed = count_hashing(monkeypatch)
    assert load_model(str(model_dir), quiet=True).fingerprint == f32
    assert load_model(str(model_dir), dtype=torch.bfloat16, quiet=True).fingerprint == bf16 != f32
    assert hashed == []


@pytest.mark.parametrize("damage", ["fingerprint edited", "truncated", "not json", "a directory", "files edited"])
def test_a_damaged_entry_is_never_trusted(model_dir, monkeypatch, damage):
    first = load_model(str(model_dir), quiet=True).fingerprint
    entry = _entry(model_dir)
    recorded = json.loads(entry.read_text())
    if damage == "fingerprint edited":
        entry.write_text(json.dumps({**recorded, "fingerprint": "0" * 64}))
    elif damage == "files edited":  # an entry claiming another directory's files
        entry.write_text(json.dumps({**recorded, "files": {"config.json": [1, 2, 3, 4]}}))
    elif damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:40])
    elif damage == "not json":
        entry.write_bytes(b"\xff\x00" * 20)
    else:
        entry.unlink()
        entry.mkdir()
    hashed = count_hashing(monkeypatch)
    assert load_model(str(model_dir), quiet=True).fingerprint == first
    assert len(hashed) == 1


def test_a_cache_that_cannot_be_written_still_loads(tmp_path, monkeypatch):
    directory = save_tiny_model(tmp_path / "model")
    (tmp_path / "afile").write_text("not a directory")
    monkeypatch.setenv("TIEREDKV_CACHE", str(tmp_path / "afile"))
    hashed = count_hashing(monkeypatch)
    fingerprints = {load_model(str(directory), quiet=True).fingerprint for _ in range(2)}
    assert len(fingerprints) == 1 and len(hashed) == 2


def test_identity_leaves_out_tieredkv_files_and_follows_symlinks(tmp_path):
    (tmp_path / "tieredkv-manifest.json").write_text("{}")
    (tmp_path / "blob").write_text("weights")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.safetensors").symlink_to(tmp_path / "blob")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    files = fingerprint_cache.directory_identity(tmp_path)
    blob = os.stat(tmp_path / "blob")
    assert sorted(files) == ["blob", "dangling", "sub/model.safetensors"]
    assert files["sub/model.safetensors"] == [blob.st_size, blob.st_mtime_ns, blob.st_ctime_ns, blob.st_ino]
    assert files["dangling"] == []


def test_a_file_changed_during_the_load_is_hashed_from_memory_and_not_recorded(model_dir, monkeypatch):
    first = load_model(str(model_dir), quiet=True).fingerprint
    real_load = loading._load_dir

    def load_then_change(path, dtype):
        loaded = real_load(path, dtype)
        _scale_weight(model_dir, 1.5)  # after the bytes were read: what was loaded is the old weights
        return loaded

    monkeypatch.setattr(loading, "_load_dir", load_then_change)
    hashed = count_hashing(monkeypatch)
    assert load_model(str(model_dir), quiet=True).fingerprint == first  # the weights in memory are the old ones
    assert len(hashed) == 1
    monkeypatch.setattr(loading, "_load_dir", real_load)
    assert load_model(str(model_dir), quiet=True).fingerprint != first
    assert len(hashed) == 2
