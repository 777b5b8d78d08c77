"""No answer larger than the server's max_response_size leaves a worker (handlers/core/answer_size.py): a multi-vector
request whose answer may be larger is refused with 413 before it is computed, naming the limit and the compact
encodings; an answer measured over it once made (a route that cannot estimate) is refused in its API's shape; and the
compact encodings (base64 of little-endian float32 or float16 token vectors) decode to the float answer.

An in-process worker of a tiny random multi-vector encoder (128 floats per token) and of a tiny embedder, each with
the limit a test sets through TS_MAX_RESPONSE_SIZE, as the server start exports it.
"""

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from handlers.core.answer_size import LIMIT_ENV, MARGIN
from scripts import prepare_text_model, tiny_text_models
from scripts.ops.handler_loader import load_handler, set_requests, statuses

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = ["the quick brown fox jumps over the lazy dog " * 6] * 8  # 8 texts truncated at 64 tokens each


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("answer-size")
    folders = {}
    for name, builder in (
        ("multi-vector", tiny_text_models.make_multi_vector_encoder),
        ("mpnet", tiny_text_models.make_mpnet_mean_normalize_embedder),
    ):
        source = builder(root / f"{name}-source")
        prepare_text_model.stage(str(source), root / name, None, None)
        shutil.copy2(REPO / "models" / "text-model" / "model-config.yaml", root / name / "model-config.yaml")
        folders[name] = root / name
    return folders


def worker(folder, monkeypatch, limit):
    """post(*bodies, path='') -> (statuses, answers) of an in-process worker whose max_response_size is ``limit``."""
    monkeypatch.setenv(LIMIT_ENV, str(limit))
    handler, context = load_handler(folder, "text-model", {"precision": "fp32", "cache_size": 0})

    def post(*bodies, path=""):
        set_requests(context, [{"Content-Type": "application/json", "url_path": path}] * len(bodies))
        answers = handler.handle([{"body": body} for body in bodies], context)
        return statuses(context, len(bodies)), [json.loads(answer) for answer in answers]

    return post


def test_a_multi_vector_answer_that_cannot_be_sent_is_refused_before_computing_and_the_rest_is_answered(
    staged, monkeypatch
):
    # 8 x 64 tokens x 128 floats: ~0.8 MB as JSON numbers at worst, ~350 KB as base64 float32, ~175 KB as float16.
    limit = 400_000
    post = worker(staged["multi-vector"], monkeypatch, limit)
    status, [refused, small, packed] = post(
        {"input": DOCUMENTS}, {"input": DOCUMENTS[:1]}, {"input": DOCUMENTS, "encoding_format": "base64"}
    )
    assert status == [413, 200, 200]
    assert refused["type"] == "AnswerTooLarge"
    message = refused["message"]
    assert "may reach" in message and f"{limit - MARGIN} bytes" in message and "max_response_size" in message
    assert "'encoding_format': 'base64'" in message and "base64_float16" in message
    assert len(json.dumps(packed)) <= limit - MARGIN


def test_base64_encodings_decode_to_the_float_answer(staged, monkeypatch):
    post = worker(staged["multi-vector"], monkeypatch, 6_553_500)
    texts = ["How do I reset my password?", "ok", DOCUMENTS[0]]
    status, [floats, packed32, packed16, one] = post(
        {"input": texts, "input_type": "query"},
        {"input": texts, "input_type": "query", "encoding_format": "base64"},
        {"input": texts, "input_type": "query", "encoding_format": "base64_float16"},
        {"text": texts[0], "input_type": "query", "encoding_format": "base64"},
    )
    assert status == [200] * 4
    for index, item in enumerate(floats["data"]):
        expected = np.asarray(item["embeddings"], dtype=np.float32)
        as32, as16 = packed32["data"][index], packed16["data"][index]
        assert as32["shape"] == as16["shape"] == list(expected.shape)
        got32 = np.frombuffer(base64.b64decode(as32["embeddings"]), dtype="<f4").reshape(as32["shape"])
        got16 = np.frombuffer(base64.b64decode(as16["embeddings"]), dtype="<f2").reshape(as16["shape"])
        np.testing.assert_array_equal(got32, expected)
        np.testing.assert_array_equal(got16, expected.astype(np.float16))
    first = np.frombuffer(base64.b64decode(one["embeddings"]), dtype="<f4").reshape(one["shape"])
    np.testing.assert_array_equal(first, np.asarray(floats["data"][0]["embeddings"], dtype=np.float32))
    status, [bad] = post({"input": texts, "encoding_format": "float64"})
    assert status == [400] and "'encoding_format' must be one of" in bad["message"]


def test_an_answer_measured_over_the_limit_is_refused_in_its_apis_shape_and_the_batch_is_answered(staged, monkeypatch):
    # An embedding's size does not grow with tokens: it is measured once made. 64 texts x 16 floats ~ 12 KB.
    post = worker(staged["mpnet"], monkeypatch, MARGIN + 8_000)
    texts = [f"text number {i}" for i in range(64)]
    status, [openai, reversed_texts, small] = post(
        {"input": texts}, {"input": texts[::-1]}, {"input": texts[:2]}, path="v1/embeddings"
    )
    # every request of the batch took the OpenAI route; only the two large ones are refused
    assert status == [413, 413, 200], (openai, reversed_texts)
    assert openai["error"]["code"] == "answer_too_large" and "max_response_size" in openai["error"]["message"]
    assert len(small["data"]) == 2
