"""`tieredkv ls`, `rm`, `gc` and `stats`: JSON and text out, shared pages kept, one-line errors."""
from __future__ import annotations

import pytest
import torch

from paging import PageStore
from testkit.faults import PAGE_SIZE, store_config
from tests.cli.helpers import run
from tests.paging.test_documents import ENDINGS, PREFIX
from tieredkv.artifacts.artifact import deposit, graft


@pytest.fixture
def store(tiny_model, tmp_path):
    """Three tiny-llama documents sharing their first two pages, deposited by a store that is closed since."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    lm = tiny_model("tiny-llama")
    path = tmp_path / "s"
    with PageStore(path, store_config()) as s:
        arts = [deposit(lm, PREFIX + end, s, page_size=PAGE_SIZE, name=f"doc{i}") for i, end in enumerate(ENDINGS)]
    yield {"path": str(path), "arts": arts, "lm": lm}
    torch.set_num_threads(threads)


def test_ls_lists_every_document(capsys, store):
    code, data, _, _ = run(capsys, "ls", "--store", store["path"], "--json")
    assert code == 0
    rows = {r["name"]: r for r in data["documents"]}
    assert sorted(rows) == ["doc0", "doc1", "doc2"]
    for i, art in enumerate(store["arts"]):
        r = rows[f"doc{i}"]
        assert (r["artifact"], r["tokens"], r["pages"], r["model"]) == (
            art.artifact_id, 4 * PAGE_SIZE, 4, art.fingerprint[:12])
        assert r["own_bytes"] * 2 == r["bytes"] and r["created"].endswith("Z") and r["last_used"] == r["created"]
    assert data["summary"]["pages"] == 8 and data["summary"]["documents"] == 3
    assert set(data["stats"]["tiers"]) == {"device", "host", "lmdb"}
    code, _, text, _ = run(capsys, "ls", "--store", store["path"])
    lines = text.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["NAME", "ID", "TOKENS"] and len(lines) == 5
    assert lines[-1].startswith("3 documents, 8 pages")


def test_rm_keeps_shared_pages_and_check_stays_clean(capsys, store):
    path, arts = store["path"], store["arts"]
    code, data, _, _ = run(capsys, "rm", "doc1", "--store", path, "--dry-run")
    assert code == 0 and data["dry_run"] and data["pages_freed"] == 2
    code, before, _, _ = run(capsys, "ls", "--store", path, "--json")
    assert before["summary"]["pages"] == 8
    code, data, _, _ = run(capsys, "rm", "doc1", "--store", path)
    own = {r["name"]: r["own_bytes"] for r in before["documents"]}
    assert code == 0 and data["removed"][0]["artifacts"] == [arts[1].artifact_id]
    assert data["pages_freed"] == 2 and data["bytes_freed"] == own["doc1"]
    code, after, _, _ = run(capsys, "ls", "--store", path, "--json")
    assert [r["name"] for r in after["documents"]] == ["doc0", "doc2"]
    assert after["summary"]["bytes"] == before["summary"]["bytes"] - own["doc1"]
    code, report, _, _ = run(capsys, "check", "--store", path)
    assert code == 0 and report["healthy"] and report["artifacts"] == 2
    with PageStore(path, store_config()) as s:
        for i in (0, 2):
            graft(store["lm"], arts[i], s)
    code, _, _, err = run(capsys, "rm", "doc1", "--store", path)
    assert code == 2 and err.startswith("tieredkv: error: DocumentNotFoundError") and len(err.splitlines()) == 1
    code, data, _, _ = run(capsys, "rm", arts[0].artifact_id[:8], "doc2", "--store", path)
    assert code == 0 and data["pages_freed"] == 6  # the last two documents: the shared pages go with them
    code, after, _, _ = run(capsys, "ls", "--store", path, "--json")
    assert after["documents"] == [] and after["summary"]["pages"] == 0 and after["summary"]["bytes"] == 0


def test_gc_frees_pages_no_document_lists(capsys, store):
    path, arts = store["path"], store["arts"]
    code, data, _, _ = run(capsys, "gc", "--store", path)
    assert code == 0 and data["pages_freed"] == 0
    with PageStore(path, store_config()) as s:
        s.delete_manifest(arts[2].artifact_id)  # a crash between pages and manifest leaves pages like these
    code, data, _, _ = run(capsys, "gc", "--store", path, "--dry-run")
    assert code == 0 and data["dry_run"] and data["pages_freed"] == 2 and data["bytes_freed"] > 0
    code, again, _, _ = run(capsys, "gc", "--store", path)
    assert code == 0 and (again["pages_freed"], again["bytes_freed"]) == (2, data["bytes_freed"])
    code, report, _, _ = run(capsys, "check", "--store", path)
    assert code == 0 and report["healthy"]


def test_stats_names_documents(capsys, store):
    code, data, _, _ = run(capsys, "stats", "--store", store["path"])
    assert code == 0 and sorted(r["name"] for r in data["documents"]) == ["doc0", "doc1", "doc2"]
    assert sorted(data["artifacts"]) == sorted(a.artifact_id for a in store["arts"])
    assert data["tiers"]["lmdb"]["verify_failures"] == 0 and data["disk_cap"]["documents_evicted"] == 0
