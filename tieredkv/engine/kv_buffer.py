"""One layer's working set as one device buffer, updated in place: per step, cost follows what changed.

    k, v  [1, Hkv, capacity, D]     pos  [capacity] (absolute, own positions; the mask reads them)

          | free | slot 0 | slot 1 | ... | slot m-1 | tail: unsealed tokens + this chunk | free |
                 lo                      lo + num_slot_tokens               + num_tail

A slot holds one sealed page (or the part of it a sliding window reads) exactly as attention reads it:
the stored bytes or a re-encoded copy, re-rotated when the placement shifts it. A slot is named by a
`SlotKey` = (start, end, offset, shift, source): two slots with equal keys hold equal bytes.

- `append`      writes a chunk's new K/V behind the tail (no copy of what is already there);
- `seal_front`  turns the tail's first tokens into a slot, where they already are (no copy);
- `arrange`     makes the slots match a selection, placed where most of what is already there stays
                put (the base `lo` moves instead): only the other slots are filled (by the caller's
                `fill`); the tail moves only if it is not in that group.
                With `in_order=False` (a retrieving decode step, where the selection changes every
                step), every slot still wanted stays where it is whatever the order, a slot no longer
                wanted becomes a hole (its position set to `HOLE_POS`, which the causal mask never
                admits), and new slots fill holes first: the cost is only the pages that joined. A page
                that only moved (another shift: the fixed policy packs pages anew) keeps its slot and
                its values; only its keys are written.

Attention gets views `k[:, :, :n]` (non-contiguous along the head axis): the same values in the same
order as concatenating the pages, and the kernels give the same bytes for them
(tests/engine/test_kv_buffer.py pins that). Nothing here knows about stores or models.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from paging import PageLayers

_GROW = 1.5  # capacity grows by at least this factor: amortised O(1) appends, room to move the base
_ROUND = 256  # capacity is a multiple of this many tokens
HOLE_POS = 1 << 62  # position of a hole's tokens: after every query, so no causal mask attends to them
_HOLE = -1  # SlotKey.source of a hole (stale bytes of a slot no longer wanted)
# what a CPU buffer's K and V are viewed as for numpy copies (`WorkingSetBuffer._numpy_views`): their own
# dtype, or an integer of the same width (numpy has no bfloat16); other dtypes are not copied through numpy
_NUMPY_AS: dict[torch.dtype, torch.dtype] = {torch.float16: torch.float16, torch.float32: torch.float32,
                                             torch.float64: torch.float64, torch.bfloat16: torch.int16}


def token_indices(starts: Sequence[int], sizes: Sequence[int], total: int) -> np.ndarray:
    """int64 [total]: starts[0], starts[0] + 1, .., starts[0] + sizes[0] - 1, starts[1], ..: runs of consecutive
    indices, built in a few numpy calls however many runs there are."""
    sizes_a = np.asarray(sizes, dtype=np.int64)
    run_first = np.cumsum(sizes_a) - sizes_a  # where each run starts in the output
    return np.arange(total, dtype=np.int64) + np.repeat(np.asarray(starts, dtype=np.int64) - run_first, sizes_a)


def _cuts(starts: Sequence[int], sizes: Sequence[int], capacity: int) -> list[int]:
    """Sizes that cut [0, capacity) into gap, run, gap, run, ..., gap for runs [starts[i], + sizes[i]) in order."""
    out, at = [], 0
    for start, n in zip(starts, sizes):
        assert start >= at, f"runs overlap or are out of order at {start}"
        out += (start - at, n)
        at = start + n
    out.append(capacity - at)
    return out


def _unshifted(key: "SlotKey") -> "SlotKey":
    """`key` at shift 0 (NOTE: `_replace` costs a microsecond; most keys are at shift 0 already)."""
    return key._replace(shift=0) if key.shift else key


def _hole_tokens(slots: Sequence["SlotKey"]) -> int:
    return sum(key.num_tokens for key in slots if key.source == _HOLE)


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


# fill(indices) -> for each index i of `wanted`, K and V [Hkv, n_i, D] as attention reads them; or, when every
# one of those slots holds T tokens, all of them stacked in one tensor [len(indices), 2, Hkv, T, D] (K then V),
# or one layer of stored pages as their unjoined bytes (`paging.PageLayers`, the same shape)
SlotKVs = Sequence[tuple[torch.Tensor, torch.Tensor]] | torch.Tensor | PageLayers
Fill = Callable[[list[int]], SlotKVs]


class WorkingSetBuffer:
    """Slots then tail in one growable buffer; see the module docstring for the layout."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str):
        self.num_kv_heads, self.head_dim, self.dtype = num_kv_heads, head_dim, dtype
        self.device = torch.device(device)
        self.k = torch.empty((1, num_kv_heads, 0, head_dim), dtype=dtype, device=self.device)
        self.v = torch.empty_like(self.k)
        self.pos = torch.empty(0, dtype=torch.long, device=self.device)
        self.slots: list[SlotKey] = []
        self.lo = 0  # where the slots start
        self.num_slot_tokens = 0  # P
        self.num_tail = 0  # t
        self.tail_start = 0  # absolute position of the tail's first token
        self.num_copied_tokens = 0  # tokens written by `arrange` (slot fills and tail moves): what changes cost
        self._refs: dict[int, Any] = {}  # source id -> the object it names, kept alive so the id stays unique
        self._np: tuple | None = None  # (k, v, pos, their numpy views): `_numpy_views`

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
        a = self.lo + self.num_slot_tokens
        return self.k[0, :, a:a + self.num_tail]

    @property
    def tail_values(self) -> torch.Tensor:
        a = self.lo + self.num_slot_tokens
        return self.v[0, :, a:a + self.num_tail]

    def views(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """K, V [1, Hkv, n, D] and positions [n] of slots then tail, as attention reads them."""
        lo, hi = self.lo, self.lo + self.num_slot_tokens + self.num_tail
        return self.k[:, :, lo:hi], self.v[:, :, lo:hi], self.pos[lo:hi]

    def source_id(self, obj: Any) -> int:
        """A slot source id naming `obj` (kept alive while this buffer lives, so the id is never reused)."""
        self._refs[id(obj)] = obj
        return id(obj)

    # ------------------------------------------------------------------ the tail
    def reset(self, tail_start: int) -> None:
        """Drop every slot and the tail; the next token appended sits at `tail_start`."""
        self.slots, self.lo, self.num_slot_tokens, self.num_tail, self.tail_start = [], 0, 0, 0, tail_start
        self._refs.clear()

    def set_tail(self, which: str, states: torch.Tensor, tail_start: int) -> None:
        """Replace the tail's keys (`which="k"`) or values by `states` [Hkv, t, D] (cache attach).
        Setting keys drops the slots; values must then match the keys' length."""
        t = states.shape[1]
        if which == "k":
            self.reset(tail_start)
            self._make_room(t)
            self.num_tail = t
            self.pos[self.lo:self.lo + t] = torch.arange(tail_start, tail_start + t, device=self.device)
            self.k[0, :, self.lo:self.lo + t] = states
        else:
            assert t == self.num_tail, f"values hold {t} tokens, keys {self.num_tail}"
            a = self.lo + self.num_slot_tokens
            self.v[0, :, a:a + t] = states

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write a chunk's K/V ([1, Hkv, q, D], positions right after the tail) behind the tail."""
        q = key_states.shape[2]
        self._make_room(q)
        end = self.lo + self.num_slot_tokens + self.num_tail
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
        a = self.lo + self.num_slot_tokens
        k, v = self.k[0, :, a:a + n], self.v[0, :, a:a + n]
        self.slots.append(SlotKey(self.tail_start, self.tail_start + n, 0, 0, 0))
        self.num_slot_tokens += n
        self.num_tail -= n
        self.tail_start += n
        return k, v

    # ------------------------------------------------------------------ the slots
    @property
    def num_hole_tokens(self) -> int:
        return _hole_tokens(self.slots)

    def slot_start(self, key: SlotKey) -> int | None:
        """Where the slot holding `key` starts in the buffer (None: no such slot)."""
        at = self.lo
        for slot in self.slots:
            if slot == key:
                return at
            at += slot.num_tokens
        return None

    def rename_slot(self, old: SlotKey, new: SlotKey) -> None:
        """The slot holding `old` holds `new` now: its caller rewrote the bytes in place (the same size)."""
        assert old.num_tokens == new.num_tokens and new not in self.slots, f"cannot rename {old} to {new}"
        self.slots[self.slots.index(old)] = new

    def arrange(self, wanted: list[SlotKey], fill: Fill, *, in_order: bool = True) -> None:
        """Make the slots exactly `wanted` (in order; with `in_order=False`, `_arrange_in_place`), then the tail.

        The new layout is placed at the base that keeps the most tokens where they already are (each
        slot already in the buffer, and the tail, votes for the base that leaves it in place; the base
        must keep room on both sides); every other wanted slot is filled through `fill` (called once,
        with the indices that need bytes).
        Cost: the bytes of those slots, plus the tail if it is not in the winning group."""
        if wanted == self.slots:
            return
        if not in_order and self._arrange_in_place(wanted, fill):
            return
        at: dict[SlotKey, int] = {}  # key -> where it is now
        a = self.lo
        for key in self.slots:
            at[key] = a
            a += key.num_tokens
        rel, r = [], 0
        for key in wanted:
            rel.append(r)
            r += key.num_tokens
        new_p, t = r, self.num_tail
        if new_p + t > self.capacity:
            self._make_room(new_p + t - self.num_slot_tokens - t)  # grows; `at` moves with the base
            return self.arrange(wanted, fill)
        votes: dict[int, int] = {}
        for key, rr in zip(wanted, rel):
            if key in at:
                votes[at[key] - rr] = votes.get(at[key] - rr, 0) + key.num_tokens
        old_tail = self.lo + self.num_slot_tokens
        if t:
            votes[old_tail - new_p] = votes.get(old_tail - new_p, 0) + t
        # NOTE: a base too close to either end would leave no room to move it next time: the winner must
        # leave a quarter of the free space on each side, else the layout is re-centred (all copied)
        room = self.capacity - new_p - t
        fits = [(w, -abs(base - self.lo), base) for base, w in votes.items() if room // 4 <= base <= room - room // 4]
        base = max(fits)[2] if fits else room // 2
        changed = [i for i, (key, rr) in enumerate(zip(wanted, rel)) if at.get(key) != base + rr]
        tail = self._take_tail() if t and old_tail != base + new_p else None
        self._write_slots([wanted[i] for i in changed], [base + rel[i] for i in changed],
                          fill(changed) if changed else [])
        self._put_tail(tail, base + new_p)
        self.slots, self.lo, self.num_slot_tokens = list(wanted), base, new_p
        self._drop_refs(wanted)

    def _write_slots(self, keys: list[SlotKey], starts: list[int], kvs: SlotKVs) -> None:
        """Write each slot's K, V ([Hkv, n, D], or stacked: `SlotKVs`) and positions at its start.

        NOTE: a retrieving decode step writes ~25 slots per layer, and one slice assignment per slot and tensor
        (and an arange for its positions) cost more in calls than in bytes. A CPU buffer copies every slot
        through numpy views of the same bytes (`_numpy_views`: a numpy slice assignment costs a fraction of
        a torch one); other buffers are cut at the slots' edges (one `split` per tensor) and every slot is
        copied with one `_foreach_copy_` per tensor (lab/2026-12-06-batched-fetch, lab/2026-12-06-churn-copies).
        Joining the slots and writing them with one `index_copy_` was no faster for float32 and 5x slower for
        bfloat16 (even through an int16 view)."""
        sizes = [key.end - key.start - key.offset for key in keys]
        if isinstance(kvs, PageLayers):
            assert len(kvs) == len(keys) and all(n == kvs.tokens for n in sizes), \
                f"slots of {sizes} tokens got {len(kvs)} pages of {kvs.tokens}"
            if self._write_parts(keys, starts, sizes, kvs):
                return
            kvs = list(kvs)
        if isinstance(kvs, torch.Tensor):
            assert kvs.shape[0] == len(keys) and all(n == kvs.shape[3] for n in sizes), \
                f"slots of {sizes} tokens got a stack {tuple(kvs.shape)}"
            if self._write_stacked(keys, starts, sizes, kvs):
                return
            kvs = list(zip(kvs[:, 0], kvs[:, 1]))
        for key, n, (k, _v) in zip(keys, sizes, kvs):
            assert k.shape[1] == n, f"slot {key} got {k.shape[1]} tokens"
        self.num_copied_tokens += sum(sizes)
        dtype, cpu = self.dtype, self.device.type == "cpu"
        if len(keys) < 2 or any(k.dtype != dtype or v.dtype != dtype for k, v in kvs) or (
                any(not (k.is_cpu and v.is_cpu) for k, v in kvs) if cpu else
                any(k.device != self.device or v.device != self.device for k, v in kvs)):
            # NOTE: a slice assignment converts dtype and device, which the batched copies are not relied on to do
            for key, dst, n, (k, v) in zip(keys, starts, sizes, kvs):
                self.k[0, :, dst:dst + n], self.v[0, :, dst:dst + n] = k, v
                first = key.start + key.offset
                self.pos[dst:dst + n] = torch.arange(first, first + n, device=self.device)
            return
        views = self._numpy_views() if cpu else None
        if views is not None and not any(k.requires_grad or v.requires_grad for k, v in kvs):
            as_int = views[3]
            if as_int is not None:
                kvs = [(k.view(as_int), v.view(as_int)) for k, v in kvs]
            self._numpy_write(views, keys, starts, sizes, [(k.numpy(), v.numpy()) for k, v in kvs])
            return
        order = sorted(range(len(keys)), key=starts.__getitem__)
        sizes = [sizes[i] for i in order]
        cuts = _cuts([starts[i] for i in order], sizes, self.capacity)  # gap, slot, gap, slot, ..., gap
        pos = torch.from_numpy(token_indices([keys[i].start + keys[i].offset for i in order], sizes, sum(sizes)))
        torch._foreach_copy_(self.k[0].split(cuts, dim=1)[1::2], [kvs[i][0] for i in order])
        torch._foreach_copy_(self.v[0].split(cuts, dim=1)[1::2], [kvs[i][1] for i in order])
        torch._foreach_copy_(self.pos.split(cuts)[1::2], pos.to(self.device).split(sizes))

    def _write_stacked(self, keys: list[SlotKey], starts: list[int], sizes: list[int], kvs: torch.Tensor) -> bool:
        """`_write_slots` of a stack [n, 2, Hkv, T, D] into a CPU buffer of its dtype: one numpy slice assignment
        per slot and tensor, and one write of every slot's positions. False, writing nothing, elsewhere."""
        views = self._numpy_views() if self.device.type == "cpu" else None
        if views is None or kvs.dtype != self.dtype or not kvs.is_cpu or kvs.requires_grad:
            return False
        src = (kvs.view(views[3]) if views[3] is not None else kvs).numpy()
        self._numpy_write(views, keys, starts, sizes, [(src[i, 0], src[i, 1]) for i in range(len(keys))])
        self.num_copied_tokens += sum(sizes)
        return True

    def _write_parts(self, keys: list[SlotKey], starts: list[int], sizes: list[int], kvs: PageLayers) -> bool:
        """`_write_stacked` of pages' unjoined bytes: numpy views of each part copied straight into a CPU buffer
        of their dtype (one copy where joining them first made two). False, writing nothing, elsewhere."""
        views = self._numpy_views() if self.device.type == "cpu" else None
        if views is None or kvs.dtype != self.dtype:
            return False
        src = kvs.arrays(views[0].dtype)
        self._numpy_write(views, keys, starts, sizes, [(a[0], a[1]) for a in src])
        self.num_copied_tokens += sum(sizes)
        return True

    @staticmethod
    def _numpy_write(views: tuple, keys: list[SlotKey], starts: list[int], sizes: list[int],
                     arrays: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        """Each slot's K, V (numpy [Hkv, n, D], as `_numpy_views` views the buffer) at its start, one slice
        assignment per slot and tensor, and every slot's positions in one write."""
        kb, vb, pb, _ = views
        for dst, n, (k, v) in zip(starts, sizes, arrays):
            kb[:, dst:dst + n] = k
            vb[:, dst:dst + n] = v
        total = sum(sizes)
        pb[token_indices(starts, sizes, total)] = token_indices([key.start + key.offset for key in keys], sizes, total)

    def _numpy_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.dtype | None] | None:
        """numpy views of a CPU buffer's K, V ([Hkv, capacity, D]) and positions, and the integer dtype of the
        same width that K and V are viewed as where numpy has no such float (bfloat16; None: their own dtype).
        None for a dtype numpy cannot view. Kept until the buffers are replaced (`_make_room`)."""
        cached = self._np
        if cached is not None and cached[0] is self.k and cached[1] is self.v and cached[2] is self.pos:
            return cached[3]
        as_int = _NUMPY_AS.get(self.dtype)
        views = None
        if as_int is not None:
            kb = self.k[0].view(as_int).numpy() if as_int is not self.dtype else self.k[0].numpy()
            vb = self.v[0].view(as_int).numpy() if as_int is not self.dtype else self.v[0].numpy()
            views = kb, vb, self.pos.numpy(), (None if as_int is self.dtype else as_int)
        self._np = (self.k, self.v, self.pos, views)
        return views

    def _take_tail(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A copy of the tail's K, V and positions, to be put back elsewhere (`_put_tail`). NOTE: a copy,
        because slot fills may overwrite the old tail region, and the two ranges may overlap."""
        a, t = self.lo + self.num_slot_tokens, self.num_tail
        return self.k[:, :, a:a + t].clone(), self.v[:, :, a:a + t].clone(), self.pos[a:a + t].clone()

    def _put_tail(self, tail: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, dst: int) -> None:
        if tail is None:
            return
        t = self.num_tail
        self.k[:, :, dst:dst + t], self.v[:, :, dst:dst + t], self.pos[dst:dst + t] = tail
        self.num_copied_tokens += t

    def _drop_refs(self, wanted: list[SlotKey]) -> None:
        """Forget the sources no wanted slot reads."""
        live = {key.source for key in wanted}
        for ref in [r for r in self._refs if r not in live]:
            del self._refs[ref]

    def _arrange_in_place(self, wanted: list[SlotKey], fill: Fill) -> bool:
        """`arrange` without order: keep every wanted slot where it is, turn the others into holes, put
        new slots into holes (the smallest that fits) or after the last slot (the tail moves behind
        them). False, doing nothing, when holes would make up more than a third of the slots: the
        caller then re-lays them out in order, which leaves none."""
        # NOTE: ~50 slots, ~25 of them new, every decode step and layer: sizes are read off the fields
        # (`end - start - offset`, as `SlotKey.num_tokens`) rather than through the property, in few passes
        want = set(wanted)
        slots = self.slots
        layout = [key if key in want else SlotKey(0, key.end - key.start - key.offset, 0, 0, _HOLE) for key in slots]
        present = set(layout)
        new = [i for i, key in enumerate(wanted) if key not in present]
        # a slot whose page only moved (another shift) gets its keys re-rotated where it is; values stay put
        leaving = {_unshifted(key): j for j, key in enumerate(slots) if key not in want and key.source != _HOLE}
        moved: dict[int, int] = {}  # index in `wanted` -> index in `layout` of the slot it re-rotates
        if leaving:
            for i in new:
                j = leaving.pop(_unshifted(wanted[i]), None)
                if j is not None:
                    moved[i], layout[j] = j, wanted[i]
            if moved:
                new = [i for i in new if i not in moved]
        # (size, index in `layout`), sorted: the first at or after (n, -1) is the smallest hole that fits n tokens
        # (a hole's key is (0, size, 0, 0, _HOLE): its size is its end)
        holes = sorted((key.end, j) for j, key in enumerate(layout) if key.source == _HOLE)
        placed: dict[int, int] = {}  # index in `layout` -> index in `wanted` that fills that hole
        appended: list[int] = []
        for i in new:  # NOTE: a slot is never split over holes; what a bigger hole leaves stays a hole
            key = wanted[i]
            at = bisect.bisect_left(holes, (key.end - key.start - key.offset, -1))
            if at < len(holes):
                placed[holes.pop(at)[1]] = i
            else:
                appended.append(i)
        out: list[SlotKey] = []
        for j, key in enumerate(layout):
            i = placed.get(j)
            if i is None:
                out.append(key)
                continue
            fresh_key = wanted[i]
            out.append(fresh_key)
            rest = key.end - (fresh_key.end - fresh_key.start - fresh_key.offset)
            if rest > 0:
                out.append(SlotKey(0, rest, 0, 0, _HOLE))
        out += [wanted[i] for i in appended]
        num_slot_tokens = hole_tokens = 0
        for key in out:
            n = key.end - key.start - key.offset
            num_slot_tokens += n
            if key.source == _HOLE:
                hole_tokens += n
        if 3 * hole_tokens > num_slot_tokens:
            return False
        t, grow = self.num_tail, num_slot_tokens - self.num_slot_tokens
        if self.lo + num_slot_tokens + t > self.capacity:
            self._make_room(grow)  # moves the contents (holes included) and `lo`
        tail = self._take_tail() if t and grow else None  # appended slots overwrite the old tail
        # NOTE: positions are written only where a slot just became a hole (a hole's remainder already
        # holds HOLE_POS) and where a new slot goes
        fresh, at, dst = {wanted[i] for i in new}, {}, self.lo
        moved_keys = {wanted[i] for i in moved}
        hole_starts, hole_sizes = [], []
        for key, was in zip(layout, slots):
            n = key.end - key.start - key.offset
            if key.source == _HOLE and was.source != _HOLE:
                hole_starts.append(dst), hole_sizes.append(n)
            dst += n
        if hole_starts:  # one write for every new hole (there are about as many as new slots)
            idx = token_indices(hole_starts, hole_sizes, sum(hole_sizes))
            self.pos.index_fill_(0, torch.from_numpy(idx).to(self.device), HOLE_POS)
        dst = self.lo
        for key in out:
            if key in fresh or key in moved_keys:
                at[key] = dst
            dst += key.end - key.start - key.offset
        kvs = fill(new + list(moved)) if new or moved else []
        self._write_slots([wanted[i] for i in new], [at[wanted[i]] for i in new], kvs[:len(new)])
        for i, (k, _v) in zip(moved, kvs[len(new):]):
            a, n = at[wanted[i]], wanted[i].num_tokens
            self.k[0, :, a:a + n] = k
            self.num_copied_tokens += n
        self._put_tail(tail, self.lo + num_slot_tokens)
        self.slots, self.num_slot_tokens = out, num_slot_tokens
        self._drop_refs(wanted)
        return True

    def _make_room(self, extra: int) -> None:
        """Room for `extra` more tokens after the tail: move the contents left, or grow (a third of the
        free space to the left of them, two thirds to the right)."""
        used = self.num_slot_tokens + self.num_tail
        need = used + extra
        if self.lo + need <= self.capacity:
            return
        cap = self.capacity
        if need > cap * 2 // 3:  # keep a third free, room to move the base later
            cap = -(-max(need * 3 // 2, int(cap * _GROW)) // _ROUND) * _ROUND
        lo = (cap - need) // 3
        src = slice(self.lo, self.lo + used)
        if cap == self.capacity:
            # NOTE: through a copy: the source and destination ranges may overlap
            k, v, pos = self.k, self.v, self.pos
            moved = self.k[:, :, src].clone(), self.v[:, :, src].clone(), self.pos[src].clone()
        else:
            k = torch.empty((1, self.num_kv_heads, cap, self.head_dim), dtype=self.dtype, device=self.device)
            v, pos = torch.empty_like(k), torch.empty(cap, dtype=torch.long, device=self.device)
            moved = self.k[:, :, src], self.v[:, :, src], self.pos[src]
        k[:, :, lo:lo + used], v[:, :, lo:lo + used], pos[lo:lo + used] = moved
        self.k, self.v, self.pos, self.lo = k, v, pos, lo
        self.num_copied_tokens += used
