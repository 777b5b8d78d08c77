"""The minilm handler called directly (no server) with the real model: rows, truncation, cache, buckets, gate."""

import json

import pytest
import torch

from handlers.core.config import ConfigError
from scripts.ops.handler_loader import load_handler, record_metrics, set_requests, statuses

LONG = "The quick brown fox jumps over the lazy dog near the riverbank. " * 40  # ~520 tokens


def load(model_dir, **handler_overrides):
    return load_handler(model_dir, "minilm", {"precision": "fp32", **handler_overrides})


@pytest.fixture(scope="module")
def minilm(unpacked_model):
    return load(unpacked_model("minilm"))


@pytest.fixture(scope="module")
def reference(unpacked_model):
    """sentence-transformers' own encode() of the same files, fp32: the embeddings we must reproduce."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(unpacked_model("minilm")), device="cpu", local_files_only=True)
    return lambda texts: model.encode(texts, convert_to_tensor=True, normalize_embeddings=False).cpu()


def run(handler, context, bodies, content_types=None):
    set_requests(context, [{"Content-Type": c} for c in content_types or ["application/json"] * len(bodies)])
    answers = handler.handle([{"body": body} for body in bodies], context)
    return [json.loads(a) if isinstance(a, str) else a for a in answers]


def vectors(answer):
    if "data" in answer:
        return torch.tensor([item["embedding"] for item in answer["data"]])
    return torch.tensor([answer["embedding"]])


def counting_forward(handler):
    """Wrap the handler's engine's forward to record the shape of every forward pass."""
    shapes = []
    original = handler.engine.forward

    def forward(model, batch):
        shapes.append(tuple(batch[0].shape))
        return original(model, batch)

    handler.engine.forward = forward
    return shapes


def test_embeddings_match_sentence_transformers_and_have_unit_length(minilm, reference):
    handler, context = minilm
    texts = ["A man is eating food.", "Ein Mann isst.", "東京タワー 🗼", "x = [i ** 2 for i in range(10)]", LONG]
    [answer] = run(handler, context, [{"input": texts}])
    got = vectors(answer)
    assert got.shape == (5, 384)
    assert torch.allclose(got.norm(dim=1), torch.ones(5), atol=1e-5)
    assert torch.nn.functional.cosine_similarity(got, reference(texts)).min() > 0.9999


def test_each_request_gets_its_own_rows_in_order_inside_a_mixed_batch(unpacked_model):
    handler, context = load(unpacked_model("minilm"), cache_size=0)
    bodies = [
        {"text": "short one"},
        {"input": ["first", LONG, "third text here"]},
        {"text": ""},
        "plain text request",
        {"input": "single string"},
        {"text": "medium " * 40},
    ]
    kinds = ["application/json"] * 3 + ["text/plain"] + ["application/json"] * 2
    together = run(handler, context, bodies, kinds)
    assert statuses(context, len(bodies)) == [200, 200, 400, 200, 200, 200]
    for index, body in enumerate(bodies):
        if index == 2:
            continue
        [alone] = run(handler, context, [body], [kinds[index]])
        assert torch.allclose(vectors(together[index]), vectors(alone), atol=1e-5), index
    assert together[1]["usage"]["prompt_tokens"] == sum(
        len(e.ids) for e in handler.loaded.tokenizer.encode_batch(["first", LONG, "third text here"])
    )


def test_a_long_text_is_truncated_and_says_so_unless_truncate_is_false(minilm, reference):
    handler, context = minilm
    answers = run(
        handler,
        context,
        [
            {"text": LONG},
            {"input": ["short", LONG]},
            {"text": LONG, "truncate": False},
            {"input": ["short", LONG], "truncate": False},
            {"text": "short", "truncate": False},
        ],
    )
    assert statuses(context, 5) == [200, 200, 400, 400, 200]
    assert answers[0]["truncated"] is True
    assert [item["truncated"] for item in answers[1]["data"]] == [False, True]
    assert answers[1]["usage"]["prompt_tokens"] == len(handler.loaded.tokenizer.encode("short").ids) + 256
    assert "'text' is longer than the model's limit of 256 tokens" in answers[2]["message"]
    assert "'input'[1] is longer" in answers[3]["message"]
    assert answers[4]["truncated"] is False
    # Truncation keeps what sentence-transformers keeps (the first 256 tokens).
    assert torch.nn.functional.cosine_similarity(vectors(answers[0]), reference([LONG])).item() > 0.9999


def test_length_buckets_run_one_pass_per_bucket_and_record_the_padding_ratio(unpacked_model):
    handler, context = load(unpacked_model("minilm"), cache_size=0)
    shapes = counting_forward(handler)
    metrics = record_metrics(context)
    texts = [f"short text number {i}" for i in range(15)] + [LONG]
    run(handler, context, [{"input": texts[:8]}, {"input": texts[8:]}])
    assert sorted(shapes) == [(1, 256), (15, 16)]
    assert metrics.values("BatchRows") == [16] and metrics.values("Batches") == [1]
    assert metrics.values("BatchRequests") == [2]
    ratio = metrics.last("PaddedTokens") / metrics.last("RealTokens")
    real = sum(len(e.ids) for e in handler.loaded.tokenizer.encode_batch(texts))
    assert metrics.last("RealTokens") == real and metrics.last("PaddedTokens") == 15 * 16 + 256
    assert ratio == pytest.approx((15 * 16 + 256) / real)
    assert ratio < 256 * 16 / real / 5  # padding everything to the longest would be > 5x more work
    # The breakdown's padded tokens per forward pass (loadtests/prometheus.py): two passes here.
    assert metrics.last("ForwardPasses") == 2


def test_cached_texts_skip_the_forward_pass_and_give_the_same_embedding(unpacked_model):
    handler, context = load(unpacked_model("minilm"), cache_size=8)
    shapes = counting_forward(handler)
    metrics = record_metrics(context)
    [first] = run(handler, context, [{"input": ["alpha", "beta"]}])
    assert shapes == [(2, 16)] and metrics.last("CacheMisses") == 2 and metrics.last("CacheHits") == 0
    shapes.clear()
    answers = run(handler, context, [{"text": "beta"}, {"input": ["gamma", "alpha", "gamma"]}])
    assert shapes == [(1, 16)]  # only "gamma", once, although it appears twice
    assert metrics.last("CacheHits") == 2 and metrics.last("CacheMisses") == 1
    assert torch.equal(vectors(answers[0])[0], vectors(first)[1])
    assert torch.equal(vectors(answers[1])[1], vectors(first)[0])
    assert torch.equal(vectors(answers[1])[0], vectors(answers[1])[2])
    assert len(handler.cache) == 3 and handler.describe()["cached"] == 3


def test_the_cache_key_holds_model_identity_version_precision_and_token_limit(minilm):
    handler, _ = minilm
    digest, *rest = handler.engine.cache_key("text")
    assert handler.identity.startswith("sha256:") and handler.describe()["identity"] == handler.identity
    assert rest == [handler.identity, "1.0", "fp32", 256]
    assert digest != handler.engine.cache_key("text ")[0] and digest == handler.engine.cache_key("te" + "xt")[0]


def test_the_cache_keeps_a_fixed_size_digest_not_the_text(minilm):
    """A cache full of maximum-length texts must not hold their characters (bounded worker memory)."""
    handler, _ = minilm
    long_text = "🙂" * handler.config["max_text_chars"]
    assert len(handler.engine.cache_key(long_text)[0]) == 16


def test_a_cached_truncated_text_still_refuses_truncate_false(unpacked_model):
    handler, context = load(unpacked_model("minilm"), cache_size=8)
    run(handler, context, [{"text": LONG}])
    [answer] = run(handler, context, [{"text": LONG, "truncate": False}])
    assert statuses(context, 1) == [400] and "longer than" in answer["message"]


def test_size_limits_refuse_one_request_with_413_and_serve_its_batch_mates(unpacked_model):
    handler, context = load(
        unpacked_model("minilm"), max_text_chars=600, max_request_chars=1000, max_request_tokens=300, max_inputs=3
    )
    bodies = [
        {"text": "ok " * 50},
        {"text": "x" * 601},
        {"input": ["y" * 600, "y" * 401]},
        {"input": ["a " * 300, "c " * 200]},
        {"input": ["a", "b", "c", "d"]},
        "plain " * 120,
    ]
    kinds = ["application/json"] * 5 + ["text/plain"]
    answers = run(handler, context, bodies, kinds)
    assert statuses(context, len(bodies)) == [200, 413, 413, 413, 413, 413]
    expected = [
        "'text' has 601 characters; handler.max_text_chars is 600",
        "have 1001 characters together; handler.max_request_chars is 1000",
        "tokens after truncation; handler.max_request_tokens is 300",
        "(handler.max_inputs)",
        "body has 720 characters; handler.max_text_chars is 600",
    ]
    for answer, fragment in zip(answers[1:], expected, strict=True):
        assert answer["type"] == "RequestTooLarge" and fragment in answer["message"], answer
    assert handler.describe()["limits"] == {
        "max_inputs": 3,
        "max_text_chars": 600,
        "max_request_chars": 1000,
        "max_request_tokens": 300,
    }


def test_the_token_limit_counts_cached_texts_too(unpacked_model):
    """Whether a request is accepted must not depend on which of its texts happen to be cached."""
    handler, context = load(unpacked_model("minilm"), max_request_tokens=300, cache_size=8)
    run(handler, context, [{"text": LONG}])  # 256 tokens, now cached
    [answer] = run(
        handler,
        context,
        [
            {
                "input": [
                    LONG,
                    "one two three four five six seven eight nine ten "
                    "eleven twelve thirteen fourteen fifteen sixteen seventeen "
                    "eighteen nineteen twenty " * 3,
                ]
            }
        ],
    )
    assert statuses(context, 1) == [413] and "handler.max_request_tokens is 300" in answer["message"]
    [answer] = run(handler, context, [{"input": [LONG, "a few more words"]}])
    assert statuses(context, 1) == [200] and answer["usage"]["prompt_tokens"] <= 300


def test_freed_memory_is_returned_after_a_large_batch_only(unpacked_model, monkeypatch):
    from handlers.core import memory

    calls = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append(1) or True)
    handler, context = load(unpacked_model("minilm"), release_memory_tokens=512, cache_size=0)
    run(handler, context, [{"text": "a short text"}])
    assert calls == []
    run(handler, context, [{"input": [LONG, "other " + LONG]}])  # 2 rows padded to 256 tokens
    assert calls == [1]
    handler, context = load(unpacked_model("minilm"), release_memory_tokens=0, cache_size=0, warmup=False)
    run(handler, context, [{"input": [LONG, "other " + LONG]}])
    assert calls == [1]  # 0 turns it off


def test_a_char_limit_below_the_text_limit_is_a_config_error(unpacked_model):
    with pytest.raises(ConfigError, match=r"handler.max_request_chars \(10\) is below handler.max_text_chars"):
        load(unpacked_model("minilm"), max_text_chars=20, max_request_chars=10, warmup=False)


def test_int8_fails_the_accuracy_gate_and_the_worker_serves_fp32(unpacked_model):
    handler, context = load(unpacked_model("minilm"), backend="eager", precision="int8", warmup=False)
    assert handler.precision == "fp32" and handler.gate_rejected == "int8"
    assert handler.min_cosine == 1.0  # what serves is eager fp32 itself
    [refused] = handler.describe()["backend_fallbacks"]
    assert (refused["backend"], refused["precision"]) == ("eager", "int8")
    assert refused["reason"].startswith("accuracy gate: min cosine 0.") and "below the bound 0.999" in refused["reason"]
    assert handler.describe()["gate_rejected"] == "int8"
    [answer] = run(handler, context, [{"text": "still served"}])
    assert len(answer["embedding"]) == 384


def test_bf16_passes_the_accuracy_gate(unpacked_model):
    handler, _ = load(unpacked_model("minilm"), precision="bf16", warmup=False)
    assert handler.precision == "bf16" and handler.min_cosine >= 0.999


def test_bad_bucket_config_is_refused_with_its_key(unpacked_model):
    with pytest.raises(ConfigError, match="handler.length_buckets: the last length bucket must equal"):
        load(unpacked_model("minilm"), length_buckets=[16, 64])
