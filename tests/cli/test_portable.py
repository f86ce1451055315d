"""`tieredkv export`, `import` and `check`: JSON out, one-line errors, exit codes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from paging import PageStore
from testkit.faults import PAGE_SIZE, corpus_text, flip_file_bit, flip_lmdb_value_bit, store_config
from tests.cli.helpers import run
from tieredkv.artifacts.artifact import deposit
from tieredkv.artifacts.portable import read_header
from tieredkv.cli import main
from tieredkv.models.loading import load_model


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cli")
    lm = load_model("tiny-llama")
    with PageStore(root / "src", store_config()) as store:
        art = deposit(lm, corpus_text(4 * PAGE_SIZE, seed=2), store, page_size=PAGE_SIZE)
    yield {"root": root, "store": str(root / "src"), "art": art}
    torch.set_num_threads(threads)


def test_export_import_check(capsys, source, tmp_path):
    art = source["art"]
    f = str(tmp_path / "a.tkva")
    code, out, _, _ = run(capsys, "export", "--store", source["store"], "--artifact", art.artifact_id[:6], "-o", f,
                       "--quiet")
    assert code == 0 and out["artifact"] == art.artifact_id and out["pages"] == 4 and out["path"] == f
    dst = str(tmp_path / "dst")
    code, out, _, _ = run(capsys, "import", f, "--store", dst, "--model", "tiny-llama", "--quiet")
    assert code == 0 and out["root_sha256"] == art.root_sha256 and out["file"] == f
    code, out, _, _ = run(capsys, "check", "--store", dst)
    assert code == 0 and out["checked"] == out["ok"] == 4 and out["corrupt"] == 0 and out["artifacts"] == 1

    # a flipped bit in a stored page: found, quarantined, the artifact reported incomplete, exit 1
    flip_lmdb_value_bit(dst, art.page_keys[2], 8 * 300)
    code, out, _, _ = run(capsys, "check", "--store", dst)
    assert code == 1 and out["corrupt"] == 1 and out["quarantined_keys"] == [art.page_keys[2]]
    assert out["incomplete_artifacts"] == {art.artifact_id: {"missing_pages": 1, "first_missing": art.page_keys[2]}}
    code, out, _, _ = run(capsys, "check", "--store", dst)  # still unhealthy until repaired
    assert code == 1 and out["corrupt"] == 0 and out["quarantined_total"] == 1
    # re-importing the verified file repairs it
    code, _, _, _ = run(capsys, "import", f, "--store", dst, "--quiet")
    code, out, _, _ = run(capsys, "check", "--store", dst, "--sample", "0.5", "--seed", "3")
    assert code == 0 and out["incomplete_artifacts"] == {} and out["checked"] <= 4


def test_errors_are_one_line_with_exit_2(capsys, source, tmp_path):
    f = str(tmp_path / "a.tkva")
    run(capsys, "export", "--store", source["store"], "--artifact", source["art"].artifact_id, "-o", f, "--quiet")
    code, _, _, err = run(capsys, "import", f, "--store", str(tmp_path / "d1"), "--model", "tiny-qwen2", "--quiet")
    assert code == 2 and err.startswith("tieredkv: error: ModelMismatchError: ") and err.count("\n") == 1
    late = str(tmp_path / "late.tkva")  # a payload bit near the end: refused after earlier pages were written
    with open(f, "rb") as src, open(late, "wb") as dst:
        dst.write(src.read())
    flip_file_bit(late, 8 * (Path(late).stat().st_size - 9))
    code, _, _, err = run(capsys, "import", late, "--store", str(tmp_path / "d3"), "--quiet")
    assert code == 2 and "ArtifactIntegrityError" in err
    (tmp_path / "d4").mkdir()  # an empty directory made for the store: it stays, empty
    code, _, _, err = run(capsys, "import", late, "--store", str(tmp_path / "d4"), "--quiet")
    assert code == 2 and "ArtifactIntegrityError" in err and list((tmp_path / "d4").iterdir()) == []
    flip_file_bit(f, 8 * (read_header(f).data_offset - 4))  # a hex digit of the header
    code, _, _, err = run(capsys, "import", f, "--store", str(tmp_path / "d2"), "--quiet")
    assert code == 2 and "ArtifactIntegrityError: bad artifact header: header_sha256 mismatch" in err
    # a refused import into a new store leaves nothing behind (was: data.mdb, lock.mdb, tieredkv.commit)
    assert not any((tmp_path / d).exists() for d in ("d1", "d2", "d3"))
    code, _, _, err = run(capsys, "export", "--store", source["store"], "--artifact", "zzz", "-o", f, "--quiet")
    assert code == 2 and "ArtifactNotFoundError" in err
    assert main(["check", "--store", source["store"], "--sample", "1.5"]) == 2  # a usage error: one line too
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--sample: must be a number in (0, 1], got 1.5" in err
