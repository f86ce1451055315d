"""Two hosts, one server: host 1 deposits, host 2 (another process, its own LMDB and model
cache) finds the artifact by id on the server and grafts it; the continuation logits are
SHA-256-equal to a fresh computation. Then the server restarts / dies in the middle of a graft."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from paging import PageNotFoundError, PageStore, RemoteTierWarning, StoreConfig
from testkit.redis_server import RedisServer, requires_server
from tieredkv.artifacts.artifact import deposit, graft, load_artifact, prefill
from tieredkv.provenance.domain import sha256_tensor
from tieredkv.question.corpus import python_reference

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
PREFIX_CHARS, CONT_CHARS = 1000, 40  # ByteTokenizer: one token per byte; 32-token pages

HOST = r'''
import json, sys
import torch
from transformers import DynamicCache
from paging import PageStore, StoreConfig
from tieredkv.artifacts.artifact import deposit, graft, load_artifact, prefill
from tieredkv.question.corpus import python_reference
from tieredkv.provenance.domain import sha256_tensor
from tieredkv.models.loading import load_model

role, store_dir, url, artifact_id = sys.argv[1:5]
lm = load_model("{model}")
text = python_reference()
prefix, cont = lm.codec.encode(text[:{p}]), lm.codec.encode(text[{p}:{p} + {c}])
ps = lm.default_page_size

def continuation(cache, start):
    logits = []
    prefill(lm, cont, cache, start=start, page_size=ps, logits_to_keep=0,
            on_chunk=lambda s, e, out: logits.append(out.logits[0]))
    return sha256_tensor(torch.cat(logits))

fresh = DynamicCache(config=lm.model.config)
prefill(lm, prefix, fresh, page_size=ps)
out = {{"fresh_sha256": continuation(fresh, len(prefix)), "fingerprint": lm.fingerprint}}
with PageStore(store_dir, StoreConfig(remote=url)) as store:
    if role == "deposit":
        art = deposit(lm, prefix, store, page_size=ps)
        out.update(artifact=art.artifact_id, pages=len(art.page_keys))
    else:
        out["lmdb_pages_before"] = store.lmdb_tier.num_pages
        art = load_artifact(store, artifact_id)          # manifest from the server
        cache = graft(lm, art, store)                    # pages from the server, verified
        out.update(graft_sha256=continuation(cache, art.num_tokens), pages=len(art.page_keys),
                   lmdb_pages_after=store.lmdb_tier.num_pages,
                   remote_hits=store.stats()["remote"]["hits"],
                   corrupt=store.stats()["remote"]["corrupt_detected"])
print(json.dumps(out))
'''.format(model=MODEL, p=PREFIX_CHARS, c=CONT_CHARS)


def run_host(tmp_path, name: str, role: str, url: str, artifact_id: str = "-") -> dict:
    env = {**os.environ, "TIEREDKV_CACHE": str(tmp_path / f"{name}-cache"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("TIEREDKV_REMOTE", None)
    proc = subprocess.run([sys.executable, "-c", HOST, role, str(tmp_path / f"{name}-lmdb"),
                           url, artifact_id], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_hosts_deposit_and_graft_through_the_server(redis_server, tmp_path):
    h1 = run_host(tmp_path, "host1", "deposit", redis_server.url)
    h2 = run_host(tmp_path, "host2", "graft", redis_server.url, h1["artifact"])
    assert h1["pages"] == h2["pages"] == -(-PREFIX_CHARS // 32)
    assert h2["lmdb_pages_before"] == 0 and h2["lmdb_pages_after"] == h2["pages"]
    assert h2["remote_hits"] == h2["pages"] and h2["corrupt"] == 0
    assert h2["graft_sha256"] == h2["fresh_sha256"] == h1["fresh_sha256"]


# -- the server restarts / dies while host 2 grafts (in this process) -----------------
def _continuation_sha(lm, cache, start: int, cont: list[int]) -> str:
    logits = []
    prefill(lm, cont, cache, start=start, page_size=lm.default_page_size, logits_to_keep=0,
            on_chunk=lambda s, e, out: logits.append(out.logits[0]))
    return sha256_tensor(torch.cat(logits))


def _hook_after(store: PageStore, num_calls: int, action) -> None:
    """Run `action` right before the remote tier's `num_calls`-th pipeline."""
    calls = [0]

    def hook(what):
        calls[0] += 1
        if calls[0] == num_calls:
            action()
    store.remote_tier.before_round_trip = hook


@requires_server
def test_graft_survives_a_restart_and_fails_clearly_when_the_server_dies(lm, tmp_path):
    text = python_reference()
    prefix = lm.codec.encode(text[:PREFIX_CHARS])
    cont = lm.codec.encode(text[PREFIX_CHARS:PREFIX_CHARS + CONT_CHARS])
    fresh = DynamicCache(config=lm.model.config)
    prefill(lm, prefix, fresh, page_size=lm.default_page_size)
    fresh_sha = _continuation_sha(lm, fresh, len(prefix), cont)
    with RedisServer(tmp_path / "r", appendonly=True) as server:
        url = f"{server.url}?retries=6&backoff=0.05&down=60"
        with PageStore(tmp_path / "h1", StoreConfig(remote=url)) as h1:
            art = deposit(lm, prefix, h1)
        with PageStore(tmp_path / "h2", StoreConfig(remote=url)) as h2:
            _hook_after(h2, 6, server.restart)  # mid-graft: retried, then verified pages
            cache = graft(lm, load_artifact(h2, art.artifact_id), h2)
            assert _continuation_sha(lm, cache, art.num_tokens, cont) == fresh_sha
            assert h2.stats()["remote"]["hits"] == len(art.page_keys)
        with PageStore(tmp_path / "h3", StoreConfig(remote=url.replace(
                "retries=6", "retries=1"))) as h3:
            found = load_artifact(h3, art.artifact_id)
            # page-by-page reads here: graft's pipelined prefetch would fetch every page in one
            # round trip, before the kill; this test is about the server dying between reads
            h3.prefetch = lambda keys: 0
            _hook_after(h3, 4, server.kill)     # mid-graft: dead for good
            with pytest.warns(RemoteTierWarning, match="unreachable"):
                with pytest.raises(PageNotFoundError, match="unreachable"):
                    graft(lm, found, h3)
            assert 0 < h3.lmdb_tier.num_pages < len(art.page_keys)  # only verified pages
            for key in h3.lmdb_tier.keys():
                assert h3.get(key).key == key
