"""One layer's working set as one device buffer, updated in place: per step, cost follows what changed.

    k, v  [1, Hkv, capacity, D]     pos  [capacity] (absolute, own positions; the mask reads them)

          | slot 0 | slot 1 | ... | slot m-1 | tail: unsealed tokens + this chunk | free ... |
          0                       num_slot_tokens                    + num_tail

A slot holds one sealed page (or the part of it a sliding window reads) exactly as attention reads it:
the stored bytes or a re-encoded copy, re-rotated when the placement shifts it. A slot is named by a
`SlotKey` = (start, end, offset, shift, source): two slots with equal keys hold equal bytes.

- `append`      writes a chunk's new K/V behind the tail (no copy of what is already there);
- `seal_front`  turns the tail's first tokens into a slot, where they already are (no copy);
- `arrange`     makes the slots match a selection: only slots whose key or place changed are filled
                (by the caller's `fill`), the tail moves only if the slots' length changed.

Attention gets views `k[:, :, :n]` (non-contiguous along the head axis): the same values in the same
order as concatenating the pages, and the kernels give the same bytes for them
(tests/test_kv_buffer.py pins that). Nothing here knows about stores or models.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch

_GROW = 1.25  # capacity grows by at least this factor (amortised O(1) appends)
_ROUND = 256  # capacity is a multiple of this many tokens


class SlotKey(NamedTuple):
    """What a slot holds: tokens [start + offset, end) of the page spanning [start, end), moved by
    `shift` positions, from `source` (0: the stored page; else the id of the re-encoded K/V it came from)."""

    start: int
    end: int
    offset: int
    shift: int
    source: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start - self.offset


# fill(indices) -> for each index i of `wanted`, K and V [Hkv, n_i, D] as attention reads them
Fill = Callable[[list[int]], Sequence[tuple[torch.Tensor, torch.Tensor]]]


class WorkingSetBuffer:
    """Slots then tail in one growable buffer; see the module docstring for the layout."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str):
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        self.device = torch.device(device)
        self.k = torch.empty((1, num_kv_heads, 0, head_dim), dtype=dtype, device=self.device)
        self.v = torch.empty_like(self.k)
        self.pos = torch.empty(0, dtype=torch.long, device=self.device)
        self.slots: list[SlotKey] = []
        self.num_slot_tokens = 0  # P
        self.num_tail = 0  # t
        self.tail_start = 0  # absolute position of the tail's first token
        self.num_copied_tokens = 0  # tokens written by `arrange` (slot fills and tail moves): what changes cost
        self._refs: dict[int, Any] = {}  # source id -> the object it names, kept alive so the id stays unique

    # ------------------------------------------------------------------ views
    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size() + self.pos.numel() * self.pos.element_size()

    @property
    def is_empty(self) -> bool:
        return self.num_slot_tokens + self.num_tail == 0

    @property
    def tail_keys(self) -> torch.Tensor:
        """[Hkv, t, D] view of the unsealed tokens (and the current chunk)."""
        p = self.num_slot_tokens
        return self.k[0, :, p:p + self.num_tail]

    @property
    def tail_values(self) -> torch.Tensor:
        p = self.num_slot_tokens
        return self.v[0, :, p:p + self.num_tail]

    def views(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """K, V [1, Hkv, n, D] and positions [n] of slots then tail, as attention reads them."""
        n = self.num_slot_tokens + self.num_tail
        return self.k[:, :, :n], self.v[:, :, :n], self.pos[:n]

    def source_id(self, obj: Any) -> int:
        """A slot source id naming `obj` (kept alive while this buffer lives, so the id is never reused)."""
        self._refs[id(obj)] = obj
        return id(obj)

    # ------------------------------------------------------------------ the tail
    def reset(self, tail_start: int) -> None:
        """Drop every slot and the tail; the next token appended sits at `tail_start`."""
        self.slots, self.num_slot_tokens, self.num_tail, self.tail_start = [], 0, 0, tail_start
        self._refs.clear()

    def set_tail(self, which: str, states: torch.Tensor, tail_start: int) -> None:
        """Replace the tail's keys (`which="k"`) or values by `states` [Hkv, t, D] (cache attach).
        Setting keys drops the slots; values must then match the keys' length."""
        t = states.shape[1]
        if which == "k":
            self.reset(tail_start)
            self._ensure_capacity(t)
            self.num_tail = t
            self.pos[:t] = torch.arange(tail_start, tail_start + t, device=self.device)
            self.k[0, :, :t] = states
        else:
            assert t == self.num_tail, f"values hold {t} tokens, keys {self.num_tail}"
            self.v[0, :, self.num_slot_tokens:self.num_slot_tokens + t] = states

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write a chunk's K/V ([1, Hkv, q, D], positions right after the tail) behind the tail."""
        q = key_states.shape[2]
        end = self.num_slot_tokens + self.num_tail
        self._ensure_capacity(end + q)
        self.k[:, :, end:end + q] = key_states
        self.v[:, :, end:end + q] = value_states
        first = self.tail_start + self.num_tail
        self.pos[end:end + q] = torch.arange(first, first + q, device=self.device)
        self.num_tail += q

    def seal_front(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tail's first `n` tokens ([Hkv, n, D] each) become the last slot, in place.

        NOTE: the returned views alias the buffer; read them (seal the page) before the next
        `append` or `arrange`, which may overwrite or move them."""
        assert 0 < n <= self.num_tail, f"cannot seal {n} of {self.num_tail} tail tokens"
        p = self.num_slot_tokens
        k, v = self.k[0, :, p:p + n], self.v[0, :, p:p + n]
        self.slots.append(SlotKey(self.tail_start, self.tail_start + n, 0, 0, 0))
        self.num_slot_tokens += n
        self.num_tail -= n
        self.tail_start += n
        return k, v

    # ------------------------------------------------------------------ the slots
    def arrange(self, wanted: list[SlotKey], fill: Fill) -> None:
        """Make the slots exactly `wanted` (in order), then the tail.

        A wanted slot whose key already sits at its new offset is kept; every other one is filled
        through `fill` (called once, with the indices that need bytes). Cost: the bytes of the
        changed slots, plus the tail when the slots' total length changed."""
        if wanted == self.slots:
            return
        old_at: dict[int, SlotKey] = {}
        o = 0
        for key in self.slots:
            old_at[o] = key
            o += key.num_tokens
        offsets, changed, o = [], [], 0
        for i, key in enumerate(wanted):
            offsets.append(o)
            if old_at.get(o) != key:
                changed.append(i)
            o += key.num_tokens
        new_p, old_p, t = o, self.num_slot_tokens, self.num_tail
        tail = None
        if new_p != old_p and t:
            # NOTE: clone first: fills may overwrite the old tail region, and the two ranges may overlap
            tail = (self.k[:, :, old_p:old_p + t].clone(), self.v[:, :, old_p:old_p + t].clone(),
                    self.pos[old_p:old_p + t].clone())
        self._ensure_capacity(max(new_p, old_p) + t)
        if changed:
            for i, (k, v) in zip(changed, fill(changed)):
                key, at = wanted[i], offsets[i]
                n = key.num_tokens
                assert k.shape[1] == n, f"slot {key} got {k.shape[1]} tokens"
                self.k[0, :, at:at + n] = k  # k, v: [Hkv, n, D]
                self.v[0, :, at:at + n] = v
                first = key.start + key.offset
                self.pos[at:at + n] = torch.arange(first, first + n, device=self.device)
                self.num_copied_tokens += n
        if tail is not None:
            self.k[:, :, new_p:new_p + t], self.v[:, :, new_p:new_p + t], self.pos[new_p:new_p + t] = tail
            self.num_copied_tokens += t
        self.slots = list(wanted)
        self.num_slot_tokens = new_p
        live = {key.source for key in wanted}
        for ref in [r for r in self._refs if r not in live]:
            del self._refs[ref]

    def _ensure_capacity(self, need: int) -> None:
        if need <= self.capacity:
            return
        cap = max(need, int(self.capacity * _GROW))
        cap = -(-cap // _ROUND) * _ROUND
        used = self.num_slot_tokens + self.num_tail
        k = torch.empty((1, self.num_kv_heads, cap, self.head_dim), dtype=self.dtype, device=self.device)
        v = torch.empty_like(k)
        pos = torch.empty(cap, dtype=torch.long, device=self.device)
        k[:, :, :used], v[:, :, :used], pos[:used] = self.k[:, :, :used], self.v[:, :, :used], self.pos[:used]
        self.k, self.v, self.pos = k, v, pos
