"""Property-based fuzzing of every text-model kind, in process on tiny random models (scripts/tiny_text_models.py)
packaged by the project's own prepare step: a cross-encoder reranker, a multi-label classifier, a DeBERTa NLI model,
embedders with prompts (XLM-R, and a Qwen3 decoder whose pooling leaves no prompt out), a SPLADE sparse encoder and a
multi-vector encoder. Whatever a body says, parsing raises only a 4xx RequestError, and in a batch of hostile and
valid bodies each hostile one gets its own 4xx while every valid one is answered with its own result."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.core.errors import RequestError
from scripts import prepare_text_model, tiny_text_models
from scripts.ops.handler_loader import load_handler, set_requests, statuses

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=40,
)
texts = st.text(max_size=40) | json_scalars
near_valid = (
    st.fixed_dictionaries(
        {"text": texts},
        optional={"text_pair": texts, "top_k": json_scalars, "truncate": json_scalars, "prompt_name": texts},
    )
    | st.fixed_dictionaries(
        {"inputs": texts | st.lists(texts | st.lists(texts, max_size=3), max_size=5)},
        optional={"top_k": json_scalars | st.integers(min_value=-(10**30), max_value=10**30)},
    )
    | st.fixed_dictionaries(
        {"query": texts, "documents": json_values | st.lists(texts, max_size=5)},
        optional={"top_n": json_scalars, "return_documents": json_scalars},
    )
    | st.fixed_dictionaries({"input": texts | st.lists(texts, max_size=3)}, optional={"prompt_name": json_values})
    | st.fixed_dictionaries(
        {"input": texts | st.lists(texts, max_size=3)},
        optional={
            "top_k": json_scalars | st.integers(min_value=-(10**30), max_value=10**30),
            "decode": json_scalars,
            "input_type": texts,
            "truncate": json_scalars,
        },
    )
)


class Request:
    url_path = ""  # the model's own URL, /predictions/<model>

    def __init__(self, content_type):
        self.content_type = content_type


def staged(tmp_path_factory, name, builder):
    source = builder(tmp_path_factory.mktemp(f"src-{name}") / name)
    out = tmp_path_factory.mktemp(f"staged-{name}") / "model"
    prepare_text_model.stage(str(source), out, None, None)
    (out / "model-config.yaml").write_text(
        (prepare_text_model.REPO / "models" / "text-model" / "model-config.yaml").read_text()
    )
    return out


# name -> (builder, a valid body for it)
MODELS = {
    "reranker": (tiny_text_models.make_cross_encoder, {"query": "the cat", "documents": ["a cat", "markets"]}),
    "multilabel": (
        tiny_text_models.make_bert_multilabel_classifier,
        {"inputs": ["fine text", ["a", "pair"]], "top_k": None},
    ),
    "nli": (tiny_text_models.make_deberta_nli_classifier, {"inputs": [["a cat sleeps", "a cat is awake"]]}),
    "prompts": (tiny_text_models.make_xlmr_mean_prompts_embedder, {"input": ["hello"], "prompt_name": "query"}),
    "decoder": (tiny_text_models.make_qwen3_decoder_embedder, {"input": ["hello"], "prompt_name": "query"}),
    "sparse": (tiny_text_models.make_splade_encoder, {"input": ["hello world"], "top_k": 4, "decode": True}),
    "multi-vector": (tiny_text_models.make_multi_vector_encoder, {"input": ["hello"], "input_type": "query"}),
}


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    overrides = {"backend": "eager", "precision": "fp32", "shared_cache": {"url": ""}}
    return {
        name: load_handler(staged(tmp_path_factory, name, builder), "text-model", overrides)
        for name, (builder, _) in MODELS.items()
    }


def parse_or_reject(handler, body, content_type="application/json"):
    try:
        payload = handler.parse_request(body, Request(content_type))
    except RequestError as error:
        assert 400 <= error.code < 500 and error.message
        return None
    assert payload.texts and len(payload.texts) == len(payload.names)
    return payload


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_values | near_valid)
def test_any_json_body_is_parsed_or_refused_with_a_4xx(handlers, body):
    for handler, _ in handlers.values():
        parse_or_reject(handler, body)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostile=st.lists(near_valid, min_size=1, max_size=4))
def test_hostile_bodies_in_a_batch_fail_alone(handlers, hostile):
    for name, (handler, context) in handlers.items():
        valid = MODELS[name][1]
        bodies = [valid, *hostile, valid]
        set_requests(context, [{"Content-Type": "application/json"}] * len(bodies))
        answers = handler.handle([{"body": body} for body in bodies], context)
        codes = statuses(context, len(bodies))
        assert codes[0] == codes[-1] == 200, (name, answers)
        assert answers[0] == answers[-1]  # the valid request's own answer, wherever it sits in the batch
        for code, answer in zip(codes, answers, strict=True):
            assert code == 200 or 400 <= code < 500, (name, code, answer)
            json.loads(answer)  # strict JSON either way


# Every field any route of any kind reads (handlers/text/requests/): bodies mixing them, valid or not.
ROUTE_FIELDS = [
    "texts", "input", "inputs", "query", "documents", "embedding_types", "input_type", "truncate", "max_tokens",
    "output_dimension", "encoding_format", "dimensions", "top_n", "return_documents", "max_tokens_per_doc",
    "raw_scores", "return_text", "ids", "add_special_tokens", "skip_special_tokens", "candidate_labels", "parameters",
    "hypothesis_template", "multi_label", "model", "normalize", "truncation_direction", "rank_fields",
    "max_chunks_per_doc", "prompt_name", "priority",
]  # fmt: skip
route_values = (
    json_values
    | texts
    | st.lists(texts, max_size=3)
    | st.lists(st.integers(min_value=-5, max_value=40000), max_size=4)
    | st.sampled_from(["float", "int8", "binary", "search_query", "END", "NONE", "START", "right", "left"])
    | st.lists(st.sampled_from(["float", "int8", "uint8", "binary", "ubinary", "base64", "int4"]), max_size=3)
)
route_bodies = st.fixed_dictionaries({}, optional=dict.fromkeys(ROUTE_FIELDS, route_values))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=route_bodies)
def test_every_route_of_every_kind_answers_any_body_or_refuses_it_with_a_4xx(handlers, body):
    """Each API surface (handlers/text/routes.py): OpenAI, Cohere, TEI, rerank shapes, zero-shot, the tokenizer."""
    for name, (handler, context) in handlers.items():
        for path in handler.routes:
            set_requests(context, [{"Content-Type": "application/json", "url_path": path}])
            [answer] = handler.handle([{"body": body}], context)
            [code] = statuses(context, 1)
            assert code == 200 or 400 <= code < 500, (name, path, code, answer)
            json.loads(answer)  # strict JSON in the route's own shape
