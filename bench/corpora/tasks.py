"""Offline, seeded long-context tasks: passkey and RULER-style needles, variable tracking, aggregation and
extraction, in a haystack of filler sentences or real prose (the Python language reference).

Each task is (document ids, question ids, the strings a right answer holds, the token spans of its evidence).
Token counts are targets: the haystack is filled up to `num_tokens` minus the needles and the question.

    passkey     one pass key (RULER niah_single)
    multikey    4 keys with a magic number each; asked for one (niah_multikey)
    multivalue  one key with 4 magic numbers; asked for all 4 (niah_multivalue)
    multiquery  4 keys; asked for 2 of them at once (niah_multiquery)
    vartrack    a chain of 4 variable assignments (and a distractor chain); asked for every variable
                that holds the value (RULER vt)
    aggregate   3 keywords said 8 times each among 10 said once; asked for the 3 most frequent (RULER's
                common-words extraction, the words scattered through prose)
    extract     4 fields of one record scattered through the document; asked for all 4 as one line
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
    answers: tuple[str, ...] = ()  # every string a right answer holds (default: `answer` alone)
    spans: tuple[tuple[int, int], ...] = ()  # token ranges of all the evidence (default: `needle_span`)
    max_new_tokens: int = 12  # enough for every answer string

    @property
    def expected(self) -> tuple[str, ...]:
        return self.answers or (self.answer,)

    @property
    def evidence_spans(self) -> tuple[tuple[int, int], ...]:
        return self.spans or (self.needle_span,)

    def needle_pages(self, page_size: int) -> set[int]:
        """Ids of the pages that hold the evidence."""
        return {p for s, e in self.evidence_spans for p in range(s // page_size, (e - 1) // page_size + 1)}

    def row(self, codec, out: list[int]) -> dict:
        """What every benchmark row of a task records about an answer: the answer, the output,
        whether it holds every expected string (and the share it holds), and input and output-id hashes."""
        from tieredkv.provenance.domain import sha256_ids

        text = codec.decode(out)
        found = sum(a in text for a in self.expected)
        return {"answer": " | ".join(self.expected), "output": text, "correct": found == len(self.expected),
                "recall": found / len(self.expected),
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


def _prose_body(codec, needle_ids, budget: int, seed: int) -> tuple[list[int], dict[int, int]]:
    """Real prose (the language reference, from a seeded offset) with each needle inserted after the
    first line break at or past its depth (needles of equal depth in their order); (body, offset of each
    needle in the body, by its index)."""
    prose, breaks = _prose_ids(codec)
    start = random.Random(seed).randrange(len(prose))
    stream = (prose[start:] + prose * (budget // len(prose) + 1))[:budget]
    body, at, where = [], 0, {}
    for d, ids, i in sorted(needle_ids, key=lambda x: (x[0], x[2])):
        cut = max(at, int(d * budget))
        while cut < len(stream) and stream[cut - 1] not in breaks and cut > 0:
            cut += 1
        body += stream[at:cut]
        where[i] = len(body)
        body += ids
        at = cut
    return body + stream[at:], where


def _prose_document(codec, needles: list[tuple[float, str]], intro: str, question: str, answer_prefix: str,
                    num_tokens: int, seed: int) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """(document ids, question ids, token span of every needle in the document) over real prose."""
    head, tail_q, needle_ids, budget = _parts(codec, needles, intro, question, answer_prefix, num_tokens)
    body, where = _prose_body(codec, needle_ids, budget, seed)
    spans = [(len(head) + where[i], len(head) + where[i] + len(ids)) for _, ids, i in needle_ids]
    return head + body, tail_q, spans


def _parts(codec, needles, intro, question, answer_prefix, num_tokens):
    """The document's head, the question's ids, the needles' ids (depth, ids, index), the haystack's budget."""
    pre, post = _chat_split(codec)
    head = codec.encode(pre + intro)
    tail_q = codec.encode("\n\n" + question + post + answer_prefix)
    needle_ids = [(d, codec.encode(" " + text + " "), i) for i, (d, text) in enumerate(needles)]
    budget = num_tokens - len(head) - len(tail_q) - sum(len(n) for _, n, _ in needle_ids)
    if budget < len(codec.encode(FILLER)):
        raise ValueError(f"{num_tokens} tokens is too short for a needle document")
    return head, tail_q, needle_ids, budget


def _haystack(codec, needles: list[tuple[float, str]], intro: str, question: str, answer_prefix: str,
              num_tokens: int, target: int = 0, haystack: str = "filler",
              seed: int = 0) -> tuple[list[int], list[int], tuple[int, int]]:
    """(document ids, question ids, token span of needles[target] in the document). The haystack is the
    repeated FILLER, or real prose ("prose") in which the needle is not the only distinct text."""
    if haystack == "prose":
        doc, q, spans = _prose_document(codec, needles, intro, question, answer_prefix, num_tokens, seed)
        return doc, q, spans[target]
    head, tail_q, needle_ids, budget = _parts(codec, needles, intro, question, answer_prefix, num_tokens)
    filler = codec.encode(FILLER)
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


MAGIC_INTRO = "Some special magic numbers are hidden within the following text. Make sure to memorize them.\n\n"


def _key(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128)))[:8]


def _number(rng: random.Random) -> str:
    return str(rng.randint(1000000, 9999999))


def multivalue(codec, num_tokens: int, depth: float, seed: int, num_values: int = 4, haystack: str = "prose") -> Task:
    """RULER niah_multivalue: one key with several magic numbers, the first at `depth`; all are asked for."""
    rng = random.Random(seed)
    key, values = _key(rng), [_number(rng) for _ in range(num_values)]
    depths = [depth] + [rng.random() for _ in range(num_values - 1)]
    needles = [(d, f"One of the special magic numbers for {key} is: {v}.") for d, v in zip(depths, values)]
    doc, q, spans = _prose_document(codec, needles, MAGIC_INTRO, f"What are all the special magic numbers for {key}?",
                                    f"The special magic numbers for {key} are:", num_tokens, seed)
    return Task("multivalue", num_tokens, depth, seed, doc, q, values[0], spans[0], tuple(values), tuple(spans), 48)


def multiquery(codec, num_tokens: int, depth: float, seed: int, num_keys: int = 4, haystack: str = "prose") -> Task:
    """RULER niah_multiquery: several keys with a magic number each; two are asked for at once."""
    rng = random.Random(seed)
    keys, values = [_key(rng) for _ in range(num_keys)], [_number(rng) for _ in range(num_keys)]
    asked = rng.sample(range(num_keys), 2)
    depths = [depth if i == asked[0] else rng.random() for i in range(num_keys)]
    needles = [(d, f"One of the special magic numbers for {k} is: {v}.") for d, k, v in zip(depths, keys, values)]
    pair = f"{keys[asked[0]]} and {keys[asked[1]]}"
    doc, q, spans = _prose_document(codec, needles, MAGIC_INTRO, f"What are the special magic numbers for {pair}?",
                                    f"The special magic numbers for {pair} are:", num_tokens, seed)
    return Task("multiquery", num_tokens, depth, seed, doc, q, values[asked[0]], spans[asked[0]],
                tuple(values[i] for i in asked), tuple(spans[i] for i in asked), 32)


def _name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))


def vartrack(codec, num_tokens: int, depth: float, seed: int, hops: int = 3, haystack: str = "prose") -> Task:
    """RULER variable tracking: VAR A = value, then VAR B = VAR A, ... (`hops` links, the first at `depth`
    or earlier), and a distractor chain of 2 links holding another value; every name of the chain is asked for."""
    rng = random.Random(seed)
    names = [_name(rng) for _ in range(hops + 1 + 2)]
    value, other = str(rng.randint(10000, 99999)), str(rng.randint(10000, 99999))
    chain, distractor = names[:hops + 1], names[hops + 1:]
    depths = sorted([depth] + [rng.uniform(depth, 1.0) for _ in range(hops)])
    lines = [f"VAR {chain[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:])]
    d0 = rng.random()
    needles = list(zip(depths, lines)) + [(d0, f"VAR {distractor[0]} = {other}."),
                                          (rng.uniform(d0, 1.0), f"VAR {distractor[1]} = VAR {distractor[0]}.")]
    intro = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    doc, q, spans = _prose_document(
        codec, needles, intro, f"Find all variables that are assigned the value {value} in the text above.",
        f"According to the chain(s) of variable assignment in the text above, {hops + 1} variables are assigned "
        f"the value {value}, they are:", num_tokens, seed)
    return Task("vartrack", num_tokens, depth, seed, doc, q, chain[0], spans[0], tuple(chain),
                tuple(spans[:hops + 1]), 32)


WORDS = ("anchor", "basket", "candle", "dragon", "engine", "falcon", "garden", "harbor", "island", "jacket",
         "kettle", "ladder", "magnet", "needle", "orange", "pencil", "quartz", "rocket", "saddle", "timber",
         "tunnel", "valley", "walnut", "yogurt", "zipper", "bucket", "copper", "donkey", "feather", "glacier")


def aggregate(codec, num_tokens: int, depth: float, seed: int, common: int = 3, repeats: int = 8,
              rare: int = 10, haystack: str = "prose") -> Task:
    """RULER common-words extraction over prose: `common` keywords said `repeats` times each and `rare` said
    once, at random depths; the `common` most frequent are asked for. The evidence is everywhere (no page
    holds it alone): `depth` is not used."""
    rng = random.Random(seed)
    words = rng.sample(WORDS, common + rare)
    said = [w for w in words[:common] for _ in range(repeats)] + words[common:]
    needles = [(rng.random(), f"Keyword: {w}.") for w in said]
    intro = "Keywords are hidden within the following text. Count how often each one is said.\n\n"
    doc, q, spans = _prose_document(codec, needles, intro,
                                    f"Which {common} keywords are said most often in the text above?",
                                    f"The {common} most frequent keywords are:", num_tokens, seed)
    ours = tuple(s for (w, s) in zip(said, spans) if w in words[:common])
    return Task("aggregate", num_tokens, depth, seed, doc, q, words[0], ours[0], tuple(words[:common]), ours, 24)


CITIES = ("Tarnow", "Lisbon", "Oulu", "Ghent", "Bergen", "Cusco", "Dakar", "Perth", "Quito", "Malmo")
DEPARTMENTS = ("Glassworks", "Cartography", "Beekeeping", "Typesetting", "Ropemaking", "Clockmaking")


def extract(codec, num_tokens: int, depth: float, seed: int, haystack: str = "prose") -> Task:
    """Extraction: four fields of one record, the first at `depth` and the others anywhere; all four are asked
    for as one structured line."""
    rng = random.Random(seed)
    fields = {"badge": str(rng.randint(1000, 9999)), "city": rng.choice(CITIES),
              "department": rng.choice(DEPARTMENTS), "year": str(rng.randint(1950, 2020))}
    sentences = [f"The archivist's badge number is {fields['badge']}.",
                 f"The archivist's home city is {fields['city']}.",
                 f"The archivist works in the {fields['department']} department.",
                 f"The archivist started in the year {fields['year']}."]
    order = rng.sample(range(4), 4)
    needles = [(depth if i == order[0] else rng.random(), sentences[i]) for i in range(4)]
    intro = "Facts about one archivist are scattered through the following text. Collect them.\n\n"
    doc, q, spans = _prose_document(
        codec, needles, intro, "Give the archivist's badge number, home city, department and start year, on one line "
        "in the form badge=..., city=..., department=..., year=...", "badge=", num_tokens, seed)
    return Task("extract", num_tokens, depth, seed, doc, q, fields["badge"], spans[0], tuple(fields.values()),
                tuple(spans), 32)


TASKS = {"passkey": passkey, "multikey": multikey}
# the suite of bench/ruler.py: every family over real prose
SUITE = {"passkey": passkey, "multikey": multikey, "multivalue": multivalue, "multiquery": multiquery,
         "vartrack": vartrack, "aggregate": aggregate, "extract": extract}
