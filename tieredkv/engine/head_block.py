"""The per-head block of a working set (`TieredConfig.retrieval="per_head"`): one slot, each KV head's own pages.

    buffer k  [1, Hkv, capacity, D]:   | sink | block: m pages per head | local pages | tail |
                                                 row h = head h's pages, column j = j-th page (T tokens)

Every head retrieves the same number of pages (they rank the same eligible pages), so one slot of
m x T tokens holds them all: head h's row reads head h's pages only. Far pages come before every
query, so the block's positions ([0, m x T)) never need a per-head mask.

- `block_kv`        the block whole, each head's pages in position order (a prefill chunk, the first
                    decode step after one, or a block that cannot be updated in place);
- `update_in_place` a decode step: a page still wanted keeps its column, joined pages take the columns
                    freed (keys and values written there), a page whose packed position moved (`fixed`)
                    gets only its keys re-rotated where it is; the slot is renamed, never copied.
"""
from __future__ import annotations

import torch

from tieredkv.engine.kv_buffer import SlotKey
from tieredkv.engine.rotary import rerotate
from tieredkv.engine.working_set import HeadPages, Span

Cell = tuple[int, int, int, int, bool]  # (head, column, page id, shift, keys only)


def block_key(spans: list[Span], heads: HeadPages) -> SlotKey:
    """The block's slot: positions [0, n); its content named by every head's pages and shifts in column
    order. NOTE: a 61-bit hash of them, > 0 (not the stored page's source 0, not a hole's -1)."""
    n = sum(spans[p].end - spans[p].start for p in heads.pages[0])
    return SlotKey(0, n, 0, 0, (hash((heads.pages, heads.shifts)) & ((1 << 61) - 1)) | (1 << 61))


def block_kv(cache, heads: HeadPages, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [Hkv, n, D]: row h holds head h's pages back to back, keys moved by their shifts."""
    pin = {(cache.page_keys[p], layer_idx) for p in heads.union()}
    kv = {p: cache.page_kv(p, layer_idx, pin) for p in heads.union()}  # each [Hkv, T, D]
    ks, vs = [], []
    for h, (row, moved) in enumerate(zip(heads.pages, heads.shifts)):
        k = torch.cat([kv[p][0][h] for p in row])  # [n, D]
        if any(moved):
            k = rerotate(cache.model, k, list(moved), layer_idx, sizes=[kv[p][0].shape[1] for p in row])
        ks.append(k)
        vs.append(torch.cat([kv[p][1][h] for p in row]))
    return torch.stack(ks), torch.stack(vs)


def update_in_place(cache, layer_idx: int, heads: HeadPages) -> HeadPages:
    """`heads` with each head's pages in the columns of the block the layer's buffer holds, written and
    renamed there (see the module docstring). `heads` as given, to be written whole, when the buffer
    holds no block of as many whole pages."""
    prev = cache.blocks.get(layer_idx)
    buffer = cache.layers[layer_idx].buffer
    start = None if prev is None else buffer.slot_start(prev[0])
    if start is None or prev[1].num_pages != heads.num_pages or any(
            cache.spans[p].end - cache.spans[p].start != cache.page_size for p in {*heads.union(), *prev[1].union()}):
        return heads
    rows, cells = [], []
    for h, (old_pages, old_shifts) in enumerate(zip(prev[1].pages, prev[1].shifts)):
        want = dict(zip(heads.pages[h], heads.shifts[h]))  # page -> shift, position order
        row, free = list(zip(old_pages, old_shifts)), []
        for j, (p, d) in enumerate(row):
            if p not in want:
                free.append(j)
                continue
            if want[p] != d:
                cells.append((h, j, p, want[p], True))
                row[j] = (p, want[p])
            del want[p]
        for j, (p, d) in zip(free, want.items()):  # as many freed columns as joined pages
            cells.append((h, j, p, d, False))
            row[j] = (p, d)
        rows.append(row)
    new = HeadPages(tuple(tuple(p for p, _ in r) for r in rows), tuple(tuple(d for _, d in r) for r in rows))
    if cells:
        _write_cells(cache, layer_idx, start, cells)
    key = block_key(cache.spans, new)
    if key != prev[0]:
        buffer.rename_slot(prev[0], key)
    return new


def _write_cells(cache, layer_idx: int, start: int, cells: list[Cell]) -> None:
    """Each cell's page, head h's K moved by its shift (and V unless keys only), into its column at `start`:
    the bytes `block_kv` puts there (one rotation for all of them: elementwise, per page)."""
    buffer, t = cache.layers[layer_idx].buffer, cache.page_size
    pin = {(cache.page_keys[p], layer_idx) for _, _, p, _, _ in cells}
    kv = {p: cache.page_kv(p, layer_idx, pin) for p in {c[2] for c in cells}}  # each [Hkv, T, D]
    keys = torch.cat([kv[p][0][h] for h, _, p, _, _ in cells])  # [cells * T, D]
    shifts = [d for _, _, _, d, _ in cells]
    if any(shifts):
        keys = rerotate(cache.model, keys, shifts, layer_idx, sizes=[t] * len(cells))
    for i, (h, j, p, _, keys_only) in enumerate(cells):
        a = start + j * t
        buffer.k[0, h, a:a + t] = keys[i * t:(i + 1) * t]
        if not keys_only:
            buffer.v[0, h, a:a + t] = kv[p][1][h]
    buffer.num_copied_tokens += len(cells) * t // buffer.num_kv_heads
