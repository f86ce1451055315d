"""Hub ids (`ORG/NAME`) are loaded from the local Hugging Face cache and never downloaded; an id that is not
there is one typed line that says how to get it. The cache here is a fake one in the hub's own layout
(blobs, snapshots of symlinks, refs/main), built from a tiny random model."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models.test_local_directory import count_hashing, save_tiny_model
from tieredkv.errors import ModelNotFoundError
from tieredkv.models.hub import hub_cache_dir, is_hub_id
from tieredkv.models.loading import load_model

REPO = "tieredkv-test/Tiny-Llama-0.1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root: Path, source: Path, repo: str = REPO) -> Path:
    """`root` laid out as huggingface_hub lays out its cache, holding `source`'s files as `repo`'s main."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / COMMIT
    (repo_dir / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    for f in source.iterdir():
        blob = repo_dir / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """(the local model directory, its snapshot in a fake hub cache named by $HF_HUB_CACHE); no network."""
    monkeypatch.setenv("TIEREDKV_CACHE", str(tmp_path / "tkv"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    source = save_tiny_model(tmp_path / "model")
    snapshot = fake_hub_cache(tmp_path / "hf" / "hub", source)

    def no_network(*_args, **_kwargs):
        raise AssertionError("a hub id was looked up on the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    return source, snapshot


def test_a_hub_id_in_the_local_cache_loads_as_its_directory(hub):
    source, _ = hub
    lm = load_model(REPO, quiet=True)
    assert lm.name == REPO
    assert lm.fingerprint == load_model(str(source), quiet=True).fingerprint
    assert lm.default_page_size == 128


def test_the_cache_is_found_under_hf_home_too(hub, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    assert load_model(REPO, quiet=True).name == REPO


def test_a_hub_ids_fingerprint_is_cached_like_a_directorys(hub, monkeypatch):
    first = load_model(REPO, quiet=True).fingerprint
    hashed = count_hashing(monkeypatch)
    assert load_model(REPO, quiet=True).fingerprint == first
    assert hashed == []


def test_a_hub_id_not_in_the_cache_says_how_to_get_it(hub, tmp_path):
    with pytest.raises(ModelNotFoundError) as err:
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    message = str(err.value)
    assert "\n" not in message
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct" in message
    assert str(tmp_path / "hf" / "hub") in message and "local model directory" in message


def test_a_cached_repo_without_a_main_revision_is_not_found(hub):
    _, snapshot = hub
    (snapshot.parents[1] / "refs" / "main").unlink()
    with pytest.raises(ModelNotFoundError, match="does not hold it"):
        load_model(REPO)


def test_a_local_directory_wins_over_a_hub_id_of_the_same_spelling(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_tiny_model(tmp_path / "tieredkv-test" / "Tiny-Llama-0.1", name="tiny-qwen2")
    assert load_model(REPO, quiet=True).config.model_type == "qwen2"


@pytest.mark.parametrize("name", ["tieredkv-test/Tiny-Llama-0.1", "org/name.v2", "a/b"])
def test_hub_id_spelling(name):
    assert is_hub_id(name)


@pytest.mark.parametrize("name", ["no-slash", "a/b/c", "/abs/path", "./rel/x", "a/..", "org/", "org/name-"])
def test_not_hub_ids(name):
    assert not is_hub_id(name)


def test_an_unknown_name_lists_every_way_to_name_a_model():
    with pytest.raises(ModelNotFoundError, match=r"tiny-llama.*local HF model directory.*ORG/NAME"):
        load_model("no-such-model")


def test_the_cli_takes_a_hub_id(hub, tmp_path):
    """`--model ORG/NAME` in a CLI process: the same fingerprint as the directory, loaded with no network."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "tieredkv.cli", "verify", "--model", REPO, "--samples", "1",
                          "--tokens", "128", "--json"], check=False, capture_output=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr.decode()
    assert json.loads(out.stdout)["model_fingerprint"] == load_model(str(hub[0]), quiet=True).fingerprint
