"""A store's lifecycle: the host cap, removing one of three documents that share a prefix, gc, a disk cap.

Three documents share their first `--shared` pages (one prefix, three endings of `--own` pages each).
Measured, each in the same run as its baseline:

  host      pages read back through a host tier capped at a quarter of them: host copies held, evictions,
            hits and misses (the cap holds; LMDB keeps every page)
  rm        delete_document of the middle document: seconds, pages and bytes freed against its own bytes;
            SHA-256 of the other two documents' continuation logits before and after (must be equal)
  gc        seconds to walk every page when nothing is unreferenced
  disk cap  depositing the third document into a store capped at two: seconds against the same deposit
            into a store with room (the eviction's cost), and what was evicted

    python -m bench.store_lifecycle --json

The report's `tieredkv recheck` recipe (`--recheck-only`, the same run untimed) hashes what is not a time:
the documents' token ids must be equal on any machine, the continuation logits and the pages, bytes and
documents each step left hash-equal in the same determinism domain, and anywhere the other documents'
logits must be equal before and after the rm, rm must free the document's own bytes, gc nothing, and both
caps must hold.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.lib.report import environment, print_recheck, recheck_block, recipe_argv, sha256_json, write_report
from paging import PageStore, StoreConfig
from testkit.graft_child import continuation_logits
from tieredkv.artifacts.artifact import deposit, graft
from tieredkv.models.loading import load_model
from tieredkv.provenance.domain import determinism_domain, sha256_ids, sha256_tensor


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _answer(lm, store, art, cont: list[int], page_size: int) -> str:
    return sha256_tensor(continuation_logits(lm, graft(lm, art, store), cont, art.num_tokens, page_size))


def _config(**kw) -> StoreConfig:
    return StoreConfig(**{"host_budget_bytes": 256 << 20, "lmdb_map_size": 256 << 20, **kw})


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--page-size", type=int, default=32)
    ap.add_argument("--shared", type=int, default=8, help="pages the three documents share")
    ap.add_argument("--own", type=int, default=8, help="pages of each document's own ending")
    ap.add_argument("--out", default="bench/results/store_lifecycle.json")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, help="torch threads (recorded in the environment and the recipe)")
    ap.add_argument("--recheck-only", action="store_true",
                    help="the same run, untimed: print {outputs, inputs, relations, domain} without writing "
                         "(`tieredkv recheck`)")
    return ap


def lifecycle(a: argparse.Namespace, lm) -> dict:
    """rm and gc on a store of three documents, then the host cap and the disk cap: the report's sections."""
    prefix = _ids(a.shared * a.page_size, 1)
    docs = [prefix + _ids(a.own * a.page_size, 2 + i) for i in range(3)]
    cont = _ids(16, 99)
    out = {"inputs_sha256": [sha256_ids(d) for d in docs] + [sha256_ids(cont)]}
    with tempfile.TemporaryDirectory(prefix="tkv-life-") as d:
        with PageStore(Path(d) / "s", _config()) as store:
            arts = [deposit(lm, ids, store, page_size=a.page_size, name=f"doc{i}") for i, ids in enumerate(docs)]
            page_nb = store.lmdb_tier.nbytes // (a.shared + 3 * a.own)
            before = [_answer(lm, store, art, cont, a.page_size) for art in arts]
            own = {r.artifact_id: r.own_bytes for r in store.list_documents()}
            t = time.perf_counter()
            removal = store.delete_document(arts[1].artifact_id)
            rm_s = time.perf_counter() - t
            after = [_answer(lm, store, arts[i], cont, a.page_size) for i in (0, 2)]
            t = time.perf_counter()
            collected = store.gc()
            gc_s = time.perf_counter() - t
            out["rm"] = {"seconds": round(rm_s, 4), "pages_freed": removal.num_pages, "bytes_freed": removal.nbytes,
                         "own_bytes_listed": own[arts[1].artifact_id], "pages_left": store.lmdb_tier.num_pages,
                         "logits_sha256_before": [before[0], before[2]], "logits_sha256_after": after,
                         "others_unchanged": after == [before[0], before[2]]}
            out["gc"] = {"seconds": round(gc_s, 4), "pages_walked": store.lmdb_tier.num_pages,
                         "pages_freed": collected.num_pages}
        out["host"] = _host_cap(Path(d) / "s", arts, page_nb)
        out["disk_cap"] = _disk_cap(Path(d), lm, docs, a.page_size, page_nb, a.shared + 2 * a.own)
    return out


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    lm = load_model(a.model)
    out = {"config": vars(a), "environment": environment(), "model_fingerprint": lm.fingerprint,
           **lifecycle(a, lm)}
    outputs, inputs, relations = recipe_hashes(out)
    domain = determinism_domain(lm.model, lm.fingerprint, a.page_size)
    if a.recheck_only:
        print_recheck(outputs, domain, inputs, relations)
        return 0
    out["recheck"] = recheck_block("bench.store_lifecycle", recipe_args(vars(a), torch.get_num_threads()), outputs,
                                   inputs=inputs, relations=relations, domain=domain)
    write_report(a.out, out, print_json=a.json)
    if not a.json:
        print(f"rm: {out['rm']['pages_freed']} pages, {out['rm']['bytes_freed']} bytes in {out['rm']['seconds']} s; "
              f"others unchanged: {out['rm']['others_unchanged']}; disk cap deposit {out['disk_cap']['ratio']}x "
              f"of the uncapped one; host evictions {out['host']['evictions']}")
    return 0


def _host_cap(path: Path, arts, page_nb: int) -> dict:
    """Every page of the two kept documents read through a host tier capped at a quarter of them."""
    keys = list(dict.fromkeys(k for art in (arts[0], arts[2]) for k in art.page_keys))
    cap = len(keys) // 4 * page_nb
    with PageStore(path, _config(host_budget_bytes=cap)) as store:
        for key in keys + keys:
            store.get(key)
        st = store.stats()
    return {"pages_read": 2 * len(keys), "cap_bytes": cap, "held_bytes": st["host"]["bytes"],
            "held_pages": st["host"]["pages"], **{k: st["tiers"]["host"][k] for k in ("hits", "misses", "evictions")},
            "lmdb_pages": st["lmdb"]["pages"], "default_cap_bytes": StoreConfig().resolved_host_budget()}


def _disk_cap(root: Path, lm, docs, page_size: int, page_nb: int, two_docs_pages: int) -> dict:
    """The third deposit into a store capped at two documents, against the same deposit with room."""
    rows = {}
    for label, cap in (("room", None), ("capped", two_docs_pages * page_nb)):
        with PageStore(root / label, _config(max_disk_bytes=cap)) as store:
            for i in (0, 1):
                deposit(lm, docs[i], store, page_size=page_size, name=f"doc{i}")
            t = time.perf_counter()
            deposit(lm, docs[2], store, page_size=page_size, name="doc2")
            rows[label] = {"seconds": round(time.perf_counter() - t, 4), "bytes": store.lmdb_tier.nbytes,
                           "documents": [r.name for r in store.list_documents()],
                           "evicted": store.stats()["disk_cap"]["documents_evicted"]}
    return {**rows, "cap_bytes": two_docs_pages * page_nb,
            "ratio": round(rows["capped"]["seconds"] / rows["room"]["seconds"], 3)}


# ----------------------------------------------------------------------------- the recheck recipe
RM_COUNTS = ("pages_freed", "bytes_freed", "own_bytes_listed", "pages_left")
HOST_COUNTS = ("pages_read", "cap_bytes", "held_bytes", "held_pages", "hits", "misses", "evictions", "lmdb_pages")


def recipe_args(values: dict, threads: int) -> list[str]:
    """`--recheck-only` with a run's arguments (its report's config)."""
    return recipe_argv(parser(), values, drop=("out", "json"), threads=threads, recheck_only=True)


def recipe_hashes(out: dict) -> tuple[dict[str, str], list[str], dict[str, bool]]:
    """The recipe's outputs from a report's sections (no time in them), the names that hash inputs, and relations."""
    rm, gc, host, cap = out["rm"], out["gc"], out["host"], out["disk_cap"]
    *docs, cont = out["inputs_sha256"]
    outputs = {**{f"doc{i} token ids": sha for i, sha in enumerate(docs)}, "continuation token ids": cont}
    inputs = sorted(outputs)
    outputs |= {"doc0 continuation logits": rm["logits_sha256_before"][0],
                "doc2 continuation logits": rm["logits_sha256_before"][1],
                "rm": sha256_json({k: rm[k] for k in RM_COUNTS}),
                "gc": sha256_json({k: gc[k] for k in ("pages_walked", "pages_freed")}),
                "host cap": sha256_json({k: host[k] for k in HOST_COUNTS}),
                "disk cap": sha256_json({"cap_bytes": cap["cap_bytes"], **{
                    label: {k: v for k, v in cap[label].items() if k != "seconds"} for label in ("room", "capped")}})}
    relations = {
        "rm: the other documents' logits equal before and after": rm["logits_sha256_before"] ==
        rm["logits_sha256_after"] and rm["others_unchanged"],
        "rm: the bytes freed are the document's own bytes": rm["bytes_freed"] == rm["own_bytes_listed"] > 0,
        "gc: nothing unreferenced, nothing freed": gc["pages_freed"] == 0,
        "host cap: held at most the cap, LMDB kept every page": host["held_bytes"] <= host["cap_bytes"]
        and host["lmdb_pages"] == rm["pages_left"],
        "disk cap: at most the cap, the least recently used document evicted": cap["capped"]["bytes"] <=
        cap["cap_bytes"] and sorted(cap["capped"]["documents"]) == ["doc1", "doc2"] and cap["capped"]["evicted"] == 1,
    }
    return outputs, inputs, relations


def recipe_for_report(report: dict, threads: int) -> list[str]:
    return recipe_args(report["config"], threads)


def report_hashes(report: dict) -> dict[str, str]:
    return recipe_hashes(report)[0]


if __name__ == "__main__":
    sys.exit(main())
