"""The working-set buffer: in place, byte-equal to concatenating the pages, and copies only what changed."""
import pytest
import torch

from tieredkv.engine.kv_buffer import HOLE_POS, SlotKey, WorkingSetBuffer
from tieredkv.engine.working_set import build_mask

H, D = 2, 4


def _page(start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic K, V [H, n, D] of positions [start, end): each value names its position."""
    pos = torch.arange(start, end, dtype=torch.float32)
    k = pos[None, :, None] + torch.arange(H * D, dtype=torch.float32).view(H, 1, D) / 100
    return k, -k


def _filler(calls: list[list[int]], wanted: list[SlotKey]):
    def fill(idx):
        calls.append(list(idx))
        out = []
        for i in idx:
            s = wanted[i]
            k, v = _page(s.start, s.end)
            out.append((k[:, s.offset:] + s.shift, v[:, s.offset:]))
        return out
    return fill


def _expected(wanted: list[SlotKey], tail: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ks, vs, ps = [], [], []
    for s in wanted:
        k, v = _page(s.start, s.end)
        ks.append(k[:, s.offset:] + s.shift), vs.append(v[:, s.offset:])
        ps.append(torch.arange(s.start + s.offset, s.end))
    k, v = _page(*tail)
    ks.append(k), vs.append(v), ps.append(torch.arange(*tail))
    return torch.cat(ks, 1)[None], torch.cat(vs, 1)[None], torch.cat(ps)


def _buffer_with_tail(start: int, end: int) -> WorkingSetBuffer:
    """An empty buffer whose tail holds positions [start, end)."""
    buf = WorkingSetBuffer(H, D, torch.float32, "cpu")
    buf.reset(start)
    if end > start:
        k, v = _page(start, end)
        buf.append(k[None], v[None])
    return buf


def _arrange(buf: WorkingSetBuffer, wanted: list[SlotKey], tail: tuple[int, int]) -> list[list[int]]:
    calls: list[list[int]] = []
    buf.arrange(wanted, _filler(calls, wanted))
    got, want = buf.views(), _expected(wanted, tail)
    for g, w in zip(got, want):
        assert torch.equal(g, w.to(g.dtype))
    return calls


def test_append_and_seal_front_move_nothing():
    buf = WorkingSetBuffer(H, D, torch.float32, "cpu")
    k, v = _page(0, 10)
    buf.append(k[None, :, :6], v[None, :, :6])
    buf.append(k[None, :, 6:], v[None, :, 6:])
    sealed_k, _ = buf.seal_front(8)
    assert torch.equal(sealed_k, k[:, :8]) and buf.slots == [SlotKey(0, 8, 0, 0, 0)]
    assert torch.equal(buf.tail_keys, k[:, 8:]) and buf.tail_start == 8
    # the sealed page is selected where it already is: nothing is filled or copied
    assert _arrange(buf, [SlotKey(0, 8, 0, 0, 0)], (8, 10)) == [] and buf.num_copied_tokens == 0


def test_arrange_fills_only_slots_whose_key_or_place_changed():
    buf = _buffer_with_tail(40, 43)
    a, b, c, d = (SlotKey(s, s + 8, 0, 0, 0) for s in (0, 8, 16, 24))
    assert _arrange(buf, [a, b, c], (40, 43)) == [[0, 1, 2]]
    assert _arrange(buf, [a, d, c], (40, 43)) == [[1]]  # same length: c keeps its place
    assert _arrange(buf, [a, d, c], (40, 43)) == []  # unchanged: no work at all
    assert _arrange(buf, [d, c], (40, 43)) == []  # a removal at the front: the base moves, not the bytes
    assert _arrange(buf, [d, c, SlotKey(8, 16, 0, 5, 0), a], (40, 43)) == [[2, 3]]  # grows; tail moves
    assert _arrange(buf, [d, c, SlotKey(8, 16, 0, 6, 0), a], (40, 43)) == [[2]]  # another shift: other bytes
    assert _arrange(buf, [SlotKey(0, 8, 3, 0, 0)], (40, 43)) == [[0]]  # a sliding window's partial page


def test_arrange_keeps_the_largest_group_in_place():
    buf = _buffer_with_tail(100, 105)
    pages = [SlotKey(s, s + 8, 0, 0, 0) for s in range(0, 96, 8)]
    assert _arrange(buf, pages[2:], (100, 105)) == [list(range(10))]
    copied = buf.num_copied_tokens
    # a page joins at the front: the ten after it and the tail stay where they are
    assert _arrange(buf, pages[1:], (100, 105)) == [[0]] and buf.num_copied_tokens == copied + 8
    # one leaves in the middle: the larger side stays, the smaller one is copied
    kept = pages[1:5] + pages[6:]
    assert _arrange(buf, kept, (100, 105)) == [[0, 1, 2, 3]]


def _arrange_in_place(buf: WorkingSetBuffer, wanted: list[SlotKey], tail: tuple[int, int]) -> list[list[int]]:
    """In-place arrange; the live tokens (holes dropped) are exactly the wanted slots' and the tail's, each
    key and value beside its own position, in whatever order the buffer keeps them."""
    calls: list[list[int]] = []
    buf.arrange(wanted, _filler(calls, wanted), in_order=False)
    k, v, pos = buf.views()
    live = pos != HOLE_POS
    want_k, want_v, want_pos = _expected(wanted, tail)
    order = torch.argsort(pos[live])
    assert torch.equal(pos[live][order], torch.sort(want_pos).values)
    back = torch.argsort(want_pos)
    assert torch.equal(k[:, :, live][:, :, order], want_k[:, :, back])
    assert torch.equal(v[:, :, live][:, :, order], want_v[:, :, back])
    return calls


def test_in_place_arrange_copies_only_pages_that_joined():
    buf = _buffer_with_tail(200, 203)
    pages = [SlotKey(s, s + 8, 0, 0, 0) for s in range(0, 200, 8)]
    assert _arrange_in_place(buf, pages[:10], (200, 203)) == [list(range(10))]
    copied = buf.num_copied_tokens
    # page 1 leaves, page 15 joins: it takes page 1's place, whatever the order; nothing else moves
    sel = [pages[0], *pages[2:10], pages[15]]
    assert _arrange_in_place(buf, sel, (200, 203)) == [[9]] and buf.num_copied_tokens == copied + 8
    assert buf.num_hole_tokens == 0
    # two leave, one joins: one hole stays, masked
    sel = [pages[0], *pages[4:10], pages[15], pages[20]]
    assert _arrange_in_place(buf, sel, (200, 203)) == [[8]] and buf.num_hole_tokens == 8
    # more join than holes: the rest go after the last slot and the tail moves behind them
    sel = [pages[0], *pages[4:10], pages[15], pages[20], pages[21], pages[22]]
    assert _arrange_in_place(buf, sel, (200, 203)) == [[9, 10]] and buf.num_hole_tokens == 0
    assert buf.num_copied_tokens == copied + 8 + 8 + 16 + 3


def test_in_place_arrange_relays_out_in_order_when_holes_pile_up():
    buf = _buffer_with_tail(100, 100)
    pages = [SlotKey(s, s + 8, 0, 0, 0) for s in range(0, 96, 8)]
    _arrange_in_place(buf, pages, (100, 100))
    _arrange_in_place(buf, pages[:8], (100, 100))  # 4 of 12 slots are holes: a third, kept
    assert buf.num_hole_tokens == 32
    _arrange_in_place(buf, pages[:6], (100, 100))  # more than a third: in position order, no holes
    assert buf.num_hole_tokens == 0 and _arrange(buf, pages[:6], (100, 100)) == []


@pytest.mark.parametrize("kind", ["sdpa", "eager"])
def test_holes_are_masked_out(kind):
    # A hole's stale keys must never be attended: the mask built from the positions drops them.
    buf = _buffer_with_tail(64, 64)
    pages = [SlotKey(s, s + 8, 0, 0, 0) for s in range(0, 64, 8)]
    _arrange_in_place(buf, pages, (64, 64))
    _arrange_in_place(buf, pages[:3] + pages[4:], (64, 64))
    _, _, pos = buf.views()
    mask = build_mask(torch.tensor([64]), pos, sliding_window=None, kind=kind, dtype=torch.float32, q_offset=64)
    attended = mask[0, 0, 0] if kind == "sdpa" else mask[0, 0, 0] == 0
    assert int((pos == HOLE_POS).sum()) == 8 and not bool(attended[pos == HOLE_POS].any())
    assert bool(attended[pos != HOLE_POS].all())


def test_growth_keeps_contents():
    buf = WorkingSetBuffer(H, D, torch.float64, "cpu")
    buf.reset(0)
    k, v = _page(0, 600)
    for s in range(0, 600, 7):
        buf.append(k[None, :, s:s + 7].double(), v[None, :, s:s + 7].double())
    got_k, got_v, pos = buf.views()
    assert torch.equal(got_k[0], k.double()) and torch.equal(pos, torch.arange(600))
    assert buf.capacity >= 600 and buf.capacity % 256 == 0


@pytest.mark.parametrize("q", [1, 5])
def test_attention_over_buffer_views_is_byte_equal_to_contiguous(q):
    # The buffer hands attention non-contiguous views; sdpa and the eager matmul give the same bytes.
    torch.manual_seed(0)
    buf = torch.randn(1, 3, 700, 16)
    k, v = buf[:, :, :523], buf.flip(2)[:, :, :523]
    query = torch.randn(1, 6, q, 16)
    rep = lambda x: x.repeat_interleave(2, 1)  # noqa: E731
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(query, rep(k), rep(v)), sdpa(query, rep(k.contiguous()), rep(v.contiguous())))
    assert torch.equal(sdpa(query, k, v, enable_gqa=True), sdpa(query, k.contiguous(), v.contiguous(), enable_gqa=True))
    w = torch.softmax(query @ rep(k).transpose(2, 3), -1)
    assert torch.equal(w @ rep(v), torch.softmax(query @ rep(k.contiguous()).transpose(2, 3), -1) @ rep(v.contiguous()))
    # eager without GQA (no repeat_kv copy): the matmuls read the strided views themselves
    q6 = torch.randn(1, 3, q, 16)
    w = torch.softmax(q6 @ k.transpose(2, 3), -1) @ v
    assert torch.equal(w, torch.softmax(q6 @ k.contiguous().transpose(2, 3), -1) @ v.contiguous())


def test_in_place_arrange_rewrites_only_the_keys_of_a_page_that_moved():
    """A page whose shift changed (the fixed policy packed the pages anew) keeps its slot: only its keys
    are written, its values and position stay, and no hole is left."""
    buf = _buffer_with_tail(200, 203)
    pages = [SlotKey(s, s + 8, 0, 0, 0) for s in range(0, 80, 8)]
    _arrange_in_place(buf, pages, (200, 203))
    where = buf.lo + buf.views()[2].tolist().index(24)  # page 3's first token
    buf.v[0, :, where:where + 8] = 7.0  # a mark in its values: writing them again would erase it
    values, copied, calls = buf.v.clone(), buf.num_copied_tokens, []
    sel = [*pages[:3], pages[3]._replace(shift=16), *pages[4:]]
    buf.arrange(sel, _filler(calls, sel), in_order=False)
    # compared as bits: the spare capacity beyond the live slots is uninitialised and may hold NaNs
    unchanged = torch.equal(buf.v.view(torch.int32), values.view(torch.int32))
    assert calls == [[3]] and unchanged and buf.num_copied_tokens == copied + 8
    k = _page(24, 32)[0] + 16
    assert torch.equal(buf.k[0, :, where:where + 8], k) and buf.num_hole_tokens == 0
    buf.v[0, :, where:where + 8] = _page(24, 32)[1]
    where -= buf.lo
    # one joins, one leaves and one moves: the mover stays, the newcomer takes the leaver's place
    sel = [*pages[:2], pages[3]._replace(shift=8), *pages[4:], SlotKey(96, 104, 0, 0, 0)]
    calls = _arrange_in_place(buf, sel, (200, 203))
    assert sorted(calls[0]) == [2, 9] and buf.views()[2].tolist().index(24) == where
    assert buf.num_hole_tokens == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_batched_slot_writes_are_the_per_slot_writes(dtype):
    """`_write_slots` copies every slot in one pass (a CPU buffer through numpy views, others split +
    _foreach_copy_): the same bytes and positions as a slice assignment per slot, whatever the order of the
    slots' starts; K/V of another dtype are converted."""
    keys = [SlotKey(s, s + 8, off, 0, 0) for s, off in ((40, 0), (0, 3), (96, 0), (8, 1), (200, 0))]
    starts = [70, 10, 30, 18, 50]  # disjoint runs, not in order
    gen = torch.Generator().manual_seed(0)
    for src_dtype in (dtype, torch.float32 if dtype != torch.float32 else torch.float64):
        kvs = [(torch.randn(H, k.num_tokens, D, generator=gen).to(src_dtype),
                torch.randn(H, k.num_tokens, D, generator=gen).to(src_dtype)) for k in keys]
        bufs = [WorkingSetBuffer(H, D, dtype, "cpu") for _ in range(2)]
        for b in bufs:
            b._make_room(100)
            b.pos.fill_(-7), b.k.zero_(), b.v.zero_()
        bufs[0]._write_slots(keys, starts, kvs)
        for key, dst, kv in zip(keys, starts, kvs):  # one by one: the reference
            bufs[1]._write_slots([key], [dst], [kv])
        a, b = bufs
        as_int = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(a.k.view(as_int), b.k.view(as_int)) and torch.equal(a.v.view(as_int), b.v.view(as_int))
        assert torch.equal(a.pos, b.pos) and a.num_copied_tokens == b.num_copied_tokens == sum(
            k.num_tokens for k in keys)
        dst, key = starts[1], keys[1]
        assert torch.equal(a.pos[dst:dst + key.num_tokens], torch.arange(3, 8))
        assert torch.equal(a.k[0, :, dst:dst + key.num_tokens], kvs[1][0].to(dtype))


@pytest.mark.parametrize("dtype, as_int", [(torch.float32, torch.int32), (torch.bfloat16, torch.int16),
                                           (torch.float16, torch.int16), (torch.float64, torch.int64)])
def test_cpu_slot_writes_copy_every_bit(dtype, as_int):
    """A CPU buffer's batched writes (numpy views of its bytes) copy bit patterns exactly, NaNs, infinities and
    subnormals included, from read-only views of immutable bytes and from slices that start past a page's first
    token, and keep doing so after the buffer grows (the numpy views follow the new buffers)."""
    gen = torch.Generator().manual_seed(1)
    width = torch.empty(0, dtype=as_int).element_size()
    keys = [SlotKey(s, s + 8, off, 0, 0) for s, off in ((40, 0), (0, 3), (96, 0), (8, 1))]
    a, b = WorkingSetBuffer(H, D, dtype, "cpu"), WorkingSetBuffer(H, D, dtype, "cpu")
    for grow in (100, 2000):
        for buf in (a, b):
            buf._make_room(grow)
            buf.pos.fill_(-7), buf.k.zero_(), buf.v.zero_()
        starts = [buf.lo + s for s in (70, 10, 30, 18)]
        kvs = []
        for key in keys:
            bits = torch.randint(-(1 << 8 * width - 1), (1 << 8 * width - 1) - 1, (2, H, 8, D), generator=gen,
                                 dtype=torch.int64).to(as_int)
            payload = bytes(bits.view(torch.uint8).reshape(-1).numpy())  # immutable, like a host page's payload
            kv = torch.frombuffer(payload, dtype=dtype).view(2, H, 8, D)
            kvs.append((kv[0, :, key.offset:], kv[1, :, key.offset:]))
        a._write_slots(keys, starts, kvs)
        for key, dst, kv in zip(keys, starts, kvs):  # one slice assignment per slot: the reference
            b._write_slots([key], [dst], [kv])
        assert a._np is not None and a._np[0] is a.k  # the numpy path ran, on the current buffers
        assert torch.equal(a.k.view(as_int), b.k.view(as_int)) and torch.equal(a.v.view(as_int), b.v.view(as_int))
        assert torch.equal(a.pos, b.pos)
        for key, dst, (k, v) in zip(keys, starts, kvs):
            n = key.num_tokens
            assert torch.equal(a.k[0, :, dst:dst + n].view(as_int), k.view(as_int))
            assert torch.equal(a.v[0, :, dst:dst + n].view(as_int), v.view(as_int))


@pytest.mark.parametrize("dtype, as_int", [(torch.float32, torch.int32), (torch.bfloat16, torch.int16)])
def test_page_parts_are_written_as_the_per_slot_writes(dtype, as_int):
    """Stored pages' unjoined bytes (`paging.PageLayers`, each a view of an immutable payload) are copied straight
    into a CPU buffer: the same bits and positions as a slice assignment per slot."""
    from paging import PageLayers

    gen = torch.Generator().manual_seed(2)
    keys = [SlotKey(s, s + 8, 0, 0, 0) for s in (40, 0, 96, 8)]
    starts = [70, 10, 30, 18]
    payloads = [bytes(torch.randn(2, H, 8, D, generator=gen).to(dtype).view(torch.uint8).reshape(-1).numpy())
                for _ in keys]
    parts = PageLayers(H, 8, D, dtype, [memoryview(p) for p in payloads])
    a, b = WorkingSetBuffer(H, D, dtype, "cpu"), WorkingSetBuffer(H, D, dtype, "cpu")
    for buf in (a, b):
        buf._make_room(100)
        buf.pos.fill_(-7), buf.k.zero_(), buf.v.zero_()
    a._write_slots(keys, starts, parts)
    for key, dst, p in zip(keys, starts, payloads):
        kv = torch.frombuffer(bytearray(p), dtype=dtype).view(2, H, 8, D)
        b._write_slots([key], [dst], [(kv[0], kv[1])])
    assert a._np is not None and a._np[0] is a.k  # the numpy path ran
    assert torch.equal(a.k.view(as_int), b.k.view(as_int)) and torch.equal(a.v.view(as_int), b.v.view(as_int))
    assert torch.equal(a.pos, b.pos) and a.num_copied_tokens == b.num_copied_tokens == 32
    other = WorkingSetBuffer(H, D, torch.float64, "cpu")  # another dtype: converted through the pairs
    other._make_room(100)
    other._write_slots(keys, starts, parts)
    assert torch.equal(other.k[0, :, 70:78], a.k[0, :, 70:78].to(torch.float64))
