"""Every kind and architecture a team brings, through the packaging step's staging (scripts/prepare_text_model.py) and
an in-process worker (handlers/text_model.py), compared with the reference library computed here.

The folders are tiny random models (scripts/tiny_text_models.py) of the layouts teams have: all-mpnet-base-v2's (MPNet,
mean, Normalize), LaBSE's (BERT, CLS, Dense tanh, Normalize), Qwen3-Embedding's (a decoder, last token, an instruction
prompt), DeBERTa-v3 NLI, ModernBERT and ELECTRA classifiers, a BERT pair classifier whose tokenizer sends no segment
ids, a SPLADE sparse encoder and a ColBERT-style multi-vector encoder. Staging proves fp32 parity one unpadded row at
a time; these tests ask the served path (batched, padded per bucket, cached) for answers and compare them with the
reference library's on the same texts. Refusals (code shipped with a folder, a module the served path does not
compute, pickled module weights, a non-torch activation, query expansion) name the file and the fix, and stage
nothing.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from handlers.text.folder import FolderError
from scripts import prepare_text_model, tiny_text_models
from scripts.ops.handler_loader import load_handler, set_requests, statuses

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["How do I reset my password?", "ok", "Le café est très chaud ce matin.", "the quick brown fox " * 9]
PAIRS = [["the cat sleeps", "a cat is sleeping"], ["How do I reset my password?", "stock markets fell"]]
# name -> (builder, the kind the folder says it is, the transformers class it is served as)
FOLDERS = {
    "mpnet": (tiny_text_models.make_mpnet_mean_normalize_embedder, "embedding", "MPNetModel"),
    "bert-dense": (tiny_text_models.make_bert_cls_dense_normalize_embedder, "embedding", "BertModel"),
    "qwen3": (tiny_text_models.make_qwen3_decoder_embedder, "embedding", "Qwen3Model"),
    "prompt-layernorm": (tiny_text_models.make_bert_prompt_layernorm_embedder, "embedding", "BertModel"),
    "deberta-nli": (
        tiny_text_models.make_deberta_nli_classifier,
        "classification",
        "DebertaV2ForSequenceClassification",
    ),
    "modernbert": (
        tiny_text_models.make_modernbert_classifier,
        "classification",
        "ModernBertForSequenceClassification",
    ),
    "electra": (tiny_text_models.make_electra_classifier, "classification", "ElectraForSequenceClassification"),
    "bert-no-segments": (
        tiny_text_models.make_bert_pair_classifier_without_segments,
        "classification",
        "BertForSequenceClassification",
    ),
    "splade": (tiny_text_models.make_splade_encoder, "sparse", "BertForMaskedLM"),
    "multi-vector": (tiny_text_models.make_multi_vector_encoder, "multi-vector", "BertModel"),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    return {name: builder(root / name) for name, (builder, _, _) in FOLDERS.items()}


@pytest.fixture(scope="module")
def staged(sources, tmp_path_factory):
    """name -> (model_source.json record, the staged folder with the text-model template's model-config.yaml)."""
    root = tmp_path_factory.mktemp("staged")
    result = {}
    for name, source in sources.items():
        record = prepare_text_model.stage(str(source), root / name, None, None)
        shutil.copy2(REPO / "models" / "text-model" / "model-config.yaml", root / name / "model-config.yaml")
        result[name] = (record, root / name)
    return result


@pytest.fixture(scope="module")
def served(staged):
    """name -> a function posting bodies to that model's in-process worker (fp32, caches off)."""

    def serve(name):
        handler, context = load_handler(staged[name][1], "text-model", {"precision": "fp32", "cache_size": 0})

        def post(*bodies):
            set_requests(context, [{"Content-Type": "application/json"}] * len(bodies))
            answers = handler.handle([{"body": body} for body in bodies], context)
            return statuses(context, len(bodies)), [json.loads(answer) for answer in answers]

        return post

    return {name: serve(name) for name in FOLDERS}


def cosines(a, b):
    return torch.nn.functional.cosine_similarity(torch.as_tensor(a).float(), torch.as_tensor(b).float(), dim=-1)


def test_each_folder_is_staged_as_its_kind_with_fp32_parity(staged):
    for name, (_, kind, body_class) in FOLDERS.items():
        record, folder = staged[name]
        served = json.loads((folder / "text_model.json").read_text())
        assert (record["kind"], served["kind"], served["body"]["class"]) == (kind, kind, body_class), name
        assert record["parity"]["fp32_agreement"] >= 0.9999, (name, record["parity"])


def test_the_served_inputs_are_what_transformers_feeds_the_model(staged):
    inputs = {name: json.loads((staged[name][1] / "text_model.json").read_text())["tokenizer"] for name in FOLDERS}
    # transformers sends no segment ids where the tokenizer does not list them: both texts of a pair are segment 0.
    assert inputs["bert-no-segments"]["input_names"] == ["input_ids", "attention_mask"]
    assert inputs["modernbert"]["input_names"] == ["input_ids", "attention_mask"]
    assert "token_type_ids" in inputs["electra"]["input_names"]
    assert inputs["qwen3"]["class"] == "Qwen2Tokenizer"


@pytest.mark.parametrize("name", ["mpnet", "bert-dense", "qwen3"])
def test_embeddings_equal_sentence_transformers_in_a_padded_batch(staged, served, name):
    status, [answer] = served[name]({"input": TEXTS})
    assert status == [200]
    got = torch.tensor([item["embedding"] for item in answer["data"]])
    assert cosines(got, tiny_text_models.reference_embeddings(staged[name][1], TEXTS)).min() >= 0.9999
    if name == "bert-dense":  # the Dense projection and the Normalize after it are computed
        assert got.shape[1] == 16 and torch.allclose(got.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-4)


def test_a_prompt_left_out_of_the_pooling_a_layer_norm_and_truncate_dim_are_computed_as_encode_does(staged, served):
    folder = staged["prompt-layernorm"][1]
    status, [plain, query] = served["prompt-layernorm"]({"input": TEXTS}, {"input": TEXTS, "prompt_name": "query"})
    assert status == [200, 200]
    for answer, prompt in ((plain, None), (query, "query")):
        got = torch.tensor([item["embedding"] for item in answer["data"]])
        assert got.shape == (len(TEXTS), 16)  # truncate_dim
        assert cosines(got, tiny_text_models.reference_embeddings(folder, TEXTS, prompt)).min() >= 0.9999
    # The same text with the prompt written into it (no prompt_name) is pooled over every token: another vector,
    # and another cache entry.
    status, [inline] = served["prompt-layernorm"]({"input": ["query: " + text for text in TEXTS]})
    inline_rows = torch.tensor([item["embedding"] for item in inline["data"]])
    query_rows = torch.tensor([item["embedding"] for item in query["data"]])
    assert cosines(inline_rows, query_rows).max() < 0.9999


def test_a_decoder_embedders_instruction_prompt_is_applied_as_sentence_transformers_does(staged, served):
    folder = staged["qwen3"][1]
    status, [plain, query] = served["qwen3"]({"input": TEXTS}, {"input": TEXTS, "prompt_name": "query"})
    assert status == [200, 200]
    with_prompt = torch.tensor([item["embedding"] for item in query["data"]])
    without = torch.tensor([item["embedding"] for item in plain["data"]])
    assert cosines(with_prompt, tiny_text_models.reference_embeddings(folder, TEXTS, "query")).min() >= 0.9999
    assert cosines(with_prompt, without).max() < 0.999  # the prompt changes the vector


@pytest.mark.parametrize("name", ["deberta-nli", "modernbert", "electra", "bert-no-segments"])
def test_classifier_probabilities_equal_transformers_on_texts_and_pairs(staged, served, name):
    rows = [*TEXTS, *PAIRS]
    expected, id2label = tiny_text_models.reference_probabilities(staged[name][1], rows)
    status, [answer] = served[name]({"inputs": rows, "top_k": None})
    assert status == [200]
    for row, result, probabilities in zip(rows, answer["results"], expected, strict=True):
        got = {entry["label"]: entry["score"] for entry in result["scores"]}
        assert max(abs(got[id2label[i]] - float(p)) for i, p in enumerate(probabilities)) < 1e-4, row


def test_sparse_weights_equal_the_sparse_encoders_and_top_k_and_decode_shape_the_answer(staged, served):
    from sentence_transformers import SparseEncoder

    folder = staged["splade"][1]
    reference = tiny_text_models.reference_sparse(folder, TEXTS)
    status, [answer, top] = served["splade"]({"input": TEXTS}, {"text": TEXTS[0], "top_k": 3, "decode": True})
    assert status == [200, 200]
    for item, expected in zip(answer["data"], reference, strict=True):
        assert float(cosines(tiny_text_models.dense_sparse(item["sparse"], expected.shape[0]), expected)) >= 0.9999
        values = [entry["value"] for entry in item["sparse"]]
        assert values == sorted(values, reverse=True)  # largest first
    assert [e["index"] for e in top["sparse"]] == [e["index"] for e in answer["data"][0]["sparse"][:3]]
    decoded = SparseEncoder(str(folder), device="cpu").decode(reference[0], top_k=3)
    assert list(top["tokens"]) == [token for token, _ in decoded]


def test_multi_vector_tokens_equal_the_encoders_for_queries_and_documents(staged, served):
    folder = staged["multi-vector"][1]
    status, [documents, queries] = served["multi-vector"]({"input": TEXTS}, {"input": TEXTS, "input_type": "query"})
    assert status == [200, 200]
    for answer, task in ((documents, "document"), (queries, "query")):
        expected = tiny_text_models.reference_multi_vector(folder, TEXTS, task)
        for item, reference in zip(answer["data"], expected, strict=True):
            got = torch.tensor(item["embeddings"])
            assert got.shape == reference.shape
            assert cosines(got, reference).min() >= 0.9999


def test_each_kind_refuses_bad_fields_with_a_400_and_serves_the_rest_of_the_batch(served):
    bad = {"splade": {"text": "a", "top_k": -1}, "multi-vector": {"text": "a", "input_type": "passage"}}
    for name, body in bad.items():
        status, answers = served[name](body, {"text": "fine"})
        assert status == [400, 200], (name, answers)
        assert answers[0]["type"] == "InvalidRequest"


# ------------------------------------------------------------------------------------------------------ refusals
def refused(source, out, **options):
    with pytest.raises(FolderError) as error:
        prepare_text_model.stage(str(source), out, None, None, **options)
    assert not out.exists()  # refused before anything was staged
    return str(error.value)


def test_a_folder_shipping_code_is_refused_naming_auto_map_unless_opted_in(sources, tmp_path):
    folder = tiny_text_models.with_remote_code(tmp_path / "remote", sources["mpnet"])
    message = refused(folder, tmp_path / "out")
    assert "config.json: auto_map (AutoConfig -> custom_model.CustomConfig" in message
    assert "--var trust_remote_code=true" in message
    record = prepare_text_model.stage(str(folder), tmp_path / "opted-in", None, None, trust_remote_code=True)
    assert record["trust_remote_code"] is True and record["parity"]["fp32_agreement"] >= 0.9999
    assert (tmp_path / "opted-in" / "custom_model.py").is_file()
    served = json.loads((tmp_path / "opted-in" / "text_model.json").read_text())
    assert served["trust_remote_code"] is True and served["body"]["class"] == "AutoModel"


def rewrite_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_module_the_served_path_does_not_compute_is_refused_naming_it(sources, tmp_path):
    folder = tmp_path / "extra-module"
    shutil.copytree(sources["bert-dense"], folder)
    rewrite_json(
        folder / "modules.json",
        lambda modules: modules.append(
            {"idx": 4, "name": "4", "path": "4_WordWeights", "type": "sentence_transformers.models.WordWeights"}
        ),
    )
    assert "module 'WordWeights' (4_WordWeights) is not computed by the served path" in refused(folder, tmp_path / "o")


def test_a_dense_activation_outside_torch_nn_is_refused(sources, tmp_path):
    folder = tmp_path / "activation"
    shutil.copytree(sources["bert-dense"], folder)
    rewrite_json(folder / "2_Dense" / "config.json", lambda c: c.update(activation_function="os.system"))
    assert "2_Dense/config.json: activation_function 'os.system' is not a torch.nn activation" in refused(
        folder, tmp_path / "o"
    )


def test_pickled_module_weights_are_refused_naming_the_file(sources, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    shutil.copytree(sources["bert-dense"], folder)
    weights = folder / "2_Dense" / "model.safetensors"
    torch.save(load_file(str(weights)), folder / "2_Dense" / "pytorch_model.bin")
    weights.unlink()
    assert "2_Dense/pytorch_model.bin: holds pickled weights" in refused(folder, tmp_path / "o")


def test_query_expansion_is_refused_naming_the_setting(sources, tmp_path):
    folder = tmp_path / "expansion"
    shutil.copytree(sources["multi-vector"], folder)
    rewrite_json(
        folder / "sentence_bert_config.json",
        lambda c: c.update(query_expansion={"strategy": "fixed", "attend": True, "length": 32}),
    )
    assert "sentence_bert_config.json: query_expansion" in refused(folder, tmp_path / "o")
