"""`recheck` compares every claim it can recompute: every sample exactly once, the report's identity and each
row's fields, and refuses at once a report whose counts, nesting or size no verify report has."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest

from tests.provenance.test_recheck import ENV, _rerun_of, _verify, _write
from tieredkv.provenance.recheck import RecheckError, recheck


@pytest.fixture(scope="module")
def report():
    return _verify()


def _never(argv, cwd):
    raise AssertionError(f"re-ran {argv} for a report that should have been refused first")


def test_a_row_replaced_by_a_copy_of_another_is_refused(report, tmp_path):
    doctored = copy.deepcopy(report)
    doctored["rows"][2] = copy.deepcopy(doctored["rows"][1])  # sample 2 is never compared
    with pytest.raises(RecheckError, match=r"every sample exactly once \(given twice: \[1\]; missing: \[2\]\)"):
        recheck(_write(tmp_path, doctored), runner=_never)  # was: "hash-equal 7/7 ... the report holds"
    removed = copy.deepcopy(report)
    removed["rows"] = removed["rows"][:2]
    with pytest.raises(RecheckError, match="claims 3 samples but holds 2 rows"):
        recheck(_write(tmp_path, removed), runner=_never)


@pytest.mark.parametrize("where, key, value", [
    (None, "model_fingerprint", "e" * 64), (None, "domain_id", "0123456789abcdef"),
    (1, "artifact", "0" * 20), (1, "prefix_tokens", 7), (2, "continuation_tokens", 1)])
def test_a_doctored_field_the_rerun_knows_is_not_certified(report, tmp_path, where, key, value):
    doctored = copy.deepcopy(report)
    (doctored if where is None else doctored["rows"][where])[key] = value
    result = recheck(_write(tmp_path, doctored), runner=_rerun_of(report))
    failed = [i["name"] for i in result.items if i["ok"] is False]
    name = key if where is None else f"sample {where:03d} {key}"
    assert not result.ok and f"{name} (re-run)" in failed, failed  # was: every field ignored, exit 0
    assert recheck(_write(tmp_path, report, "honest.json"), runner=_rerun_of(report)).ok


def test_a_report_claiming_more_samples_than_rows_is_refused_without_a_rerun(report, tmp_path):
    huge = {**copy.deepcopy(report), "samples": 10 ** 30}
    with pytest.raises(RecheckError, match="claims 1000000000000000000000000000000 samples but holds 3 rows"):
        recheck(_write(tmp_path, huge), runner=_never)  # was: an endless re-run of 10^30 samples
    bad_row = copy.deepcopy(report)
    bad_row["rows"][0]["prefix_tokens"] = "48"
    with pytest.raises(RecheckError, match="no valid prefix_tokens"):
        recheck(_write(tmp_path, bad_row), runner=_never)


def test_a_deeply_nested_or_huge_report_is_one_typed_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    proc = subprocess.run([sys.executable, "-m", "tieredkv.cli", "recheck", str(deep)], capture_output=True,
                          text=True, env=ENV, timeout=120, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr  # was: "this is a bug in tieredkv"
    assert lines[0].startswith("tieredkv: error: RecheckError: ") and "nested deeper than 32 levels" in lines[0]
    moderate = tmp_path / "moderate.json"  # parses, but no report nests this deep
    moderate.write_text('{"rows": [{"a": ' + "[" * 40 + "1" + "]" * 40 + "}]}")
    with pytest.raises(RecheckError, match="nested deeper than 32 levels"):
        recheck(moderate, runner=_never)
