"""Property-based fuzzing of the text classifier / reranker and the embedding prompts, in process on tiny random
models (tests/text_models.py) packaged by the project's own prepare step: whatever a body says, parsing raises only
a 4xx RequestError, and in a batch of hostile and valid bodies each hostile one gets its own 4xx while every valid one
is answered with its own result."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.core.errors import RequestError
from scripts import prepare_text_model
from scripts.ops.handler_loader import load_handler, set_requests, statuses
from tests import text_models

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
)


class Request:
    url_path = ""  # the model's own URL, /predictions/<model>

    def __init__(self, content_type):
        self.content_type = content_type


def staged(tmp_path_factory, name, builder, kind):
    source = builder(tmp_path_factory.mktemp(f"src-{name}") / name)
    out = tmp_path_factory.mktemp(f"staged-{name}") / "model"
    prepare_text_model.stage(str(source), out, kind, None)
    spec = "embedding" if kind == "embedding" else "text-classifier"
    (out / "model-config.yaml").write_text(
        (prepare_text_model.REPO / "models" / spec / "model-config.yaml").read_text()
    )
    return out


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    overrides = {"backend": "eager", "precision": "fp32", "shared_cache": {"url": ""}}
    models = {
        "reranker": (text_models.make_cross_encoder, "classification", "text-classifier"),
        "multilabel": (text_models.make_bert_multilabel_classifier, "classification", "text-classifier"),
        "prompts": (text_models.make_xlmr_mean_prompts_embedder, "embedding", "embedding"),
    }
    loaded = {}
    for name, (builder, kind, spec) in models.items():
        model_dir = staged(tmp_path_factory, name, builder, kind)
        loaded[name] = load_handler(model_dir, spec, overrides)
    return loaded


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
    valid = {
        "reranker": {"query": "the cat", "documents": ["a cat", "markets"]},
        "multilabel": {"inputs": ["fine text", ["a", "pair"]], "top_k": None},
        "prompts": {"input": ["hello"], "prompt_name": "query"},
    }
    for name, (handler, context) in handlers.items():
        bodies = [valid[name], *hostile, valid[name]]
        set_requests(context, [{"Content-Type": "application/json"}] * len(bodies))
        answers = handler.handle([{"body": body} for body in bodies], context)
        codes = statuses(context, len(bodies))
        assert codes[0] == codes[-1] == 200, (name, answers)
        assert answers[0] == answers[-1]  # the valid request's own answer, wherever it sits in the batch
        for code, answer in zip(codes, answers, strict=True):
            assert code == 200 or 400 <= code < 500, (name, code, answer)
            json.loads(answer)  # strict JSON either way
