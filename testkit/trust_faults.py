"""The trust faults (docs/TRUST.md), shared by tests/trust/ and bench/fault_suite.py.

Each injection damages a copy of a store, a manifest, an artifact file or an input the way a review
found, then drives the code a user would (open, check, graft, import, the CLI) in a child process, so
that a SIGBUS or a crash ends the child and is counted instead of ending the run. Outcomes:

    detected   a typed error (or `check` says not healthy and names the problem)
    survived   the damage changed nothing that is read: every artifact loads, verified and complete
    crashed    the child died of a signal                                  (must be 0)
    lost       wrong contents were served, imported or called healthy      (must be 0)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from testkit.faults import MODEL, PAGE_SIZE, REPO, store_config

ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}
PAGE = 4096  # LMDB's page size on this platform
META_NBYTES = 152  # page header (16) + MDB_meta up to and including mm_txnid


# ----------------------------------------------------------------------------- children
def call(runner, target, args: tuple, timeout: float = 60.0) -> dict[str, Any]:
    """`target(*args, out)` in a forked child (testkit.faults.ForkRunner); {"outcome": "crashed"} if it dies."""
    out = runner.ctx.Queue()
    p = runner.ctx.Process(target=target, args=(*args, out))
    p.start()
    try:
        waited = 0.0
        while True:
            try:
                return out.get(timeout=0.1)
            except queue.Empty:
                waited += 0.1
                if p.exitcode is not None or waited > timeout:
                    if p.exitcode is None:
                        p.kill()
                    p.join(5)
                    return {"outcome": "crashed", "exitcode": p.exitcode}
    finally:
        p.join(30)


def cli_here(argv: list[str]) -> dict[str, Any]:
    """One `tieredkv` command through the real entry point, in this process: exit status, stdout, stderr."""
    import contextlib
    import io

    from tieredkv.cli.main import main

    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    return {"argv": argv, "rc": rc, "out": o.getvalue(), "err": e.getvalue()}


def cli_many(*commands: list[str], timeout: int = 240) -> list[dict]:
    """Run each `tieredkv` command through the real entry point in one fresh interpreter; per command its
    exit status, stdout and stderr. A child killed by a signal raises (the caller counts it)."""
    code = ("import json, sys\nfrom testkit.trust_faults import cli_here\n"
            "print(json.dumps([cli_here(argv) for argv in json.loads(sys.argv[1])]))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(list(commands))], capture_output=True, text=True,
                          env=ENV, cwd=REPO, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"CLI child ended with {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_line(err: str) -> bool:
    """stderr that holds exactly one error line and no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    return len(lines) == 1 and ": error: " in lines[0] and "Traceback" not in err


def is_one_line_error(result: dict) -> bool:
    return result["rc"] == 2 and one_line(result["err"])


# ----------------------------------------------------------------------------- audit in a child
def served_roots(store) -> dict[str, str]:
    """artifact id -> root page key of every artifact whose pages all load, verified (as a graft reads them)."""
    from paging.errors import PagingError
    from tieredkv.artifacts.artifact import load_artifact, load_pages
    from tieredkv.errors import TieredKVError

    served = {}
    for artifact_id in store.list_manifests():
        try:
            art = load_artifact(store, artifact_id)
            load_pages(store, art)
            served[artifact_id] = art.root_sha256
        except (PagingError, TieredKVError):
            pass
    return served


def open_and_audit_target(store_path: str, expected: dict[str, str], out) -> None:
    """Open the store as a user would, then check it: what was refused, served or called healthy.

    `expected`: artifact id -> root page key of every artifact the store must hold."""
    from paging import PageStore
    from paging.errors import PagingError
    from tieredkv.artifacts.check import check_store
    from tieredkv.errors import TieredKVError

    try:
        store = PageStore(store_path, store_config())
    except (PagingError, TieredKVError) as exc:
        out.put({"outcome": "detected", "error": type(exc).__name__, "message": str(exc)[:300]})
        return
    try:
        with store:
            served = served_roots(store)
            healthy = check_store(store)["healthy"]
    except (PagingError, TieredKVError) as exc:
        out.put({"outcome": "detected", "error": type(exc).__name__, "message": str(exc)[:300]})
        return
    if served == expected and healthy:
        out.put({"outcome": "survived"})
    elif not healthy:
        out.put({"outcome": "detected", "error": "check: not healthy"})
    else:
        out.put({"outcome": "lost", "served": served})


def _check_walk(store_path: str) -> dict[str, Any]:
    """What `tieredkv check` reports (its walk, as cmd_check's child runs it)."""
    from paging import PageStore
    from paging.errors import PagingError, StoreIntegrityError
    from tieredkv.artifacts.check import check_store
    from tieredkv.errors import TieredKVError

    try:
        with PageStore(store_path, store_config(allow_damaged=True)) as s:
            return {"healthy": check_store(s)["healthy"]}
    except StoreIntegrityError as exc:
        return {"healthy": False, "error": type(exc).__name__}
    except (PagingError, TieredKVError) as exc:  # a typed error that cmd_check does not turn into a report
        return {"typed": type(exc).__name__}


def _load_all(store_path: str) -> dict[str, Any]:
    """Every artifact's root as a user's graft would read it (pages verified), or the typed error."""
    from paging import PageStore
    from paging.errors import PagingError
    from tieredkv.errors import TieredKVError

    try:
        with PageStore(store_path, store_config()) as store:
            return {"served": served_roots(store)}
    except (PagingError, TieredKVError) as exc:
        return {"refused": type(exc).__name__}


def check_walk_target(store_path: str, out) -> None:
    out.put(_check_walk(store_path))


def load_all_target(store_path: str, out) -> None:
    out.put(_load_all(store_path))


def tree_flip_run(runner, template: Path, work: Path, damage, expected: dict[str, str]) -> dict[str, Any]:
    """Copy `template` to `work`, apply `damage(work)`, then `check` it as the CLI runs it (its walk in a
    child: a crash inside liblmdb is a report, exit 1) and load every artifact as a user would (in another
    child: a crash there is counted in "loads", not hidden)."""
    with _damaged_copy(template, work, damage):
        walk = call(runner, check_walk_target, (str(work),))
        load = call(runner, load_all_target, (str(work),))
    if load.get("outcome") == "crashed":
        loads = f"crashed ({_signal_name(load['exitcode'])})"
    else:
        loads = "refused" if "refused" in load else "served" if load["served"] == expected else "partly refused"
    if walk.get("outcome") == "crashed":
        result = {"outcome": "detected", "error": f"check: LMDB crashed ({_signal_name(walk['exitcode'])}), reported"}
    elif "untyped" in walk or "typed" in walk:
        result = {"outcome": "error", "error": walk.get("untyped") or walk["typed"]}
    elif not walk["healthy"]:
        result = {"outcome": "detected", "error": "check: not healthy"}
    elif loads == "served":
        result = {"outcome": "survived"}
    else:
        result = {"outcome": "lost", "error": f"check healthy, but the artifacts were {loads}"}
    return {**result, "loads": loads}


def _signal_name(exitcode: int | None) -> str:
    import signal

    return signal.Signals(-exitcode).name if exitcode is not None and exitcode < 0 else f"exit {exitcode}"


def artifact_roots(store_path: Path) -> dict[str, str]:
    from paging import PageStore
    from tieredkv.artifacts.artifact import load_artifact

    with PageStore(store_path, store_config()) as s:
        return {a: load_artifact(s, a).root_sha256 for a in s.list_manifests()}


def current_meta_offset(store_path: Path) -> int:
    import lmdb

    env = lmdb.open(str(store_path), max_dbs=4, readonly=True)
    try:
        return PAGE * (env.info()["last_txnid"] % 2)
    finally:
        env.close()


def flip_byte_bit(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))


@contextlib.contextmanager
def _damaged_copy(template: Path, work: Path, damage):
    """`template` copied to `work` and `damage(work)` applied, for the `with` block; removed after."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    damage(work)
    try:
        yield
    finally:
        shutil.rmtree(work, ignore_errors=True)


def damaged_store_run(runner, template: Path, work: Path, damage, expected: dict[str, str]) -> dict[str, Any]:
    """Copy `template` to `work`, apply `damage(work)`, open and audit it in a child."""
    with _damaged_copy(template, work, damage):
        return call(runner, open_and_audit_target, (str(work), expected))


# ----------------------------------------------------------------------------- lock.mdb deleted
def paused_deposit_target(store_path: str, text: str, paused, resume, out) -> None:
    from paging import PageStore
    from tieredkv.artifacts.artifact import deposit
    from tieredkv.models.loading import load_model

    lm = load_model(MODEL)
    done = []

    def progress(n: int, total: int) -> None:
        if n >= 3 * PAGE_SIZE and not done:
            done.append(1)
            paused.set()
            resume.wait(60)

    try:
        with PageStore(store_path, store_config()) as store:
            art = deposit(lm, text, store, page_size=PAGE_SIZE, progress=progress)
        out.put({"outcome": "deposited", "artifact": art.artifact_id})
    except Exception as exc:  # noqa: BLE001 - the parent classifies it
        out.put({"outcome": "error", "error": type(exc).__name__, "message": str(exc)[:300]})


def lock_deleted_run(runner, lm, template: Path, work: Path, texts: tuple[str, str]) -> dict[str, Any]:
    """A deposit pauses half-way; lock.mdb is deleted; a second deposit runs to the end; the first resumes.

    ok: the first refuses with StoreLockError, the store is healthy and holds the second artifact complete."""
    from paging import PageStore
    from tieredkv.artifacts.artifact import deposit, graft
    from tieredkv.artifacts.check import check_store

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    before = artifact_roots(work)
    paused, resume, out = runner.ctx.Event(), runner.ctx.Event(), runner.ctx.Queue()
    p = runner.ctx.Process(target=paused_deposit_target, args=(str(work), texts[0], paused, resume, out))
    p.start()
    try:
        if not paused.wait(120):
            raise RuntimeError("the first deposit never reached its pause")
        (work / "lock.mdb").unlink()
        with PageStore(work, store_config()) as s:
            second = deposit(lm, texts[1], s, page_size=PAGE_SIZE)
        resume.set()
        first = out.get(timeout=120)
    finally:
        p.join(30)
    with PageStore(work, store_config()) as s:
        report = check_store(s)
        held = set(s.list_manifests())
        graft(lm, second.artifact_id, s)
    shutil.rmtree(work, ignore_errors=True)
    ok = (first.get("error") == "StoreLockError" and report["healthy"]
          and set(held) == set(before) | {second.artifact_id})
    return {"ok": ok, "first": first, "healthy": report["healthy"], "lost": not set(before) <= set(held)}


# ----------------------------------------------------------------------------- damaged keys
def key_offsets(data: bytes, key: bytes) -> list[int]:
    """Where LMDB stores `key` as a key: in a leaf node, right after its u16 LE size."""
    size = len(key).to_bytes(2, "little")
    out, i = [], data.find(key)
    while i >= 0:
        if data[i - 2:i] == size:
            out.append(i)
        i = data.find(key, i + 1)
    return out


def damaged_key_target(store_path: str, out) -> None:
    from paging import PageStore, StoreConfig
    from tieredkv.artifacts.check import check_store

    try:
        with PageStore(store_path, StoreConfig(allow_damaged=True)) as s:
            first = check_store(s)
            second = check_store(s)
        out.put({"outcome": "detected" if not (first["healthy"] or second["healthy"]) else "lost",
                 "error": "reported by check",
                 "damaged_keys": len(first["damaged_keys"]), "corrupt_manifests": len(first["corrupt_manifests"])})
    except Exception as exc:  # noqa: BLE001
        out.put({"outcome": "error", "error": type(exc).__name__, "message": str(exc)[:300]})


# ----------------------------------------------------------------------------- manifests
def tampered_manifests(a, b) -> dict[str, tuple[str, bytes]]:
    """(stored under, bytes) of manifests that must all be refused; `a`, `b`: two genuine Artifacts."""
    def body(art, **change) -> bytes:
        d = json.loads(art.to_json())
        d.update(change)
        return json.dumps(d, sort_keys=True).encode()

    out = {"another document's manifest, renamed": (a.artifact_id, body(b, artifact=a.artifact_id)),
           "stored under another id": ("x" + a.artifact_id[1:], a.to_json()),
           "not canonical (indented)": (a.artifact_id, json.dumps(json.loads(a.to_json()), indent=1).encode()),
           "not JSON": (a.artifact_id, b"\x00garbage"),
           "domain edited": (a.artifact_id, body(a, domain={**a.domain, "num_threads": 99})),
           "tokens edited": (a.artifact_id, body(a, tokens=a.num_tokens - 1)),
           "pages reversed": (a.artifact_id, body(a, pages=list(reversed(a.page_keys))))}
    for k in range(1, len(a.page_keys)):
        keys = list(a.page_keys[:k])
        out[f"cut to {k} pages"] = (a.artifact_id, body(a, pages=keys, tokens=k * a.page_size, root_sha256=keys[-1]))
    return out


def manifest_run(lm, store_path: Path, stored_as: str, data: bytes) -> dict[str, Any]:
    """Put a tampered manifest in the store; graft, export and check must all refuse or report it."""
    from paging import PageStore
    from paging.errors import PagingError
    from tieredkv.artifacts.artifact import graft
    from tieredkv.artifacts.check import check_store
    from tieredkv.artifacts.portable import export_artifact
    from tieredkv.errors import TieredKVError

    with PageStore(store_path, store_config()) as s:
        genuine = s.get_manifest(stored_as) if stored_as in s.list_manifests() else None
        if genuine is not None:
            s.delete_manifest(stored_as)
        s.put_manifest(stored_as, data)
        refused = []
        for _what, fn in (("graft", lambda: graft(lm, stored_as, s)),
                          ("export", lambda: export_artifact(s, stored_as, store_path.parent / "x.tkva"))):
            try:
                fn()
                refused.append(False)
            except (PagingError, TieredKVError):
                refused.append(True)
        report = check_store(s)
        s.delete_manifest(stored_as)
        if genuine is not None:
            s.put_manifest(stored_as, genuine)  # as it was, for the next case
    named = stored_as in report["corrupt_manifests"] or stored_as in report["broken_chains"]
    detected = all(refused) and named and not report["healthy"]
    return {"detected": detected, "refused": refused}


# ----------------------------------------------------------------------------- forgery
def forge_file(genuine: Path, forged: Path, page_index: int, lm=None) -> None:
    """One number of one page's K/V changed, every hash of the file recomputed (the key does not move).

    With `lm`, every later page is recomputed honestly on top of the forged one (a consistent forgery): then
    only recomputing the forged page itself can tell."""
    from paging import Page
    from paging.page import payload_digest
    from tieredkv.artifacts.file_format import encode_header
    from tieredkv.artifacts.portable import read_header

    raw = genuine.read_bytes()
    header = read_header(genuine)
    base = header.data_offset
    tokens = raw[base + header.token_ids.begin:base + header.token_ids.end]
    blobs = [raw[base + s.begin:base + s.end] for s in header.pages]
    pages = [Page.from_bytes(b) for b in blobs]
    k, v = pages[page_index].kv()
    k = [x.clone() for x in k]
    k[0][0, 0, 0] += 1e-3
    p = pages[page_index]
    pages[page_index] = Page.seal(p.layout, p.fingerprint, p.parent_key, p.start, p.token_ids, k, v)
    if lm is not None:
        pages[page_index + 1:] = _recomputed_after(lm, pages, page_index, header.artifact.page_size)
    blobs = [page.to_bytes() for page in pages]
    sections = [(len(b), payload_digest(b)) for b in blobs]
    forged.write_bytes(encode_header(header.artifact, hashlib.sha256(tokens).hexdigest(), sections) + tokens
                       + b"".join(blobs))


def _recomputed_after(lm, pages: list, index: int, page_size: int) -> list:
    import torch

    from paging import Page
    from tieredkv.artifacts.artifact import install_kv, prefill
    from tieredkv.artifacts.capture import CaptureCache

    cache = CaptureCache(lm.model.config)
    for p in pages[:index + 1]:
        install_kv(cache, p.kv_tensor(), lm.model.device)
    out = []
    with torch.inference_mode():
        for p in pages[index + 1:]:
            prefill(lm, list(p.token_ids), cache, start=p.start, page_size=page_size)
            k, v = cache.take()
            out.append(Page.seal(p.layout, p.fingerprint, p.parent_key, p.start, p.token_ids, k, v))
    return out


def forged_import_run(lm, forged: Path, store_path: Path, fraction: float, seed: int) -> dict[str, Any]:
    """Import a forged file with recomputation: refused (nothing written) or, at a fraction < 1, missed."""
    from paging import PageStore
    from tieredkv.artifacts.portable import import_artifact, read_header
    from tieredkv.artifacts.recompute import RecomputeMismatchError, Recomputer

    shutil.rmtree(store_path, ignore_errors=True)
    rec = Recomputer(lm, read_header(forged).artifact, fraction, seed)
    with PageStore(store_path, store_config()) as s:
        try:
            import_artifact(forged, s, recompute=rec)
            caught = False
        except RecomputeMismatchError:
            caught = True
        written = s.lmdb_tier.num_pages + len(s.list_manifests())
    shutil.rmtree(store_path, ignore_errors=True)
    return {"caught": caught, "written_when_caught": written if caught else None,
            "fraction_recomputed": len(rec.checked) / len(rec.art.page_keys)}


# ----------------------------------------------------------------------------- export targets
def special_targets(root: Path) -> dict[str, Path]:
    """A FIFO, a symlink to a regular file, a directory and (as root) a character device like /dev/null."""
    root.mkdir(parents=True, exist_ok=True)
    targets = {}
    os.mkfifo(root / "fifo")
    targets["FIFO"] = root / "fifo"
    (root / "target.txt").write_text("keep")
    (root / "link").symlink_to(root / "target.txt")
    targets["symlink"] = root / "link"
    (root / "dir").mkdir()
    targets["directory"] = root / "dir"
    with contextlib.suppress(PermissionError):
        os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        targets["device node"] = root / "null"
    return targets


def node_kind(path: Path) -> str:
    mode = os.lstat(path).st_mode
    return ("symlink" if stat.S_ISLNK(mode) else "FIFO" if stat.S_ISFIFO(mode) else "directory"
            if stat.S_ISDIR(mode) else "device node" if stat.S_ISCHR(mode) else "file")


# ----------------------------------------------------------------------------- bad command-line input
def bad_cli_inputs(tmp_path: Path, store: Path, artifact_id: str) -> dict[str, tuple[list[str], str, str]]:
    """The CLI's bad inputs: name -> (argv, the error it must give, words its one line must hold).

    `store` holds artifact `artifact_id` (tiny-llama); files the inputs need are made under `tmp_path`."""
    from tieredkv.models.loading import load_model

    art_id = artifact_id
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\x00\x01\x02 not text")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    no_config = tmp_path / "empty-model"
    no_config.mkdir()
    no_tokenizer = tmp_path / "model-without-tokenizer"
    load_model("tiny-llama").model.save_pretrained(no_tokenizer)
    a_file = tmp_path / "plain-file"
    a_file.write_text("x")
    a_list = tmp_path / "list.json"
    a_list.write_text("[1, 2]")
    missing = tmp_path / "mistyped-store"
    dep = ["deposit", "--model", "tiny-llama", "--store", str(tmp_path / "new"), "--quiet"]
    qa = ["qa", "--model", "tiny-llama", "--store", str(tmp_path / "qa"), "--quiet"]
    cases = {
        "binary FILE": (dep + [str(binary)], "InputError", "is binary"),
        "non-UTF-8 FILE": (dep + [str(latin)], "InputError", "not UTF-8"),
        "directory FILE": (dep + [str(tmp_path)], "InputError", "is a directory"),
        "binary --doc": (qa + ["--doc", str(binary)], "InputError", "is binary"),
        "directory --doc": (qa + ["--doc", str(tmp_path)], "InputError", "is a directory"),
        "--page-size -1": (dep + ["--text", "hi", "--page-size", "-1"], "tieredkv deposit", ">= 1"),
        "--page-size 0": (dep + ["--text", "hi", "--page-size", "0"], "tieredkv deposit", ">= 1"),
        "--max-new-tokens -1": (["graft", "--model", "tiny-llama", "--store", str(store), "--artifact",
                                 art_id, "--prompt", "x", "--max-new-tokens", "-1"], "tieredkv graft", ">= 1"),
        "verify --samples 0": (["verify", "--model", "tiny-llama", "--samples", "0"], "tieredkv verify", ">= 1"),
        "qa --local-pages 0": (qa + ["--local-pages", "0"], "tieredkv qa", ">= 1"),
        "qa --topk-pages 0": (qa + ["--topk-pages", "0"], "tieredkv qa", ">= 1"),
        "qa --show-pages 0": (qa + ["--show-pages", "0"], "tieredkv qa", ">= 1"),
        "model dir without config": (dep[:1] + ["--model", str(no_config)] + dep[3:] + ["--text", "hi"],
                                     "ModelNotFoundError", "no config.json"),
        "model dir without tokenizer": (dep[:1] + ["--model", str(no_tokenizer)] + dep[3:] + ["--text", "hi"],
                                        "ModelNotFoundError", "tokenizer"),
        "--store is a file": (["deposit", "--model", "tiny-llama", "--store", str(a_file), "--text", "hi",
                               "--quiet"], "PagingError", "cannot open store"),
        "--store under a file": (["deposit", "--model", "tiny-llama", "--store", str(a_file / "s"), "--text",
                                  "hi", "--quiet"], "PagingError", "cannot open store"),
        "remote port 99999": (["remote", "ping", "--remote", "redis://127.0.0.1:99999/0"], "PagingError",
                              "a port is 1-65535"),
        "unknown URL parameter": (["remote", "ping", "--remote", "redis://127.0.0.1:6379/0?colour=blue"],
                                  "PagingError", "unknown remote URL parameter 'colour'"),
        "recheck a JSON list": (["recheck", str(a_list)], "RecheckError", "not a report object"),
        "recheck a directory": (["recheck", str(tmp_path)], "RecheckError", "is a directory"),
        "import a directory": (["import", str(tmp_path), "--store", str(tmp_path / "imp")], "InputError",
                               "is a directory"),
        "check a mistyped path": (["check", "--store", str(missing)], "InputError", "does not exist"),
        "stats a mistyped path": (["stats", "--store", str(missing)], "InputError", "does not exist"),
        "push a mistyped path": (["remote", "push", "--store", str(missing), "--remote",
                                  "redis://127.0.0.1:1/0?retries=0&connect_timeout=0.2"], "RemoteUnavailableError",
                                 "unreachable"),
        "graft past the window": (["graft", "--model", "tiny-llama", "--store", str(store), "--artifact",
                                   art_id, "--prompt", "x", "--max-new-tokens", "100000"], "InputError",
                                  "run past the model's window"),
        **_more_bad_cli_inputs(tmp_path, store),
    }
    return cases


def _more_bad_cli_inputs(tmp_path: Path, store: Path) -> dict[str, tuple[list[str], str, str]]:
    """A later attack on every flag (values too large, blank, or files that are not what they name);
    the library and deposit ones point their stores at tmp_path / "left-*", which must not exist after."""
    huge = str(10 ** 30)
    empty = tmp_path / "empty.json"
    empty.write_text("")
    fifo = tmp_path / "key-fifo"
    os.mkfifo(fifo)
    blank_key = tmp_path / "blank-answer.json"
    blank_key.write_text(json.dumps({"What is 2+2?": ""}))
    verify = ["verify", "--model", "tiny-llama", "--samples", "1", "--tokens", "8", "--continuation", "2", "--quiet"]
    dep = ["deposit", "--model", "tiny-llama", "--store", str(tmp_path / "left-deposit"), "--quiet"]

    def lib(verifier: str, solution: str = "4", library: str = "default") -> list[str]:
        return ["library", "add", "--model", "tiny-llama", "--store", str(tmp_path / "left-library"), "--library",
                library, "--problem", "What is 2+2?", "--solution", solution, "--verifier", verifier]
    ping = ["remote", "ping", "--remote"]
    return {
        "--store ''": (["deposit", "--model", "tiny-llama", "--store", "", "--text", "hi"], "tieredkv deposit",
                       "must name a directory"),
        "blank --text": (dep + ["--text", "   "], "EmptyInputError", "empty or blank"),
        "--page-size 10**30": (dep + ["--text", "hi", "--page-size", huge], "tieredkv deposit", "<= 65,536"),
        "verify --seed 10**30": (verify + ["--seed", huge], "tieredkv verify", "<= 9,223,372,036,854,775,807"),
        "verify --shift 10**30": (verify + ["--shift", huge], "tieredkv verify", "<= 16,777,216"),
        "library ''": (lib("arithmetic", library=""), "LibraryNameError", "non-empty"),
        "answer key, an empty file": (lib(f"answer-key:{empty}"), "TieredKVError", "not a JSON text file"),
        "answer key, a FIFO": (lib(f"answer-key:{fifo}"), "TieredKVError", "give a regular JSON file"),
        "answer key, a blank answer": (lib(f"answer-key:{blank_key}", "banana"), "TieredKVError", "empty answer"),
        "verifier os:sep": (lib("os:sep"), "VerifierSpecError", "a verifier needs"),
        "verifier class with arguments": (lib("tieredkv.library.verifiers:AnswerKeyVerifier"), "TieredKVError",
                                          "cannot be made without arguments"),
        "rejected solution": (lib("arithmetic", "5"), "SolutionRejectedError", "nothing was deposited"),
        "remote timeout=inf": (ping + ["redis://127.0.0.1:1/0?timeout=inf"], "PagingError", "finite"),
        "remote retries=10**30": (ping + [f"redis://127.0.0.1:1/0?retries={huge}"], "PagingError", "0..100"),
        "remote max_connections=-1": (ping + ["redis://127.0.0.1:1/0?max_connections=-1"], "PagingError",
                                      "fix that URL parameter"),
        "remote ?password= masked": (ping + ["redis://127.0.0.1:1/0?password=hunter3&retries=0"],
                                     "RemoteUnavailableError", "password=***"),
        "stats /dev/null": (["stats", "--store", os.devnull], "InputError", "is not a directory"),
        "graft --artifact ''": (["graft", "--model", "tiny-llama", "--store", str(store), "--artifact", "",
                                 "--prompt", "x"], "tieredkv graft", "got an empty one"),
        "check --recompute, another model": (["check", "--store", str(store), "--recompute", "1", "--model",
                                              "tiny-qwen2"], "ModelMismatchError", "needs the store's model"),
        "--model ''": (["import", str(tmp_path / "none.tkva"), "--store", str(tmp_path / "left-import"), "--model",
                        ""], "tieredkv import", "must name a model"),
        "qa --reencode-pages with --read-passages": (["qa", "--model", "tiny-llama", "--store",
                                                      str(tmp_path / "left-qa"), "--question", "What?",
                                                      "--reencode-pages", "2", "--read-passages", "3"], "InputError",
                                                     "give one or the other"),
        "qa --disk-budget 1": (["qa", "--model", "tiny-llama", "--store", str(tmp_path / "left-qa"),
                                "--disk-budget", "1"], "tieredkv qa", ">= 33554432"),
        "--text not UTF-8": (dep + ["--text", "\udcff\udcfe"], "tieredkv deposit", "is not UTF-8 text"),
        "qa --max-new-tokens 10**30": (["qa", "--model", "tiny-llama", "--store", str(tmp_path / "left-qa"),
                                       "--max-new-tokens", huge], "tieredkv qa", "<= 65,536"),
        "qa question and answer past the window": (["qa", "--model", "tiny-llama", "--store", str(tmp_path / "left-qa"),
                                                    "--max-new-tokens", "65536"], "InputError",
                                                   "runs past the model's window of 8,192"),
        "qa refused once its store is open": (["qa", "--model", "tiny-gpt2", "--store", str(tmp_path / "left-qa"),
                                               "--position", "fixed"], "UnsupportedModelError", "no single rotary"),
        "remote URL [::1": (ping + ["redis://[::1"], "PagingError", "is malformed"),
        # flags that did nothing without another one (the user took the result for what they asked)
        "import --seed without --verify-recompute": (["import", str(tmp_path / "none.tkva"), "--store",
                                                      str(tmp_path / "left-import"), "--seed", "3"], "InputError",
                                                     "give --verify-recompute FRACTION too"),
        "check --model without --recompute": (["check", "--store", str(store), "--model", "tiny-qwen2"], "InputError",
                                              "give --recompute FRACTION too"),
        "remote URL parameter twice": (ping + ["redis://127.0.0.1:1/0?retries=0&retries=5"], "PagingError",
                                       "'retries' more than once"),
        "remote URL db in the path and the query": (ping + ["redis://127.0.0.1:1/5?db=3"], "PagingError",
                                                    "'db' both in the path and as a parameter"),
        "remote URL timeout under two names": (ping + ["redis://127.0.0.1:1/0?timeout=1&socket_timeout=9"],
                                               "PagingError", "both 'timeout' and 'socket_timeout'"),
    }


__all__ = ["call", "cli_many", "one_line", "is_one_line_error",
           "damaged_store_run", "lock_deleted_run", "key_offsets",
           "damaged_key_target", "tampered_manifests", "manifest_run", "forge_file", "forged_import_run",
           "special_targets", "node_kind", "current_meta_offset", "flip_byte_bit", "artifact_roots",
           "bad_cli_inputs"]


# ----------------------------------------------------------------------------- files of a store that are not files
def store_file_cases(template: Path, root: Path) -> dict[str, Path]:
    """Copies of the store `template`, each with one of its files replaced by what it must never be taken
    for: the commit record as a FIFO, a symlink and a directory; data.mdb as a symlink; lock.mdb as a FIFO."""
    from paging.commit_record import RECORD_NAME

    root.mkdir(parents=True, exist_ok=True)
    (root / "outside").write_bytes(b"not a commit record")
    cases: dict[str, Path] = {}
    for name, file, make in (
            ("commit record is a FIFO", RECORD_NAME, os.mkfifo),
            ("commit record is a symlink", RECORD_NAME, lambda p: p.symlink_to(root / "outside")),
            ("commit record is a directory", RECORD_NAME, os.mkdir),
            ("data.mdb is a symlink", "data.mdb", lambda p: p.symlink_to(p.with_name("data.real"))),
            ("lock.mdb is a FIFO", "lock.mdb", os.mkfifo)):
        store = root / name.replace(" ", "-").replace(".", "")
        shutil.copytree(template, store)
        target = store / file
        if file == "data.mdb":
            target.rename(store / "data.real")
        else:
            target.unlink(missing_ok=True)
        make(target)
        cases[name] = store
    return cases


def refused_or_reported(result: dict) -> bool:
    """A `check` that names the file and says what it is: a report (exit 1, not healthy), or one line, exit 2."""
    if result["rc"] == 1:
        report = json.loads(result["out"])
        return not report["healthy"] and any("not a regular file" in d for d in report["store_damage"])
    return is_one_line_error(result) and "not a regular file" in result["err"]


def commit_temp_symlink_run(lm, template: Path, root: Path) -> bool:
    """A symlink where the commit record's temporary file went, pointing at a file the user can write: a
    deposit must leave that file as it was."""
    from paging import PageStore
    from paging.commit_record import RECORD_NAME
    from tieredkv.artifacts.artifact import deposit

    store = root / "commit-temp-symlink"
    shutil.copytree(template, store)
    victim = root / "victim"
    victim.write_bytes(b"keep")
    (store / f"{RECORD_NAME}.tmp").symlink_to(victim)
    with PageStore(store, store_config()) as s:
        deposit(lm, "a deposit that rewrites the commit record " * 4, s, page_size=PAGE_SIZE)
    return victim.read_bytes() == b"keep"
