"""The library of verified solutions on a CPU-sized task: base model vs library.

A seeded, generated knowledge base of fictional countries (capital, founder, founding year) that
the model cannot know, plus small arithmetic problems; programmatic verifiers check every answer.

  1. The library is seeded with verified literal questions about the KB (`Library.add`).
  2. Held-out questions (paraphrases, never literally in the library) are answered by the bare model
     and by the library (the chat of verified entries grafted as context): accuracy, base vs library.
  3. Flywheel: new arithmetic problems are solved with the library as context, verified, deposited.
  4. Recurring problems (library problems, respelled): the bare model vs the library's grafted entry,
     in decode tokens, CPU-seconds and energy per answer (RAPL/NVML where readable; else CPU-seconds).

Every hashed output is reproduced by `--recheck-only` (the same computation, printing hashes):

    python -m bench.library_demo --json            # writes bench/results/library_demo.json
    tieredkv recheck bench/results/library_demo.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench.lib.report import environment, recheck_block, sha256_ids, write_report
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import graft, grafted_token_ids, load_artifact
from tieredkv.library.solutions import Library, answer_plain
from tieredkv.library.verifiers import AnswerKeyVerifier, ArithmeticVerifier, Verdict, arithmetic_answer, normalize_text
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain, domain_id, sha256_tensor

COUNTRIES = ["Velmora", "Drustan", "Korvia", "Amberlund", "Tessaly", "Orvane", "Quenthia", "Marrowind",
             "Solvenia", "Briscany"]
CAPITALS = ["Quellmar", "Ostwick", "Tarnholt", "Brightvale", "Lunegard", "Fennick", "Halvorn", "Pellory",
            "Sundmere", "Crayle"]
FIRST = ["Ada", "Bram", "Celia", "Doran", "Elsa", "Fenn", "Greta", "Hugo", "Ilsa", "Joran"]
LAST = ["Voss", "Marrow", "Quill", "Thorne", "Lark", "Brenn", "Dask", "Holm", "Wick", "Astor"]
# (fact, question in the library, answer sentence, held-out paraphrases)
TEMPLATES = [
    ("capital", "What is the capital of {c}?", "The capital of {c} is {v}.",
     ["Which city is the capital of {c}?", "What is the name of the capital city of {c}?", "Name the capital of {c}."]),
    ("founder", "Who founded {c}?", "{c} was founded by {v}.",
     ["Who was the founder of {c}?", "Who established {c}?", "Name the founder of {c}."]),
    ("year", "In what year was {c} founded?", "{c} was founded in {v}.",
     ["When was {c} founded?", "What year was {c} founded in?", "In which year was {c} established?"]),
]
RESPELL = [str.lower, str.upper, lambda q: q.replace(" ", "  "), lambda q: "  " + q + " "]


# ----------------------------------------------------------------------------- the task
def make_kb(seed: int, num_countries: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    cs, caps, fs, ls = (rng.sample(x, num_countries) for x in (COUNTRIES, CAPITALS, FIRST, LAST))
    return [{"country": c, "capital": k, "founder": f"{f} {last}", "year": str(rng.randint(1100, 1899))}
            for c, k, f, last in zip(cs, caps, fs, ls)]


def make_task(seed: int, num_countries: int, num_heldout: int, num_arith: int) -> dict[str, Any]:
    kb = make_kb(seed, num_countries)
    rng = random.Random(seed + 1)
    literal, heldout, key = [], [], {}
    for fact in kb:
        for name, q, a, paraphrases in TEMPLATES:
            c, v = fact["country"], fact[name]
            literal.append((q.format(c=c), a.format(c=c, v=v)))
            key[q.format(c=c)] = v
            para = rng.choice(paraphrases).format(c=c)
            heldout.append(para)
            key[para] = v
    heldout = rng.sample(heldout, min(num_heldout, len(heldout)))
    assert not {normalize_text(q) for q in heldout} & {normalize_text(q) for q, _ in literal}
    arith = [f"What is {rng.randint(2, 9)} + {rng.randint(2, 9)}?" for _ in range(num_arith)]
    recurring = [rng.choice(RESPELL)(q) for q, _ in rng.sample(literal, 4)]
    return {"kb": kb, "literal": literal, "heldout": heldout, "arith": arith, "recurring": recurring, "key": key,
            "respell_seed": rng.random()}


class DemoVerifier:
    """Arithmetic problems by evaluation; KB questions against the generated knowledge base."""

    name = "demo-kb-arithmetic"

    def __init__(self, key: dict[str, str]):
        self.kb, self.arith = AnswerKeyVerifier(key), ArithmeticVerifier()
        self.version = f"{self.kb.version};{self.arith.version}"

    def check(self, problem: str, solution: str) -> Verdict:
        if arithmetic_answer(problem) is not None:
            return self.arith.check(problem, solution)
        return self.kb.check(problem, solution)


# ----------------------------------------------------------------------------- measuring
class EnergyMeter:
    """Cumulative joules: RAPL package counters (/sys/class/powercap) where readable, NVML on a GPU.

    `read()` is None where neither is readable; `source` then says so, and CPU-seconds stand in.
    """

    def __init__(self):
        self.rapl = sorted(p for p in Path("/sys/class/powercap").glob("intel-rapl:*/energy_uj")
                           if p.parent.name.count(":") == 1) if Path("/sys/class/powercap").is_dir() else []
        self.nvml, why = None, []
        try:
            for p in self.rapl:
                int(p.read_text())
        except OSError as e:
            why.append(f"RAPL unreadable ({e.strerror})")
            self.rapl = []
        if not self.rapl and not why:
            why.append("no RAPL counters under /sys/class/powercap")
        if torch.cuda.is_available():
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            except Exception as e:  # noqa: BLE001 - any NVML failure means "not measurable"
                why.append(f"NVML unavailable ({type(e).__name__})")
        parts = (["RAPL package energy"] if self.rapl else []) + (["NVML GPU energy"] if self.nvml else [])
        self.source = " + ".join(parts) if parts else f"none readable ({'; '.join(why)}): CPU-seconds stand in"

    def read(self) -> float | None:
        if not self.rapl and self.nvml is None:
            return None
        # NOTE: RAPL counters wrap at max_energy_range_uj; a wrap inside one answer is not corrected here.
        joules = sum(int(p.read_text()) for p in self.rapl) / 1e6
        if self.nvml is not None:
            import pynvml

            joules += pynvml.nvmlDeviceGetTotalEnergyConsumption(self.nvml) / 1e3
        return joules


def measured(meter: EnergyMeter, fn: Callable[[], Any]) -> tuple[Any, dict[str, float | None]]:
    """Run `fn`; its CPU-seconds (this process, all threads), wall seconds and joules (None if unreadable)."""
    e0, c0, w0 = meter.read(), time.process_time(), time.perf_counter()
    out = fn()
    c1, w1, e1 = time.process_time(), time.perf_counter(), meter.read()
    joules = None if e0 is None or e1 is None else e1 - e0
    return out, {"cpu_s": c1 - c0, "wall_s": w1 - w0, "joules": joules}


INPUT_OUTPUTS = ["kb_text"]  # outputs that hash inputs only: equal in any determinism domain


def sha_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def sha_id_lists(lists: list[list[int]]) -> str:
    return sha_json([sha256_ids(ids) for ids in lists])


@torch.inference_mode()
def base_logits_sha(lm, problem: str) -> str:
    """Logits (all positions) of the bare model's canonical prefill of the chat-formatted problem."""
    from transformers import DynamicCache

    from tieredkv.artifacts.artifact import prefill

    out = []
    prefill(lm, lm.codec.chat_prompt(problem), DynamicCache(config=lm.model.config), page_size=lm.default_page_size,
            on_chunk=lambda s, e, o: out.append(o.logits[0]), logits_to_keep=0)
    return sha256_tensor(torch.cat(out))


@torch.inference_mode()
def recall_logits_sha(lm, store, artifact_id: str) -> str:
    """Logits of the first decode step after grafting a library entry (what confirms its end of turn)."""
    art = load_artifact(store, artifact_id)
    ids = grafted_token_ids(store, art)
    cache = graft(lm, art, store)
    cache.crop(-1)
    x = torch.tensor([ids[-1:]], device=lm.model.device)
    pos = torch.tensor([[len(ids) - 1]], device=lm.model.device)
    return sha256_tensor(lm.model(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True).logits)


@torch.inference_mode()
def fresh_recall_logits_sha(lm, store, artifact_id: str) -> str:
    """`recall_logits_sha` computed without the store: a fresh canonical prefill of the same ids. The
    contract makes the two equal in any determinism domain (a relation `tieredkv recheck` checks anywhere)."""
    from transformers import DynamicCache

    from tieredkv.artifacts.artifact import prefill

    art = load_artifact(store, artifact_id)
    ids = grafted_token_ids(store, art)
    cache = DynamicCache(config=lm.model.config)
    prefill(lm, ids, cache, page_size=art.page_size)
    cache.crop(-1)
    x = torch.tensor([ids[-1:]], device=lm.model.device)
    pos = torch.tensor([[len(ids) - 1]], device=lm.model.device)
    return sha256_tensor(lm.model(input_ids=x, position_ids=pos, past_key_values=cache, use_cache=True).logits)


def artifact_sha(store, artifact_id: str) -> str:
    """Commits to every page of an artifact: keys (model, token ids, positions) and the SHA-256 of each K/V
    payload (computed here, not the page's own digest, so the value does not depend on the page format)."""
    art = load_artifact(store, artifact_id)
    return sha_json([[k, hashlib.sha256(store.get(k).payload).hexdigest()] for k in art.page_keys])


# ----------------------------------------------------------------------------- the run
def run(args) -> dict[str, Any]:
    lm = load_model(args.model)
    domain = determinism_domain(lm.model, lm.fingerprint, lm.default_page_size)
    task = make_task(args.seed, args.countries, args.heldout, args.arith)
    verifier = DemoVerifier(task["key"])
    meter = EnergyMeter()
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.quiet else (lambda *a: None)
    rows: dict[str, list[dict[str, Any]]] = {"library": [], "heldout": [], "flywheel": [], "recurring": []}
    with tempfile.TemporaryDirectory(prefix="tkv-library-demo-") as d, \
            PageStore(d, StoreConfig(host_budget_bytes=1 << 30)) as store:
        lib = Library(lm, store, max_new_tokens=args.max_new_tokens)
        for problem, solution in task["literal"]:  # 1. seed the library
            entry, m = measured(meter, lambda p=problem, s=solution: lib.add(p, s, verifier))
            rows["library"].append({"problem": problem, "artifact": entry.artifact_id,
                                    "artifact_sha256": artifact_sha(store, entry.artifact_id), **m})
        log(f"library: {len(lib)} entries")
        ingested, m_ctx = measured(meter, lib.prepare_context)
        context_art = lib.index.context()["artifact"]
        context = {"tokens": ingested, "artifact": context_art, "artifact_sha256": artifact_sha(store, context_art),
                   **m_ctx}
        for q in task["heldout"]:  # 2. held-out questions: bare model vs library as context
            b, mb = measured(meter, lambda q=q: answer_plain(lm, q, max_new_tokens=args.max_new_tokens))
            b.verdict = verifier.check(q, b.answer)
            r, mr = measured(meter, lambda q=q: lib.solve(q, verifier, deposit=False))
            rows["heldout"].append({"question": q, "expected": task["key"][q], "base": _row(b, mb),
                                    "library": _row(r, mr)})
            log(f"held-out {q!r}: base {b.accepted} {b.answer!r} | library {r.accepted} {r.answer!r}")
        # The flywheel, batched: held-out answers were generated against one library version (so the
        # accuracy above is that version's); the verified ones are deposited now, in one version step each.
        for row in rows["heldout"]:
            if row["library"]["accepted"]:
                lib.add(row["question"], row["library"]["answer"], verifier, source="solve")
                rows["flywheel"].append({"problem": row["question"], "from": "held-out", **row["library"],
                                         "deposited": True, "added_instead": False})
        for p in task["arith"]:  # 3. flywheel: generate with the library as context, verify, deposit
            r, mr = measured(meter, lambda p=p: lib.solve(p, verifier))
            if not r.accepted:  # an external solver's answer, verified like any other
                lib.add(p, str(arithmetic_answer(p)), verifier)
            rows["flywheel"].append({"problem": p, "from": "arithmetic", **_row(r, mr),
                                     "added_instead": not r.accepted})
            log(f"flywheel {p!r}: {r.answer!r} verified={r.accepted} deposited={r.deposited}")
        # 4. recurring problems: 4 respelled library questions, up to 2 held-out questions the flywheel
        # deposited, and the arithmetic problems: bare model vs the grafted entry
        fresh_recall: list[str] = []  # the same logits without the store (a relation, not timed)
        rng = random.Random(task["respell_seed"])
        deposited = [r["problem"] for r in rows["flywheel"] if r["from"] == "held-out"][:2]
        task["recurring"] += [rng.choice(RESPELL)(q) for q in deposited] + task["arith"]
        for p in task["recurring"]:
            b, mb = measured(meter, lambda p=p: answer_plain(lm, p, max_new_tokens=args.max_new_tokens))
            b.verdict = verifier.check(p, b.answer)
            r, mr = measured(meter, lambda p=p: lib.solve(p, verifier))
            assert r.route == "recurring", f"{p!r} should be recurring"
            rows["recurring"].append({"problem": p, "base": _row(b, mb), "cached": _row(r, mr),
                                      "recall_logits_sha256": recall_logits_sha(lm, store, r.artifact_id)})
            fresh_recall.append(fresh_recall_logits_sha(lm, store, r.artifact_id))
            log(f"recurring {p!r}: base {b.decode_tokens} tok {mb['cpu_s']:.2f} cpu-s | cached "
                f"{r.decode_tokens} tok {mr['cpu_s']:.2f} cpu-s")
        library_version, library_size = lib.version, len(lib)
    outputs = {
        "kb_text": sha_json(task["kb"]),
        "library_artifacts": sha_json([r["artifact_sha256"] for r in rows["library"]]),
        "context_artifact": context["artifact_sha256"],
        "heldout_base_ids": sha_id_lists([r["base"]["generated_ids"] for r in rows["heldout"]]),
        "heldout_library_ids": sha_id_lists([r["library"]["generated_ids"] for r in rows["heldout"]]),
        "heldout_base_logits": base_logits_sha(lm, task["heldout"][0]),
        "flywheel_ids": sha_id_lists([r["generated_ids"] for r in rows["flywheel"]]),
        "recurring_base_ids": sha_id_lists([r["base"]["generated_ids"] for r in rows["recurring"]]),
        "recurring_cached_ids": sha_id_lists([r["cached"]["generated_ids"] for r in rows["recurring"]]),
        "recurring_recall_logits": sha_json([r["recall_logits_sha256"] for r in rows["recurring"]]),
        "verdicts": sha_json([[r["base"]["accepted"], r["library"]["accepted"]] for r in rows["heldout"]]
                             + [[r["base"]["accepted"], r["cached"]["accepted"]] for r in rows["recurring"]]
                             + [[r["accepted"]] for r in rows["flywheel"]]),
    }
    # What holds in any determinism domain: the inputs hash the same, and a grafted library entry gives
    # the logits of a fresh prefill of the same tokens (the other outputs are domain-specific).
    relations = {"recurring_recall_graft_equals_fresh":
                 [r["recall_logits_sha256"] for r in rows["recurring"]] == fresh_recall}
    return {"lm": lm, "domain": domain, "task": task, "verifier": verifier, "meter": meter, "rows": rows,
            "relations": relations, "inputs": INPUT_OUTPUTS,
            "context": context, "outputs": outputs, "library_version": library_version,
            "library_size": library_size}


def _row(r, m: dict[str, Any]) -> dict[str, Any]:
    return {"answer": r.answer, "accepted": r.accepted, "reason": r.verdict.reason, "route": r.route,
            "decode_tokens": r.decode_tokens, "prefill_tokens": r.prefill_tokens, "grafted_tokens": r.grafted_tokens,
            "end_of_turn": r.end_of_turn, "deposited": r.deposited, "generated_ids": r.generated_ids,
            "generated_ids_sha256": sha256_ids(r.generated_ids), **{k: v for k, v in m.items()}}


# ----------------------------------------------------------------------------- summary and report
def summarize(res: dict[str, Any]) -> dict[str, Any]:
    h, rec, fly = res["rows"]["heldout"], res["rows"]["recurring"], res["rows"]["flywheel"]
    total = lambda rows, side, key: sum(r[side][key] for r in rows)  # noqa: E731
    ratio = lambda a, b: None if not b else a / b  # noqa: E731
    joules = [r[s]["joules"] for r in rec for s in ("base", "cached")]
    out = {
        "heldout_questions": len(h),
        "heldout_accuracy_base": sum(r["base"]["accepted"] for r in h) / len(h),
        "heldout_accuracy_library": sum(r["library"]["accepted"] for r in h) / len(h),
        "recurring_problems": len(rec),
        "recurring_accuracy_base": sum(r["base"]["accepted"] for r in rec) / len(rec),
        "recurring_accuracy_cached": sum(r["cached"]["accepted"] for r in rec) / len(rec),
        "decode_tokens_per_answer_base": total(rec, "base", "decode_tokens") / len(rec),
        "decode_tokens_per_answer_cached": total(rec, "cached", "decode_tokens") / len(rec),
        "cpu_s_per_answer_base": total(rec, "base", "cpu_s") / len(rec),
        "cpu_s_per_answer_cached": total(rec, "cached", "cpu_s") / len(rec),
        "flywheel_deposited_heldout": sum(r["from"] == "held-out" for r in fly),
        "flywheel_arithmetic_verified": sum(r["accepted"] for r in fly if r["from"] == "arithmetic"),
        "flywheel_arithmetic_problems": sum(r["from"] == "arithmetic" for r in fly),
    }
    out["decode_tokens_ratio_base_over_cached"] = ratio(total(rec, "base", "decode_tokens"),
                                                       total(rec, "cached", "decode_tokens"))
    out["cpu_s_ratio_base_over_cached"] = ratio(total(rec, "base", "cpu_s"), total(rec, "cached", "cpu_s"))
    if all(j is not None for j in joules):
        out["joules_per_answer_base"] = total(rec, "base", "joules") / len(rec)
        out["joules_per_answer_cached"] = total(rec, "cached", "joules") / len(rec)
        out["energy_ratio_base_over_cached"] = ratio(total(rec, "base", "joules"), total(rec, "cached", "joules"))
    else:
        out["energy_ratio_base_over_cached"] = None
    return out


def table(s: dict[str, Any], energy_source: str) -> str:
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    e = s.get("energy_ratio_base_over_cached")
    lines = [
        "| measure | base model | library | ratio base/library |",
        "|---|---|---|---|",
        f"| held-out accuracy ({s['heldout_questions']} questions) | {s['heldout_accuracy_base']:.0%} | "
        f"{s['heldout_accuracy_library']:.0%} | - |",
        f"| recurring accuracy ({s['recurring_problems']} problems) | {s['recurring_accuracy_base']:.0%} | "
        f"{s['recurring_accuracy_cached']:.0%} | - |",
        f"| decode tokens / recurring answer | {s['decode_tokens_per_answer_base']:.1f} | "
        f"{s['decode_tokens_per_answer_cached']:.1f} | {f(s['decode_tokens_ratio_base_over_cached'], '.1f')}x |",
        f"| CPU-seconds / recurring answer | {s['cpu_s_per_answer_base']:.2f} | {s['cpu_s_per_answer_cached']:.2f} | "
        f"{f(s['cpu_s_ratio_base_over_cached'], '.1f')}x |",
        f"| energy / recurring answer | {f(s.get('joules_per_answer_base'), '.1f')} J | "
        f"{f(s.get('joules_per_answer_cached'), '.1f')} J | {f(e, '.1f')}x |",
        "",
        f"flywheel: {s['flywheel_deposited_heldout']} verified held-out answers deposited; "
        f"{s['flywheel_arithmetic_verified']}/{s['flywheel_arithmetic_problems']} new arithmetic problems solved with "
        "the library as context, verified and deposited",
        f"energy: {energy_source}",
    ]
    return "\n".join(lines)


def recheck_args(args) -> list[str]:
    """The arguments of the hashed sub-computation that `tieredkv recheck` replays."""
    return ["--recheck-only", "--model", args.model, "--seed", str(args.seed), "--countries", str(args.countries),
            "--heldout", str(args.heldout), "--arith", str(args.arith), "--max-new-tokens", str(args.max_new_tokens)]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--countries", type=int, default=4, help="KB size: 3 facts per country (default 4)")
    ap.add_argument("--heldout", type=int, default=10)
    ap.add_argument("--arith", type=int, default=2, help="new arithmetic problems for the flywheel")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "library_demo.json"))
    ap.add_argument("--json", action="store_true", help="also print the report JSON")
    ap.add_argument("--recheck-only", action="store_true",
                    help="run the hashed computation and print {outputs, domain, inputs, relations} (for "
                         "`tieredkv recheck`)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def build_report(args, res: dict, summary: dict, wall_s: float) -> dict:
    meter: EnergyMeter = res["meter"]
    task = res["task"]
    lm = res["lm"]
    return {
        "benchmark": "library_demo",
        "env": environment(),
        "domain": res["domain"], "domain_id": domain_id(res["domain"]),
        "config": {"model": args.model, "seed": args.seed, "countries": args.countries, "heldout": args.heldout,
                   "arith": args.arith, "max_new_tokens": args.max_new_tokens, "confirm_tokens": 4,
                   "tiered_config": "TieredConfig() defaults"},
        "verifier": {"name": res["verifier"].name, "version": res["verifier"].version},
        "inputs": {
            "seeds": {"kb": args.seed, "questions": args.seed + 1},
            "kb_sha256": sha_json(task["kb"]),
            "kb": task["kb"],
            "library_prompt_ids_sha256": sha_id_lists([lm.codec.chat_prompt(q) for q, _ in task["literal"]]),
            "heldout_prompt_ids_sha256": sha_id_lists([lm.codec.chat_prompt(q) for q in task["heldout"]]),
            "recurring_prompt_ids_sha256": sha_id_lists([lm.codec.chat_prompt(q) for q in task["recurring"]]),
        },
        "energy_source": meter.source,
        "summary": summary,
        "context": res["context"],
        "library": {"entries": res["library_size"], "version": res["library_version"]},
        "rows": res["rows"],
        "recheck": recheck_block("bench.library_demo", recheck_args(args), res["outputs"], inputs=res["inputs"],
                                 relations=res["relations"]),
        "wall_s": wall_s,
    }


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.recheck_only:
        args.quiet = True
    t0 = time.perf_counter()
    res = run(args)
    if args.recheck_only:
        print(json.dumps({"outputs": res["outputs"], "domain": res["domain"], "inputs": res["inputs"],
                          "relations": res["relations"]}, sort_keys=True))
        return 0
    summary = summarize(res)
    report = build_report(args, res, summary, round(time.perf_counter() - t0, 1))
    write_report(args.out, report, print_json=args.json)
    print(table(summary, res["meter"].source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
