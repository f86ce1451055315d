"""The synthetic suite's documents (bench/corpora/tasks.py SUITE): lengths, evidence spans, answers, scoring."""
from __future__ import annotations

import collections

import pytest

from bench.corpora.tasks import SUITE, Task

N = 1500


@pytest.fixture(scope="module")
def codec(smollm2):
    return smollm2.codec


@pytest.mark.parametrize("name", list(SUITE))
def test_every_family_plants_its_answers_inside_the_spans(codec, name):
    task = SUITE[name](codec, N, 0.5, 3, haystack="prose")
    assert N - 40 <= len(task.doc_ids) + len(task.question_ids) <= N
    spans = task.evidence_spans
    evidence = " ".join(codec.decode(task.doc_ids[s:e]) for s, e in spans)
    for expected in task.expected:
        assert expected in evidence, (name, expected)
    assert task.needle_pages(128) == {p for s, e in spans for p in range(s // 128, (e - 1) // 128 + 1)}
    again = SUITE[name](codec, N, 0.5, 3, haystack="prose")
    assert again.doc_ids == task.doc_ids and again.question_ids == task.question_ids
    assert SUITE[name](codec, N, 0.5, 4, haystack="prose").doc_ids != task.doc_ids


def test_vartrack_assigns_before_it_copies(codec):
    task = SUITE["vartrack"](codec, N, 0.25, 0)
    text = codec.decode(task.doc_ids)
    chain = task.expected
    assert text.index(f"VAR {chain[0]} = ") < text.index(f"VAR {chain[1]} = VAR {chain[0]}.")
    for a, b in zip(chain[1:], chain[2:]):
        assert text.index(f"VAR {a} = VAR") < text.index(f"VAR {b} = VAR {a}.")


def test_aggregate_says_the_common_words_most_often(codec):
    task = SUITE["aggregate"](codec, 2500, 0.5, 1)
    text = codec.decode(task.doc_ids)
    counts = collections.Counter(s.split(".")[0] for s in text.split("Keyword: ")[1:])
    assert all(counts[w] == 8 for w in task.expected)
    assert sorted(counts.values(), reverse=True)[len(task.expected)] == 1


def test_a_row_is_correct_only_with_every_expected_string(codec):
    t = Task("x", 10, 0.5, 0, [1], [2], "a", (0, 1), ("12", "34"), ((0, 1), (5, 6)))
    ids = codec.encode(" 12 and 34")
    assert t.row(codec, ids)["correct"] and t.row(codec, ids)["recall"] == 1.0
    half = t.row(codec, codec.encode(" 12 and 35"))
    assert not half["correct"] and half["recall"] == 0.5
    assert t.needle_pages(4) == {0, 1}


def test_too_short_a_document_is_refused(codec):
    with pytest.raises(ValueError, match="too short"):
        SUITE["multivalue"](codec, 120, 0.5, 0)
