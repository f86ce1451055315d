"""Re-checking `tieredkv verify --json --rows` reports: the replay command, and every claim.

A verify report claims, per row, that the grafted logits did (or did not) hash equal to the fresh
ones, a KL and an argmax agreement, and in its summary how many rows were equal, the largest KL and
the overall agreement. Each claim is checked twice:

    against the report's own rows    sha256_equal == (fresh hash == grafted hash), summary == rows
    against the re-run's rows        the same numbers computed afresh

In another domain the logits themselves (hashes, KL and agreement of a shifted graft) are
domain-specific; what holds anywhere is the relation per row (grafted == fresh at its own position,
and the equality flags) and, for own-position grafts, KL 0 and agreement 1.
"""
from __future__ import annotations

import math
from typing import Any

from tieredkv.provenance.recheck_plan import Plan, RecheckError, item

SPEC_FIELDS = ("model", "tokens", "samples", "shift", "page_size")
MAX_SAMPLES = 100_000  # far more rows than any verify run makes; a claim past it is refused, not re-run
# each row field the re-run recomputes, and the types a report may give it
ROW_TYPES = {"sample": int, "prefix_tokens": int, "continuation_tokens": int, "artifact": str, "input_sha256": str,
             "fresh_logits_sha256": str, "grafted_logits_sha256": str, "sha256_equal": bool,
             "kl": (int, float, type(None)), "argmax_agreement": (int, float)}


def is_verify_report(report: dict[str, Any]) -> bool:
    rows = report.get("rows")
    return isinstance(rows, list) and bool(rows) and isinstance(rows[0], dict) and "fresh_logits_sha256" in rows[0]


def verify_outputs(report: dict[str, Any]) -> dict[str, str]:
    """Every hash a `verify --rows` report commits to, by name."""
    out = {"corpus": report.get("corpus_sha256")}
    for r in report["rows"]:
        i = r["sample"]
        out[f"sample {i:03d} input"] = r["input_sha256"]
        out[f"sample {i:03d} fresh_logits"] = r["fresh_logits_sha256"]
        out[f"sample {i:03d} grafted_logits"] = r["grafted_logits_sha256"]
    return {k: v for k, v in out.items() if v is not None}


def verify_plan(report: dict[str, Any]) -> Plan:
    """The replay of a verify report. Every spec field must be recorded, except in reports made before
    verify recorded them: `seed` (then 0) and `continuation` (then the longest continuation in the
    rows) are inferred, said so, and stand only if every input hash reproduces."""
    check_rows(report)
    missing = [k for k in SPEC_FIELDS if k not in report]
    if missing or not isinstance(report.get("domain"), dict):
        raise RecheckError(f"the verify report does not record {', '.join(missing) or 'its domain'}; it cannot be "
                           "replayed without guessing — produce it again with `tieredkv verify --json --rows`")
    inferred = []
    seed = report.get("seed")
    if seed is None:
        seed = 0
        inferred.append("seed=0: not recorded (an older report); the verify default, standing only because "
                        "every input hash reproduces")
    cont = report.get("continuation")
    if cont is None:
        lengths = [int(r["continuation_tokens"]) for r in report["rows"]]
        cont = max(lengths)
        if max(1, cont // 2) > min(lengths):
            raise RecheckError(f"the report does not record --continuation and its rows ({min(lengths)}..{cont} "
                               "tokens) fit no single value; it cannot be replayed")
        inferred.append(f"continuation={cont}: not recorded (an older report); the longest continuation in its rows "
                        f"(each sample draws C/2..C tokens), standing only because every input hash reproduces")
    argv = ["tieredkv", "verify", "--model", str(report["model"]), "--tokens", str(report["tokens"]),
            "--samples", str(report["samples"]), "--shift", str(report["shift"]),
            "--page-size", str(report["page_size"]), "--seed", str(seed), "--continuation", str(cont),
            "--json", "--rows", "--quiet"]
    outputs = verify_outputs(report)
    inputs = frozenset(n for n in outputs if n == "corpus" or n.endswith(" input"))
    return Plan("verify", argv, outputs, report["domain"], tuple(inferred), inputs, report)


def check_rows(report: dict[str, Any]) -> None:
    """Refuse, before any re-run, a report whose rows cannot be what verify printed: a sample count that is
    not its number of rows, a sample index missing or given twice (a row replaced by a copy of another), a
    row field of the wrong type."""
    rows, samples = report["rows"], report.get("samples")
    if type(samples) is not int or not 1 <= samples <= MAX_SAMPLES or samples != len(rows):
        raise RecheckError(f"the report claims {str(samples)[:40]} samples but holds {len(rows)} rows (at most "
                           f"{MAX_SAMPLES}): its counts do not match its rows, so it is refused without a re-run")
    for r in rows:
        wrong = [k for k, t in ROW_TYPES.items() if not isinstance(r, dict) or not isinstance(r.get(k), t)
                 or (t is int and isinstance(r.get(k), bool))]
        if wrong:
            raise RecheckError(f"a row of the report has no valid {', '.join(wrong)}: it is not a row verify "
                               "printed; produce the report again with `tieredkv verify --json --rows`")
    indices = sorted(r["sample"] for r in rows)
    if indices != list(range(samples)):
        twice = sorted({i for i in indices if indices.count(i) > 1})
        missing = sorted(set(range(samples)) - set(indices))
        raise RecheckError(f"the report's rows do not hold every sample exactly once (given twice: {twice[:5]}; "
                           f"missing: {missing[:5]}): a row was replaced or removed, so it is refused")


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What verify's summary must say about `rows` (computed as verify computes it)."""
    kl_max = 0.0
    for r in rows:
        kl = r.get("kl")
        kl = float("nan") if kl is None else kl
        if not math.isnan(kl_max) and (math.isnan(kl) or kl > kl_max):
            kl_max = kl
    agree = sum(round(r["argmax_agreement"] * r["continuation_tokens"]) for r in rows)
    total = sum(r["continuation_tokens"] for r in rows)
    return {"samples": len(rows), "sha256_equal": sum(r["fresh_logits_sha256"] == r["grafted_logits_sha256"]
                                                      for r in rows),
            "kl_max": None if math.isnan(kl_max) else kl_max, "argmax_agreement": agree / total if total else None}


def verify_items(plan: Plan, rerun: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    report = plan.report
    if not is_verify_report(rerun):
        raise RecheckError(f"the re-run `{' '.join(plan.argv)}` printed no verify rows")
    items: list[dict[str, Any]] = []
    rows, new_rows = report["rows"], rerun["rows"]
    # 1. the report against itself: each flag against its hashes, the summary against its rows
    for r in rows:
        flag = r["fresh_logits_sha256"] == r["grafted_logits_sha256"]
        items.append(item(f"sample {r['sample']:03d} sha256_equal (report's own hashes)", "claim",
                           r.get("sha256_equal"), flag, r.get("sha256_equal") is flag))
    own = _summary(rows)
    for name in ("samples", "sha256_equal", "kl_max", "argmax_agreement"):
        items.append(item(f"{name} (report's own rows)", "claim", report.get(name), own[name],
                           report.get(name) == own[name]))
    # 2. hashes: inputs in any domain, logits only in the report's own
    got = verify_outputs(rerun)
    for name, committed in plan.outputs.items():
        now = got.get(name)
        if mode == "hash" or name in plan.inputs:
            items.append(item(name, "hash", committed, now, now == committed,
                               "" if now == committed or not plan.inferred or name not in plan.inputs else
                               "the inferred parameters do not reproduce the inputs"))
        else:
            items.append(item(name, "domain-specific", committed, now, None,
                               "matches" if now == committed else "differs (expected on another machine)"))
    # 3. relations per row: grafted == fresh (own position) or not (shifted), as the report says
    by_sample = {r["sample"]: r for r in new_rows}
    for r in rows:
        n = by_sample.get(r["sample"])
        now = None if n is None else n["fresh_logits_sha256"] == n["grafted_logits_sha256"]
        items.append(item(f"sample {r['sample']:03d} grafted == fresh", "relation", r.get("sha256_equal"), now,
                           now is not None and now == r.get("sha256_equal")))
    # 3b. every other field the re-run knows: the report's identity and each row's inputs
    items += _field_items(report, rerun, by_sample, mode)
    # 4. the summary against the re-run's rows
    fresh = _summary(new_rows)
    anywhere = ("samples", "sha256_equal") + (("kl_max", "argmax_agreement") if report.get("shift") == 0 else ())
    for name in ("samples", "sha256_equal", "kl_max", "argmax_agreement"):
        if mode == "hash" or name in anywhere:
            items.append(item(f"{name} (re-run)", "claim", report.get(name), fresh[name],
                               report.get(name) == fresh[name]))
        else:
            items.append(item(f"{name} (re-run)", "domain-specific", report.get(name), fresh[name], None,
                               "a shifted graft's drift depends on the machine"))
    return items


def _field_items(report: dict[str, Any], rerun: dict[str, Any], by_sample: dict[int, dict[str, Any]],
                 mode: str) -> list[dict[str, Any]]:
    """The report's model fingerprint and domain id (against its own domain and the re-run's), and each
    row's artifact id and token counts (against the re-run's row of the same sample). An artifact id and a
    domain id name the machine too: on another one they are not comparable."""
    from tieredkv.provenance.domain import domain_id

    same_model = report["domain"].get("fingerprint") == (rerun.get("domain") or {}).get("fingerprint")
    items = [item("model_fingerprint (report's own domain)", "claim", report.get("model_fingerprint"),
                   report["domain"].get("fingerprint"),
                   report.get("model_fingerprint") == report["domain"].get("fingerprint")),
             item("domain_id (report's own domain)", "claim", report.get("domain_id"), domain_id(report["domain"]),
                   report.get("domain_id") == domain_id(report["domain"]))]
    fields = [("model_fingerprint", report, rerun, same_model), ("domain_id", report, rerun, mode == "hash")]
    for r in report["rows"]:
        n = by_sample.get(r["sample"]) or {}
        fields += [(f"sample {r['sample']:03d} {k}", r, n, mode == "hash" or k != "artifact")
                   for k in ("artifact", "prefix_tokens", "continuation_tokens")]
    for name, have, now, comparable in fields:
        key = name.rsplit(" ", 1)[-1]
        if comparable:
            items.append(item(f"{name} (re-run)", "claim", have.get(key), now.get(key), have.get(key) == now.get(key)))
        else:
            items.append(item(f"{name} (re-run)", "domain-specific", have.get(key), now.get(key), None,
                               "names the machine or the model: not comparable here"))
    return items
