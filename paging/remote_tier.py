"""Remote tier: pages and manifests shared by several machines through one Redis or Valkey.

Keys (one standalone server or one cluster, shared by every machine)::

    <prefix>:v<FORMAT_VERSION>:<fingerprint[:16]>:p:<page key>   Page.to_bytes()
    <prefix>:v<FORMAT_VERSION>:m:<artifact id>                   sha256(data) hex | data
    <prefix>:v<FORMAT_VERSION>:manifests                         SET of artifact ids
    <prefix>:v<FORMAT_VERSION>:fingerprints                      SET of model fingerprints

NOTE: no key holds a `{hash tag}`, so a cluster spreads pages over all slots and the client
splits every pipeline per node. Multi-key commands (MGET, EXISTS a b) would need one slot:
every batch is a pipeline of single-key commands instead.
NOTE: a page is looked up by its key alone but stored in its model's namespace. The tier
learns the namespaces from the pages it writes and from the `fingerprints` set.

Every value read is verified before it is returned (Page.from_bytes(expected_key=...), the
manifest's sha256). A value that fails is counted, deleted from the server if it still holds
the same bytes, and raised as CorruptPageError: it is never served. Eviction is the
server's (maxmemory-policy); an evicted page is a miss.

`RemoteTier` moves bytes. `RemoteLink` is what a PageStore does with it: the write mode
(write-through / write-back), the queue of unsent keys, and outages (a remote that is down
is skipped for `down_s` seconds with one warning; the local tiers keep working).
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import shlex
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import CorruptPageError, ManifestNotFoundError, PageConflictError, PagingError
from .framing import open_value, seal_value
from .page import FORMAT_VERSION, Page
from .tier import Tier

log = logging.getLogger(__name__)

REMOTE_MODES = ("write-through", "write-back")
_SCHEMES = {"redis": ("redis", False), "rediss": ("rediss", False), "unix": ("unix", False),
            "redis+cluster": ("redis", True), "rediss+cluster": ("rediss", True)}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_TIER_PARAMS = ("cluster", "timeout", "connect_timeout", "retries", "backoff", "batch", "ttl", "prefix", "down")
# Query parameters redis-py reads from a URL (redis.connection.URL_QUERY_ARGUMENT_PARSERS, plus names)
_CLIENT_PARAMS = frozenset({"db", "health_check_interval", "legacy_responses", "max_connections", "protocol",
                            "retry_on_error", "retry_on_timeout", "socket_connect_timeout", "socket_keepalive",
                            "socket_read_size", "socket_timeout", "client_name", "username", "password"})
_MAX_BATCH_BYTES = 64 << 20
COUNTERS = ("pages_put", "bytes_put", "pages_got", "bytes_got", "hits", "misses",
            "corrupt_detected", "round_trips")
_REFRESH_S = 1.0  # at most one re-read of the fingerprints set per second on misses
# Delete a corrupt value only if it is still the bytes we read (a writer may have fixed it).
_DELETE_IF_SAME = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
                   "return redis.call('DEL', KEYS[1]) end return 0")


class RemoteError(PagingError):
    """The remote tier failed; the local tiers still hold every page they held."""


class RemoteUnavailableError(RemoteError):
    """The server did not answer after the configured retries."""


class RemoteTierWarning(UserWarning):
    """The remote tier is unreachable or refused a write; the store carries on locally."""


def _float(name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise PagingError(f"remote URL parameter {name}={value!r} is not a number") from None
    if not math.isfinite(number):
        raise PagingError(f"remote URL parameter {name}={value!r} must be a finite number of seconds")
    return number


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise PagingError(f"remote URL parameter {name}={value!r} is not an integer") from None


@dataclass(frozen=True)
class RemoteConfig:
    """Where the remote is and how hard to try. Build it with `from_url`.

    URL: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS), ``unix:///path``,
    ``redis+cluster://host:port`` (any one node of a cluster) or ``?cluster=1``. Parameters
    of this tier (removed before the URL reaches the client): ``timeout``, ``connect_timeout``
    (seconds), ``retries``, ``backoff`` (first retry delay, doubling up to 2 s), ``batch``
    (pages per pipeline), ``ttl`` (seconds; pages only), ``prefix``, ``down`` (seconds to
    skip a remote after it failed). Other parameters go to the redis client.
    """

    url: str
    is_cluster: bool = False
    timeout_s: float = 5.0
    connect_timeout_s: float = 2.0
    retries: int = 3
    backoff_s: float = 0.1
    batch_pages: int = 32
    page_ttl_s: int | None = None
    prefix: str = "tkv"
    down_s: float = 5.0

    def __post_init__(self) -> None:
        for name, hi, zero_ok in (("timeout_s", 3600, False), ("connect_timeout_s", 3600, False),
                                  ("backoff_s", 60, True), ("down_s", 86400, True)):
            value = getattr(self, name)
            if not (1e-3 <= value <= hi or (zero_ok and value == 0)):
                raise PagingError(f"remote {name} must be {'0 or ' if zero_ok else ''}between 0.001 and {hi} "
                                  f"seconds, got {value!r}")
        if not (0 <= self.retries <= 100 and 1 <= self.batch_pages <= 100_000):
            raise PagingError(f"remote retries must be 0..100 and batch 1..100000, got "
                              f"{self.retries}, {self.batch_pages}")
        if self.page_ttl_s is not None and not 1 <= self.page_ttl_s <= 10 * 365 * 86400:
            raise PagingError(f"remote ttl must be 1 second to 10 years, got {self.page_ttl_s}")
        if not self.prefix or any(c in self.prefix for c in "{}: \t\n*?[]"):
            raise PagingError(f"remote prefix {self.prefix!r} must be non-empty without "
                              f"braces, colons, spaces or glob characters")

    @classmethod
    def from_url(cls, url: str) -> "RemoteConfig":
        if not isinstance(url, str) or "://" not in url:
            raise PagingError(f"remote must be a URL like redis://host:6379/0, got {url!r}")
        parts = _split(url)
        if parts.scheme not in _SCHEMES:
            raise PagingError(f"remote URL scheme {parts.scheme!r} is not one of "
                              f"{sorted(_SCHEMES)} (got {cls._redact(url)})")
        scheme, is_cluster = _SCHEMES[parts.scheme]
        query, kw = [], {}
        twice = _given_twice(parts)
        if twice is not None:  # NOTE: else one of the two would win without a word (a push to the wrong db)
            raise PagingError(f"remote URL {cls._redact(url)} gives {twice}; give it once")
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name == "cluster":
                if value.lower() not in _TRUE | _FALSE:
                    raise PagingError(f"remote URL parameter cluster={value!r}: use 1 or 0")
                is_cluster = is_cluster or value.lower() in _TRUE
            elif name in ("timeout", "connect_timeout", "backoff", "down"):
                kw[{"timeout": "timeout_s", "connect_timeout": "connect_timeout_s",
                    "backoff": "backoff_s", "down": "down_s"}[name]] = _float(name, value)
            elif name in ("retries", "batch", "ttl"):
                kw[{"retries": "retries", "batch": "batch_pages", "ttl": "page_ttl_s"}[name]] = \
                    _int(name, value)
            elif name == "prefix":
                kw["prefix"] = value
            elif name in _CLIENT_PARAMS or name.startswith("ssl_"):
                query.append((name, value))
            else:
                raise PagingError(
                    f"unknown remote URL parameter {name!r} in {cls._redact(url)}; this tier reads "
                    f"{', '.join(_TIER_PARAMS)}, the redis client {', '.join(sorted(_CLIENT_PARAMS))} and ssl_*")
        try:
            port = parts.port  # NOTE: urlsplit checks the range only when asked
        except ValueError as exc:
            raise PagingError(f"remote URL {cls._redact(url)}: {exc}; a port is 1-65535") from None
        if port == 0:
            raise PagingError(f"remote URL {cls._redact(url)}: port 0; a port is 1-65535")
        if is_cluster and scheme == "unix":
            raise PagingError("a cluster is reached over TCP: use redis+cluster://host:port")
        client_url = f"{scheme}://{parts.netloc}{parts.path}" + (
            f"?{urlencode(query)}" if query else "")
        return cls(url=client_url, is_cluster=is_cluster, **kw)

    @staticmethod
    def _redact(url: str) -> str:
        """`url` with the password of its user part and of a ?password= parameter replaced by ***."""
        try:
            parts = urlsplit(url)
        except ValueError:  # malformed: the whole user part goes, it cannot be told apart
            return re.sub(r"(?i)(password=)[^&#]*", r"\1***", re.sub(r"//[^/?#]*@", "//***@", url, count=1))
        if parts.password is not None:
            user = parts.username or ""
            parts = parts._replace(netloc=f"{user}:***@{parts.netloc.rsplit('@', 1)[1]}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        if any(name == "password" for name, _ in query):
            parts = parts._replace(query="&".join(f"{n}=***" if n == "password" else urlencode([(n, v)])
                                                  for n, v in query))
        return urlunsplit(parts)

    @property
    def safe_url(self) -> str:
        """The URL with any password replaced by ***, for messages and reports."""
        return self._redact(self.url) + (" (cluster)" if self.is_cluster else "")


def _split(url: str):
    try:
        return urlsplit(url)
    except ValueError as exc:  # NOTE: urlsplit checks a [bracketed] host; a bad one is a raw ValueError
        raise PagingError(f"remote URL {RemoteConfig._redact(url)} is malformed ({exc}); give one like "
                          f"redis://host:6379/0, an IPv6 host in brackets: redis://[::1]:6379/0") from None


def push_command(store_path: str, url: str) -> str:
    """The command that uploads to `url` what the store at `store_path` could not send (password shown as ***)."""
    return f"tieredkv remote push --store {shlex.quote(store_path)} --remote {shlex.quote(RemoteConfig._redact(url))}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# settings a URL can give under two names: the tier's parameter and the redis client's own
_SAME_SETTING = (("timeout", "socket_timeout"), ("connect_timeout", "socket_connect_timeout"))


def _given_twice(parts) -> str | None:
    """What a URL sets twice, said for the message: a query parameter repeated, one setting under both
    of its names, or the db / user / password both in the URL's body and as a parameter. None if nothing."""
    given = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
    twice = next((name for i, name in enumerate(given) if name in given[:i]), None)
    if twice is not None:
        return f"parameter {twice!r} more than once"
    for a, b in _SAME_SETTING:
        if a in given and b in given:
            return f"one setting as both {a!r} and {b!r}"
    db_in_path = _SCHEMES[parts.scheme][0] != "unix" and parts.path.strip("/") != ""  # unix: the path is the socket
    for name, in_body, where in (("db", db_in_path, "the path"),
                                 ("password", parts.password is not None, "the user part"),
                                 ("username", parts.username not in (None, ""), "the user part")):
        if name in given and in_body:
            return f"{name!r} both in {where} and as a parameter"
    return None


def _connect(config: RemoteConfig):
    try:
        import redis  # NOTE: imported here: redis is optional (pip install tieredkv[remote])
    except ImportError:
        raise PagingError("the remote tier needs the redis client: pip install "
                          "'tieredkv[remote]' (or pip install 'redis>=5')") from None
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    kw = dict(socket_timeout=config.timeout_s, socket_connect_timeout=config.connect_timeout_s,
              retry=Retry(ExponentialBackoff(cap=2.0, base=config.backoff_s), config.retries),
              retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError])
    try:
        if config.is_cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(config.url, **kw)
        return redis.Redis.from_url(config.url, **kw)
    except (ValueError, TypeError) as exc:  # a client parameter of the URL that redis-py refuses
        raise PagingError(f"remote URL {config.safe_url}: {exc}; fix that URL parameter") from None


def _chunks(pages: Sequence[Page], max_pages: int) -> Iterator[list[Page]]:
    chunk: list[Page] = []
    nbytes = 0
    for page in pages:
        if chunk and (len(chunk) >= max_pages or nbytes + page.nbytes > _MAX_BATCH_BYTES):
            yield chunk
            chunk, nbytes = [], 0
        chunk.append(page)
        nbytes += page.nbytes
    if chunk:
        yield chunk


class RemoteTier(Tier):
    """Pages on a Redis/Valkey server (or cluster). Blocking; one client per tier.

    `put` never returns False: the server evicts by its own policy, and a refused write
    raises RemoteError. Network failures raise RemoteUnavailableError after the client's
    retries (exponential backoff).
    """

    name = "remote"

    def __init__(self, config: RemoteConfig | str, *, fingerprints: Iterable[str] = (),
                 client: Any = None) -> None:
        self.config = RemoteConfig.from_url(config) if isinstance(config, str) else config
        self._ns = f"{self.config.prefix}:v{FORMAT_VERSION}"
        self._fps: list[str] = list(dict.fromkeys(fingerprints))  # most recently useful first
        self._fps_read_at = float("-inf")
        self.counters = dict.fromkeys(COUNTERS, 0)
        # called with the operation's name before each pipeline: an observer, and the seam where
        # the fault tests restart or kill the server in the middle of a transfer
        self.before_round_trip: Callable[[str], None] | None = None
        if client is None:
            with self._io("connect"):
                client = _connect(self.config)  # standalone: lazy; cluster: reads slots now
        self._client = client

    # -- plumbing ---------------------------------------------------------------------
    @contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """Translate client errors into typed paging errors that say what to do."""
        try:
            yield
        except PagingError:
            raise
        except Exception as exc:
            import redis.exceptions as rx

            where = self.config.safe_url
            if isinstance(exc, rx.OutOfMemoryError):
                raise RemoteError(
                    f"{where} refused {what}: out of memory with maxmemory-policy noeviction; "
                    f"set maxmemory-policy allkeys-lru (or volatile-lru with ?ttl=)") from exc
            if isinstance(exc, (rx.AuthenticationError, rx.NoPermissionError)):
                raise RemoteError(f"{where} refused {what}: {exc}; check the user, password "
                                  f"and ACL in the remote URL") from exc
            if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, rx.ClusterError,
                                rx.RedisClusterException, rx.TryAgainError, OSError)):
                raise RemoteUnavailableError(
                    f"remote {where} unreachable during {what} after "
                    f"{self.config.retries} retries ({type(exc).__name__}: {exc}); check that "
                    f"the server is up and the URL is right") from exc
            if isinstance(exc, rx.RedisError):
                raise RemoteError(f"remote {where} failed during {what} "
                                  f"({type(exc).__name__}: {exc})") from exc
            raise

    def _run(self, what: str, build: Callable[[Any], None]) -> list:
        """One pipeline (no MULTI/EXEC): one round trip per node."""
        if self.before_round_trip is not None:
            self.before_round_trip(what)
        with self._io(what):
            pipe = self._client.pipeline(transaction=False)
            build(pipe)
            out = pipe.execute()
        self.counters["round_trips"] += 1
        return out

    def page_name(self, fingerprint: str, key: str) -> str:
        return f"{self._ns}:{fingerprint[:16]}:p:{key}"

    def manifest_name(self, artifact_id: str) -> str:
        return f"{self._ns}:m:{artifact_id}"

    @property
    def _manifests_set(self) -> str:
        return f"{self._ns}:manifests"

    @property
    def _fps_set(self) -> str:
        return f"{self._ns}:fingerprints"

    def ping(self) -> float:
        """Round-trip seconds of one PING."""
        t = time.perf_counter()
        with self._io("ping"):
            self._client.ping()
        return time.perf_counter() - t

    def server_info(self) -> dict[str, Any]:
        """Version, eviction policy and memory of the server (first node of a cluster)."""
        with self._io("info"):
            info = self._client.info()
        if self.config.is_cluster and info and all(isinstance(v, dict) for v in info.values()):
            info = next(iter(info.values()))
        return {k: info.get(k) for k in ("redis_version", "valkey_version", "maxmemory",
                                         "maxmemory_policy", "used_memory") if k in info}

    # -- namespaces -------------------------------------------------------------------
    def _learn(self, fingerprint: str) -> None:
        if fingerprint in self._fps:
            self._fps.remove(fingerprint)
        self._fps.insert(0, fingerprint)

    def _refresh_fps(self) -> None:
        members = self._run("read of the fingerprints set",
                            lambda pipe: pipe.smembers(self._fps_set))[0]
        self._fps_read_at = time.monotonic()
        for fp in sorted(m.decode() for m in members):
            if fp not in self._fps:
                self._fps.append(fp)

    def _probe(self, keys: Sequence[str], op: str) -> tuple[list[Any], list[str | None]]:
        """Raw GET/EXISTS results per key and the fingerprint each was found under.

        Known namespaces first; on misses, the `fingerprints` set is re-read (at most once
        a second) and new namespaces are tried.
        """
        found: list[Any] = [None] * len(keys)
        where: list[str | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        tried: set[str] = set()
        for attempt in range(2):
            stale = time.monotonic() - self._fps_read_at >= _REFRESH_S
            if (attempt == 1 or not self._fps) and stale and todo:
                self._refresh_fps()
            fps = [fp for fp in self._fps if fp not in tried]
            if not fps or not todo:
                continue
            tried.update(fps)
            for start in range(0, len(todo), self.config.batch_pages):
                batch = todo[start:start + self.config.batch_pages]
                names = [self.page_name(fp, keys[i]) for i in batch for fp in fps]
                replies = self._run(f"{op} of {len(batch)} pages", lambda pipe: [
                    getattr(pipe, op)(n) for n in names])
                for j, i in enumerate(batch):
                    for f, fp in enumerate(fps):
                        reply = replies[j * len(fps) + f]
                        if reply:  # bytes (GET) or 1 (EXISTS)
                            found[i], where[i] = reply, fp
                            break
            todo = [i for i in todo if found[i] is None]
        return found, where

    # -- pages ------------------------------------------------------------------------
    def put(self, page: Page) -> bool:
        return self.put_many([page])[0]

    def put_many(self, pages: Iterable[Page]) -> list[bool]:
        """SET every page (last writer wins; pages are content-addressed) in pipelines."""
        pages = list(pages)
        ttl = self.config.page_ttl_s
        for chunk in _chunks(pages, self.config.batch_pages):
            items = [(self.page_name(p.fingerprint, p.key), p.to_bytes()) for p in chunk]
            fps = sorted({p.fingerprint for p in chunk})

            def build(pipe: Any) -> None:
                for name, raw in items:
                    pipe.set(name, raw, ex=ttl)
                pipe.sadd(self._fps_set, *fps)  # NOTE: every batch: the set may be evicted
            self._run(f"put of {len(items)} pages", build)
            self.counters["pages_put"] += len(items)
            self.counters["bytes_put"] += sum(len(raw) for _, raw in items)
            for fp in fps:
                self._learn(fp)
        return [True] * len(pages)

    def fetch(self, keys: Iterable[str]) -> tuple[list[Page | None], dict[str, CorruptPageError]]:
        """Verified pages (None where missing) and the keys whose bytes failed verification."""
        keys = list(keys)
        raws, where = self._probe(keys, "get")
        pages: list[Page | None] = [None] * len(keys)
        corrupt: dict[str, CorruptPageError] = {}
        for i, (key, raw, fp) in enumerate(zip(keys, raws, where)):
            if raw is None:
                self.counters["misses"] += 1
                continue
            try:
                page = Page.from_bytes(raw, expected_key=key)
                if page.fingerprint[:16] != fp[:16]:
                    raise CorruptPageError(key, f"stored in the namespace of model {fp[:16]} "
                                                f"but made by {page.fingerprint[:16]}")
            except CorruptPageError as exc:
                self.counters["corrupt_detected"] += 1
                corrupt[key] = CorruptPageError(key, f"remote {self.config.safe_url}: {exc.reason}")
                self._delete_if_same(self.page_name(fp, key), raw)
                continue
            pages[i] = page
            self._learn(fp)
            self.counters["hits"] += 1
            self.counters["pages_got"] += 1
            self.counters["bytes_got"] += len(raw)
        return pages, corrupt

    def _delete_if_same(self, name: str, raw: bytes) -> None:
        try:
            with self._io("delete of a corrupt page"):
                self._client.eval(_DELETE_IF_SAME, 1, name, raw)
        except RemoteError as exc:  # scripting disabled, or gone: the value stays unserved
            log.info("could not delete corrupt remote value %s: %s", name, exc)

    def get(self, key: str) -> Page | None:
        """The verified page, or None. Bytes that fail verification raise CorruptPageError."""
        pages, corrupt = self.fetch([key])
        if corrupt:
            raise corrupt[key]
        return pages[0]

    def get_many(self, keys: Iterable[str]) -> list[Page | None]:
        """Verified pages; None where missing or corrupt (counted in `counters`)."""
        return self.fetch(keys)[0]

    def contains_many(self, keys: Iterable[str]) -> list[bool]:
        found, _ = self._probe(list(keys), "exists")
        return [bool(f) for f in found]

    def contains(self, key: str) -> bool:
        return self.contains_many([key])[0]

    def remove(self, key: str) -> bool:
        if time.monotonic() - self._fps_read_at >= _REFRESH_S:
            self._refresh_fps()
        names = [self.page_name(fp, key) for fp in self._fps]
        return bool(names) and any(self._run("delete", lambda p: [p.delete(n) for n in names]))

    def keys(self) -> Iterator[str]:
        """Every page key on the server (SCAN; O(keys) — for tools, not hot paths)."""
        marker = ":p:"
        with self._io("scan"):
            for name in self._client.scan_iter(match=f"{self._ns}:*{marker}*", count=1000):
                yield name.decode().rsplit(marker, 1)[1]

    @property
    def num_pages(self) -> int:
        return sum(1 for _ in self.keys())

    @property
    def nbytes(self) -> int:
        """Stored bytes of every page, framing included (SCAN + STRLEN; O(keys))."""
        with self._io("scan"):
            names = list(self._client.scan_iter(match=f"{self._ns}:*:p:*", count=1000))
        total = 0
        for start in range(0, len(names), 1000):
            batch = names[start:start + 1000]
            total += sum(self._run("strlen", lambda pipe: [pipe.strlen(n) for n in batch]))
        return total

    # -- manifests --------------------------------------------------------------------
    def put_manifest(self, artifact_id: str, data: bytes) -> None:
        """Store `data` under `artifact_id` (first writer wins: other valid bytes under the
        same id raise PageConflictError; corrupt bytes are replaced)."""
        name = self.manifest_name(artifact_id)
        value = seal_value(data)
        created, old = self._run("manifest put", lambda pipe: (
            pipe.set(name, value, nx=True), pipe.get(name), pipe.sadd(self._manifests_set,
                                                                        artifact_id)))[:2]
        if created or old == value:
            return
        if old is not None and open_value(old) is not None:
            raise PageConflictError(f"manifest {artifact_id!r} exists on {self.config.safe_url} "
                                    f"with other bytes; delete it there first to replace it")
        self._run("manifest put", lambda pipe: pipe.set(name, value))

    def get_manifest(self, artifact_id: str) -> bytes:
        raw = self._run("manifest get", lambda pipe: pipe.get(self.manifest_name(artifact_id)))[0]
        if raw is None:
            raise ManifestNotFoundError(f"no manifest {artifact_id!r} on {self.config.safe_url}")
        data = open_value(raw)
        if data is None:
            self.counters["corrupt_detected"] += 1
            self._delete_if_same(self.manifest_name(artifact_id), raw)
            raise CorruptPageError(artifact_id, f"manifest sha256 mismatch on "
                                                f"{self.config.safe_url}")
        return data

    def list_manifests(self) -> list[str]:
        members = self._run("manifest list", lambda pipe: pipe.smembers(self._manifests_set))[0]
        return sorted(m.decode() for m in members)

    def delete_manifest(self, artifact_id: str) -> bool:
        deleted, _ = self._run("manifest delete", lambda pipe: (
            pipe.delete(self.manifest_name(artifact_id)),
            pipe.srem(self._manifests_set, artifact_id)))
        return bool(deleted)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # closing a dead connection must not mask the real error
            pass


class RemoteLink:
    """What a PageStore does with a remote tier: write mode, unsent keys, outages.

    - write-through: each put is sent at once; write-back: keys queue up and are sent in
      batches of `batch_pages`, before any manifest, and on `flush`/`close`.
    - The queue holds keys, not pages: at flush time pages are re-read from the local tiers
      (`load`), so a long outage costs no memory. Manifests queue behind their pages, so
      the remote never names an artifact whose pages were not sent first.
    - After a failure the remote is skipped for `down_s` seconds (one warning per outage):
      reads are misses, writes wait in the queue. Nothing unverified is ever returned.
    """

    def __init__(self, config: RemoteConfig, mode: str, load: Callable[[str], Page | None], *,
                 push: str = "tieredkv remote push --store DIR --remote URL") -> None:
        """`push`: the command that uploads what was not sent (push_command), named in the warning at close."""
        if mode not in REMOTE_MODES:
            raise PagingError(f"remote_mode must be one of {REMOTE_MODES}, got {mode!r}")
        self.config, self.mode, self._load, self._push = config, mode, load, push
        self.tier: RemoteTier | None = None
        self._pending: dict[str, None] = {}  # ordered set of page keys not yet sent
        self._pending_manifests: dict[str, bytes] = {}
        self._down_until = 0.0
        self._is_down = False
        self.outages = 0
        self.last_error: str | None = None
        self._available()

    # -- outages ----------------------------------------------------------------------
    def _available(self) -> RemoteTier | None:
        if time.monotonic() < self._down_until:
            return None
        if self.tier is None:
            try:
                self.tier = RemoteTier(self.config)
                self.tier.ping()
            except RemoteError as exc:
                if self.tier is not None:
                    self.tier.close()
                    self.tier = None
                self._fail(exc)
                return None
        return self.tier

    def _fail(self, exc: Exception) -> None:
        self._down_until = time.monotonic() + self.config.down_s
        self.last_error = str(exc)
        if not self._is_down:
            self._is_down = True
            self.outages += 1
            warnings.warn(_one_line(f"{exc} — continuing with the local tiers only; retrying the remote "
                                    f"in {self.config.down_s:g} s"), RemoteTierWarning, stacklevel=4)

    def _call(self, fn: Callable[[RemoteTier], Any], default: Any) -> Any:
        tier = self._available()
        if tier is None:
            return default
        try:
            out = fn(tier)
        except RemoteError as exc:
            self._fail(exc)
            return default
        if self._is_down:
            self._is_down = False
            log.warning("remote %s is reachable again", self.config.safe_url)
        return out

    @property
    def is_up(self) -> bool:
        return self.tier is not None and not self._is_down

    # -- pages ------------------------------------------------------------------------
    def publish(self, pages: Sequence[Page]) -> None:
        """Pages just written locally: send now (write-through) or queue (write-back)."""
        for page in pages:
            self._pending[page.key] = None
        if self.mode == "write-through" or len(self._pending) >= self.config.batch_pages:
            self.flush({p.key: p for p in pages})

    def flush(self, at_hand: dict[str, Page] | None = None) -> int:
        """Send queued pages, then queued manifests; returns pages sent. Stops at an outage."""
        at_hand = at_hand or {}
        sent = 0
        while self._pending:
            keys = list(itertools.islice(self._pending, self.config.batch_pages))
            pages = [p for p in (at_hand.get(k) or self._load_quietly(k) for k in keys) if p]
            if pages and self._call(lambda t: t.put_many(pages), None) is None:
                return sent
            for k in keys:
                del self._pending[k]
            sent += len(pages)
        for artifact_id, data in list(self._pending_manifests.items()):
            if self._call(lambda t: self._put_manifest(t, artifact_id, data), None) is None:
                break
            del self._pending_manifests[artifact_id]
        return sent

    def _load_quietly(self, key: str) -> Page | None:
        try:
            return self._load(key)
        except CorruptPageError as exc:  # quarantined locally: do not spread it
            log.warning("not sending %s to the remote: %s", key, exc)
            return None

    @staticmethod
    def _put_manifest(tier: RemoteTier, artifact_id: str, data: bytes) -> bool:
        try:
            tier.put_manifest(artifact_id, data)
        except PageConflictError as exc:  # the remote keeps the first writer's manifest
            warnings.warn(str(exc), RemoteTierWarning, stacklevel=5)
        return True

    def fetch(self, keys: Sequence[str]) -> tuple[list[Page | None], dict[str, CorruptPageError]]:
        return self._call(lambda t: t.fetch(keys), ([None] * len(keys), {}))

    def contains(self, key: str) -> bool:
        return self._call(lambda t: t.contains(key), False)

    def remove(self, key: str) -> bool:
        self._pending.pop(key, None)
        return self._call(lambda t: t.remove(key), False)

    # -- manifests --------------------------------------------------------------------
    def put_manifest(self, artifact_id: str, data: bytes) -> None:
        self._pending_manifests[artifact_id] = bytes(data)
        self.flush()

    def get_manifest(self, artifact_id: str) -> bytes | None:
        def get(t: RemoteTier) -> bytes | None:
            try:
                return t.get_manifest(artifact_id)
            except ManifestNotFoundError:
                return None
        return self._call(get, None)

    def list_manifests(self) -> list[str]:
        return self._call(lambda t: t.list_manifests(), [])

    def delete_manifest(self, artifact_id: str) -> bool:
        self._pending_manifests.pop(artifact_id, None)
        return self._call(lambda t: t.delete_manifest(artifact_id), False)

    # -- lifecycle --------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        counters = dict.fromkeys(COUNTERS, 0)
        if self.tier is not None:
            counters.update(self.tier.counters)
        return {"url": self.config.safe_url, "mode": self.mode, "is_up": self.is_up,
                "pending_pages": len(self._pending),
                "pending_manifests": len(self._pending_manifests), "outages": self.outages,
                "last_error": self.last_error, **counters}

    def close(self) -> None:
        self._down_until = 0.0  # one last attempt, even inside an outage window
        self.flush()
        if self._pending or self._pending_manifests:
            warnings.warn(_one_line(
                f"{len(self._pending)} pages and {len(self._pending_manifests)} manifests were "
                f"not written to remote {self.config.safe_url} ({self.last_error}); they are "
                f"safe in the local store — `{self._push}` uploads them"), RemoteTierWarning, stacklevel=3)
        if self.tier is not None:
            self.tier.close()
