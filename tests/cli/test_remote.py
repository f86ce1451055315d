"""`tieredkv remote ping|ls|push|pull` against a real server."""

from __future__ import annotations

import json

from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import deposit
from tieredkv.cli import main


def run(capsys, *argv: str) -> tuple[int, dict | str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def test_push_ls_pull_ping(redis_server, tmp_path, capsys, tiny_model):
    lm = tiny_model("tiny-llama")
    with PageStore(tmp_path / "a", StoreConfig()) as a:
        art = deposit(lm, list(range(3, 27)), a, page_size=4, name="synthetic")
        pages = [a.get(k) for k in art.page_keys]
    url = redis_server.url
    code, out = run(capsys, "remote", "push", "--store", str(tmp_path / "a"), "--remote", url)
    assert code == 0 and out["pages"] == 6 and out["artifacts"] == [art.artifact_id]
    code, out = run(capsys, "remote", "ls", "--remote", url)
    assert out["artifacts"] == [art.artifact_id]
    assert out["documents"] == [{"artifact": art.artifact_id, "name": "synthetic", "tokens": 24, "pages": 6,
                                 "model": lm.fingerprint[:12]}]
    code, out = run(capsys, "remote", "pull", "--store", str(tmp_path / "b"), "--remote", url,
                    "--artifact", art.artifact_id[:5])
    assert code == 0 and out["pages_pulled"] == 6 and out["corrupt_detected"] == 0
    with PageStore(tmp_path / "b", StoreConfig()) as b:  # offline now
        assert [b.get(p.key) for p in pages] == pages
        assert b.list_manifests() == [art.artifact_id]
    code, out = run(capsys, "remote", "ping", "--remote", url)
    assert code == 0 and out["artifacts"] == 1 and out["redis_version"]


def test_unreachable_server_is_one_clear_line(capsys):
    code, err = run(capsys, "remote", "ping", "--remote",
                    "redis://127.0.0.1:1/0?retries=0&connect_timeout=0.5")
    assert code == 2 and err.startswith("tieredkv: error: RemoteUnavailableError: remote ")
    assert "check that the server is up" in err


def test_qa_uses_the_remote_named_by_the_environment(redis_server, tmp_path, capsys, monkeypatch):
    """`tieredkv qa` opens its store like every other command: $TIEREDKV_REMOTE's server receives the
    document's pages and manifest."""
    doc = tmp_path / "doc.txt"
    doc.write_text("Alpha. " * 60 + "The secret colour is teal. " + "Beta. " * 60)
    monkeypatch.setenv("TIEREDKV_REMOTE", redis_server.url)
    code, out = run(capsys, "qa", "--model", "tiny-llama", "--doc", str(doc), "--question", "What colour?",
                    "--store", str(tmp_path / "s"), "--max-new-tokens", "2", "--json", "--quiet")
    assert code == 0 and out["context"] == "ingested"
    monkeypatch.delenv("TIEREDKV_REMOTE")
    code, listed = run(capsys, "remote", "ls", "--remote", redis_server.url)
    assert code == 0 and listed["artifacts"] == [out["artifact"]]
