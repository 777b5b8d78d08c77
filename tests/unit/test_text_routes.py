"""The API surfaces of text models (handlers/text/routes.py), through the packaging step's staging and an in-process
worker, compared with the reference libraries computed here: compressed embeddings with sentence-transformers'
``quantize_embeddings``, Matryoshka cuts with ``truncate_dim``, the three rerank shapes with ``CrossEncoder``,
zero-shot classification with transformers' pipeline, TEI's /embed_sparse with ``SparseEncoder``, /tokenize with the
tokenizer. Each route's refusals come in its API's error shape, and a refused request fails alone in its batch."""

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from handlers.text.quantization import CALIBRATION_FILE
from scripts import prepare_text_model, tiny_text_models
from scripts.ops.handler_loader import load_handler, set_requests, statuses

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["How do I reset my password?", "ok", "Le café est très chaud ce matin.", "the quick brown fox " * 9]
DOCUMENTS = ["a cat is sleeping", "stock markets fell", "cats nap a lot", "ok"]
FOLDERS = {
    "mpnet": tiny_text_models.make_mpnet_mean_normalize_embedder,
    "rerank": tiny_text_models.make_cross_encoder,
    "nli": tiny_text_models.make_deberta_nli_classifier,
    "splade": tiny_text_models.make_splade_encoder,
}


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    root = tmp_path_factory.mktemp("routes")
    result = {}
    for name, builder in FOLDERS.items():
        source = builder(root / f"{name}-source")
        prepare_text_model.stage(str(source), root / name, None, None)
        shutil.copy2(REPO / "models" / "text-model" / "model-config.yaml", root / name / "model-config.yaml")
        result[name] = (source, root / name)
    return result


class Worker:
    def __init__(self, folder, overrides=None):
        config = {"precision": "fp32", "cache_size": 0, **(overrides or {})}
        self.handler, self.context = load_handler(folder, "text-model", config)

    def post(self, path, *bodies):
        """(statuses, answers) of one batch of bodies sent to ``path``."""
        set_requests(self.context, [{"Content-Type": "application/json", "url_path": path}] * len(bodies))
        answers = self.handler.handle([{"body": body} for body in bodies], self.context)
        return statuses(self.context, len(bodies)), [json.loads(answer) for answer in answers]


@pytest.fixture(scope="module")
def workers(staged):
    return {
        "mpnet": Worker(staged["mpnet"][1], {"dimensions": [8, 16]}),
        "rerank": Worker(staged["rerank"][1]),
        "nli": Worker(staged["nli"][1]),
        "splade": Worker(staged["splade"][1]),
    }


def quantized(vectors, precision, ranges=None):
    from sentence_transformers.util.quantization import quantize_embeddings

    return quantize_embeddings(np.asarray(vectors, dtype=np.float32), precision, ranges=ranges).tolist()


def test_the_calibration_is_the_reference_sentences_fp32_vectors_and_describe_shows_its_ranges(staged, workers):
    folder = staged["mpnet"][1]
    sentences = json.loads((folder / "reference_sentences.json").read_text())
    from safetensors.torch import load_file

    vectors = load_file(str(folder / CALIBRATION_FILE))["vectors"]
    reference = tiny_text_models.reference_embeddings(folder, sentences)
    assert vectors.shape == reference.shape
    assert torch.nn.functional.cosine_similarity(vectors, reference).min() >= 0.9999
    described = workers["mpnet"].handler.describe()
    assert described["calibration"]["sentences"] == len(sentences)
    assert np.allclose(described["calibration"]["min"], vectors.min(0).values.numpy())
    assert described["dimensions"] == [8, 16, vectors.shape[1]]
    assert described["routes"]["v2/embed"] == "Cohere embed v2"


def test_every_cohere_embedding_type_is_quantize_embeddings_of_the_float_vectors(workers):
    described = workers["mpnet"].handler.describe()["calibration"]
    ranges = np.array([described["min"], described["max"]], dtype=np.float32)
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    body = {"model": "text-model", "texts": TEXTS, "input_type": "search_document", "embedding_types": types}
    status, [answer] = workers["mpnet"].post("v2/embed", body)
    assert status == [200], answer
    embeddings = answer["embeddings"]
    assert list(embeddings) == types and answer["texts"] == TEXTS
    floats = np.array(embeddings["float"], dtype=np.float32)
    for precision in ("int8", "uint8"):
        assert embeddings[precision] == quantized(floats, precision, ranges), precision
    for precision in ("binary", "ubinary"):
        assert embeddings[precision] == quantized(floats, precision), precision
    decoded = np.array([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in embeddings["base64"]])
    assert np.array_equal(decoded, floats)
    assert answer["meta"]["billed_units"]["input_tokens"] > 0


def test_openai_encoding_formats_answer_the_same_integers(workers):
    status, answers = workers["mpnet"].post(
        "v1/embeddings",
        {"input": TEXTS, "encoding_format": "int8"},
        {"input": TEXTS, "encoding_format": "ubinary"},
        {"input": TEXTS},
    )
    assert status == [200, 200, 200]
    calibration = workers["mpnet"].handler.describe()["calibration"]
    ranges = np.array([calibration["min"], calibration["max"]], dtype=np.float32)
    floats = [item["embedding"] for item in answers[2]["data"]]
    assert [item["embedding"] for item in answers[0]["data"]] == quantized(floats, "int8", ranges)
    assert [item["embedding"] for item in answers[1]["data"]] == quantized(floats, "ubinary")


@pytest.mark.parametrize("size", [8, 16])
def test_dimensions_cut_and_renormalise_as_truncate_dim_does(staged, workers, size):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(staged["mpnet"][1]), device="cpu", truncate_dim=size)
    expected = model.encode(TEXTS, normalize_embeddings=True, convert_to_tensor=True)
    status, answers = workers["mpnet"].post("v1/embeddings", {"input": TEXTS, "dimensions": size})
    got = torch.tensor([item["embedding"] for item in answers[0]["data"]])
    assert got.shape == expected.shape
    assert torch.nn.functional.cosine_similarity(got, expected).min() >= 0.9999
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)
    status, [cut] = workers["mpnet"].post("v2/embed", {"texts": TEXTS, "output_dimension": size})
    assert status == [200] and np.allclose(cut["embeddings"]["float"], got.numpy(), atol=1e-6)


def test_a_size_the_model_does_not_declare_is_refused_naming_the_sizes(workers):
    status, answers = workers["mpnet"].post("v1/embeddings", {"input": "a", "dimensions": 12}, {"input": "a"})
    assert status == [400, 200]
    assert "[8, 16, 32]" in answers[0]["error"]["message"] and answers[0]["error"]["code"] == "invalid_request"
    status, [refused] = workers["rerank"].post("tokenize", {"inputs": "a", "add_special_tokens": "yes"})
    assert status == [400] and refused["error_type"] == "Validation"


def test_tei_embed_answers_a_bare_list_of_vectors(workers):
    status, [answer, refused] = workers["mpnet"].post(
        "embed", {"inputs": TEXTS[:2]}, {"inputs": "a", "normalize": False}
    )
    assert status == [200, 400]
    _, [openai] = workers["mpnet"].post("v1/embeddings", {"input": TEXTS[:2]})
    assert answer == [item["embedding"] for item in openai["data"]]
    assert refused == {"error": refused["error"], "error_type": "Validation"} and "normalise" in refused["error"]


def test_cohere_refusals_are_cohere_shaped_and_fail_alone(workers):
    status, answers = workers["mpnet"].post(
        "v2/embed",
        {"texts": ["a"], "embedding_types": ["float16"]},
        {"texts": ["a"], "model": "embed-english-v3.0"},
        {"texts": ["a"], "truncate": "START"},
        {"texts": ["fine"], "embedding_types": ["int8"]},
    )
    assert status == [400, 404, 400, 200]
    assert all(set(answer) == {"message"} for answer in answers[:3])
    assert "float16" in answers[0]["message"] and "send model='text-model'" in answers[1]["message"]


def cross_encoder_scores(source, query, documents):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(source), device="cpu").predict([(query, d) for d in documents]).tolist()


def test_the_three_rerank_shapes_rank_as_cross_encoder_does(staged, workers):
    query = "the cat sleeps"
    expected = cross_encoder_scores(staged["rerank"][0], query, DOCUMENTS)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    v2_body = {"model": "text-model", "query": query, "documents": DOCUMENTS, "top_n": 3}
    _, [v2] = workers["rerank"].post("v2/rerank", v2_body)
    _, [v1] = workers["rerank"].post(
        "v1/rerank", {"query": query, "documents": [{"text": d} for d in DOCUMENTS], "return_documents": True}
    )
    _, [tei] = workers["rerank"].post("rerank", {"query": query, "texts": DOCUMENTS, "return_text": True})
    _, [raw] = workers["rerank"].post("rerank", {"query": query, "texts": DOCUMENTS, "raw_scores": True})
    assert [r["index"] for r in v2["results"]] == order[:3] and "document" not in v2["results"][0]
    assert v2["meta"]["api_version"] == {"version": "2"} and v2["meta"]["tokens"]["input_tokens"] > 0
    assert [r["index"] for r in v1["results"]] == order and v1["model"] == "text-model" and v1["usage"]["total_tokens"]
    assert [r["document"]["text"] for r in v1["results"]] == [DOCUMENTS[i] for i in order]
    assert [r["index"] for r in tei] == order and [r["text"] for r in tei] == [DOCUMENTS[i] for i in order]
    for answer in (v2["results"], v1["results"]):
        for result in answer:
            assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
    for result in tei:
        assert result["score"] == pytest.approx(expected[result["index"]], abs=1e-5)
    logits = torch.logit(torch.tensor(expected))
    for result in raw:
        assert result["score"] == pytest.approx(float(logits[result["index"]]), abs=1e-3)


def test_max_tokens_per_doc_cuts_each_document_before_it_is_paired(staged, workers):
    long_document = "cats nap a lot " * 20
    tokenizer = workers["rerank"].handler.loaded.tokenizer.untruncated()
    offsets = tokenizer.encode(long_document, add_special_tokens=False).offsets
    cut = long_document[: offsets[4][1]]
    expected = cross_encoder_scores(staged["rerank"][0], "the cat sleeps", [cut])
    body = {"query": "the cat sleeps", "documents": [long_document], "max_tokens_per_doc": 5}
    _, [answer] = workers["rerank"].post("v2/rerank", body)
    assert answer["results"][0]["relevance_score"] == pytest.approx(expected[0], abs=1e-5)


def test_rerank_refusals_take_each_apis_shape(workers):
    status, answers = workers["rerank"].post("v1/rerank", {"query": "q", "documents": []})
    assert status == [400] and set(answers[0]) == {"message", "detail"}
    status, answers = workers["rerank"].post("rerank", {"query": "q", "texts": ["d"], "truncation_direction": "left"})
    assert status == [400] and answers[0]["error_type"] == "Validation"
    status, answers = workers["nli"].post("v2/rerank", {"query": "q", "documents": ["d"]})
    assert status == [400] and "one relevance score" in answers[0]["message"]


@pytest.mark.parametrize("multi_label", [False, True])
def test_zero_shot_answers_as_the_transformers_pipeline(staged, workers, multi_label):
    from transformers import pipeline

    labels = ["travel", "cooking", "finance"]
    classifier = pipeline("zero-shot-classification", model=str(staged["nli"][0]), device="cpu")
    expected = classifier(TEXTS[:3], labels, hypothesis_template="This text is about {}.", multi_label=multi_label)
    body = {
        "inputs": TEXTS[:3],
        "parameters": {
            "candidate_labels": labels,
            "hypothesis_template": "This text is about {}.",
            "multi_label": multi_label,
        },
    }
    status, [answer] = workers["nli"].post("", body)
    assert status == [200], answer
    for got, want in zip(answer, expected, strict=True):
        assert got["sequence"] == want["sequence"] and got["labels"] == want["labels"]
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-5)
    status, [single] = workers["nli"].post("", {"inputs": TEXTS[0], "candidate_labels": "travel, cooking"})
    assert status == [200] and single["sequence"] == TEXTS[0] and sorted(single["labels"]) == ["cooking", "travel"]


def test_zero_shot_refusals(workers):
    status, answers = workers["nli"].post(
        "",
        {"inputs": "x", "candidate_labels": ["a"], "hypothesis_template": "no placeholder"},
        {"inputs": "x", "candidate_labels": ["a"], "hypothesis_template": "{0.__class__} {}"},
        {"inputs": ["x"] * 8, "candidate_labels": [str(i) for i in range(9)]},
        {"inputs": "fine", "candidate_labels": ["a", "b"]},
    )
    assert status == [400, 400, 413, 200]
    status, answers = workers["rerank"].post("", {"inputs": "x", "candidate_labels": ["a"]})
    assert status == [400] and "entailment" in answers[0]["message"]


def test_tei_embed_sparse_answers_the_sparse_encoders_weights(staged, workers):
    expected = tiny_text_models.reference_sparse(staged["splade"][0], TEXTS)
    status, [answer] = workers["splade"].post("embed_sparse", {"inputs": TEXTS, "truncate": True})
    assert status == [200]
    for entries, reference in zip(answer, expected, strict=True):
        assert [e["index"] for e in entries] == sorted(e["index"] for e in entries)
        got = tiny_text_models.dense_sparse(entries, reference.shape[0])
        assert float(torch.nn.functional.cosine_similarity(got, reference, dim=0)) >= 0.999


def test_tokenize_and_decode_as_tei_answers_them_for_every_kind(staged, workers):
    from transformers import AutoTokenizer

    for name in ("mpnet", "rerank", "nli", "splade"):
        tokenizer = AutoTokenizer.from_pretrained(str(staged[name][1]), local_files_only=True)
        long_text = "word " * 300  # past the model's limit: /tokenize counts every token
        status, [answer] = workers[name].post("tokenize", {"inputs": [TEXTS[0], long_text]})
        assert status == [200], (name, answer)
        for tokens, text in zip(answer, [TEXTS[0], long_text], strict=True):
            assert [t["id"] for t in tokens] == tokenizer(text, truncation=False)["input_ids"], name
            words = [t for t in tokens if not t["special"]]
            assert all(text[t["start"] : t["stop"]] == t["text"] for t in words)
        _, [info] = workers[name].post("info", {})
        assert info["max_input_length"] == workers[name].handler.loaded.max_tokens
        ids = [t["id"] for t in answer[0]]
        _, [decoded] = workers[name].post("decode", {"ids": ids})
        assert decoded == [tokenizer.decode(ids, skip_special_tokens=True)], name
    status, answers = workers["mpnet"].post("decode", {"ids": [10**9]}, {"ids": [[1, 2], [3]]})
    assert status == [400, 200] and "token ids are integers" in answers[0]["error"]


def test_an_unknown_path_is_a_404_listing_the_routes(workers):
    status, [answer] = workers["rerank"].post("v3/rerank", {"query": "q"})
    assert status == [404] and "v2/rerank" in answer["message"] and "tokenize" in answer["message"]


def test_cohere_max_tokens_cuts_each_text_and_truncate_none_refuses_a_longer_one(workers):
    tokenizer = workers["mpnet"].handler.loaded.tokenizer.untruncated()
    offsets = tokenizer.encode(TEXTS[0], add_special_tokens=False).offsets
    cut = TEXTS[0][: offsets[2][1]]
    status, [answer, refused, whole] = workers["mpnet"].post(
        "v2/embed",
        {"texts": [TEXTS[0]], "max_tokens": 3},
        {"texts": [TEXTS[0]], "max_tokens": 3, "truncate": "NONE"},
        {"texts": [cut]},
    )
    assert status == [200, 400, 200]
    assert answer["embeddings"]["float"] == whole["embeddings"]["float"] and answer["texts"] == [TEXTS[0]]
    assert "more than 'max_tokens' 3" in refused["message"]
