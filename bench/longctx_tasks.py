"""Offline, seeded long-context tasks: passkey and RULER-style multi-key needles.

Each task is (document ids, question ids, expected answer string). Token counts are targets:
the haystack is filled up to `num_tokens` minus the needle and question.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


@dataclass(frozen=True)
class Task:
    name: str
    num_tokens: int
    depth: float
    seed: int
    doc_ids: list[int]
    question_ids: list[int]
    answer: str
    needle_span: tuple[int, int] = (0, 0)  # token range [start, end) of the answering needle in doc_ids

    def needle_pages(self, page_size: int) -> set[int]:
        """Ids of the pages that hold the answering needle."""
        s, e = self.needle_span
        return set(range(s // page_size, (e - 1) // page_size + 1))

    def row(self, codec, out: list[int]) -> dict:
        """What every benchmark row of a task records about an answer: the answer, the output,
        whether it is right, and input and output-id hashes."""
        from tieredkv.provenance.domain import sha256_ids

        text = codec.decode(out)
        return {"answer": self.answer, "output": text, "correct": self.answer in text,
                "input_sha256": sha256_ids(self.doc_ids + self.question_ids), "output_ids_sha256": sha256_ids(out)}


def _chat_split(codec):
    from tieredkv.models.text_codec import chat_frame

    return chat_frame(codec)


HAYSTACKS = ("filler", "prose")


_PROSE: dict[str, tuple[list[int], frozenset[int]]] = {}


def _prose_ids(codec) -> tuple[list[int], frozenset[int]]:
    """The Python language reference as token ids, and the ids of tokens that hold a line break."""
    from tieredkv.question.corpus import python_reference

    if codec.identity not in _PROSE:
        ids = codec.encode(python_reference())
        _PROSE[codec.identity] = ids, frozenset(t for t in set(ids) if "\n" in codec.decode([t]))
    return _PROSE[codec.identity]


def _prose_body(codec, needle_ids, budget: int, seed: int, target: int) -> tuple[list[int], int]:
    """Real prose (the language reference, from a seeded offset) with each needle inserted after the
    first line break at or past its depth; (body, offset of needles[target] in the body)."""
    prose, breaks = _prose_ids(codec)
    start = random.Random(seed).randrange(len(prose))
    stream = (prose[start:] + prose * (budget // len(prose) + 1))[:budget]
    body, at, where = [], 0, 0
    for d, ids, i in sorted(needle_ids, key=lambda x: x[0]):
        cut = max(at, int(d * budget))
        while cut < len(stream) and stream[cut - 1] not in breaks and cut > 0:
            cut += 1
        body += stream[at:cut]
        if i == target:
            where = len(body)
        body += ids
        at = cut
    return body + stream[at:], where


def _haystack(codec, needles: list[tuple[float, str]], intro: str, question: str, answer_prefix: str,
              num_tokens: int, target: int = 0, haystack: str = "filler",
              seed: int = 0) -> tuple[list[int], list[int], tuple[int, int]]:
    """(document ids, question ids, token span of needles[target] in the document). The haystack is the
    repeated FILLER, or real prose ("prose") in which the needle is not the only distinct text."""
    pre, post = _chat_split(codec)
    head = codec.encode(pre + intro)
    tail_q = codec.encode("\n\n" + question + post + answer_prefix)
    filler = codec.encode(FILLER)
    needle_ids = [(d, codec.encode(" " + text + " "), i) for i, (d, text) in enumerate(needles)]
    budget = num_tokens - len(head) - len(tail_q) - sum(len(n) for _, n, _ in needle_ids)
    if budget < len(filler):
        raise ValueError(f"{num_tokens} tokens is too short for a needle document")
    if haystack == "prose":
        body, where = _prose_body(codec, needle_ids, budget, seed, target)
        n = len(needle_ids[target][1])
        return head + body, tail_q, (len(head) + where, len(head) + where + n)
    reps = budget // len(filler)
    body: list[int] = []
    inserted = sorted(needle_ids, key=lambda x: x[0])
    span = (0, 0)

    def insert(needle):
        nonlocal span, body
        if needle[2] == target:
            span = (len(head) + len(body), len(head) + len(body) + len(needle[1]))
        body += needle[1]

    k = 0
    for r in range(reps):
        while k < len(inserted) and r >= int(inserted[k][0] * reps):
            insert(inserted[k])
            k += 1
        body += filler
    for needle in inserted[k:]:
        insert(needle)
    return head + body, tail_q, span


def passkey(codec, num_tokens: int, depth: float, seed: int, haystack: str = "filler") -> Task:
    rng = random.Random(seed)
    key = str(rng.randint(10000, 99999))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    intro = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
             "I will quiz you about the important information there.\n\n")
    doc, q, span = _haystack(codec, [(depth, needle)], intro, "What is the pass key?", "The pass key is", num_tokens,
                             haystack=haystack, seed=seed)
    return Task("passkey", num_tokens, depth, seed, doc, q, key, span)


def multikey(codec, num_tokens: int, depth: float, seed: int, num_keys: int = 4, haystack: str = "filler") -> Task:
    """RULER niah_multikey: several needles with distinct keys; the question asks for one of them."""
    rng = random.Random(seed)
    keys = [str(uuid.UUID(int=rng.getrandbits(128)))[:8] for _ in range(num_keys)]
    values = [str(rng.randint(1000000, 9999999)) for _ in range(num_keys)]
    target = rng.randrange(num_keys)
    depths = [depth if i == target else rng.random() for i in range(num_keys)]
    needles = [(d, f"One of the special magic numbers for {k} is: {v}.") for d, k, v in zip(depths, keys, values)]
    intro = "Some special magic numbers are hidden within the following text. Make sure to memorize them.\n\n"
    doc, q, span = _haystack(codec, needles, intro, f"What is the special magic number for {keys[target]}?",
                             f"The special magic number for {keys[target]} is:", num_tokens, target,
                             haystack=haystack, seed=seed)
    return Task("multikey", num_tokens, depth, seed, doc, q, values[target], span)


TASKS = {"passkey": passkey, "multikey": multikey}
