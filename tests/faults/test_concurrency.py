"""Four processes read while one writes (spawn): every read verifies, no artifact is seen half-written."""
from __future__ import annotations

from testkit.faults import audit_store, run_readers_and_writer


def test_four_readers_and_a_writer(tmp_path):
    store = str(tmp_path / "s")
    r = run_readers_and_writer(store, num_readers=4, num_artifacts=10, seed=1)
    assert r["errors"] == [] and r["exit_codes"] == [0] * 5, r
    assert r["written"] == 10 and r["reads"] > 0 and r["seen_at_end"] == [10] * 4, r
    a = audit_store(store)
    assert a["corrupt"] == 0 and a["checked"] == a["pages"] > 0
