"""The shared embedding cache tier (handlers/text/shared_cache.py): its value format, its config, its breaker,
and its behaviour against a real Valkey/Redis server process (tests/conftest.py's cache servers), in-process handlers
standing in for two workers."""

import json
import math
import os
import signal
import struct
import time

import pytest
import torch

from handlers.core.config import ConfigError, Option
from handlers.text.cache import CachedRow, cache_key
from handlers.text.shared_cache import (
    HEADER,
    MAGIC,
    SHARED_CACHE_OPTION,
    CircuitBreaker,
    Namespace,
    SharedCache,
    check_settings,
    decode_value,
    encode_value,
)
from scripts.ops.handler_loader import handler_class, make_context, record_metrics, set_requests

DIM = 8
IDENTITY = "sha256:" + "ab" * 32  # the content digest handlers/core/identity.py records at package time
NAMESPACE = Namespace("minilm", "1.0", "eager", "fp32", 256, DIM, identity=IDENTITY)
SETTINGS = check_settings(SHARED_CACHE_OPTION, "shared_cache", {"url": "redis://127.0.0.1:1/0", "timeout_ms": 200})


def unit_vector(seed=0, dim=DIM):
    vector = torch.randn(dim, generator=torch.Generator().manual_seed(seed))
    return vector / vector.norm()


def entry(seed=0, tokens=7, truncated=False):
    return CachedRow(unit_vector(seed), tokens, truncated)


KEY = cache_key("hello world", "1.0", "fp32", 256, identity=IDENTITY)


def unit_length(vector):
    """What the embedding kind accepts of a normalising model's vector (handlers/text/kinds/base.py check_value)."""
    return bool(torch.isfinite(vector).all()) and abs(float(vector.norm()) - 1.0) <= 1e-3


def decode(namespace, key, value):
    return decode_value(namespace, key, value, unit_length)


OTHER_KEY = cache_key("another text", "1.0", "fp32", 256, identity=IDENTITY)


# ----------------------------------------------------------------------------------------------- value format
def test_a_value_round_trips_exactly_with_its_flags():
    original = entry(seed=3, tokens=256, truncated=True)
    value = encode_value(NAMESPACE, KEY, original)
    assert len(value) == HEADER.size + 4 * DIM and value[:4] == MAGIC
    decoded = decode(NAMESPACE, KEY, value)
    assert decoded is not None
    assert torch.equal(decoded.value, original.value)
    assert (decoded.tokens, decoded.truncated) == (256, True)


def corrupted(value, offset, replacement):
    return value[:offset] + replacement + value[offset + len(replacement) :]


def float_bytes(*numbers):
    return struct.pack(f"<{len(numbers)}f", *numbers)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda v: v[:-1], id="truncated"),
        pytest.param(lambda v: v + b"\0\0\0\0", id="one float too many"),
        pytest.param(lambda v: corrupted(v, 0, b"XXXX"), id="magic"),
        pytest.param(lambda v: corrupted(v, 4, b"\x01"), id="format version"),
        pytest.param(lambda v: corrupted(v, 5, b"\x04"), id="unknown flag"),
        pytest.param(lambda v: corrupted(v, 6, struct.pack("<I", DIM + 1)), id="dimension"),
        pytest.param(lambda v: corrupted(v, 10, struct.pack("<I", 0)), id="zero tokens"),
        pytest.param(lambda v: corrupted(v, 10, struct.pack("<I", 257)), id="tokens over the limit"),
        pytest.param(lambda v: corrupted(v, 14, b"\0" * 8), id="key check"),
        pytest.param(lambda v: corrupted(v, HEADER.size, float_bytes(math.nan)), id="NaN"),
        pytest.param(lambda v: corrupted(v, HEADER.size, float_bytes(math.inf)), id="infinity"),
        pytest.param(lambda v: v[: HEADER.size] + float_bytes(*([0.5] * DIM)), id="not unit length"),
        pytest.param(lambda v: b"\x80\x04\x95" + v[3:], id="a pickle header"),
        pytest.param(lambda v: b"", id="empty"),
    ],
)
def test_a_damaged_value_is_a_miss(damage):
    value = encode_value(NAMESPACE, KEY, entry())
    assert decode(NAMESPACE, KEY, value) is not None
    assert decode(NAMESPACE, KEY, damage(value)) is None


@pytest.mark.parametrize(
    "other",
    [
        Namespace("minilm", "2.0", "eager", "fp32", 256, DIM, identity=IDENTITY),
        Namespace("other-model", "1.0", "eager", "fp32", 256, DIM, identity=IDENTITY),
        Namespace("minilm", "1.0", "jit", "fp32", 256, DIM, identity=IDENTITY),
        Namespace("minilm", "1.0", "eager", "bf16", 256, DIM, identity=IDENTITY),
        Namespace("minilm", "1.0", "eager", "fp32", 128, DIM, identity=IDENTITY),
        Namespace("minilm", "1.0", "eager", "fp32", 256, DIM, identity="sha256:" + "cd" * 32),
    ],
    ids=["version", "model", "backend", "precision", "token limit", "content (re-packaged weights)"],
)
def test_another_namespace_has_other_keys_and_refuses_this_ones_values(other):
    assert other.server_key(KEY) != NAMESPACE.server_key(KEY)
    assert other.server_key(KEY).startswith(other.prefix)
    # a value copied under the other namespace's key (or another text's key) does not decode there
    assert decode(other, KEY, encode_value(NAMESPACE, KEY, entry())) is None
    assert decode(NAMESPACE, OTHER_KEY, encode_value(NAMESPACE, KEY, entry())) is None


def test_fields_cannot_run_into_each_other():
    assert (
        Namespace("a:b", "c", "eager", "fp32", 256, DIM, identity=IDENTITY).fingerprint
        != Namespace("a", "b:c", "eager", "fp32", 256, DIM, identity=IDENTITY).fingerprint
    )


def test_keys_are_readable_by_model_and_version():
    assert NAMESPACE.server_key(KEY).startswith(b"emb:minilm:1.0:")


# ----------------------------------------------------------------------------------------------- config
def test_defaults_are_filled_in_and_the_tier_is_off_by_default():
    settings = SHARED_CACHE_OPTION.check("shared_cache", {"url": "redis://cache:6379/0"})
    assert settings["url"] == "redis://cache:6379/0" and settings["ttl_s"] == 86400
    assert SHARED_CACHE_OPTION.default["url"] == ""


@pytest.mark.parametrize(
    "value, says",
    [
        ({"url": "http://cache:6379"}, "must start with"),
        ({"url": "redis://"}, "names no host"),
        ({"url": "redis://:secret@cache:6379/0"}, "holds a password"),
        ({"url": 6379}, "expected a string"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"ttl_s": -5}, "ttl_s"),
        ({"ttl_s": "1d"}, "ttl_s: expected int"),
        ({"timeout_ms": 60000}, "timeout_ms"),
        ({"timeout_ms": True}, "timeout_ms: expected int"),
        ({"max_value_bytes": 1 << 30}, "max_value_bytes"),
        ({"breaker_failures": 0}, "breaker_failures"),
        ({"breaker_cooldown_s": math.inf}, "breaker_cooldown_s"),
        ({"breaker_cooldown_s": math.nan}, "breaker_cooldown_s"),
        ({"password": "x"}, "unknown field"),
    ],
)
def test_hostile_values_are_refused_at_load_naming_the_field(value, says):
    with pytest.raises(ConfigError, match="handler.shared_cache") as refused:
        SHARED_CACHE_OPTION.check("shared_cache", value)
    assert says in str(refused.value)


def test_a_password_in_the_url_is_not_repeated_in_the_refusal():
    with pytest.raises(ConfigError) as refused:
        SHARED_CACHE_OPTION.check("shared_cache", {"url": "redis://:hunter2@cache:6379/0"})
    assert "hunter2" not in str(refused.value)


def test_a_list_is_not_a_settings_dict():
    with pytest.raises(ConfigError, match="expected dict"):
        SHARED_CACHE_OPTION.check("shared_cache", ["redis://cache"])
    assert isinstance(SHARED_CACHE_OPTION, Option)


# ----------------------------------------------------------------------------------------------- breaker
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_breaker_opens_after_consecutive_failures_and_half_opens_after_the_cooldown():
    clock = Clock()
    breaker = CircuitBreaker(failures=3, cooldown_s=5, clock=clock)
    breaker.failed()
    breaker.failed()
    breaker.succeeded()  # not consecutive: the count starts again
    breaker.failed()
    breaker.failed()
    assert breaker.state == "closed" and breaker.allows()
    breaker.failed()
    assert breaker.state == "open" and not breaker.allows()
    clock.now += 4.9
    assert not breaker.allows()
    clock.now += 0.2
    assert breaker.state == "half_open" and breaker.allows()
    breaker.failed()  # the trial call failed: open for another cool-down
    assert breaker.state == "open"
    clock.now += 5.1
    breaker.succeeded()  # the trial call worked
    assert breaker.state == "closed" and breaker.times_opened == 2


# ----------------------------------------------------------------------------------------------- a real server
@pytest.fixture
def own_cache(start_cache_server):
    return start_cache_server(name="unit-cache")


def client(server, namespace=NAMESPACE, **settings):
    values = check_settings(SHARED_CACHE_OPTION, "shared_cache", {"url": server.url, **settings})
    return SharedCache(values, namespace, server.url, server.password(), unit_length)


def command_calls(server, command):
    stats = server.client().info("commandstats")
    return stats.get(f"cmdstat_{command}", {}).get("calls", 0)


def test_one_mget_and_one_pipelined_set_per_batch(own_cache):
    shared = client(own_cache)
    keys = [cache_key(f"text {i}", "1.0", "fp32", 256, identity=IDENTITY) for i in range(20)]
    own_cache.client().config_resetstat()
    assert shared.get_many(keys) == {}
    shared.put_many([(key, entry(seed=i)) for i, key in enumerate(keys)])
    found = shared.get_many(keys)
    assert set(found) == set(keys)
    assert torch.equal(found[keys[5]].value, entry(seed=5).value)
    assert command_calls(own_cache, "mget") == 2 and command_calls(own_cache, "get") == 0
    events = shared.drain()
    assert [operation for operation, _ in events.round_trips] == ["get", "set", "get"]
    assert (events.hits, events.misses) == (20, 20)
    ttl = own_cache.client().ttl(NAMESPACE.server_key(keys[0]))
    assert 0 < ttl <= SETTINGS["ttl_s"]


def test_another_version_never_reads_these_entries_from_the_server(own_cache):
    shared = client(own_cache)
    shared.put_many([(KEY, entry())])
    for version, precision in (("2.0", "fp32"), ("1.0", "bf16")):
        other = client(own_cache, Namespace("minilm", version, "eager", precision, 256, DIM, identity=IDENTITY))
        assert other.get_many([KEY]) == {}
    assert set(shared.get_many([KEY])) == {KEY}


def test_planted_corrupt_and_foreign_values_are_misses_and_get_overwritten(own_cache):
    shared = client(own_cache)
    raw = own_cache.client()
    foreign = Namespace("other-model", "1.0", "eager", "fp32", 256, DIM, identity=IDENTITY)
    planted = {
        KEY: b"\x80\x04\x95not a vector",
        OTHER_KEY: encode_value(foreign, OTHER_KEY, entry(seed=9)),  # another model's value under this key
    }
    for key, value in planted.items():
        raw.set(NAMESPACE.server_key(key), value)
    assert shared.get_many([KEY, OTHER_KEY]) == {}
    assert shared.drain().bad_values == 2
    shared.put_many([(KEY, entry(seed=1)), (OTHER_KEY, entry(seed=2))])
    found = shared.get_many([KEY, OTHER_KEY])
    assert torch.equal(found[OTHER_KEY].value, entry(seed=2).value)


def test_a_value_over_max_value_bytes_is_neither_written_nor_read(own_cache):
    shared = client(own_cache, max_value_bytes=64)  # an 8-float entry is 54 bytes: fits
    wide = Namespace("minilm", "1.0", "eager", "fp32", 256, 32, identity=IDENTITY)
    wide_client = client(own_cache, wide, max_value_bytes=64)  # 32 floats: 150 bytes
    wide_client.put_many([(KEY, CachedRow(unit_vector(dim=32), 5, False))])
    assert own_cache.client().exists(wide.server_key(KEY)) == 0
    shared.put_many([(KEY, entry())])
    assert set(shared.get_many([KEY])) == {KEY}


def test_a_dead_server_costs_misses_then_the_breaker_stops_asking_and_a_restart_resumes(own_cache):
    shared = client(own_cache, breaker_failures=2, breaker_cooldown_s=0.5)
    shared.put_many([(KEY, entry())])
    own_cache.kill()
    started = time.perf_counter()
    for _ in range(5):
        assert shared.get_many([KEY]) == {}
        shared.put_many([(KEY, entry())])
    elapsed = time.perf_counter() - started
    events = shared.drain()
    assert events.errors == 2 and events.skipped == 8 and shared.breaker.state == "open"
    assert elapsed < 5  # refused connections fail at once; no retries with backoff
    own_cache.start()
    time.sleep(0.6)
    assert shared.get_many([KEY]) == {}  # the trial call goes out; the restarted server is empty
    assert shared.breaker.state == "closed"
    shared.put_many([(KEY, entry())])
    assert set(shared.get_many([KEY])) == {KEY}


def test_a_hung_server_costs_one_timeout_per_round_trip(own_cache):
    shared = client(own_cache, timeout_ms=50, breaker_failures=1)
    assert shared.get_many([KEY]) == {}  # connected while the server answers
    os.kill(own_cache.pid(), signal.SIGSTOP)
    try:
        started = time.perf_counter()
        assert shared.get_many([KEY]) == {}
        elapsed = time.perf_counter() - started
        assert shared.get_many([KEY]) == {}  # breaker open: not asked
    finally:
        os.kill(own_cache.pid(), signal.SIGCONT)
    events = shared.drain()
    assert events.timeouts == 1 and events.skipped == 1
    assert elapsed < 1.0


def test_a_password_protected_server_refuses_a_client_without_it(start_cache_server, tmp_path):
    from scripts.ops.cache_server import make_password_file

    server = start_cache_server(name="with-password", password_file=make_password_file(tmp_path / "password"))
    assert (tmp_path / "password").stat().st_mode & 0o077 == 0
    anonymous = SharedCache(
        check_settings(SHARED_CACHE_OPTION, "shared_cache", {"url": server.url}), NAMESPACE, server.url, None
    )
    anonymous.put_many([(KEY, entry())])
    assert anonymous.drain().errors == 1
    authorized = client(server)
    authorized.put_many([(KEY, entry())])
    assert set(authorized.get_many([KEY])) == {KEY}


# ----------------------------------------------------------------------------------------------- two workers
def load_worker(model_dir, url, version="1.0"):
    """An in-process minilm handler (a worker) of ``version`` using the shared cache at ``url``."""
    context = make_context(model_dir, "minilm", version=version)
    handler_config = context.model_yaml_config.get("handler") or {}
    context.model_yaml_config = {
        **context.model_yaml_config,
        "handler": {**handler_config, "precision": "fp32", "shared_cache": {"url": url}},
    }
    handler = handler_class("minilm")()
    handler.initialize(context)
    return handler, context


def embed(worker, texts):
    handler, context = worker
    recorder = record_metrics(context)
    set_requests(context, [{"Content-Type": "application/json"}])
    [answer] = handler.handle([{"body": {"input": texts}}], context)
    vectors = [item["embedding"] for item in json.loads(answer)["data"]]
    return vectors, recorder


def total(recorder, name):
    return sum(recorder.values(name))


def test_a_text_one_worker_computed_is_served_by_another_from_the_shared_tier(tiny_minilm_dir, own_cache, monkeypatch):
    monkeypatch.delenv("TS_SHARED_CACHE_URL", raising=False)
    first, second = load_worker(tiny_minilm_dir, own_cache.url), load_worker(tiny_minilm_dir, own_cache.url)
    texts = ["shared between workers", "a second text"]
    computed, first_metrics = embed(first, texts)
    assert total(first_metrics, "CacheMisses") == 2 and total(first_metrics, "SharedCacheMisses") == 2
    served, second_metrics = embed(second, texts)
    assert served == computed
    assert total(second_metrics, "SharedCacheHits") == 2
    assert total(second_metrics, "CacheMisses") == 0  # no forward pass
    assert second_metrics.values("SharedCacheRoundTripMilliseconds")  # one MGET, timed
    # now in the second worker's own cache: no round trip at all
    _, again = embed(second, texts)
    assert total(again, "CacheHits") == 2 and not again.values("SharedCacheRoundTripMilliseconds")
    describe = second[0].describe()["shared_cache"]
    assert describe["prefix"] == "emb:minilm:1.0:" and describe["breaker"] == "closed"


def test_a_new_version_does_not_serve_the_old_versions_entries(tiny_minilm_dir, own_cache, monkeypatch):
    monkeypatch.delenv("TS_SHARED_CACHE_URL", raising=False)
    old, new = load_worker(tiny_minilm_dir, own_cache.url), load_worker(tiny_minilm_dir, own_cache.url, "2.0")
    embed(old, ["rolled out"])
    _, new_metrics = embed(new, ["rolled out"])
    assert total(new_metrics, "SharedCacheHits") == 0 and total(new_metrics, "CacheMisses") == 1
    keys = {key.decode().rsplit(":", 1)[0] for key in own_cache.client().scan_iter("emb:*")}
    assert keys == {"emb:minilm:1.0", "emb:minilm:2.0"}


# ----------------------------------------------------------------------------------------------- other kinds' values
def test_a_sparse_row_round_trips_and_a_damaged_one_is_a_miss():
    from handlers.text.shared_cache import SPARSE

    namespace = Namespace("splade", "1.0", "eager", "fp32", 256, 30522, SPARSE, identity=IDENTITY)
    row = (torch.tensor([7, 2991, 15], dtype=torch.long), torch.tensor([2.5, 1.25, 0.5]))
    value = encode_value(namespace, KEY, CachedRow(row, 9, False))
    assert len(value) == HEADER.size + 8 * 3
    ids_in_range = lambda v: bool((v[0] >= 0).all() and (v[0] < 30522).all())  # noqa: E731
    decoded = decode_value(namespace, KEY, value, ids_in_range)
    assert decoded is not None and torch.equal(decoded.value[0], row[0]) and torch.equal(decoded.value[1], row[1])
    beyond = encode_value(namespace, KEY, CachedRow((torch.tensor([40000]), torch.tensor([1.0])), 9, False))
    assert (
        decode_value(namespace, KEY, beyond, ids_in_range) is None
    )  # the kind's check refuses an id off the vocabulary
    assert decode_value(namespace, KEY, value[:-4], ids_in_range) is None


def test_token_vectors_round_trip_and_a_count_over_the_token_limit_is_a_miss():
    from handlers.text.shared_cache import MATRIX

    namespace = Namespace("colbert", "1.0", "eager", "fp32", 8, 4, MATRIX, identity=IDENTITY)
    vectors = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    value = encode_value(namespace, KEY, CachedRow(vectors, 5, False))
    decoded = decode_value(namespace, KEY, value, lambda v: True)
    assert decoded is not None and torch.equal(decoded.value, vectors)
    long = encode_value(namespace, KEY, CachedRow(torch.zeros(9, 4), 8, True))  # 9 vectors from an 8-token limit
    assert decode_value(namespace, KEY, long, lambda v: True) is None
