"""No answer too large to deliver: a multi-vector model's answers against a real TorchServe whose max_response_size is
1,000,000 bytes (the project's config.properties with that one key changed, so that the answers here stay small).

TorchServe drops a worker whose answer is over max_response_size (TooLongFrameException; every request of its batch
gets 500 "Worker died" and the worker restarts). Here: a request whose answer cannot be sent gets 413 and the worker
lives on; the same request in base64 float16 is answered; a batch whose answers together are larger than the limit,
each under it, is answered whole (TorchServe bounds each answer, not the batch); and a batch filled with the largest
request each route accepts gets only 200s and 4xxs, with the same worker before and after.
"""

import concurrent.futures
import sys
import threading
from pathlib import Path

import pytest
import requests

from scripts import tiny_text_models

REPO = Path(__file__).resolve().parents[2]
LIMIT = 1_000_000
BATCH = 4
NAME = "t-colbert-big"
DOCUMENT = "the quick brown fox jumps over the lazy dog " * 8  # cut at the model's 64 tokens
# Requests of one worker, batched up to BATCH within half a second, so that concurrent requests share a batch.
CONFIG = ["minWorkers=1", "maxWorkers=1", f"batchSize={BATCH}", "maxBatchDelay=500"]


@pytest.fixture(scope="module")
def server(start_ts_server, tmp_path_factory):
    import subprocess

    folder = tiny_text_models.make_multi_vector_encoder(tmp_path_factory.mktemp("colbert") / NAME)
    store = tmp_path_factory.mktemp("answer-size-store")
    command = [sys.executable, "-m", "scripts.package", "text-model", "--name", NAME, "--store", str(store)]
    command += ["--var", f"model_dir={folder}", "--var", "backends=none"]
    for setting in CONFIG:
        command += ["--config", setting]
    built = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout + built.stderr
    return start_ts_server(name="answer-size", models=[NAME], store=store, overrides={"max_response_size": str(LIMIT)})


def post(server, body, path=""):
    url = f"{server.inference_url}/predictions/{NAME}" + (f"/1.0/{path}" if path else "")
    return requests.post(url, json=body, timeout=120)


def together(server, bodies):
    """Post ``bodies`` at once (they arrive within the batch delay, so the worker answers them as one batch)."""
    start = threading.Barrier(len(bodies))

    def send(item):
        body, path = item
        start.wait()
        return post(server, body, path)

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(send, bodies))


def worker_pids(server):
    return server.management().worker_pids(NAME)


def test_a_request_whose_answer_cannot_be_sent_gets_413_and_the_worker_lives(server):
    pids = worker_pids(server)
    # 16 documents of 64 tokens: ~1.6 MB of JSON numbers, over the 1 MB limit (the finding: 500 "Worker died").
    response = post(server, {"input": [DOCUMENT] * 16})
    assert response.status_code == 413, response.text[:300]
    body = response.json()
    assert body["type"] == "AnswerTooLarge" and "max_response_size" in body["message"]
    assert "base64_float16" in body["message"]
    packed = post(server, {"input": [DOCUMENT] * 16, "encoding_format": "base64_float16"})
    assert packed.status_code == 200, packed.text[:300]
    assert [item["shape"][1] for item in packed.json()["data"]] == [128] * 16
    assert worker_pids(server) == pids


def test_a_batch_larger_than_the_limit_in_all_is_answered_whole(server):
    pids = worker_pids(server)
    # Each answer ~0.4 MB of JSON numbers, the batch's together ~1.6 MB: over the limit, which bounds each answer only.
    responses = together(server, [({"input": [DOCUMENT] * 4}, "")] * BATCH)
    assert [r.status_code for r in responses] == [200] * BATCH, [r.text[:200] for r in responses]
    assert sum(len(r.content) for r in responses) > LIMIT
    assert worker_pids(server) == pids


def largest_legal_requests():
    """The largest body each route of a multi-vector model accepts: max_inputs (64) texts at the model's 64 tokens
    (the request's 4096 tokens are under max_request_tokens), in the widest encoding; the tokenizer's largest answer
    is max_request_chars (50,000) of one-character words, tokenized whole."""
    texts = [DOCUMENT] * 64
    words = ["a " * 390] * 64  # 49,920 characters, ~25,000 tokens with their offsets
    return [
        ({"input": texts}, ""),
        ({"input": texts, "input_type": "query"}, ""),
        ({"input": texts, "encoding_format": "base64"}, ""),
        ({"inputs": words, "add_special_tokens": True}, "tokenize"),
    ]


def test_a_batch_of_the_largest_legal_answers_gets_no_5xx_and_keeps_its_worker(server):
    pids = worker_pids(server)
    fitting = ({"input": [DOCUMENT] * 16, "encoding_format": "base64_float16"}, "")  # ~0.35 MB
    responses = together(server, [*largest_legal_requests()[: BATCH - 1], fitting])
    codes = [r.status_code for r in responses]
    assert all(code == 200 or 400 <= code < 500 for code in codes), [r.text[:200] for r in responses]
    # At a 1 MB limit the largest multi-vector answers are refused before they are computed; the one that fits is
    # answered in the same batch.
    assert codes == [413] * (BATCH - 1) + [200], [r.text[:200] for r in responses]
    tokenized = post(server, *largest_legal_requests()[3])  # measured once made: over 1 MB, refused in TEI's shape
    assert tokenized.status_code == 413 and tokenized.json()["error_type"] == "Validation", tokenized.text[:200]
    assert worker_pids(server) == pids
