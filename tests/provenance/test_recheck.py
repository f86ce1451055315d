"""`tieredkv recheck`: a report's hashes are reproduced in its own domain; on another machine its inputs and
the relations that hold anywhere are; every claim is checked against the rows, in any domain.

Reports are made by a separate CLI process and re-checked by another one, as a reader would. Issue 16
case 8 (doctored claims certified because only hashes were compared) and case 9 (another CPU vendor
recorded as the same `cpu:x86_64`: every logits hash "DIFFERS", the continuation assumed).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys

import pytest

from tieredkv.errors import DomainMismatchError
from tieredkv.provenance.domain import domain_id
from tieredkv.provenance.recheck import RecheckError, plan_for, recheck, verify_outputs

ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}
AMD = "AuthenticAMD AMD EPYC 7B13 64-Core Processor"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tieredkv.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


def _verify(*extra: str) -> dict:
    proc = _cli("verify", "--model", "tiny-llama", "--samples", "3", "--tokens", "48", "--continuation", "8",
                "--json", "--rows", *extra)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def verify_report():
    return _verify()


@pytest.fixture(scope="module")
def shifted_report():
    return _verify("--shift", "3", "--samples", "2")


def _write(tmp_path, report, name="report.json"):
    path = tmp_path / name
    path.write_text(json.dumps(report))
    return path


def _rerun_of(report):
    return lambda argv, cwd: copy.deepcopy(report)  # stands in for the process (the CLI tests run one)


def _as_if_made_elsewhere(report: dict) -> dict:
    """The report as another CPU vendor would have made it: its own domain, its own logits hashes (other floats,
    the same relations per row)."""
    other = copy.deepcopy(report)
    other["domain"].update(cpu=AMD, cpu_capability="AVX2")
    other["domain_id"] = domain_id(other["domain"])
    for row in other["rows"]:
        fresh = hashlib.sha256(("amd" + row["fresh_logits_sha256"]).encode()).hexdigest()
        row["grafted_logits_sha256"] = fresh if row["sha256_equal"] else \
            hashlib.sha256(("amd" + row["grafted_logits_sha256"]).encode()).hexdigest()
        row["fresh_logits_sha256"] = fresh
    return other


# -- the same domain: every hash ---------------------------------------------------------------------
def test_recheck_reproduces_a_fresh_verify_report(verify_report, tmp_path):
    proc = _cli("recheck", str(_write(tmp_path, verify_report)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "hash-equal: 10/10" in out  # corpus + 3 samples x (input, fresh, grafted)
    # claims: 11 flags and summaries, 4 identity fields (fingerprint, domain id), 3 x 3 row fields
    assert "relation-only: 3/3 hold" in out and "claims: 24/24 hold" in out
    assert "domain: the same as the report's" in out and "RESULT: the report holds\n" in out
    assert "DIFFERS" not in out


def test_recheck_fails_when_one_hash_is_altered(verify_report, tmp_path, monkeypatch, capsys):
    import tieredkv.provenance.recheck as rc
    from tieredkv.cli import main

    monkeypatch.setattr(rc, "run_subprocess", _rerun_of(verify_report))
    bad = copy.deepcopy(verify_report)
    row = bad["rows"][1]
    row["input_sha256"] = ("0" if row["input_sha256"][0] != "0" else "1") + row["input_sha256"][1:]
    assert main(["recheck", str(_write(tmp_path, bad)), "--failures-only"]) == 1
    out = capsys.readouterr().out
    assert "| sample 001 input | hash |" in out and "DIFFERS" in out and "hash-equal: 9/10" in out
    assert main(["recheck", str(_write(tmp_path, verify_report))]) == 0


# -- case 8: claims are checked, not only hashes -----------------------------------------------------
def test_case8_doctored_claims_of_a_shifted_verify_are_not_certified(shifted_report, tmp_path):
    assert shifted_report["sha256_equal"] == 0  # a shifted graft is not exact: the honest report says so
    doctored = copy.deepcopy(shifted_report)
    doctored.update(sha256_equal=2, kl_max=0.0, argmax_agreement=1.0)
    proc = _cli("recheck", str(_write(tmp_path, doctored)), "--failures-only")
    # was: "7/7 hashes reproduced", exit 0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "hash-equal: 7/7" in out and "RESULT: the report does NOT hold" in out
    doctored_names = [k for k in ("sha256_equal", "kl_max", "argmax_agreement") if doctored[k] != shifted_report[k]]
    assert {"sha256_equal", "kl_max"} <= set(doctored_names)
    for name in doctored_names:
        assert f"| {name} (report's own rows) | claim |" in out and f"| {name} (re-run) | claim |" in out, name
    honest = _cli("recheck", str(_write(tmp_path, shifted_report, "honest.json")))
    assert honest.returncode == 0, honest.stdout


def test_case8_a_doctored_row_flag_is_caught_by_its_own_hashes_and_by_the_rerun(shifted_report, tmp_path):
    doctored = copy.deepcopy(shifted_report)
    doctored["rows"][0]["sha256_equal"] = True
    result = recheck(_write(tmp_path, doctored), runner=_rerun_of(shifted_report))
    failed = sorted(i["name"] for i in result.items if i["ok"] is False)
    assert failed == ["sample 000 grafted == fresh", "sample 000 sha256_equal (report's own hashes)"]
    # and a row whose hashes were made equal too: the re-run's hashes (same domain) and relation disagree
    doctored["rows"][0]["grafted_logits_sha256"] = doctored["rows"][0]["fresh_logits_sha256"]
    result = recheck(_write(tmp_path, doctored), runner=_rerun_of(shifted_report))
    failed = sorted(i["name"] for i in result.items if i["ok"] is False)
    assert failed == ["sample 000 grafted == fresh", "sample 000 grafted_logits", "sha256_equal (report's own rows)"]


# -- case 9: another machine checks relations, and says so --------------------------------------------
def test_case9_a_report_from_another_cpu_is_rechecked_by_relations(verify_report, tmp_path):
    elsewhere = _as_if_made_elsewhere(verify_report)
    result = recheck(_write(tmp_path, elsewhere), runner=_rerun_of(verify_report))
    # was: every logits hash DIFFERS (both domains said cpu:x86_64), exit 1
    assert result.ok and result.mode == "relation"
    assert any(d.startswith("cpu: ") and AMD in d for d in result.domain_differences)
    assert result.count("hash") == (4, 4)  # corpus and the inputs: the same in any domain
    assert result.count("relation") == (3, 3)  # grafted == fresh in every re-run row
    assert result.count("domain-specific") == (0, 10)  # logits hashes, domain and artifact ids: not evidence
    from tieredkv.provenance.recheck import format_table

    text = format_table(result)
    assert "ANOTHER machine" in text and "committed output hashes are domain-specific" in text
    assert "RESULT: the report holds (relation-only on this machine)" in text


def test_case9_on_another_machine_a_relation_that_fails_fails(verify_report, tmp_path):
    elsewhere = _as_if_made_elsewhere(verify_report)
    rerun = copy.deepcopy(verify_report)
    rerun["rows"][2]["grafted_logits_sha256"] = "f" * 64  # the re-run here found a graft that is not exact
    result = recheck(_write(tmp_path, elsewhere), runner=_rerun_of(rerun))
    assert not result.ok
    assert [i["name"] for i in result.items if i["ok"] is False] == ["sample 002 grafted == fresh",
                                                                     "sha256_equal (re-run)"]


def test_case9_an_older_report_names_what_it_did_not_record(verify_report, tmp_path):
    older = copy.deepcopy(verify_report)
    for field in ("cpu", "cpu_capability", "blas", "onednn", "cuda"):
        older["domain"].pop(field)
    older["domain_id"] = domain_id(older["domain"])  # what the older build recorded for its own domain
    del older["seed"], older["continuation"]
    plan = plan_for(older)
    cont = max(r["continuation_tokens"] for r in older["rows"])
    assert plan.argv[plan.argv.index("--continuation") + 1] == str(cont)
    assert [a.split(":")[0] for a in plan.inferred] == ["seed=0", f"continuation={cont}"]
    result = recheck(_write(tmp_path, older), runner=_rerun_of(verify_report))
    assert result.mode == "relation" and result.ok
    assert any("not recorded (made by an older tieredkv)" in d for d in result.domain_differences)
    # an inferred parameter stands only if every input hash reproduces
    wrong = copy.deepcopy(verify_report)
    wrong["rows"][0]["input_sha256"] = "0" * 64
    result = recheck(_write(tmp_path, older), runner=_rerun_of(wrong))
    bad = [i for i in result.items if i["ok"] is False]
    assert not result.ok and bad[0]["note"] == "the inferred parameters do not reproduce the inputs"


def test_verify_reports_record_every_parameter(verify_report):
    plan = plan_for(verify_report)
    assert plan.kind == "verify" and plan.argv[:2] == ["tieredkv", "verify"] and plan.inferred == ()
    for flag, key in (("--continuation", "continuation"), ("--seed", "seed"), ("--samples", "samples"),
                      ("--tokens", "tokens"), ("--page-size", "page_size"), ("--shift", "shift")):
        assert plan.argv[plan.argv.index(flag) + 1] == str(verify_report[key])
    assert plan.outputs == verify_outputs(verify_report) and len(plan.outputs) == 10
    assert {"cpu", "cpu_capability", "blas", "onednn", "cuda"} <= set(verify_report["domain"])
    no_tokens = {k: v for k, v in verify_report.items() if k != "tokens"}
    with pytest.raises(RecheckError, match="does not record tokens"):
        plan_for(no_tokens)


def test_a_rerun_with_another_model_is_refused_unless_allowed(verify_report, tmp_path):
    other = copy.deepcopy(verify_report)
    other["domain"]["fingerprint"] = other["model_fingerprint"] = "f" * 64  # only the re-run can see this
    other["domain_id"] = domain_id(other["domain"])
    path = _write(tmp_path, other)
    with pytest.raises(DomainMismatchError, match="another recipe"):
        recheck(path, runner=_rerun_of(verify_report))
    result = recheck(path, runner=_rerun_of(verify_report), allow_domain_mismatch=True)
    assert result.ok and result.mode == "relation" and any("fingerprint" in d for d in result.domain_differences)


def test_recheck_block_convention(verify_report, tmp_path):
    """Any report can carry {"recheck": {"argv", "outputs"}}; the re-run prints {"outputs", "domain"} and may
    name its domain-independent "inputs" and its "relations"."""
    domain = verify_report["domain"]
    printed = {"outputs": {"answer": "a" * 64, "question": "q" * 64}, "domain": domain, "inputs": ["question"],
               "relations": {"graft_equals_fresh": True}}
    report = {"domain": domain, "recheck": {"argv": ["python", "-c", f"print({json.dumps(printed)!r})"],
                                            "outputs": {"answer": "a" * 64, "question": "q" * 64}}}
    result = recheck(_write(tmp_path, report))
    assert result.ok and result.count("hash") == (2, 2) and result.count("relation") == (1, 1)
    report["recheck"]["outputs"]["missing"] = "b" * 64
    result = recheck(_write(tmp_path, report))
    assert not result.ok and [i["name"] for i in result.items if i["ok"] is False] == ["missing"]
    moved = copy.deepcopy(report)
    moved["domain"] = dict(domain, cpu=AMD)
    moved["recheck"]["outputs"]["answer"] = "c" * 64  # another machine's floats
    del moved["recheck"]["outputs"]["missing"]
    result = recheck(_write(tmp_path, moved))
    assert result.ok and result.mode == "relation"
    assert {i["name"]: i["check"] for i in result.items} == {"answer": "domain-specific", "question": "hash",
                                                            "graft_equals_fresh": "relation"}
    printed["relations"]["graft_equals_fresh"] = False
    moved["recheck"]["argv"] = ["python", "-c", f"print({json.dumps(printed)!r})"]
    assert not recheck(_write(tmp_path, moved)).ok


def test_unsupported_reports_are_refused_with_the_reason(tmp_path, verify_report):
    no_rows = {k: v for k, v in verify_report.items() if k != "rows"}
    with pytest.raises(RecheckError, match="--rows"):
        recheck(_write(tmp_path, no_rows))
    with pytest.raises(RecheckError, match="convention"):
        recheck(_write(tmp_path, {"hello": 1}))

    from tieredkv.cli import main

    assert main(["recheck", str(_write(tmp_path, {"hello": 1}))]) == 2
