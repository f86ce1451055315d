"""`verify`: the exactness contract on demand.

For each sample: a prefix is deposited, read back from the store (BLAKE3-verified) and grafted
into a fresh cache; a continuation is prefilled after it. Independently, prefix + continuation are
prefilled fresh with the same chunk schedule. The continuation's logits are compared by SHA-256,
KL divergence and argmax agreement. With `shift=K` the pages are grafted K positions away (keys
re-rotated), which is expected to break exactness: the drift is measured and reported.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers import DynamicCache

from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import deposit, graft, prefill
from tieredkv.engine.rotary import rerotate
from tieredkv.errors import EmptyInputError
from tieredkv.models.loading import LoadedModel
from tieredkv.provenance.domain import determinism_domain, domain_id, sha256_ids, sha256_tensor
from tieredkv.question.corpus import python_reference, text_sha256


@dataclass(frozen=True)
class VerifySpec:
    tokens: int = 256  # prefix length (varied per sample, up to this)
    samples: int = 50
    continuation: int = 16  # continuation tokens whose logits are compared (varied per sample)
    shift: int = 0
    page_size: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.tokens < 2 or self.samples < 1 or self.continuation < 1 or self.shift < 0:
            raise ValueError("tokens >= 2, samples >= 1, continuation >= 1 and shift >= 0 are required")


def _samples(lm: LoadedModel, spec: VerifySpec) -> list[tuple[list[int], list[int]]]:
    """Varied prefixes (offsets and lengths, page-aligned or not) and continuations from the corpus."""
    g = torch.Generator().manual_seed(spec.seed)
    ids = lm.codec.encode(python_reference()[: 40 * (spec.tokens + spec.continuation) * max(1, spec.samples // 4)])
    need = spec.tokens + 2 * spec.continuation
    if len(ids) < need + 1:
        raise EmptyInputError("corpus too short for the requested sizes")
    out = []
    for _ in range(spec.samples):
        n = int(torch.randint(max(1, spec.tokens // 2), spec.tokens + 1, (1,), generator=g))
        c = int(torch.randint(max(1, spec.continuation // 2), spec.continuation + 1, (1,), generator=g))
        off = int(torch.randint(0, len(ids) - n - c, (1,), generator=g))
        out.append((ids[off:off + n], ids[off + n:off + n + c]))
    return out


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """max over positions of KL(softmax(p) || softmax(q)) in float64."""
    lp = torch.log_softmax(p_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).max())


def _continue(lm: LoadedModel, cache, cont: list[int], start: int, page_size: int, pos_offset: int = 0):
    """Logits [C, vocab] of every continuation token, prefilled after `start` with the same schedule."""
    logits = []
    prefill(lm, cont, cache, start=start, page_size=page_size,
            on_chunk=lambda _s, _e, out: logits.append(out.logits[0]),
            logits_to_keep=0, position_offset=pos_offset)
    return torch.cat(logits, 0)


def _shift_cache(lm: LoadedModel, cache: DynamicCache, shift: int) -> None:
    for i, layer in enumerate(cache.layers):
        layer.keys = rerotate(lm.model, layer.keys, shift, i)


def verify(lm: LoadedModel, spec: VerifySpec = VerifySpec(), *, store: PageStore | None = None,
           progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the contract over `spec.samples` samples; returns the JSON-able report."""
    page_size = spec.page_size or lm.default_page_size
    tmp = None
    if store is None:
        tmp = tempfile.TemporaryDirectory(prefix="tieredkv-verify-")
        store = PageStore(tmp.name, StoreConfig(host_budget_bytes=1 << 30))
    rows, kl_max, agree, total = [], 0.0, 0, 0
    try:
        for i, (prefix, cont) in enumerate(_samples(lm, spec)):
            fresh_cache = DynamicCache(config=lm.model.config)
            prefill(lm, prefix, fresh_cache, page_size=page_size)
            fresh = _continue(lm, fresh_cache, cont, len(prefix), page_size)
            art = deposit(lm, prefix, store, page_size=page_size)
            cache = graft(lm, art, store)
            if spec.shift:
                _shift_cache(lm, cache, spec.shift)
            grafted = _continue(lm, cache, cont, len(prefix), page_size, pos_offset=spec.shift)
            fresh_sha, graft_sha = sha256_tensor(fresh), sha256_tensor(grafted)
            kl = _kl(fresh, grafted)
            if not math.isnan(kl_max) and (math.isnan(kl) or kl > kl_max):
                kl_max = kl  # NOTE: max() would drop a NaN (its comparisons are False); keep it visible
            a = int((fresh.argmax(-1) == grafted.argmax(-1)).sum())
            agree, total = agree + a, total + fresh.shape[0]
            rows.append({"sample": i, "prefix_tokens": len(prefix), "continuation_tokens": len(cont),
                         "artifact": art.artifact_id, "input_sha256": sha256_ids(prefix + cont),
                         "fresh_logits_sha256": fresh_sha, "grafted_logits_sha256": graft_sha,
                         "sha256_equal": fresh_sha == graft_sha, "kl": kl, "argmax_agreement": a / fresh.shape[0]})
            if progress is not None:
                progress(i + 1, spec.samples)
    finally:
        if tmp is not None:
            store.close()
            tmp.cleanup()
    domain = determinism_domain(lm.model, lm.fingerprint, page_size)
    return {
        "model": lm.name, "model_fingerprint": lm.fingerprint, "domain": domain, "domain_id": domain_id(domain),
        "samples": len(rows), "sha256_equal": sum(r["sha256_equal"] for r in rows),
        "kl_max": kl_max if not math.isnan(kl_max) else None, "argmax_agreement": agree / total,
        "shift": spec.shift, "tokens": spec.tokens, "page_size": page_size, "seed": spec.seed,
        "continuation": spec.continuation,
        "corpus_sha256": text_sha256(python_reference()), "rows": rows,
    }
