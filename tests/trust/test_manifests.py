"""Trust, manifests: one is verified wherever it is read, before anything is written or served.

Issue 16, case 1 (a tampered or truncated manifest on the server or in LMDB grafts another document)
and case 10 (pull writes the manifest last, push refuses incomplete artifacts, a server that is down
is one clear line). Real LMDB stores, a real redis-server, the CLI entry point.
"""
from __future__ import annotations

import json

import pytest
import redis
import torch

import paging.remote_tier as remote_tier
from paging import FORMAT_VERSION, PageStore, StoreConfig
from paging.framing import seal_value
from tieredkv.artifacts.artifact import Artifact, deposit, graft, load_artifact
from tieredkv.artifacts.check import check_store
from tieredkv.artifacts.file_format import encode_header
from tieredkv.artifacts.manifest import ManifestIntegrityError, parse_manifest
from tieredkv.artifacts.portable import ArtifactIntegrityError, export_artifact, import_artifact
from tieredkv.cli import main
from tieredkv.question.corpus import python_reference

PAGE = 8


def _text(offset: int, n: int = 160) -> str:
    return python_reference().encode("ascii", "ignore").decode()[offset:offset + n]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, error: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"tieredkv: error: {error}: "), err
    return lines[0]


@pytest.fixture
def pushed(tiny_model, tmp_path, redis_server, capsys):
    """Artifacts A and B deposited in store "a" and pushed to a real server."""
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "a", StoreConfig()) as s:
        a = deposit(lm, _text(0), s, page_size=PAGE)
        b = deposit(lm, _text(6000), s, page_size=PAGE)
    code, _, err = run(capsys, "remote", "push", "--store", str(tmp_path / "a"), "--remote", redis_server.url)
    assert code == 0, err
    return lm, a, b


def _renamed(of: Artifact, artifact_id: str) -> bytes:
    d = json.loads(of.to_json())
    d["artifact"] = artifact_id
    return json.dumps(d, sort_keys=True).encode()


def _cut(art: Artifact, num_pages: int) -> bytes:
    d = json.loads(art.to_json())
    d["pages"] = d["pages"][:num_pages]
    d["tokens"] = num_pages * art.page_size
    d["root_sha256"] = d["pages"][-1]
    return json.dumps(d, sort_keys=True).encode()


# -- case 1 -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["another document's manifest", "cut to fewer pages"])
def test_case1_a_tampered_remote_manifest_is_refused_by_pull_graft_and_check(pushed, tmp_path, redis_server,
                                                                             capsys, monkeypatch, how):
    lm, a, b = pushed
    body = _renamed(b, a.artifact_id) if how.startswith("another") else _cut(a, 3)
    server = redis.Redis.from_url(redis_server.url)
    # its SHA-256 prefix recomputed, as in the issue
    server.set(f"tkv:v{FORMAT_VERSION}:m:{a.artifact_id}", seal_value(body))
    # pull: refused before anything is written (was: exit 0, the store then grafted B's K/V as A)
    code, _, err = run(capsys, "remote", "pull", "--store", str(tmp_path / "c"), "--remote", redis_server.url,
                       "--artifact", a.artifact_id)
    assert code == 2 and "does not match its model, domain and root hash" in one_line(err, "ManifestIntegrityError")
    assert not (tmp_path / "c").exists()
    # graft and check through a store that reads the remote
    monkeypatch.setenv("TIEREDKV_REMOTE", redis_server.url)
    code, out, err = run(capsys, "graft", "--model", "tiny-llama", "--store", str(tmp_path / "a"), "--artifact",
                         a.artifact_id, "--prompt", "x", "--max-new-tokens", "2")
    assert code == 0  # store "a" holds A's own manifest: the server's copy is never consulted
    with PageStore(tmp_path / "d", StoreConfig(remote=redis_server.url)) as d:
        with pytest.raises(ManifestIntegrityError, match="does not match"):
            graft(lm, a.artifact_id, d)
        assert d.lmdb_tier.list_manifests() == []
        report = check_store(d)
    assert a.artifact_id in report["corrupt_manifests"] and not report["healthy"]
    code, out, err = run(capsys, "graft", "--model", "tiny-llama", "--store", str(tmp_path / "d"), "--artifact",
                         a.artifact_id, "--prompt", "x", "--max-new-tokens", "2")
    assert code == 2 and "ManifestIntegrityError" in err
    code, out, _ = run(capsys, "check", "--store", str(tmp_path / "d"))
    assert code == 1 and a.artifact_id in json.loads(out)["corrupt_manifests"]


def test_case1_a_tampered_manifest_in_lmdb_is_refused_by_graft_export_check(tiny_model, tmp_path, capsys):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", StoreConfig()) as s:
        a = deposit(lm, _text(0), s, page_size=PAGE)
        b = deposit(lm, _text(6000), s, page_size=PAGE)
        s.delete_manifest(a.artifact_id)
        s.put_manifest(a.artifact_id, _renamed(b, a.artifact_id))
        for fn in (lambda: load_artifact(s, a.artifact_id), lambda: graft(lm, a.artifact_id, s),
                   lambda: export_artifact(s, a.artifact_id, tmp_path / "a.tkva")):
            with pytest.raises(ManifestIntegrityError, match="does not match"):
                fn()
        report = check_store(s)
    assert report["corrupt_manifests"] == [a.artifact_id] and not report["healthy"]
    assert not (tmp_path / "a.tkva").exists()
    code, out, _ = run(capsys, "check", "--store", str(tmp_path / "s"))
    assert code == 1  # was: exit 0, "every checked page and manifest verified"


def test_case1_a_manifest_under_another_id_or_not_canonical_is_refused(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", StoreConfig()) as s:
        a = deposit(lm, _text(0), s, page_size=PAGE)
    genuine = a.to_json()
    assert parse_manifest(genuine, stored_as=a.artifact_id) == a
    with pytest.raises(ManifestIntegrityError, match="stored under 'other'"):
        parse_manifest(genuine, stored_as="other")
    with pytest.raises(ManifestIntegrityError, match="canonical"):
        parse_manifest(json.dumps(json.loads(genuine), indent=1).encode(), stored_as=a.artifact_id)
    for junk in (b"", b"[]", b"{\"format\": 1}", b"\xff\xfe", b"NaN"):
        with pytest.raises(ManifestIntegrityError):
            parse_manifest(junk)


def test_case1_an_artifact_file_with_a_renamed_manifest_is_refused_by_import(tiny_model, tmp_path):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "s", StoreConfig()) as s:
        a = deposit(lm, _text(0), s, page_size=PAGE)
        b = deposit(lm, _text(6000), s, page_size=PAGE)
        export_artifact(s, b.artifact_id, tmp_path / "b.tkva")
    forged = Artifact(a.artifact_id, b.fingerprint, b.domain, b.num_tokens, b.page_size, b.page_keys,
                      b.token_ids_sha256, b.layout, b.name)
    raw = (tmp_path / "b.tkva").read_bytes()
    from tieredkv.artifacts.portable import read_header

    header = read_header(tmp_path / "b.tkva")
    sections = [(p.end - p.begin, p.digest) for p in header.pages]
    new_header = encode_header(forged, header.token_ids.digest, sections)
    (tmp_path / "forged.tkva").write_bytes(new_header + raw[header.data_offset:])
    with PageStore(tmp_path / "t", StoreConfig()) as t:
        with pytest.raises(ArtifactIntegrityError, match="does not match its model, domain and root"):
            import_artifact(tmp_path / "forged.tkva", t)
        assert t.list_manifests() == [] and t.lmdb_tier.num_pages == 0


# -- case 10 ----------------------------------------------------------------------------------------------
def test_case10_an_interrupted_pull_leaves_no_manifest_and_a_second_pull_completes(pushed, tmp_path, redis_server,
                                                                                  capsys, monkeypatch):
    lm, a, _ = pushed
    url = redis_server.url + "?batch=4&retries=0&connect_timeout=0.5&timeout=0.5"
    fetch = remote_tier.RemoteTier.fetch
    calls = []

    def dies_after_one_batch(self, keys):
        calls.append(len(keys))
        if len(calls) == 3:  # the last page (checked first), one batch committed: the server goes away
            redis_server.kill()
        return fetch(self, keys)

    monkeypatch.setattr(remote_tier.RemoteTier, "fetch", dies_after_one_batch)
    code, _, err = run(capsys, "remote", "pull", "--store", str(tmp_path / "c"), "--remote", url,
                       "--artifact", a.artifact_id)
    assert code == 2 and one_line(err, "RemoteUnavailableError")
    with PageStore(tmp_path / "c", StoreConfig()) as c:
        assert c.list_manifests() == []  # was: the manifest, with 0 of its pages
        assert 0 < c.lmdb_tier.num_pages < len(a.page_keys)
        assert check_store(c)["healthy"]
    redis_server.start()  # an empty server again (no persistence): push once more, then pull
    code, _, err = run(capsys, "remote", "push", "--store", str(tmp_path / "a"), "--remote", redis_server.url)
    assert code == 0, err
    code, _, err = run(capsys, "remote", "pull", "--store", str(tmp_path / "c"), "--remote", redis_server.url,
                       "--artifact", a.artifact_id)
    assert code == 0, err
    with PageStore(tmp_path / "c", StoreConfig()) as c:
        assert c.list_manifests() == [a.artifact_id]
        fresh = graft(lm, a.artifact_id, c)
        with PageStore(tmp_path / "a", StoreConfig()) as s:
            want = graft(lm, a.artifact_id, s)
        assert all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
                   for x, y in zip(fresh.layers, want.layers))


def test_case10_push_refuses_an_incomplete_artifact_and_sends_nothing(tiny_model, tmp_path, redis_server, capsys):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "a", StoreConfig()) as s:
        a = deposit(lm, _text(0), s, page_size=PAGE)
        deposit(lm, _text(6000), s, page_size=PAGE)
        s.remove(a.page_keys[2])  # as a quarantine would leave it
    for extra in ([], ["--artifact", a.artifact_id]):
        code, _, err = run(capsys, "remote", "push", "--store", str(tmp_path / "a"), "--remote", redis_server.url,
                           *extra)
        line = one_line(err, "TieredKVError")
        assert code == 2 and a.artifact_id in line and "incomplete" in line
    assert redis.Redis.from_url(redis_server.url).dbsize() == 0  # was: a manifest naming a missing page


def test_case10_pull_from_a_server_that_is_down_is_one_line(tmp_path, capsys):
    code, _, err = run(capsys, "remote", "pull", "--store", str(tmp_path / "c"), "--remote",
                       "redis://127.0.0.1:1/0?retries=0&connect_timeout=0.5", "--artifact", "abc")
    # was: a two-line RemoteTierWarning, then ArtifactNotFoundError ("the store holds no artifacts")
    assert code == 2 and "check that the server is up" in one_line(err, "RemoteUnavailableError")
    assert not (tmp_path / "c").exists()
