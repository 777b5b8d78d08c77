"""A user's own models, from folder to served answer: the documented commands against a real TorchServe.

Small random models are made offline (scripts/tiny_text_models.py). Through the kind templates: a BERT embedder with CLS
pooling and Normalize, an XLM-RoBERTa embedder with mean pooling, no Normalize and named prompts, a DistilBERT
single-label classifier, a BERT multi-label classifier and a BERT cross-encoder reranker. Through the generic
template (whatever architecture and kind the folder is, `python -m scripts.package text-model`): all-mpnet-base-v2's
layout, LaBSE's (a Dense after pooling), a Qwen3 decoder embedder with an instruction prompt, DeBERTa-v2 NLI,
ModernBERT and ELECTRA classifiers, a SPLADE sparse encoder and a multi-vector encoder. Each is packaged with `python
-m scripts.package <template> --name ... --var model_dir=...` into a private model store and served by a TorchServe
started from the project's config.properties (the reranker is added to the running server with `modelctl
register`); answers are compared with sentence-transformers / transformers computed here. Bad folders (and one that
ships its own code) are refused by the same command, with the file and the fix named and nothing written to the
store.
"""

import concurrent.futures
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import requests
import torch

from scripts import tiny_text_models

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["How do I reset my password?", "Le café est très chaud ce matin.", "the quick brown fox", "ok"]
PAIRS = [("the cat sleeps", "a cat is sleeping"), ("How do I reset my password?", "stock markets fell")]
ONE_WORKER = ["--config", "minWorkers=1", "--config", "maxWorkers=1"]  # keeps the test server small
# (package spec, builder, prepare vars, extra arguments): only the XLM-R embedder builds compiled backends (a short
# ranking), so that a transformers-engine model is served through the compiled path too; the others serve eager.
MODELS = {
    "t-bert-cls": ("embedding", tiny_text_models.make_bert_cls_normalize_embedder, ["backends=none"], []),
    "t-xlmr-mean": ("embedding", tiny_text_models.make_xlmr_mean_prompts_embedder, ["rank_seconds=2"], []),
    "t-distil": ("text-classifier", tiny_text_models.make_distilbert_classifier, ["backends=none"], []),
    "t-multilabel": ("text-classifier", tiny_text_models.make_bert_multilabel_classifier, ["backends=none"], []),
    "t-rerank": ("text-classifier", tiny_text_models.make_cross_encoder, ["backends=none"], []),
    "t-mpnet": (
        "text-model",
        tiny_text_models.make_mpnet_mean_normalize_embedder,
        ["backends=none"],
        [*ONE_WORKER, "--config", "handler.dimensions=[8, 16]"],  # Matryoshka sizes a request may cut to
    ),
    "t-dense": ("text-model", tiny_text_models.make_bert_cls_dense_normalize_embedder, ["backends=none"], ONE_WORKER),
    "t-qwen3": ("text-model", tiny_text_models.make_qwen3_decoder_embedder, ["backends=none"], ONE_WORKER),
    "t-deberta": ("text-model", tiny_text_models.make_deberta_nli_classifier, ["backends=none"], ONE_WORKER),
    "t-modernbert": ("text-model", tiny_text_models.make_modernbert_classifier, ["backends=none"], ONE_WORKER),
    "t-electra": ("text-model", tiny_text_models.make_electra_classifier, ["backends=none"], ONE_WORKER),
    "t-splade": ("text-model", tiny_text_models.make_splade_encoder, ["backends=none"], ONE_WORKER),
    "t-colbert": ("text-model", tiny_text_models.make_multi_vector_encoder, ["backends=none"], ONE_WORKER),
}
SERVED_AT_START = [name for name in MODELS if name != "t-rerank"]


def package(template, name, folder, store, *variables, extra=()):
    command = [sys.executable, "-m", "scripts.package", template, "--name", name, "--var", f"model_dir={folder}"]
    for variable in variables:
        command += ["--var", variable]
    command += ["--store", str(store), *extra]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("user-models")
    return {name: builder(root / name) for name, (_, builder, _, _) in MODELS.items()}


@pytest.fixture(scope="module")
def store(folders, tmp_path_factory):
    """Every folder packaged by the documented command, two at a time (each is its own process on 2 cores)."""
    store = tmp_path_factory.mktemp("user-store")

    def build(name):
        template, _, variables, extra = MODELS[name]
        return name, package(template, name, folders[name], store, *variables, extra=extra)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for name, result in pool.map(build, MODELS):
            assert result.returncode == 0, (name, result.stdout + result.stderr)
    return store


@pytest.fixture(scope="module")
def server(start_ts_server, store):
    return start_ts_server(name="user-models", models=SERVED_AT_START, store=store)


@pytest.fixture(scope="module")
def post(server):
    session = requests.Session()

    def call(model, body):
        return session.post(f"{server.inference_url}/predictions/{model}", json=body, timeout=60)

    return call


def describe(server, model):
    response = requests.get(f"{server.management_url}/models/{model}", params={"customized": "true"}, timeout=30)
    response.raise_for_status()
    metadata = response.json()[0]["customizedMetadata"]
    return json.loads(metadata) if isinstance(metadata, str) else metadata


def cosine(a, b):
    return float(torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=-1))


def test_each_archive_records_parity_with_the_reference_library_in_fp32(store):
    kinds = {}
    for name in MODELS:
        with zipfile.ZipFile(store / f"{name}.mar") as archive:
            source = json.loads(archive.read("model_source.json"))
        assert source["parity"]["fp32_agreement"] >= 0.9999, (name, source["parity"])
        kinds[name] = source["kind"]
    # The generic template took each folder's kind from the folder itself.
    assert [kinds[name] for name in ("t-mpnet", "t-deberta", "t-splade", "t-colbert")] == [
        "embedding",
        "classification",
        "sparse",
        "multi-vector",
    ]


@pytest.mark.parametrize("name", ["t-mpnet", "t-dense", "t-qwen3"])
def test_any_embedder_architecture_answers_as_sentence_transformers(server, post, folders, name):
    expected = tiny_text_models.reference_embeddings(folders[name], TEXTS)
    response = post(name, {"input": TEXTS})
    assert response.status_code == 200, response.text
    got = torch.tensor([row["embedding"] for row in response.json()["data"]])
    assert torch.nn.functional.cosine_similarity(got, expected).min() >= 0.999
    if name == "t-qwen3":  # the decoder's instruction prompt, as encode(prompt_name="query") applies it
        prompted = post(name, {"input": TEXTS, "prompt_name": "query"}).json()["data"]
        reference = tiny_text_models.reference_embeddings(folders[name], TEXTS, "query")
        got = torch.tensor([row["embedding"] for row in prompted])
        assert torch.nn.functional.cosine_similarity(got, reference).min() >= 0.999
    described = describe(server, name)["model"]
    assert described["kind"] == "embedding" and described["remote_code"] is False


@pytest.mark.parametrize("name", ["t-deberta", "t-modernbert", "t-electra"])
def test_any_classifier_architecture_answers_as_transformers_on_texts_and_pairs(post, folders, name):
    rows = [*TEXTS, *[list(pair) for pair in PAIRS]]
    expected, id2label = tiny_text_models.reference_probabilities(folders[name], rows)
    response = post(name, {"inputs": rows, "top_k": None})
    assert response.status_code == 200, response.text
    for result, probabilities in zip(response.json()["results"], expected, strict=True):
        scores = {entry["label"]: entry["score"] for entry in result["scores"]}
        assert all(math.isclose(scores[id2label[i]], float(p), abs_tol=0.01) for i, p in enumerate(probabilities))


def test_a_sparse_encoder_serves_the_sparse_encoders_weights(server, post, folders):
    expected = tiny_text_models.reference_sparse(folders["t-splade"], TEXTS)
    response = post("t-splade", {"input": TEXTS})
    assert response.status_code == 200, response.text
    for item, reference in zip(response.json()["data"], expected, strict=True):
        got = tiny_text_models.dense_sparse(item["sparse"], reference.shape[0])
        assert float(torch.nn.functional.cosine_similarity(got, reference, dim=0)) >= 0.999
    top = post("t-splade", {"text": TEXTS[0], "top_k": 5, "decode": True}).json()
    assert len(top["sparse"]) == 5 and len(top["tokens"]) == 5
    assert describe(server, "t-splade")["model"]["vocabulary"] == expected.shape[1]


def test_a_multi_vector_encoder_serves_one_vector_per_scored_token(post, folders):
    for task in ("document", "query"):
        expected = tiny_text_models.reference_multi_vector(folders["t-colbert"], TEXTS, task)
        response = post("t-colbert", {"input": TEXTS, "input_type": task})
        assert response.status_code == 200, response.text
        for item, reference in zip(response.json()["data"], expected, strict=True):
            got = torch.tensor(item["embeddings"])
            assert got.shape == reference.shape
            assert torch.nn.functional.cosine_similarity(got, reference).min() >= 0.999


def test_a_folder_that_ships_its_own_code_is_refused_unless_the_packager_opts_in(folders, tmp_path):
    folder = tiny_text_models.with_remote_code(tmp_path / "remote", folders["t-mpnet"])
    store = tmp_path / "store"
    result = package("text-model", "remote", folder, store, "backends=none")
    assert result.returncode == 1
    assert "config.json: auto_map (AutoConfig -> custom_model.CustomConfig" in result.stderr
    assert "--var trust_remote_code=true" in result.stderr
    assert not store.exists() or not any(store.glob("*.mar"))


def test_bert_cls_normalize_embeddings_match_sentence_transformers(server, post, folders):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folders["t-bert-cls"]), device="cpu").encode(TEXTS)
    response = post("t-bert-cls", {"input": TEXTS})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    bound = describe(server, "t-bert-cls")["backend_min_cosine"] - 1e-3
    for row, expected in zip(data, reference, strict=True):
        assert len(row["embedding"]) == 32
        assert math.isclose(sum(v * v for v in row["embedding"]), 1.0, rel_tol=1e-3)  # Normalize module honoured
        assert cosine(row["embedding"], expected) >= min(bound, 0.999)


def test_xlmr_mean_embeddings_honour_prompts_and_the_missing_normalize(server, post, folders, store):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folders["t-xlmr-mean"]), device="cpu")
    plain = model.encode(TEXTS)
    query = model.encode(TEXTS, prompt_name="query")
    served_plain = post("t-xlmr-mean", {"input": TEXTS}).json()["data"]
    served_query = post("t-xlmr-mean", {"input": TEXTS, "prompt_name": "query"}).json()["data"]
    for row, expected in zip(served_plain, plain, strict=True):
        assert cosine(row["embedding"], expected) >= 0.995
        # No Normalize module: the served vector keeps sentence-transformers' length, not 1.
        norm = math.sqrt(sum(v * v for v in row["embedding"]))
        assert math.isclose(norm, float(torch.tensor(expected).norm()), rel_tol=0.02)
    for row, expected, other in zip(served_query, query, plain, strict=True):
        assert cosine(row["embedding"], expected) >= 0.995
        assert cosine(row["embedding"], expected) > cosine(row["embedding"], other)
    single = post("t-xlmr-mean", {"text": TEXTS[0], "prompt_name": "query"}).json()["embedding"]
    assert cosine(single, query[0]) >= 0.995
    described = describe(server, "t-xlmr-mean")
    assert described["model"]["pooling"] == ["mean"] and described["model"]["normalize"] is False
    assert described["model"]["architecture"] == "xlm-roberta" and described["max_tokens"] == 64
    assert described["length_buckets"] == [16, 32, 64]  # the model's own limit, not minilm's 256
    # Served through the archive's ranking: its best candidate this worker runs (which backend wins depends on the CPU
    # kind that packaged it: OpenVINO with native bf16, AOTInductor on AVX2 only), eager when none was kept.
    with zipfile.ZipFile(store / "t-xlmr-mean.mar") as archive:
        manifest = json.loads(archive.read("backends/manifest.json"))
    offered = [(c["backend"], c["precision"]) for c in manifest["candidates"]]
    assert (described["backend"], described["precision"]) in (offered or [("eager", described["precision"])])


def test_the_openai_client_serves_a_users_embedder_with_a_named_prompt(server, post, folders):
    """The official client, unchanged, at the user's model's base URL (docs/clients.md); prompt_name rides in
    extra_body, and its defaults (base64) give the vectors of encode(prompt_name="query") and of plain HTTP."""
    openai = pytest.importorskip("openai")
    import numpy as np
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(folders["t-xlmr-mean"]), device="cpu").encode(TEXTS, prompt_name="query")
    base_url = f"{server.inference_url}/predictions/t-xlmr-mean/1.0/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        answer = client.embeddings.create(model="t-xlmr-mean", input=TEXTS, extra_body={"prompt_name": "query"})
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="minilm", input=TEXTS)  # another model's name: 404, not its vectors
    assert answer.model == "t-xlmr-mean" and answer.usage.prompt_tokens > 0
    served = np.array([item.embedding for item in answer.data], dtype=np.float32)
    over_http = post("t-xlmr-mean", {"input": TEXTS, "prompt_name": "query"}).json()["data"]
    assert np.array_equal(served, np.array([row["embedding"] for row in over_http], dtype=np.float32))
    for row, reference in zip(served, expected, strict=True):
        assert len(row) == 32 and cosine(row.tolist(), reference) >= 0.995


def test_an_unknown_prompt_name_is_a_400_naming_the_prompts_and_the_batch_goes_on(post):
    bad = post("t-xlmr-mean", {"text": "hello", "prompt_name": "nope"})
    assert bad.status_code == 400
    assert "'nope' is not a prompt of this model" in bad.json()["message"]
    assert "query" in bad.json()["message"]
    assert post("t-xlmr-mean", {"text": "hello"}).status_code == 200
    # sentence-transformers 6 saves empty "query"/"document" prompts by default: the same vector as no prompt.
    empty = post("t-bert-cls", {"text": "hello", "prompt_name": "query"})
    assert empty.json()["embedding"] == post("t-bert-cls", {"text": "hello"}).json()["embedding"]


def test_distilbert_classifier_labels_and_probabilities_match_transformers(post, folders):
    expected, id2label = tiny_text_models.reference_probabilities(folders["t-distil"], TEXTS)
    response = post("t-distil", {"inputs": TEXTS, "top_k": None})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    for result, probabilities in zip(results, expected, strict=True):
        best = int(probabilities.argmax())
        assert result["label"] == id2label[best]
        assert math.isclose(result["score"], float(probabilities[best]), abs_tol=0.01)
        assert [s["label"] for s in result["scores"]] == [
            id2label[i] for i in sorted(range(3), key=lambda i: -float(probabilities[i]))
        ]
        assert math.isclose(sum(s["score"] for s in result["scores"]), 1.0, abs_tol=1e-3)
    single = post("t-distil", {"text": TEXTS[0], "top_k": 2}).json()
    assert single["label"] == results[0]["label"] and len(single["scores"]) == 2


def test_multilabel_classifier_answers_a_sigmoid_per_label(post, folders):
    expected, id2label = tiny_text_models.reference_probabilities(folders["t-multilabel"], TEXTS)
    results = post("t-multilabel", {"inputs": TEXTS, "top_k": None}).json()["results"]
    for result, probabilities in zip(results, expected, strict=True):
        by_label = {s["label"]: s["score"] for s in result["scores"]}
        for index, label in id2label.items():
            assert math.isclose(by_label[label], float(probabilities[index]), abs_tol=0.01)
        assert result["labels"] == [s["label"] for s in result["scores"] if s["score"] >= 0.5]


def test_pairs_are_classified_as_pairs(post, folders):
    expected, id2label = tiny_text_models.reference_probabilities(folders["t-multilabel"], PAIRS)
    results = post("t-multilabel", {"inputs": [list(pair) for pair in PAIRS], "top_k": None}).json()["results"]
    for result, probabilities in zip(results, expected, strict=True):
        by_label = {s["label"]: s["score"] for s in result["scores"]}
        assert all(math.isclose(by_label[id2label[i]], float(p), abs_tol=0.01) for i, p in enumerate(probabilities))


def test_a_bad_row_in_a_batch_fails_alone(server, post):
    bodies = [{"inputs": ["fine text"]}, {"inputs": [["only one"]]}, {"text": "x", "top_k": 0}, {"inputs": ["also"]}]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: post("t-distil", body), bodies))
    assert [r.status_code for r in responses] == [200, 400, 400, 200]
    assert "pair" in responses[1].json()["message"] and "'top_k'" in responses[2].json()["message"]


def test_register_adds_a_reranker_to_the_running_server_and_it_ranks_like_cross_encoder(server, store, folders):
    from sentence_transformers import CrossEncoder

    command = [
        sys.executable,
        "-m",
        "scripts.modelctl",
        "--management-url",
        server.management_url,
        "--model-store",
        str(store),
        "--json",
        "register",
        "t-rerank.mar",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ready_workers"] >= 1
    query, documents = "the cat sleeps", ["a cat is sleeping", "stock markets fell", "cats nap a lot", "ok"]
    expected = CrossEncoder(str(folders["t-rerank"]), device="cpu").predict([(query, d) for d in documents])
    response = requests.post(
        f"{server.inference_url}/predictions/t-rerank",
        json={"query": query, "documents": documents, "return_documents": True, "top_n": 3},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    order = sorted(range(len(documents)), key=lambda i: -float(expected[i]))[:3]
    assert [r["index"] for r in results] == order
    for r in results:
        assert math.isclose(r["relevance_score"], float(expected[r["index"]]), abs_tol=0.01)
        assert r["document"]["text"] == documents[r["index"]]
    described = describe(server, "t-rerank")
    assert described["model"]["labels"] == ["LABEL_0"] and described["model"]["activation"] == "sigmoid"
    not_a_reranker = requests.post(
        f"{server.inference_url}/predictions/t-distil", json={"query": "q", "documents": ["d"]}, timeout=60
    )
    assert not_a_reranker.status_code == 400 and "one relevance score" in not_a_reranker.json()["message"]


@pytest.mark.parametrize(
    "breaker, file, words",
    [
        (tiny_text_models.break_no_weights, "model.safetensors", "no weights"),
        (tiny_text_models.break_bin_only, "pytorch_model.bin", "pickled weights"),
        (tiny_text_models.break_pooling_mode, "1_Pooling/config.json", "is unknown"),
        (tiny_text_models.break_architecture, "model.safetensors", "they would be random"),
        (tiny_text_models.break_tokenizer, "tokenizer.json", "every other tokenizer file"),
    ],
)
def test_a_bad_folder_is_refused_at_package_time_naming_the_file_and_the_fix(tmp_path, breaker, file, words):
    good = tiny_text_models.make_bert_cls_normalize_embedder(tmp_path / "good")
    bad = breaker(tmp_path / "bad", good)
    store = tmp_path / "store"
    result = package("embedding", "refused", bad, store, "backends=none")
    assert result.returncode == 1
    assert f"{file}: " in result.stderr and words in result.stderr and "Fix: " in result.stderr, result.stderr
    assert not store.exists() or not any(store.glob("*.mar"))


@pytest.mark.parametrize("model", ["t-multilabel", "t-rerank", "t-qwen3", "t-splade", "t-colbert"])
def test_the_fuzzer_covers_every_kind_of_a_users_model(server, store, model):
    """The whole-server fuzzer on a user's archives, as on the bundled models (tests/integration/test_fuzz_server.py):
    the campaign learns the kind from the archive (its handler, or the kind text_model.json records), not from the
    name, and judges each 200 against the model's own handler answering the request alone."""
    from scripts.reliability import fuzz

    client = server.management()
    if not client.registered(model):  # t-rerank: registered by the modelctl test above, unless that did not run
        client.register(f"{model}.mar", synchronous=True, timeout=600)
        client.wait_ready(model, timeout=600)
    count = 200
    row = fuzz.campaign(server, model, store, requests=count, seed=11, clients=24)
    details = row.details
    assert row.passed, f"{row.figure}\n{json.dumps(details['examples'], indent=1)[:6000]}"
    assert details["requests"] == count and sum(int(n) for n in details["statuses"].values()) == count
    # The campaign really mixed valid and invalid requests, and valid ones were answered.
    assert details["expected"]["ok"] > count // 5 and details["expected"]["error"] > count // 5
    assert details["statuses"].get("200", 0) >= details["expected"]["ok"]
    assert details["worker_restarts"] == 0


@pytest.fixture(scope="module")
def reranker(server):
    """t-rerank's versioned base URL (registered by the modelctl test above, or here when that did not run)."""
    client = server.management()
    if not client.registered("t-rerank"):
        client.register("t-rerank.mar", synchronous=True, timeout=600)
        client.wait_ready("t-rerank", timeout=600)
    return f"{server.inference_url}/predictions/t-rerank/1.0"


def test_rerank_clients_rank_as_cross_encoder_in_every_shape(reranker, folders):
    """The official cohere client (v2 and v1), LangChain's CohereRerank, and the TEI and Jina bodies over HTTP, at the
    reranker's base URL, against CrossEncoder.predict computed here."""
    import cohere
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document
    from sentence_transformers import CrossEncoder

    query, documents = "the cat sleeps", ["a cat is sleeping", "stock markets fell", "cats nap a lot", "ok"]
    expected = CrossEncoder(str(folders["t-rerank"]), device="cpu").predict([(query, d) for d in documents]).tolist()
    order = sorted(range(len(documents)), key=lambda i: -expected[i])

    def check(results, count):
        assert [r.index for r in results] == order[:count]
        assert all(math.isclose(r.relevance_score, expected[r.index], abs_tol=0.01) for r in results)

    v2 = cohere.ClientV2(base_url=reranker, api_key="unused", timeout=60)
    check(v2.rerank(model="t-rerank", query=query, documents=documents, top_n=3).results, 3)
    v1 = cohere.Client(base_url=reranker, api_key="unused", timeout=60)
    answer = v1.rerank(model="t-rerank", query=query, documents=documents, return_documents=True)
    check(answer.results, 4)
    assert [r.document.text for r in answer.results] == [documents[i] for i in order]
    with pytest.raises(cohere.NotFoundError):
        v2.rerank(model="rerank-v3.5", query=query, documents=documents)
    with pytest.raises(cohere.BadRequestError) as refused:
        v2.rerank(model="t-rerank", query=query, documents=[])
    assert "non-empty list" in refused.value.body["message"]

    langchain = CohereRerank(base_url=reranker, cohere_api_key="unused", model="t-rerank", top_n=2)
    kept = langchain.compress_documents([Document(page_content=d) for d in documents], query)
    assert [doc.page_content for doc in kept] == [documents[i] for i in order[:2]]
    assert math.isclose(kept[0].metadata["relevance_score"], expected[order[0]], abs_tol=0.01)

    tei = requests.post(
        f"{reranker}/rerank", json={"query": query, "texts": documents, "return_text": True}, timeout=60
    )
    assert [r["index"] for r in tei.json()] == order and tei.json()[0]["text"] == documents[order[0]]
    jina = requests.post(
        f"{reranker}/v1/rerank",
        json={"model": "t-rerank", "query": query, "documents": documents, "top_n": 2},
        timeout=60,
    ).json()  # what LlamaIndex's JinaRerank sends, and reads (results, usage)
    assert [r["index"] for r in jina["results"]] == order[:2] and jina["usage"]["total_tokens"] > 0


def test_the_openai_client_cuts_a_matryoshka_model_as_truncate_dim_does(server, folders):
    openai = pytest.importorskip("openai")
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folders["t-mpnet"]), device="cpu", truncate_dim=16)
    expected = reference.encode(TEXTS, normalize_embeddings=True, convert_to_tensor=True)
    base_url = f"{server.inference_url}/predictions/t-mpnet/1.0/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        answer = client.embeddings.create(model="t-mpnet", input=TEXTS, dimensions=16)
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="t-mpnet", input=TEXTS, dimensions=12)
    got = torch.tensor([item.embedding for item in answer.data])
    assert got.shape == (len(TEXTS), 16)
    assert torch.nn.functional.cosine_similarity(got, expected).min() >= 0.999
    assert "[8, 16, 32]" in refused.value.message
    assert describe(server, "t-mpnet")["dimensions"] == [8, 16, 32]


def test_zero_shot_on_a_users_nli_model_answers_as_the_pipeline(post, folders):
    from transformers import pipeline

    labels = ["travel", "cooking", "finance"]
    classifier = pipeline("zero-shot-classification", model=str(folders["t-deberta"]), device="cpu")
    expected = classifier(TEXTS[:2], labels, multi_label=True)
    response = post("t-deberta", {"inputs": TEXTS[:2], "parameters": {"candidate_labels": labels, "multi_label": True}})
    assert response.status_code == 200, response.text
    for got, want in zip(response.json(), expected, strict=True):
        assert got["labels"] == want["labels"]
        assert all(math.isclose(a, b, abs_tol=0.01) for a, b in zip(got["scores"], want["scores"], strict=True))


class FineText:
    """The good request the reliability suite's corpus run sends after each bad one (scripts/reliability)."""

    def __init__(self, model):
        self.name = model

    def body(self, index):
        return json.dumps({"inputs": ["fine text"]})

    def matches(self, index, answer):
        return len(answer["results"]) == 1


@pytest.mark.parametrize("model", ["t-rerank", "t-deberta"])
def test_the_bad_input_corpus_of_a_users_reranker_and_nli_model(server, reranker, model):
    """Every route's refusals (tests/data/bad_requests/<model>.yaml) in that API's shape, a good request after each,
    no worker restarted: the reliability suite's corpus run (scripts/reliability/correctness.py)."""
    from scripts.reliability import correctness

    cases, failures, pids_before, pids_after = correctness.run_bad_input(server, FineText(model))
    assert cases and not failures, "\n".join(failures)
    assert pids_after == pids_before
