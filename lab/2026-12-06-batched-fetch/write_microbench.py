"""Micro-benchmark: a step's new slots written into a working-set buffer (K only), us per step; one run, its output
kept in write_microbench.txt.  taskset -c 1 python lab/2026-12-06-batched-fetch/write_microbench.py

slice: one slice assignment per slot (before); cat+index_copy(_int): the slots joined, one index_copy_ (through an
integer view of the same bytes); split+foreach: the buffer cut at the slots' edges, one _foreach_copy_ (kept).
"""
import time, torch, numpy as np, sys
torch.set_num_threads(1)
def bench(H, D, dtype, nslots=27, T=128, cap_slots=64):
    cap = cap_slots * T
    k = torch.zeros(1, H, cap, D, dtype=dtype)
    rng = np.random.default_rng(0)
    dsts = sorted(rng.choice(cap_slots, nslots, replace=False) * T)
    srcs = [torch.randn(2, H, T, D).to(dtype).unbind(0)[0] for _ in range(nslots)]
    def a():
        for d, s in zip(dsts, srcs):
            k[0, :, d:d + T] = s
    as_int = {2: torch.int16, 4: torch.int32}[k.element_size()]
    idx = torch.from_numpy(np.concatenate([np.arange(d, d + T) for d in dsts]))
    def b():
        k.view(as_int)[0].index_copy_(1, idx, torch.cat(srcs, dim=1).view(as_int))
    def b2():
        k[0].index_copy_(1, idx, torch.cat(srcs, dim=1))
    # split approach: regions of the buffer in slot-size pieces
    sizes = [T] * cap_slots
    sel = [d // T for d in dsts]
    def e():
        views = k[0].split(sizes, dim=1)
        torch._foreach_copy_([views[i] for i in sel], srcs)
    def f():
        views = k[0].split(sizes, dim=1)
        for i, s in zip(sel, srcs):
            views[i].copy_(s)
    out = {}
    for name, fn in (("slice", a), ("cat+index_copy_int", b), ("cat+index_copy", b2), ("split+foreach", e), ("split+copy_", f)):
        for _ in range(20): fn()
        t0 = time.perf_counter()
        for _ in range(300): fn()
        out[name] = round(1e6 * (time.perf_counter() - t0) / 300, 1)
    ref = torch.zeros_like(k); k.zero_(); a(); ref.copy_(k)
    for fn in (b, b2, e, f):
        k.zero_(); fn(); assert torch.equal(k.view(as_int), ref.view(as_int))
    print(H, D, dtype, out)
bench(2, 16, torch.float32)
bench(2, 16, torch.bfloat16)
bench(5, 64, torch.bfloat16)
