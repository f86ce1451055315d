"""PageIndex: which pages of a layer best match a chunk of queries, per KV head.

One exact faiss ``IndexIDMap(IndexFlatIP)`` per (layer, head) holds every page's R summary
vectors under the page's id (R rows share one id):

    layer l, head h:  [page 7: r0 r1 r2 r3] [page 9: r0 r1 r2 r3] [page 12: r0 ...] ...

Scores of a page for head h, given that head's queries q [Q, D]:
    mean / repr:  max_r (mean_q q) . r   -- the mean of q . r over the chunk, best summary row
    minmax:       mean_q sum_d max(q_d * max_d, q_d * min_d)  (Quest bound; scoring.quest_bound)
For minmax the faiss index only stores the bounds (rows [max, min] per page). Scoring is exact either way,
switched by the number of pages in the index (`PageIndex.flat_scan_below`, see `search`):
    fewer pages:  a brute-force float64 numpy pass over all pages of the layer (`search_flat`);
    more pages:   a float32 faiss pass over [max | min] rows picks the candidates that can make the top-k,
                  then the same float64 scores rank them (bound_scan.py): the same pages and scores, with
                  no per-page float64 work, which is what grows with the context.

The index knows vectors and page ids, nothing about models or the page store. It is not safe
to mutate from several threads at once; concurrent searches are fine.
"""

from __future__ import annotations

import os
from typing import Container, Iterable, Sequence

import faiss
import numpy as np

from .bound_scan import BoundRows, fits_half
from .errors import IndexStaleError
from .index_file import read_index_file, write_index_file
from .scoring import quest_bound
from .summary import check_method, max_summary_vectors

_MAX_PAGE_ID = 2**63 - 1
# Below this many pages a minmax search scores every page in float64 (flat scan); from it on, the exact
# float32 candidate pass of bound_scan.py. Both give the same answers (tests/index/test_bound_scan.py);
# below 1,024 pages (128K tokens of 128-token pages) the flat scan is as fast or faster (docs/DESIGN.md,
# "Page search").
FLAT_SCAN_BELOW = 1024


class PageIndex:
    """Summary vectors of pages, searchable per (layer, KV head)."""

    flat_scan_below: int = FLAT_SCAN_BELOW  # minmax: pages below which `search` is the flat scan

    def __init__(self, num_layers: int, num_heads: int, dim: int, method: str = "repr",
                 num_repr: int = 4) -> None:
        for name, value in (("num_layers", num_layers), ("num_heads", num_heads), ("dim", dim)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        check_method(method, num_repr)
        self.num_layers, self.num_heads, self.dim = int(num_layers), int(num_heads), int(dim)
        self.method, self.num_repr = method, int(num_repr)
        self.max_vectors = max_summary_vectors(method, num_repr)  # R per page, at most
        self.reset()

    # -- contents ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Drop every page."""
        self._indexes = [[_new_flat(self.dim) for _ in range(self.num_heads)]
                         for _ in range(self.num_layers)]
        self._page_ids: set[int] = set()
        self._bounds: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = \
            [None] * self.num_layers  # minmax scoring cache per layer, rebuilt after mutation
        self._bounds_buffers: list = [None] * self.num_layers  # its backing arrays (spare capacity)
        self._rows: list[BoundRows | None] = [None] * self.num_layers  # minmax: the candidate pass's rows (bound_scan)

    def __len__(self) -> int:
        return len(self._page_ids)

    def __contains__(self, page_id: object) -> bool:
        return page_id in self._page_ids

    def page_ids(self) -> list[int]:
        """Ids of all indexed pages, ascending."""
        return sorted(self._page_ids)

    def add(self, page_id: int, summaries: np.ndarray) -> None:
        """Index one page. summaries: [L, H, R, D] (``summarize`` per layer, stacked).

        ``page_id`` is a non-negative int64, not yet indexed (``ValueError`` otherwise; -1 is
        the padding id of ``search``). R must be what ``summarize`` gives for this index's
        method: 1 for mean, 2 for minmax, 1..num_repr for repr.
        """
        self.add_many([page_id], np.asarray(summaries)[None])

    def add_many(self, page_ids: Sequence[int], summaries: np.ndarray) -> None:
        """Index several pages at once (faster rebuilds). summaries: [N, L, H, R, D], one R.

        All-or-nothing with respect to validation: nothing is added if any id or shape is bad.
        """
        ids = np.array([_check_page_id(p) for p in page_ids], dtype=np.int64)  # [N]
        if len(np.unique(ids)) != len(ids):
            raise ValueError("page_ids contains duplicates; each page is indexed once")
        for pid in ids.tolist():
            if pid in self._page_ids:
                raise ValueError(f"page {pid} is already indexed; remove() it first to replace "
                                 "its summaries")
        s = self._check_summaries(summaries, len(ids))  # [N, L, H, R, D] float32
        if len(ids) == 0:
            return
        num_vectors = s.shape[3]
        # NOTE: rows are page-major (page 0's R rows, then page 1's ...) in every (layer, head)
        # index, so the id arrays of all indexes stay identical; minmax scoring relies on it.
        row_ids = np.repeat(ids, num_vectors)  # [N * R]
        for layer in range(self.num_layers):
            for h in range(self.num_heads):
                rows = np.ascontiguousarray(s[:, layer, h].reshape(-1, self.dim))  # [N * R, D]
                self._indexes[layer][h].add_with_ids(rows, row_ids)
        self._page_ids.update(ids.tolist())
        if self.method == "minmax":
            for layer in range(self.num_layers):
                self._append_bounds(layer, ids, s[:, layer])
        else:
            self._drop_bounds()

    def _drop_bounds(self) -> None:
        """Forget the minmax scoring caches (rebuilt from the faiss rows at the next search)."""
        self._bounds = [None] * self.num_layers
        self._rows = [None] * self.num_layers

    def _append_bounds(self, layer: int, ids: np.ndarray, rows: np.ndarray) -> None:
        """Extend a layer's cached [max, min] bounds in place (amortised doubling), so that
        indexing page after page costs O(pages) in total, not O(pages^2)."""
        cached = self._bounds[layer]
        if cached is None:
            return  # built from the faiss rows at the next search
        page_ids, upper, lower = cached
        n, m = len(page_ids), len(ids)
        buf_ids, buf_up, buf_low = self._bounds_buffers[layer]
        if n + m > len(buf_ids):
            cap = max(2 * len(buf_ids), n + m, 64)
            buf_ids = np.resize(buf_ids, cap)
            buf_up = np.concatenate([buf_up[:, :n], np.empty((self.num_heads, cap - n, self.dim))], axis=1)
            buf_low = np.concatenate([buf_low[:, :n], np.empty((self.num_heads, cap - n, self.dim))], axis=1)
            self._bounds_buffers[layer] = (buf_ids, buf_up, buf_low)
        buf_ids[n:n + m] = ids
        buf_up[:, n:n + m] = rows[:, :, 0].transpose(1, 0, 2)  # rows: [N, H, 2, D] -> [H, N, D]
        buf_low[:, n:n + m] = rows[:, :, 1].transpose(1, 0, 2)
        self._bounds[layer] = (buf_ids[:n + m], buf_up[:, :n + m], buf_low[:, :n + m])
        rows = self._rows[layer]
        if rows is not None:
            if rows.half and not fits_half(buf_up[:, n:n + m], buf_low[:, n:n + m]):
                self._rows[layer] = None  # rebuilt in float32 at the next search
            else:
                rows.extend(buf_up[:, n:n + m], buf_low[:, n:n + m])

    def remove(self, page_id: int) -> None:
        """Forget one page (``KeyError`` if it is not indexed). O(pages) per call."""
        if page_id not in self._page_ids:
            raise KeyError(f"page {page_id} is not in the index")
        ids = np.array([page_id], dtype=np.int64)
        for per_head in self._indexes:
            for index in per_head:
                index.remove_ids(ids)
        self._page_ids.discard(int(page_id))
        self._drop_bounds()

    # -- retrieval --------------------------------------------------------------------------

    def search(self, layer: int, queries: np.ndarray, k: int,
               exclude: Container[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Top-k pages per KV head for a chunk of queries.

        queries: [H, Q, D], already grouped by KV head (GQA query heads mapped by the caller).
        Returns (page_ids [H, k] int64, scores [H, k] float32), best first per head; equal
        scores order by page id. Rows are padded with -1 / -inf when fewer than k pages are
        eligible. Pages in ``exclude`` (e.g. sinks and the local window, which attention
        reads anyway) are never returned.
        """
        return self._search(layer, queries, k, exclude, flat=False)

    def _search(self, layer: int, queries: np.ndarray, k: int, exclude: Container[int],
                flat: bool) -> tuple[np.ndarray, np.ndarray]:
        q = self._check_queries(layer, queries)  # [H, Q, D] float32
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be a non-negative int, got {k!r}")
        out_ids = np.full((self.num_heads, k), -1, dtype=np.int64)  # [H, k]
        out_scores = np.full((self.num_heads, k), -np.inf, dtype=np.float32)  # [H, k]
        if k == 0 or not self._page_ids:
            return out_ids, out_scores
        if self.method == "minmax":
            # NOTE: the switch between the two exact scans; an exclude without len() cannot size the
            # candidate pass, so it takes the flat scan
            flat = flat or len(self._page_ids) < self.flat_scan_below or not hasattr(exclude, "__len__")
            (self._search_flat_bounds if flat else self._search_bound_rows)(layer, q, k, exclude, out_ids, out_scores)
        else:
            q_mean = q.mean(axis=1, dtype=np.float64).astype(np.float32)  # [H, D]
            for h in range(self.num_heads):
                ids, best = self._search_faiss(self._indexes[layer][h], q_mean[h], k, exclude)
                out_ids[h, :len(ids)], out_scores[h, :len(ids)] = ids, best
        return out_ids, out_scores

    def search_flat(self, layer: int, queries: np.ndarray, k: int,
                    exclude: Container[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """`search` by scoring every page, whatever the page count: the reference the faster scan equals."""
        return self._search(layer, queries, k, exclude, flat=True)

    def _search_flat_bounds(self, layer, q, k, exclude, out_ids, out_scores) -> None:
        # minmax, every page scored in float64: q [H, Q, D] -> out_ids, out_scores [H, k] filled in place
        page_ids, upper, lower = self._layer_bounds(layer)
        scores = quest_bound(q, upper, lower)  # [H, N]: every head in one pass
        if isinstance(exclude, _LISTABLE) and exclude:  # dropped once for every head
            keep = _eligible(page_ids, exclude)
            page_ids, scores, exclude = page_ids[keep], scores[:, keep], ()
        for h in range(self.num_heads):
            ids, best = _top_pages(page_ids, scores[h], k, exclude)
            out_ids[h, :len(ids)], out_scores[h, :len(ids)] = ids, best

    def _search_bound_rows(self, layer, q, k, exclude, out_ids, out_scores) -> None:
        # minmax, as _search_flat_bounds, but only the candidates of bound_scan.py are scored in float64
        page_ids, upper, lower = self._layer_bounds(layer)
        rows = self._rows[layer]
        if rows is None:
            rows = self._rows[layer] = BoundRows(self.num_heads, self.dim, half=fits_half(upper, lower))
            rows.extend(upper, lower)
        q64 = q.astype(np.float64)  # as quest_bound takes the means
        pos, neg = np.maximum(q64, 0.0).mean(axis=1), np.minimum(q64, 0.0).mean(axis=1)  # [H, D]
        want = k + len(exclude)
        for h in range(self.num_heads):
            cand = rows.candidates(h, pos[h], neg[h], want)  # [M] row numbers, ascending
            # NOTE: a few dozen candidates: set lookups beat np.isin's sort, which costs as much as the scan
            cand = cand[np.fromiter((int(p) not in exclude for p in page_ids[cand]), dtype=bool, count=len(cand))]
            scores = quest_bound(q[h], upper[h, cand], lower[h, cand])  # [M]: the flat scan's bytes
            ids, best = _top_pages(page_ids[cand], scores, k, ())
            out_ids[h, :len(ids)], out_scores[h, :len(ids)] = ids, best

    def union_topk(self, layer: int, queries: np.ndarray, k: int,
                   exclude: Container[int] = ()) -> list[int]:
        """Union over KV heads of each head's top-k page ids, ascending (position order).

        This is the set attention streams in for the chunk; at most H * k pages.
        """
        ids, _ = self.search(layer, queries, k, exclude)
        return [int(p) for p in np.unique(ids[ids >= 0])]

    def _search_faiss(self, index: faiss.IndexIDMap, q_mean: np.ndarray, k: int,
                     exclude: Container[int]) -> tuple[np.ndarray, np.ndarray]:
        # q_mean: [D]. Ask faiss for enough rows to cover k pages after dropping excluded
        # pages and duplicate rows of one page; widen if exclude had no len() or hid more.
        total = index.ntotal
        want = min(total, (k + _len_or_zero(exclude)) * self.max_vectors)
        while True:
            scores, rows = index.search(q_mean[None], want)  # [1, want] each, best first
            # NOTE: a page's best row ranks above its other rows, so keeping each id's first
            # row is its max over r; any page not in the list scores <= every listed page.
            page_ids, first = np.unique(rows[0], return_index=True)
            keep = page_ids >= 0
            ids, best = _top_pages(page_ids[keep], scores[0][first[keep]], k, exclude)
            if len(ids) >= k or want >= total:
                return ids, best
            want = min(total, 2 * want)

    def _layer_bounds(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # -> (page_ids [N] int64, upper [H, N, D] float64, lower [H, N, D] float64)
        cached = self._bounds[layer]
        if cached is None:
            uppers, lowers = [], []
            page_ids = None
            for index in self._indexes[layer]:
                row_ids = faiss.vector_to_array(index.id_map).reshape(-1, 2)  # [N, 2]
                rows = index.index.reconstruct_n(0, index.ntotal).reshape(-1, 2, self.dim)
                if page_ids is None:
                    page_ids = row_ids[:, 0]
                # NOTE: add_many writes [max, min] rows page-major into every head's index.
                assert (row_ids == page_ids[:, None]).all(), "minmax rows out of step"
                uppers.append(rows[:, 0])
                lowers.append(rows[:, 1])
            # [H, N, D] so that each head's bounds are one contiguous block
            cached = (page_ids, np.ascontiguousarray(np.stack(uppers), dtype=np.float64),
                      np.ascontiguousarray(np.stack(lowers), dtype=np.float64))
            self._bounds_buffers[layer] = cached
            self._bounds[layer] = cached
        return cached

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the index to ``path`` and ``path.json`` atomically (see index_file.py)."""
        blobs = [faiss.serialize_index(index) for per_head in self._indexes for index in per_head]
        write_index_file(path, blobs, {**self._geometry(), "num_pages": len(self)})

    @classmethod
    def load(cls, path: str | os.PathLike, *, num_layers: int, num_heads: int, dim: int,
             method: str, num_repr: int,
             expected_page_ids: Iterable[int] | None = None) -> "PageIndex":
        """Load a saved index and check it matches what the caller expects.

        Raises IndexStaleError if the files are missing or corrupt (sha256 mismatch, faiss
        cannot read them), if geometry, method or num_repr differ from the arguments, or if
        ``expected_page_ids`` is given and the saved page id set differs. On IndexStaleError
        rebuild from the page store.
        """
        index = cls(num_layers, num_heads, dim, method, num_repr)
        meta, chunks = read_index_file(path)

        def stale(why: str) -> IndexStaleError:
            return IndexStaleError(f"page index at {path} is stale: {why}; rebuild it from the "
                                   "page store (new PageIndex, add() every stored page, save())")

        saved = {key: meta.get(key) for key in index._geometry()}
        if saved != index._geometry():
            raise stale(f"saved for {saved}, expected {index._geometry()}")
        if len(chunks) != num_layers * num_heads:
            raise stale(f"holds {len(chunks)} faiss indexes, expected {num_layers * num_heads}")
        flats = []
        for chunk in chunks:
            try:
                flat = faiss.deserialize_index(np.frombuffer(chunk, dtype=np.uint8))
            except RuntimeError as e:
                raise stale(f"faiss cannot read it: {e}") from e
            if (not isinstance(flat, faiss.IndexIDMap) or flat.d != dim
                    or flat.metric_type != faiss.METRIC_INNER_PRODUCT):
                raise stale("it does not hold inner-product IndexIDMap indexes of this dim")
            flats.append(flat)
        row_ids = faiss.vector_to_array(flats[0].id_map)
        if any(not np.array_equal(faiss.vector_to_array(f.id_map), row_ids) for f in flats[1:]):
            raise stale("its per-head indexes disagree on the pages they hold")
        page_ids = set(row_ids.tolist())
        if len(page_ids) != meta.get("num_pages"):
            raise stale(f"holds {len(page_ids)} pages, sidecar says {meta.get('num_pages')}")
        if expected_page_ids is not None:
            expected = {int(p) for p in expected_page_ids}
            if expected != page_ids:
                raise stale(f"{len(expected - page_ids)} expected pages are missing and "
                            f"{len(page_ids - expected)} indexed pages are not expected")
        index._indexes = [flats[layer * num_heads:(layer + 1) * num_heads]
                          for layer in range(num_layers)]
        index._page_ids = page_ids
        return index

    # -- validation -------------------------------------------------------------------------

    def _geometry(self) -> dict[str, object]:
        return {"num_layers": self.num_layers, "num_heads": self.num_heads, "dim": self.dim,
                "method": self.method, "num_repr": self.num_repr}

    def _check_summaries(self, summaries: np.ndarray, num_pages: int) -> np.ndarray:
        s = np.asarray(summaries)
        lhd = (self.num_layers, self.num_heads, self.dim)
        if s.ndim != 5 or s.shape[0] != num_pages or (s.shape[1], s.shape[2], s.shape[4]) != lhd:
            raise ValueError(f"summaries must be [N={num_pages}, L={lhd[0]}, H={lhd[1]}, R, "
                             f"D={lhd[2]}] (per page [L, H, R, D]), got {s.shape}")
        r = s.shape[3]
        ok = {"mean": r == 1, "minmax": r == 2, "repr": 1 <= r <= self.num_repr}[self.method]
        if not ok:
            raise ValueError(f"R={r} summary vectors per page does not fit method "
                             f"{self.method!r} with num_repr={self.num_repr}; build summaries "
                             "with summarize() using the same method and num_repr")
        return _finite_float32(s, "summaries")

    def _check_queries(self, layer: int, queries: np.ndarray) -> np.ndarray:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) \
                or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer!r}")
        q = np.asarray(queries)
        if q.ndim != 3 or q.shape[0] != self.num_heads or q.shape[2] != self.dim or q.shape[1] < 1:
            raise ValueError(f"queries must be [H={self.num_heads}, Q>=1, D={self.dim}] (grouped "
                             f"by KV head), got {q.shape}")
        return _finite_float32(q, "queries")


def _new_flat(dim: int) -> faiss.IndexIDMap:
    return faiss.IndexIDMap(faiss.IndexFlatIP(dim))


def _check_page_id(page_id: int) -> int:
    if isinstance(page_id, bool) or not isinstance(page_id, (int, np.integer)) \
            or not 0 <= page_id <= _MAX_PAGE_ID:
        raise ValueError(f"page_id must be a non-negative int64, got {page_id!r}")
    return int(page_id)


def _len_or_zero(exclude: Container[int]) -> int:
    try:
        return len(exclude)  # type: ignore[arg-type]
    except TypeError:
        return 0


_LISTABLE = (set, frozenset, list, tuple, range)  # excluded ids that numpy can take in one pass


def _eligible(page_ids: np.ndarray, exclude) -> np.ndarray:
    """[N] bool, False where `exclude` (one of _LISTABLE) holds the page id."""
    return ~np.isin(page_ids, np.fromiter(exclude, dtype=np.int64, count=len(exclude)))


def _top_pages(page_ids: np.ndarray, scores: np.ndarray, k: int,
               exclude: Container[int]) -> tuple[np.ndarray, np.ndarray]:
    # page_ids, scores: [N] (one score per page) -> up to k (ids, scores), best first,
    # ties by ascending id, skipping excluded pages.
    m = k + _len_or_zero(exclude)
    if hasattr(exclude, "__len__") and m < len(scores):
        # Only the best m scores (and every tie of the m-th) can make the cut: sort just those.
        threshold = np.partition(scores, len(scores) - m)[len(scores) - m]
        cand = np.flatnonzero(scores >= threshold)
        page_ids, scores = page_ids[cand], scores[cand]
    order = np.lexsort((page_ids, -scores))
    if isinstance(exclude, _LISTABLE):  # vectorised: drop excluded ids from the ranking, keep the first k (as the loop)
        keep = (order[_eligible(page_ids[order], exclude)] if exclude else order)[:k]
        return page_ids[keep].astype(np.int64), scores[keep].astype(np.float32)
    ids, best = [], []
    for i in order:
        pid = int(page_ids[i])
        if pid in exclude:
            continue
        ids.append(pid)
        best.append(scores[i])
        if len(ids) == k:
            break
    return np.array(ids, dtype=np.int64), np.array(best, dtype=np.float32)


def _finite_float32(a: np.ndarray, what: str) -> np.ndarray:
    """`a` as contiguous float32, or ValueError if it is not floating point or holds NaN/inf."""
    if not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"{what} must be floating point, got {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        raise ValueError(f"{what} contain NaN or inf")
    return a
