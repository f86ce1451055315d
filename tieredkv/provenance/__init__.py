"""Exactness and provenance: determinism domains, graft-vs-fresh verification, report re-checks.

    domain.py          the determinism domain every artifact and report records
    verify.py          `tieredkv verify`: graft vs fresh logits, SHA-256, KL, argmax
    recheck.py         `tieredkv recheck`: re-run a report's recipe and compare its output hashes
    recheck_plan.py    what a re-check runs (Plan) and what it reports (one item per compared value)
    recheck_verify.py  the recheck plan of a verify report
    report_runs.py     reports of named runs: one file per benchmark, a whole report per run
"""
