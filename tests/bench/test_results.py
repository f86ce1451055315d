"""bench/ holds the maintained benchmarks at its top level, each with one row in bench/README.md's table and one
current report in bench/results/ named for it; a figure there is named for its benchmark and shown in a document."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
SUB_PACKAGES = {"lib", "corpora", "longdoc", "tools"}
NO_REPORT_HERE = {"gpu_check"}  # made on a CUDA machine only, into bench/results/gpu/ (scripts/gpu_check.sh)
CLI_REPORTS = {"verify.json"}  # `tieredkv verify --json --rows`'s own output, not a module's


def benchmarks() -> set[str]:
    return {p.stem for p in BENCH.glob("*.py") if p.name != "__init__.py"}


def test_the_top_level_holds_the_benchmarks_their_readme_and_the_sub_packages():
    entries = {p.name for p in BENCH.iterdir() if not p.name.startswith((".", "__pycache__"))}
    assert entries == {"README.md", "__init__.py", "results", *SUB_PACKAGES, *(f"{b}.py" for b in benchmarks())}
    assert all((BENCH / sub / "__init__.py").is_file() for sub in SUB_PACKAGES)
    rows = re.findall(r"^\| `(\w+)` \|", (BENCH / "README.md").read_text(), re.MULTILINE)
    assert sorted(rows) == sorted(benchmarks())  # one row per benchmark in its table


def test_one_report_per_benchmark_named_for_it():
    reports = {p.name for p in RESULTS.glob("*.json")} - CLI_REPORTS
    assert {f"{b}.json" for b in benchmarks() - NO_REPORT_HERE} <= reports <= {f"{b}.json" for b in benchmarks()}


def test_every_figure_is_named_for_its_benchmark_and_shown_in_a_document():
    docs = "\n".join(p.read_text() for p in [REPO / "README.md", BENCH / "README.md", *(REPO / "docs").glob("*.md")])
    figures = sorted(p.name for p in RESULTS.glob("*.png"))
    assert figures
    for name in figures:
        assert name.split(".")[0] in benchmarks() and len(name.split(".")) in (2, 3), name
        assert f"bench/results/{name}" in docs, f"{name} is shown in no document"
    for named in set(re.findall(r"bench/results/([\w.-]+\.png)", docs)):
        assert (RESULTS / named).is_file(), f"a document shows {named}, which is not there"
