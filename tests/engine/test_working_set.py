"""The pure working-set rules: page selection, masks from absolute positions, fixed placement."""
import torch

from tieredkv.engine.schedule import canonical_chunks
from tieredkv.engine.working_set import (
    Span,
    build_mask,
    fixed_positions,
    merge_ranked,
    retrieval_excluded,
    select_pages,
    sliding_spans,
)


def test_canonical_chunks_cut_at_every_page_boundary():
    assert list(canonical_chunks(0, 70, 32)) == [(0, 32), (32, 64), (64, 70)]
    assert list(canonical_chunks(70, 100, 32)) == [(70, 96), (96, 100)]
    assert list(canonical_chunks(5, 5, 32)) == []


def test_select_pages_is_sink_retrieved_local_in_position_order():
    assert select_pages(20, sink=1, local=3, retrieved=[9, 2, 18, 99]) == [0, 2, 9, 17, 18, 19]
    assert retrieval_excluded(20, sink=1, local=3) == {0, 17, 18, 19}
    assert select_pages(3, sink=2, local=4, retrieved=[]) == [0, 1, 2]


def test_sliding_spans_start_inside_the_first_page():
    spans = [Span(i, 10 * i, 10 * i + 10) for i in range(6)]
    assert sliding_spans(spans, 35) == [(spans[3], 5), (spans[4], 0), (spans[5], 0)]
    assert sliding_spans(spans, 60) == []


def test_mask_is_causal_by_absolute_position_with_gaps():
    q_pos = torch.tensor([100, 101])
    k_pos = torch.tensor([0, 1, 50, 51, 100, 101])  # a sink, a retrieved page, then local
    mask = build_mask(q_pos, k_pos, sliding_window=None, kind="sdpa", dtype=torch.float32, q_offset=100)
    assert mask.shape == (1, 1, 2, 6)
    assert mask[0, 0].tolist() == [[True] * 5 + [False], [True] * 6]
    eager = build_mask(q_pos, k_pos, sliding_window=None, kind="eager", dtype=torch.float32, q_offset=100)
    assert eager[0, 0, 0, 5] == torch.finfo(torch.float32).min and eager[0, 0, 1].eq(0).all()


def test_mask_matches_transformers_skipping_rules():
    # first chunk (no past) and single-token decode: transformers passes None to sdpa
    pos = torch.arange(4)
    assert build_mask(pos, pos, sliding_window=None, kind="sdpa", dtype=torch.float32, q_offset=0) is None
    assert build_mask(torch.tensor([9]), torch.arange(10), sliding_window=None, kind="sdpa",
                      dtype=torch.float32, q_offset=9) is None
    # a sliding window that actually cuts keys always needs a mask
    m = build_mask(torch.tensor([9]), torch.arange(10), sliding_window=4, kind="sdpa", dtype=torch.float32,
                   q_offset=9)
    assert m[0, 0, 0].tolist() == [False] * 6 + [True] * 4


def test_fixed_positions_pack_far_pages_right_before_the_local_window():
    spans = [Span(i, 100 * i, 100 * i + 100) for i in range(10)]
    shifts = fixed_positions(spans, far=[0, 3], local_start=800)
    # page 3 moves to [700, 800), page 0 to [600, 700): distances to the query stay small
    assert shifts == {3: 400, 0: 600}


def test_merge_ranked_takes_every_heads_best_pages_first():
    rows = [[9, 4, 7], [4, 2, 8], [5, 6, 1]]  # per head, best first
    assert merge_ranked(rows, 3) == [4, 5, 9]  # each head's first
    assert merge_ranked(rows, 4) == [2, 4, 5, 9]  # head 0's second (4) is taken: head 1's second joins
    assert merge_ranked(rows, 5) == [2, 4, 5, 6, 9]
    assert merge_ranked(rows, 2) == [4, 9]  # a tie for the last place goes to the head listed first
    assert merge_ranked(rows, 9) == merge_ranked(rows, 100) == sorted({p for r in rows for p in r})
    assert merge_ranked([[], [3]], 2) == [3] and merge_ranked([], 4) == []
