"""The second cache tier: embeddings in a Redis-protocol server (Valkey, Redis) shared by every worker and replica.

The worker's LRU (:mod:`handlers.text.cache`, L1) is asked first; its misses go to this tier (L2) in ONE ``MGET``
per batch, and the rows the batch computed are written back in ONE pipelined ``SET ... EX`` after the answers are
formed. Serving never depends on it: every call is bounded by ``timeout_ms``, an error or timeout is a miss, and a
circuit breaker stops asking for ``breaker_cooldown_s`` after ``breaker_failures`` consecutive failures (then one
trial call decides: closed again, or open for another cool-down).

Keys: ``emb:{model}:{version}:`` (readable, for operators' ``SCAN``/``UNLINK``) + a hash of model, version, backend,
precision, token limit and the row's digest, so one model's or version's entries can never be looked up by another.
Values (never pickle): a fixed header, then raw little-endian numbers, laid out as the model's kind keeps a row
(handlers/text/kinds: :data:`VECTOR` one float32 row, :data:`SPARSE` int32 token ids then their float32 weights,
:data:`MATRIX` float32 token vectors)::

    magic b"TSRw" | format u8 | flags u8 (bit 0: truncated) | count u32 | tokens u32 | key check 8 bytes

``count`` is the row's floats (a vector), non-zero entries (sparse) or token vectors (a matrix). The key check is the
start of the key's own hash: a value copied from another key (another text, model or version) does not decode. A
value is used only when its length, magic, format, count, token count and key check hold and its kind accepts the
numbers (finite; unit length where the model normalises; ids inside the vocabulary); anything else is a miss, and
the recomputed row overwrites it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import torch

from handlers.core.config import Bounds, Option, check_bounds, with_defaults
from handlers.core.metrics import HandlerMetrics
from handlers.text.cache import CachedRow, CacheKey

logger = logging.getLogger(__name__)

# The deployment's URL and password file, when they differ from the archive's model-config.yaml (docs/cache.md): the
# test suite and the load tools point an archive at their own cache server on a free port; production passes the
# password in a file written by scripts/ops/cache_server.py, never in the archive.
URL_ENV = "TS_SHARED_CACHE_URL"
PASSWORD_FILE_ENV = "TS_SHARED_CACHE_PASSWORD_FILE"

MAGIC = b"TSRw"
FORMAT_VERSION = 2
HEADER = struct.Struct("<4sBBII8s")  # magic, format, flags, count, tokens, key check
TRUNCATED_FLAG = 1
VECTOR, SPARSE, MATRIX = "vector", "sparse", "matrix"  # how a kind keeps a row (TextKind.value_layout)

DEFAULTS: dict[str, Any] = {
    "url": "",
    "ttl_s": 86400,
    "timeout_ms": 20,
    "max_value_bytes": 8192,
    "breaker_failures": 3,
    "breaker_cooldown_s": 5.0,
}
# key -> (type, minimum, maximum, what it is for)
FIELDS: Bounds = {
    "ttl_s": (int, 1, 30 * 86400, "seconds an entry lives in the server"),
    "timeout_ms": (int, 1, 1000, "bound of each round trip (one MGET, one pipelined SET per batch)"),
    "max_value_bytes": (int, 64, 1 << 20, "larger values are neither written nor read"),
    "breaker_failures": (int, 1, 1000, "consecutive failed round trips that open the breaker"),
    "breaker_cooldown_s": (float, 0.1, 3600, "seconds the open breaker stops asking before one trial call"),
}
URL_SCHEMES = ("redis", "rediss", "unix")


def check_settings(option: Option, key: str, value: Any) -> dict[str, Any]:
    """The ``shared_cache`` dict with defaults filled in; unknown keys, wrong types and hostile values refused."""
    settings = with_defaults(option, key, value, DEFAULTS)
    check_url(option, key, settings["url"])
    check_bounds(option, key, settings, FIELDS)
    return settings


def check_url(option: Option, key: str, url: Any) -> None:
    if not isinstance(url, str):
        option.refuse(key, f"url: expected a string, got {url!r}")
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in URL_SCHEMES:
        option.refuse(key, f"url: {url!r} must start with one of {[s + '://' for s in URL_SCHEMES]}, or be empty")
    if parts.scheme != "unix" and not parts.hostname:
        option.refuse(key, f"url: {url!r} names no host")
    if parts.password:
        option.refuse(key, f"url: {redacted(url)} holds a password; give it in ${PASSWORD_FILE_ENV} instead")


SHARED_CACHE_OPTION = Option(
    dict,
    DEFAULTS,
    help="the second cache tier in a Redis-protocol server (docs/cache.md): fields url ('' = off), ttl_s, "
    "timeout_ms, max_value_bytes, breaker_failures, breaker_cooldown_s; $" + URL_ENV + " overrides url",
    validator=check_settings,
)


def redacted(url: str) -> str:
    """The URL without its password (for logs and describe)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def effective_url(configured: str) -> str:
    """$TS_SHARED_CACHE_URL when set (empty turns the tier off), else the archive's url."""
    return os.environ.get(URL_ENV, configured)


def read_password() -> str | None:
    path = os.environ.get(PASSWORD_FILE_ENV)
    if not path:
        return None
    with open(path, encoding="utf-8") as file:
        return file.read().strip() or None


# ----------------------------------------------------------------------------------------------- keys and values
@dataclass(frozen=True)
class Namespace:
    """What, besides the row, determines its value: one worker's model, version, backend, precision and limit, and
    how its kind lays a value out; ``identity`` is the digest of the model's content (handlers/core/identity.py), so
    a model re-packaged under the same name and version never reads the vectors of the one before."""

    model: str
    version: str
    backend: str
    precision: str
    max_tokens: int
    width: int  # floats per row (VECTOR) or per token vector (MATRIX); the vocabulary (SPARSE)
    layout: str = VECTOR
    identity: str = field(kw_only=True)

    @property
    def prefix(self) -> bytes:
        return f"emb:{self.model}:{self.version}:".encode()

    @functools.cached_property
    def fingerprint(self) -> bytes:
        # Length-prefixed fields: ("a:b", "c") and ("a", "b:c") must not hash alike.
        fields = (self.model, self.version, self.identity, self.backend, self.precision, str(self.max_tokens))
        return b"".join(len(f.encode()).to_bytes(4, "little") + f.encode() for f in fields)

    def key_hash(self, key: CacheKey) -> bytes:
        """The hash naming one row's entry (``key[0]`` is the row's digest, see cache.cache_key)."""
        return hashlib.blake2b(self.fingerprint + key[0], digest_size=16).digest()

    def server_key(self, key: CacheKey) -> bytes:
        return self.prefix + self.key_hash(key).hex().encode()


def float32_bytes(values: torch.Tensor) -> bytes:
    return values.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


def encode_value(namespace: Namespace, key: CacheKey, entry: CachedRow) -> bytes:
    if namespace.layout == SPARSE:
        ids, weights = entry.value
        count = int(ids.numel())
        payload = ids.to(torch.int32).numpy().astype("<i4", copy=False).tobytes() + float32_bytes(weights)
    else:
        count = int(entry.value.shape[0])
        payload = float32_bytes(entry.value)
    flags = TRUNCATED_FLAG if entry.truncated else 0
    return HEADER.pack(MAGIC, FORMAT_VERSION, flags, count, entry.tokens, namespace.key_hash(key)[:8]) + payload


def payload_size(namespace: Namespace, count: int) -> int:
    if namespace.layout == SPARSE:
        return 8 * count
    return 4 * count * (namespace.width if namespace.layout == MATRIX else 1)


def decode_value(
    namespace: Namespace, key: CacheKey, value: bytes | None, accepts: Callable[[Any], bool]
) -> CachedRow | None:
    """The entry a stored value holds for ``key``, or None when it is absent or fails any check (``accepts``: the
    kind's check of the numbers)."""
    if value is None or len(value) < HEADER.size:
        return None
    magic, version, flags, count, tokens, check = HEADER.unpack_from(value)
    if (
        magic != MAGIC
        or version != FORMAT_VERSION
        or flags & ~TRUNCATED_FLAG
        or (namespace.layout == VECTOR and count != namespace.width)
        or count > (namespace.max_tokens if namespace.layout == MATRIX else namespace.width)
        or len(value) != HEADER.size + payload_size(namespace, count)
        or not 1 <= tokens <= namespace.max_tokens
        or check != namespace.key_hash(key)[:8]
    ):
        return None
    numbers = value[HEADER.size :]
    decoded: Any
    if namespace.layout == SPARSE:
        ids = torch.from_numpy(np.frombuffer(numbers, dtype="<i4", count=count).astype(np.int64))
        weights = torch.from_numpy(np.frombuffer(numbers, dtype="<f4", offset=4 * count).astype(np.float32))
        decoded = (ids, weights)
    else:
        decoded = torch.from_numpy(np.frombuffer(numbers, dtype="<f4").astype(np.float32))
        if namespace.layout == MATRIX:
            decoded = decoded.view(count, namespace.width)
    if not accepts(decoded):
        return None
    return CachedRow(decoded, tokens, bool(flags & TRUNCATED_FLAG))


# ----------------------------------------------------------------------------------------------- the breaker
class CircuitBreaker:
    """Closed: every call goes out. After ``failures`` consecutive failures: open, no call for ``cooldown_s``. Then
    half-open: one trial call; success closes it, failure opens it for another cool-down."""

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
    GAUGE = {CLOSED: 0.0, OPEN: 1.0, HALF_OPEN: 0.5}

    def __init__(self, failures: int, cooldown_s: float, clock: Any = time.monotonic) -> None:
        self.failures_to_open = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.consecutive_failures = 0
        self.opened_at: float | None = None
        self.times_opened = 0

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return self.CLOSED
        return self.HALF_OPEN if self.clock() - self.opened_at >= self.cooldown_s else self.OPEN

    def allows(self) -> bool:
        return self.state != self.OPEN

    def succeeded(self) -> None:
        self.consecutive_failures = 0
        self.opened_at = None

    def failed(self) -> None:
        self.consecutive_failures += 1
        state = self.state
        if state == self.HALF_OPEN or (state == self.CLOSED and self.consecutive_failures >= self.failures_to_open):
            self.times_opened += 1
            self.opened_at = self.clock()
            logger.warning(
                "shared cache: %d consecutive failures, not asking it for %.1fs",
                self.consecutive_failures,
                self.cooldown_s,
            )


# ----------------------------------------------------------------------------------------------- the client
@dataclass
class SharedCacheEvents:
    """What this tier did since the last :meth:`SharedCache.drain` (recorded as metrics once per batch)."""

    hits: int = 0
    misses: int = 0
    bad_values: int = 0  # values present but refused by decode_value (counted in misses too)
    errors: int = 0
    timeouts: int = 0
    skipped: int = 0  # round trips not made because the breaker was open
    round_trips: list[tuple[str, float]] | None = None  # (operation, milliseconds)


class RedisTier:
    """What every tier kept in a Redis-protocol server shares: one client that never retries (a failed call is a miss,
    at once), the breaker, and the events recorded as metrics (:func:`record_shared_cache`). The embedding tier
    (:class:`SharedCache`) and the generator's similarity cache (handlers/generation/semantic_cache/shared.py) add
    their own calls through :meth:`call`."""

    def __init__(self, settings: dict[str, Any], url: str, password: str | None = None) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.settings = settings
        self.url = url
        timeout = settings["timeout_ms"] / 1000
        # No retries (redis-py retries connection errors 3 times by default): a failed call is a miss, at once.
        self.client = redis.Redis.from_url(
            url,
            password=password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self.breaker = CircuitBreaker(settings["breaker_failures"], settings["breaker_cooldown_s"])
        self.events = SharedCacheEvents(round_trips=[])

    def call(self, operation: str, call: Any) -> Any:
        """``call()``'s result, or None when the breaker is open or the call fails or times out (counted)."""
        import redis

        if not self.breaker.allows():
            self.events.skipped += 1
            return None
        started = time.perf_counter()
        try:
            result = call()
        except (redis.TimeoutError, TimeoutError):
            self.events.timeouts += 1
            self.breaker.failed()
            logger.debug("shared cache %s timed out", operation)
            return None
        except (redis.RedisError, OSError) as error:
            self.events.errors += 1
            self.breaker.failed()
            logger.debug("shared cache %s failed: %s", operation, error)
            return None
        assert self.events.round_trips is not None
        self.events.round_trips.append((operation, (time.perf_counter() - started) * 1000))
        self.breaker.succeeded()
        return result

    def drain(self) -> SharedCacheEvents:
        """What happened since the last drain (and start afresh)."""
        events, self.events = self.events, SharedCacheEvents(round_trips=[])
        return events

    def describe(self) -> dict[str, Any]:
        return {
            "url": redacted(self.url),
            "breaker": self.breaker.state,
            "breaker_opened": self.breaker.times_opened,
            **{key: self.settings[key] for key in FIELDS},
        }


class SharedCache(RedisTier):
    """One worker's client of the shared tier of computed rows: ``get_many`` (one MGET) and ``put_many`` (one
    pipelined SET EX). ``accepts`` is the model kind's check of a decoded value's numbers."""

    def __init__(
        self,
        settings: dict[str, Any],
        namespace: Namespace,
        url: str,
        password: str | None = None,
        accepts: Callable[[Any], bool] = lambda value: True,
    ) -> None:
        super().__init__(settings, url, password)
        self.namespace = namespace
        self.accepts = accepts

    def get_many(
        self,
        keys: Sequence[CacheKey],
        namespace: Namespace | None = None,
        accepts: Callable[[Any], bool] | None = None,
    ) -> dict[CacheKey, CachedRow]:
        """The decodable entries among ``keys`` (one MGET; nothing when the breaker is open or the call fails).
        ``namespace`` and ``accepts``: another kind of row of the same model on this one client (connection,
        breaker, events), as the image-text kind's texts beside its images; None: this client's own."""
        if not keys:
            return {}
        namespace = namespace or self.namespace
        accepts = accepts or self.accepts
        values = self.call("get", lambda: self.client.mget([namespace.server_key(key) for key in keys]))
        if values is None:
            self.events.misses += len(keys)
            return {}
        found = {}
        for key, value in zip(keys, values, strict=True):
            entry = None
            if value is not None and len(value) <= self.settings["max_value_bytes"]:
                entry = decode_value(namespace, key, value, accepts)
                if entry is None:
                    self.events.bad_values += 1
            if entry is None:
                self.events.misses += 1
            else:
                found[key] = entry
                self.events.hits += 1
        return found

    def put_many(self, entries: Sequence[tuple[CacheKey, CachedRow]], namespace: Namespace | None = None) -> None:
        """Store computed rows with the TTL (one pipelined round trip; dropped when the breaker is open), in this
        client's namespace or ``namespace``."""
        namespace = namespace or self.namespace
        values = [(namespace.server_key(key), encode_value(namespace, key, entry)) for key, entry in entries]
        values = [(key, value) for key, value in values if len(value) <= self.settings["max_value_bytes"]]
        if not values:
            return

        def write() -> Any:
            pipeline = self.client.pipeline(transaction=False)
            for key, value in values:
                pipeline.set(key, value, ex=self.settings["ttl_s"])
            return pipeline.execute()

        self.call("set", write)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "prefix": self.namespace.prefix.decode()}


def open_shared_cache(
    settings: dict[str, Any], namespace: Namespace, accepts: Callable[[Any], bool] = lambda value: True
) -> SharedCache | None:
    """This worker's client of the shared tier, or None when the (effective) url is empty. Nothing is sent here: a
    server that is down at load costs the first batches a refused connection each, then the breaker opens."""
    url = effective_url(settings["url"])
    if not url:
        return None
    shared = SharedCache(settings, namespace, url, read_password(), accepts)
    logger.info("shared cache %s, keys %s*, ttl %ds", redacted(url), namespace.prefix.decode(), settings["ttl_s"])
    return shared


def record_shared_cache(shared: RedisTier, metrics: HandlerMetrics) -> None:
    """Record what the tier did during this batch (counters only when non-zero; the breaker's state every batch)."""
    events = shared.drain()
    for name, value in (
        ("SharedCacheHits", events.hits),
        ("SharedCacheMisses", events.misses),
        ("SharedCacheBadValues", events.bad_values),
        ("SharedCacheErrors", events.errors),
        ("SharedCacheTimeouts", events.timeouts),
        ("SharedCacheSkipped", events.skipped),
    ):
        if value:
            metrics.record(name, value)
    metrics.record("SharedCacheBreakerOpen", CircuitBreaker.GAUGE[shared.breaker.state])
    for operation, milliseconds in events.round_trips or []:
        metrics.record("SharedCacheRoundTripMilliseconds", milliseconds, [("Operation", operation)])
