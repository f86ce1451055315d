"""Working-set budget systems of `bench/longdoc_qa.py`: the tiered path at own positions answering from a
working set that holds a fraction of the document's pages (sink + top-k + local), no question-time reading.

    ws12, ws25, ws50   1 sink page, 3/8 of the budget local, the rest retrieved by each KV head alone (per_head)
    ws25-union         the same budget, the KV heads' retrieval shared (their union capped to the same pages)
    stream25           the sink and local pages only (StreamingLLM's working set, the same pages)
    oracle25           ws25's stored pages; the question and answer attend to the sink, local and the
                       evidence pages (forced: what a working set that holds the evidence can do)
    ws25-lex           ws25 with TieredConfig(selection="lexical"): the question and answer attend to the sink,
                       local and the top-k pages whose text best matches the question's words (BM25 over the
                       pages' text), chosen once per question
    ws12-lex           ws12 with TieredConfig(selection="lexical")
    ws25-q, ws12-q     ws25, ws12 with TieredConfig(selection="question"): at the question's forward each layer's KV
                       heads rank every far page by the attention the question's queries give its keys (SnapKV,
                       per page) and hold their top-k while the question and its answer run
    ws25-hyb           ws25 with TieredConfig(selection="hybrid"): ws25-q's ranking fused by rank with ws25-lex's
    ws12-d2, ws12-lex-d2
                       ws12, ws12-lex with their first DENSE_LAYERS layers attending to every page while the question
                       and its answer run (as Quest leaves its first two layers dense; testkit.placement.DenseLayers)
    ws25-exact         ws25's working set while answering, over pages ingested with full attention (the
                       artifact of an exact ingest grafted into the ws25 regime: `allow_domain_mismatch`)

Each budget is its own regime (the document is ingested with that working set: pages beyond it were never
seen by later tokens), so each is ingested once per window into the window's store. Rows record the
working set's pages per KV head, its device bytes, decode ms per token, and whether the evidence page was in
the working set of each layer while the question was read.
"""
from __future__ import annotations

import dataclasses
import math
import time

from bench.lib.common import markdown_table
from bench.lib.report import read_run
from paging import PageStore, StoreConfig
from testkit.placement import DenseLayers, ForcedPages
from tieredkv.engine.placement import OwnPositions
from tieredkv.engine.tiered_config import TieredConfig
from tieredkv.engine.tiered_model import TieredModel, working_set_bytes
from tieredkv.question.qa import open_document

CHUNK_PAGES = 4  # prefill chunks of 512 tokens: a quarter of the retrieval rounds of one-page chunks
DENSE_LAYERS = 2  # the "+dense" systems' first layers that attend to every page (Quest's choice)

# system -> (fraction of the document's pages in the working set, how the top-k is chosen)
BUDGET_SYSTEMS = {"ws12": (0.125, "per_head"), "ws25": (0.25, "per_head"), "ws50": (0.5, "per_head"),
                  "ws25-union": (0.25, "union"), "stream25": (0.25, "stream"), "oracle25": (0.25, "oracle"),
                  "ws25-lex": (0.25, "lexical"), "ws12-lex": (0.125, "lexical"),
                  "ws25-q": (0.25, "question"), "ws12-q": (0.125, "question"),
                  "ws25-hyb": (0.25, "hybrid"), "ws12-d2": (0.125, "per_head+dense"),
                  "ws12-lex-d2": (0.125, "lexical+dense"), "ws25-exact": (0.25, "exact")}


def budget_config(num_pages: int, fraction: float, mode: str, page_size: int) -> TieredConfig:
    """Own positions, `fraction` of `num_pages` per KV head: 1 sink page, 3/8 local, the rest retrieved;
    the document prefilled CHUNK_PAGES pages at a time (each chunk attends to the working set and itself)."""
    budget = max(3, round(fraction * num_pages))
    common = dict(position="own", sink_pages=1, page_size=page_size, chunk_pages=CHUNK_PAGES)
    if mode == "stream":
        return TieredConfig(**common, local_pages=budget - 1, topk_pages=0)
    local = max(1, round(budget * 3 / 8))
    topk = budget - 1 - local
    if mode == "union":
        return TieredConfig(**common, local_pages=local, topk_pages=topk, union_pages=topk)
    return TieredConfig(**common, local_pages=local, topk_pages=topk, retrieval="per_head")


def answer(runner, item, q_ids: list[int], system: str) -> tuple[list[int], dict]:
    """One question of `bench/longdoc_qa.py` under a budget system; (answer ids, the row's evidence)."""
    w, page_size = item.window, runner.a.page_size
    return run_budget(runner.lm, w.doc_ids, q_ids, item.answer_pages(page_size), system, runner.work / w.name,
                      page_size, runner.a.max_new_tokens)


def run_budget(lm, doc_ids: list[int], q_ids: list[int], evidence: list[int], system: str, store_dir,
               page_size: int, max_new: int) -> tuple[list[int], dict]:
    """The document (grafted when `store_dir` holds it under this budget, else ingested) and one question
    under a budget system; (answer ids, the row's evidence: `evidence` are the pages that hold the answer)."""
    fraction, mode = BUDGET_SYSTEMS[system]
    dense = DENSE_LAYERS if mode.endswith("+dense") else 0
    mode = mode.removesuffix("+dense")
    num_pages = math.ceil(len(doc_ids) / page_size)
    config = budget_config(num_pages, fraction, mode if mode in ("union", "stream") else "per_head", page_size)
    if mode in ("lexical", "question", "hybrid"):
        config = dataclasses.replace(config, selection=mode)
    device_bytes = working_set_bytes(lm, config)
    t0 = time.perf_counter()
    exact = exact_artifact(lm, doc_ids, store_dir, num_pages, page_size) if mode == "exact" else None
    with PageStore(store_dir, StoreConfig(device_budget_bytes=device_bytes)) as store:
        tm = TieredModel(lm, store, config)
        try:
            if exact is None:
                art, grafted = open_document(tm, doc_ids, "longdoc-budget")
            else:
                art, grafted = tm.graft(exact, allow_domain_mismatch=True), True
            t_open = time.perf_counter() - t0
            if mode == "oracle":
                tm.cache.policy = ForcedPages(OwnPositions(), evidence, replace=True)
            if dense:
                tm.cache.policy = DenseLayers(tm.cache.policy, dense)
            tm.keep_in_memory()
            tm.cache.retrieval_log.clear()
            t1 = time.perf_counter()
            out = tm.generate(q_ids, max_new_tokens=max_new)
            t_answer = time.perf_counter() - t1
            log, layers = list(tm.cache.retrieval_log), len(tm.cache.layers)
            local_first = tm.cache.local_first
        finally:
            tm.close()
    read_layers = log[:layers]  # the question's forward: one selection per layer
    return out, {"config": {"sink_pages": 1, "local_pages": config.local_pages, "topk_pages": config.topk_pages,
                            "retrieval": config.retrieval, "chunk_pages": config.chunk_pages, "mode": mode},
                 "pages_per_head": (round((dense * num_pages + (layers - dense) * config.capacity_pages) / layers, 2)
                                    if dense else config.capacity_pages),
                 "dense_layers": dense, "document_pages": num_pages,
                 "device_tier_budget_bytes": device_bytes, "artifact": art.artifact_id,
                 "grafted": grafted, "open_s": round(t_open, 2), "answer_s": round(t_answer, 2),
                 "decode_ms_per_token": round(1000 * t_answer / max(1, len(out)), 1), "answer_pages": list(evidence),
                 "evidence_local": any(p >= local_first for p in evidence),
                 "evidence_layers": sum(bool(set(sel) & set(evidence)) for sel in read_layers),
                 "layers": len(read_layers)}


def exact_artifact(lm, doc_ids: list[int], store_dir, num_pages: int, page_size: int) -> str:
    """The id of the document's artifact ingested with every page in the working set (full attention,
    exact), made in `store_dir` or found there."""
    config = TieredConfig(position="own", sink_pages=1, local_pages=num_pages, topk_pages=0, page_size=page_size,
                          chunk_pages=CHUNK_PAGES)
    with PageStore(store_dir, StoreConfig(device_budget_bytes=working_set_bytes(lm, config))) as store:
        tm = TieredModel(lm, store, config)
        try:
            return open_document(tm, doc_ids, "longdoc-budget-exact")[0].artifact_id
        finally:
            tm.close()


# ----------------------------------------------------------------------------- table and plot
def budget_rows(rows: list[dict], length: str, whole: bool = False) -> tuple[list[dict], set[str]]:
    """The rows of `length` for the questions every budget system answered; `whole`: every question of the
    length (those the plain model answered), and only the systems that answered all of them."""
    if whole:
        common = {r["id"] for r in rows if r["length"] == length and r["system"] == "full"}
        complete = {s for s in {r["system"] for r in rows}
                    if common <= {r["id"] for r in rows if r["length"] == length and r["system"] == s}}
        return [r for r in rows if r["length"] == length and r["system"] in complete and r["id"] in common], common
    ids = [{r["id"] for r in rows if r["length"] == length and r["system"] == s} for s in BUDGET_SYSTEMS]
    common = set.intersection(*[i for i in ids if i]) if any(ids) else set()
    return [r for r in rows if r["length"] == length and r["id"] in common], common


def share(system: str, rows: list[dict], page_size: int) -> float | None:
    """Of the document's pages: those each KV head attends to (budget systems), all (full attention), the
    passage read afresh (the reading); None where it does not apply."""
    budget = [r for r in rows if r["system"] in BUDGET_SYSTEMS]
    if system in BUDGET_SYSTEMS:
        mine = next((r for r in budget if r["system"] == system), None)
        return None if mine is None else mine["pages_per_head"] / mine["document_pages"]
    if system == "full":
        return 1.0
    read = [r for r in rows if r["system"] == system and r.get("reading")]
    if read and budget:
        tokens = sum(b - a for a, b in read[0]["reading"]["passages"])
        return tokens / (budget[0]["document_pages"] * page_size)
    return None


SHOWN = ("full", "tiered-attend", "tiered-attend-words", *BUDGET_SYSTEMS, "tiered-read", "ceiling", "bm25")


def summaries(rows: list[dict], length: str, page_size: int, whole: bool = False) -> tuple[set[str], list[dict]]:
    """Per system shown, on the questions every budget system answered (`whole`: on every question, see
    `budget_rows`): correct answers, the share of the document attended, the evidence page's layers in the
    working set and the median decode ms/token."""
    chosen, ids = budget_rows(rows, length, whole)
    out = []
    for s in SHOWN:
        mine = [r for r in chosen if r["system"] == s]
        if not mine:
            continue
        correct = sum(bool(r["correct"]) for r in mine)
        d = {"system": s, "correct": f"{correct}/{len(mine)}", "accuracy": correct / len(mine),
             "share": share(s, chosen, page_size)}
        if "evidence_layers" in mine[0]:
            d["evidence"] = f"{sum(r['evidence_layers'] for r in mine) / len(mine):.1f} of {mine[0]['layers']}"
        timed = sorted(r["decode_ms_per_token"] for r in mine if "decode_ms_per_token" in r)
        if len(timed) == len(mine):  # the plain model's rows are timed as the budget rows are (`full`)
            d["decode_ms"] = timed[len(timed) // 2]
        out.append(d)
    return ids, out


def table(rows: list[dict], length: str, page_size: int, whole: bool = False) -> str:
    ids, rows = summaries(rows, length, page_size, whole)
    return markdown_table(rows, [(f"system ({len(ids)} questions, {length})", "system", ""), ("correct", "correct", ""),
                                 ("share of the document attended", "share", ".0%"),
                                 ("evidence page in the working set (layers, mean)", "evidence", ""),
                                 ("decode ms/token (median)", "decode_ms", "")])


LEADER = {"arrowstyle": "-", "lw": 0.5, "color": "grey", "shrinkA": 0, "shrinkB": 3}  # a raised label's line


def label_heights(points: list[tuple[float, float]], gap: float, span: float = 1.0) -> list[float]:
    """The height of each point's label, for a plot with a log x axis: its y, raised where it would overlap
    another label. A label runs `span` octaves right of its point; two labels whose runs overlap are kept at
    least `gap` apart (the lower points placed first)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], i))
    out, placed = [0.0] * len(points), []  # placed: (log2 x, height)
    for i in order:
        x, h = math.log2(points[i][0]), points[i][1]
        near = [b for a, b in placed if abs(a - x) < span]
        while close := [b for b in near if abs(h - b) < gap - 1e-12]:  # 1e-12: sums of `gap` land on it exactly
            h = max(close) + gap
        out[i] = h
        placed.append((x, h))
    return out


def plot(rows: list[dict], lengths: list[str], page_size: int, path) -> None:
    """Accuracy against the share of the document attended, one point per system and a panel per length,
    on every question of the length (the systems that answered all of them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plotted = ("full", *BUDGET_SYSTEMS, "tiered-read")
    colour = {s: matplotlib.colormaps["tab20"](i) for i, s in enumerate(plotted)}  # one per system, every panel
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.2 * len(lengths), 3.8), sharey=True, squeeze=False)
    for ax, length in zip(axes[0], lengths):
        ids, shown = summaries(rows, length, page_size, whole=True)
        marked = [d for d in shown if d["share"] is not None and d["system"] in plotted]
        label_at = dict(zip((d["system"] for d in marked),
                            label_heights([(d["share"], d["accuracy"]) for d in marked], gap=0.022,
                                          span=1.2)))
        for d in shown:
            if d["system"] == "ceiling":
                ax.axhline(d["accuracy"], ls="--", lw=1, color="grey")
                ax.annotate("ceiling: the right 512 tokens", (1.0, d["accuracy"]), xycoords=("axes fraction", "data"),
                            xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=7, color="grey")
            if d["share"] is None or d["system"] not in plotted:
                continue
            at = (d["share"], d["accuracy"])
            ax.scatter([at[0]], [at[1]], color=colour[d["system"]])
            h = label_at[d["system"]]
            ax.annotate(f"{d['system']} {d['correct']}", at, xytext=(at[0] * 1.07, h), textcoords="data", fontsize=8,
                        va="center", arrowprops=LEADER if h - at[1] > 0.03 else None)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.0%}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks([0.0625, 0.125, 0.25, 0.5, 1.0])
        ax.set_xlabel("share of the document's pages attended per KV head (log)", fontsize=8)
        ax.set_title(f"{length} windows, {len(ids)} questions", fontsize=10)
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].set_ylim(-0.02, max(0.5, axes[0][0].get_ylim()[1]))
    fig.suptitle("Accuracy against the working set, inside the window", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="table and plot of the budget systems of a longdoc_qa report's run")
    ap.add_argument("report", nargs="?", default="bench/results/longdoc_qa.json")
    ap.add_argument("--run", default="window", help="the run that holds the budget systems' rows")
    ap.add_argument("--length", default="8k", help="the table's length")
    ap.add_argument("--whole", action="store_true",
                    help="the table over every question of the length (the systems that answered all of them)")
    ap.add_argument("--plot", help="write the plot here (png): a panel per length of --plot-lengths")
    ap.add_argument("--plot-lengths", default="4k,8k", help="comma-separated lengths of the plot's panels")
    a = ap.parse_args(argv)
    run = read_run(a.report, "longdoc_qa", a.run)
    if run is None:
        raise SystemExit(f"{a.report} has no run {a.run!r}")
    rows, page_size = run["rows"], run["config"]["page_size"]
    print(table(rows, a.length, page_size, a.whole))
    if a.plot:
        plot(rows, [x for x in a.plot_lengths.split(",") if x], page_size, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
