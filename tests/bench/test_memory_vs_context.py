"""bench.memory_vs_context's churn measure: the share of a layer's retrieved pages kept from the step before."""
import collections

from bench.memory_vs_context import kept_from_step_before


def test_kept_share_is_per_layer_over_consecutive_steps():
    # two layers, three steps, logged layer by layer within a step
    log = [[1, 2, 3, 4], [10, 11],   # step 1
           [1, 2, 5, 6], [10, 11],   # step 2: layer 0 keeps 2 of 4, layer 1 keeps both
           [7, 8, 9, 6], [12, 13]]   # step 3: layer 0 keeps 1 of 4, layer 1 none
    assert kept_from_step_before(log, 2) == round((0.5 + 0.25 + 1.0 + 0.0) / 4, 3)
    # as the cache keeps it (a bounded deque)
    assert kept_from_step_before(collections.deque(log, maxlen=100), 2) == kept_from_step_before(log, 2)
    # the same log read as one layer compares each layer with the other: a different answer
    assert kept_from_step_before(log, 1) != kept_from_step_before(log, 2)


def test_kept_share_needs_two_whole_steps():
    assert kept_from_step_before([], 2) is None
    assert kept_from_step_before([[1], [2]], 2) is None  # one step
    assert kept_from_step_before([[1], [2], [1]], 2) is None  # not whole steps
    assert kept_from_step_before([[1], [1]], 0) is None
    assert kept_from_step_before([[1, 2], [1, 2]], 1) == 1.0
