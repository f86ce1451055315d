"""The CLI at its edges: a byte-order mark is not text, and a warning is one line as an error is."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from testkit.trust_faults import REPO, cli_many


def test_a_byte_order_mark_is_not_part_of_the_document(tmp_path):
    text = "The nonlocal statement rebinds a name in the enclosing scope.\n"
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    (tmp_path / "bom.txt").write_text(text, encoding="utf-8-sig")
    (tmp_path / "only-bom.txt").write_text("\n", encoding="utf-8-sig")
    dep = ["deposit", "--model", "tiny-llama", "--quiet"]
    plain, bom, only = cli_many(dep + ["--store", str(tmp_path / "a"), str(tmp_path / "plain.txt")],
                                dep + ["--store", str(tmp_path / "b"), str(tmp_path / "bom.txt")],
                                dep + ["--store", str(tmp_path / "c"), str(tmp_path / "only-bom.txt")])
    assert plain["rc"] == bom["rc"] == 0, (plain, bom)
    first, second = json.loads(plain["out"]), json.loads(bom["out"])
    assert (first["artifact"], first["tokens"]) == (second["artifact"], second["tokens"])  # was 32 and 35 tokens
    assert only["rc"] == 2 and "EmptyInputError" in only["err"]  # as a blank file is (was: deposited)


def test_a_warning_is_one_line_that_names_its_kind(tmp_path):
    dep = cli_many(["deposit", "--model", "tiny-llama", "--store", str(tmp_path / "s"), "--text", "hi", "--quiet"])
    assert dep[0]["rc"] == 0, dep
    env = {**os.environ, "PYTHONPATH": str(REPO), "TIEREDKV_REMOTE": "redis://127.0.0.1:1/0?retries=0"}
    done = subprocess.run([sys.executable, "-m", "tieredkv", "stats", "--store", str(tmp_path / "s")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["artifacts"], done
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("tieredkv: warning: RemoteTierWarning: remote ") for line in lines), lines
