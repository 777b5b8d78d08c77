"""The shared embedding cache tier with real servers: TorchServe (minilm, 2 workers) and a real Valkey/Redis server of
its own (this module kills and restarts it, so it is not the session's). Cross-worker hits, a worker restart, a
rollout to a new version, the cache server dying under load, and planted corrupt or foreign values.

Which worker answered is not visible from outside; the Prometheus counters say what the workers did together:
CacheMisses = rows computed (forward passes), CacheHits = worker-cache hits, SharedCacheHits = shared-tier hits.
"""

import concurrent.futures
import random
import threading
import time
import uuid

import numpy as np
import pytest
import requests

from handlers.text.cache import CachedRow, cache_key
from handlers.text.shared_cache import URL_ENV, Namespace, decode_value, encode_value
from loadtests.prometheus import parse

MODEL = "minilm"
RUN = uuid.uuid4().hex[:8]  # texts no earlier run left in a cache
COOLDOWN_S = 5  # the archive's breaker_cooldown_s


@pytest.fixture(scope="module")
def cache(start_cache_server):
    return start_cache_server(name="integration-cache")


@pytest.fixture(scope="module")
def server(start_ts_server, cache):
    return start_ts_server(models=[MODEL], name="shared-cache", env={URL_ENV: cache.url})


def counters(server):
    """Sum of each of our counters over the minilm series (all workers, all label values)."""
    totals: dict[str, float] = {}
    for (name, labels), value in parse(requests.get(f"{server.metrics_url}/metrics", timeout=30).text).items():
        if ("ModelName", MODEL) in labels:
            totals[name] = totals.get(name, 0.0) + value
    return totals


def delta(before, after, name):
    return after.get(name, 0.0) - before.get(name, 0.0)


def embed(server, texts, session=None, version=None):
    route = f"{server.inference_url}/predictions/{MODEL}" + (f"/{version}" if version else "")
    response = (session or requests).post(route, json={"input": texts}, timeout=60)
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


def embed_each(server, texts, threads=4):
    """One request per text, `threads` at a time (so both workers take some)."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda text: embed(server, [text])[0], texts))


def test_a_text_computed_by_one_worker_is_served_to_the_other_from_the_shared_tier(server):
    texts = [f"two workers {RUN} {i}" for i in range(24)]
    before = counters(server)
    first = embed_each(server, texts)
    middle = counters(server)
    # One at a time in another order: TorchServe hands batches to its workers in turn, so the same concurrent
    # pattern would give every text to the worker that computed it.
    order = list(range(len(texts)))
    random.Random(7).shuffle(order)
    second_by_index = {i: embed(server, [texts[i]])[0] for i in order}
    second = [second_by_index[i] for i in range(len(texts))]
    after = counters(server)
    assert delta(before, middle, "CacheMisses") == len(texts)  # each computed once
    assert delta(middle, after, "CacheMisses") == 0  # no forward pass the second time
    assert delta(middle, after, "CacheHits") + delta(middle, after, "SharedCacheHits") == len(texts)
    assert delta(middle, after, "SharedCacheHits") > 0  # the texts the other worker had computed
    np.testing.assert_allclose(np.array(second), np.array(first), rtol=0, atol=0)


def test_restarted_workers_start_warm_from_the_shared_tier(server):
    texts = [f"restart {RUN} {i}" for i in range(8)]
    embed(server, texts)
    client = server.management(timeout=60)
    old_pids = client.worker_pids(MODEL)
    import psutil

    for pid in old_pids:
        psutil.Process(pid).kill()
    deadline = time.time() + 300
    while time.time() < deadline:
        pids = client.worker_pids(MODEL)
        if len(pids) == 2 and not set(pids) & set(old_pids):
            try:
                client.wait_ready(MODEL, timeout=300)
                break
            except Exception:
                pass
        time.sleep(1)
    before = counters(server)
    embed(server, texts)
    after = counters(server)
    assert delta(before, after, "CacheMisses") == 0
    assert delta(before, after, "SharedCacheHits") == len(texts)


def served_namespace(server, version=None):
    meta = server.management(timeout=60).handler_choices(MODEL, version)
    return Namespace(
        MODEL,
        version or "1.0",
        meta.get("backend", "eager"),
        meta["precision"],
        meta["max_tokens"],
        meta["dimension"],
        identity=meta["identity"],
    )


def test_planted_corrupt_and_foreign_values_are_misses_never_answers(server, cache):
    namespace = served_namespace(server)
    corrupt_text, foreign_text = f"corrupt {RUN}", f"foreign {RUN}"
    keys = {
        text: cache_key(text, "1.0", namespace.precision, namespace.max_tokens, identity=namespace.identity)
        for text in (corrupt_text, foreign_text)
    }
    planted_vector = np.zeros(namespace.width, dtype=np.float32)
    planted_vector[0] = 1.0
    import torch

    planted = CachedRow(torch.from_numpy(planted_vector), 3, False)
    foreign = Namespace(
        "other-model",
        "1.0",
        namespace.backend,
        namespace.precision,
        namespace.max_tokens,
        namespace.width,
        identity=namespace.identity,
    )
    raw = cache.client()
    raw.set(namespace.server_key(keys[corrupt_text]), b"\x80\x04\x95" + b"\0" * 64)
    raw.set(namespace.server_key(keys[foreign_text]), encode_value(foreign, keys[foreign_text], planted))
    before = counters(server)
    answers = embed(server, [corrupt_text, foreign_text])
    after = counters(server)
    assert delta(before, after, "SharedCacheBadValues") == 2
    assert delta(before, after, "CacheMisses") == 2  # computed, not taken from the planted values
    for text, answer in zip((corrupt_text, foreign_text), answers, strict=True):
        assert abs(answer[0] - 1.0) > 1e-3  # not the planted vector
        stored = decode_value(namespace, keys[text], raw.get(namespace.server_key(keys[text])), lambda value: True)
        assert stored is not None  # overwritten with the computed row
        np.testing.assert_allclose(stored.value.numpy(), np.array(answer, dtype=np.float32), atol=1e-6)


def test_killing_the_cache_server_under_load_fails_no_request_and_a_restart_resumes_hits(server, cache):
    failures, latencies = [], []
    stop = threading.Event()

    def traffic(worker):
        session = requests.Session()
        i = 0
        while not stop.is_set():
            i += 1
            texts = [f"steady {RUN} {worker} {i % 10}", f"steady {RUN} {worker} new {i}"]
            started = time.perf_counter()
            try:
                response = session.post(
                    f"{server.inference_url}/predictions/{MODEL}", json={"input": texts}, timeout=60
                )
                if response.status_code != 200 or len(response.json()["data"]) != 2:
                    failures.append(response.status_code)
            except requests.RequestException as error:
                failures.append(str(error))
            latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=traffic, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3)
        served_before_kill = len(latencies)
        cache.kill()
        time.sleep(COOLDOWN_S + 3)  # through the breaker opening and at least one trial call
        before_restart = counters(server)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert len(latencies) > served_before_kill  # it kept serving after the kill
    p99 = sorted(latencies)[int(0.99 * (len(latencies) - 1))]
    print(f"\n{len(latencies)} requests, 0 failed, p99 {p99 * 1000:.0f} ms with the cache server killed midway")
    assert before_restart.get("SharedCacheErrors", 0) + before_restart.get("SharedCacheTimeouts", 0) >= 1

    cache.start()  # empty, on the same port: the workers reconnect, TorchServe is not restarted
    time.sleep(COOLDOWN_S + 0.5)  # past the cool-down: each worker's next call is its breaker's trial call
    texts = [f"after restart {RUN} {i}" for i in range(16)]
    embed_each(server, texts)  # computed and written again
    assert cache.client().dbsize() > 0
    before = counters(server)
    embed_each(server, texts)
    after = counters(server)
    assert delta(before, after, "CacheMisses") == 0
    assert delta(before, after, "SharedCacheHits") > 0  # hits resumed without restarting TorchServe


@pytest.fixture(scope="module")
def second_version(server, model_store, archive_as_version):
    """minilm 2.0 (1.0's files under version 2.0) registered beside 1.0 (1.0 stays the default)."""
    archive = archive_as_version(model_store / f"{MODEL}.mar", "2.0")
    client = server.management(timeout=600)
    client.register(archive.name, model_name=MODEL, initial_workers=1)
    client.wait_ready(MODEL, "2.0", timeout=600)
    return "2.0"


def test_a_new_version_never_serves_the_old_versions_entries(server, cache, second_version):
    texts = [f"rollout {RUN} {i}" for i in range(4)]
    embed(server, texts)  # 1.0 computes and stores them
    before = counters(server)
    embed(server, texts, version=second_version)
    after = counters(server)
    assert delta(before, after, "SharedCacheHits") == 0
    assert delta(before, after, "CacheMisses") == len(texts)
    prefixes = {key.decode().rsplit(":", 1)[0] for key in cache.client().scan_iter("emb:*")}
    assert {"emb:minilm:1.0", "emb:minilm:2.0"} <= prefixes
    assert served_namespace(server, second_version).prefix == b"emb:minilm:2.0:"
