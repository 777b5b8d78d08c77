"""The route table of text models (handlers/text/routes.py, handlers/text/dialects/): which rows each kind serves, and
that a new API dialect is one module and one route row, served through the normal handler path (route -> parse ->
rows of the one text-model path -> answer, refusals in the row's error shape) without touching any other file."""

import json
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from handlers.core.errors import TEI, RequestError
from handlers.core.http import Float32
from handlers.text.kinds import KINDS
from handlers.text.kinds.embedding import EmbeddingKind
from handlers.text.requests.common import check_fields, check_text, json_object
from handlers.text.routes import Route, route_table
from scripts import prepare_text_model
from scripts import tiny_text_models as text_models
from scripts.ops.handler_loader import load_handler, set_requests, statuses

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = [
    ("tokenize", "text-embeddings-inference /tokenize"),
    ("decode", "text-embeddings-inference /decode"),
    ("info", "text-embeddings-inference /info"),
]
OWN = [("", "this project's own"), *TOKENIZER]
# What describe's "routes" lists per kind, in order (the 404 for an unknown path lists the same).
ROUTES = {
    "embedding": [
        *OWN,
        ("v1/embeddings", "OpenAI embeddings"),
        ("v2/embed", "Cohere embed v2"),
        ("embed", "text-embeddings-inference /embed"),
    ],
    "classification": [
        *OWN,
        ("v2/rerank", "Cohere rerank v2"),
        ("v1/rerank", "Cohere rerank v1 and Jina rerank"),
        ("rerank", "text-embeddings-inference /rerank"),
    ],
    "sparse": [*OWN, ("embed_sparse", "text-embeddings-inference /embed_sparse")],
    "multi-vector": OWN,
}


@pytest.mark.parametrize("kind", sorted(ROUTES))
def test_each_kind_serves_its_dialects_rows_once_each(kind):
    rows = KINDS[kind].routes()
    assert [(row.path, row.api) for row in rows] == ROUTES[kind]
    assert list(route_table(rows)) == [path for path, _ in ROUTES[kind]]


def test_a_path_served_twice_is_refused():
    row = KINDS["sparse"].routes()[-1]
    with pytest.raises(ValueError, match="two routes serve 'embed_sparse'"):
        route_table([row, row])


# ----------------------------------------------------------------------------------------- a toy dialect, one module
@dataclass
class EchoRequest:
    """The toy dialect's typed request: one text, computed as a row like every other request's."""

    texts: list[str]
    names: list[str]
    truncate: bool = True
    options: Any = None


def parse_echo(api, body, request):
    body = json_object(body, request.content_type, "'say' (a text)")
    check_fields(body, {"say"})
    if "say" not in body:
        raise RequestError("missing field 'say'")
    return EchoRequest([check_text(body["say"], "'say'", api.limits.max_text_chars)], ["'say'"])


def answer_echo(api, request, rows):
    [row] = rows
    return {"said": request.texts[0], "tokens": row.tokens, "first": Float32(row.value[0])}


toy = types.ModuleType("toy_dialect", "A made-up API: {'say': text} -> the text, its token count, its first value.")
toy.EchoRequest, toy.parse_echo, toy.answer_echo = EchoRequest, parse_echo, answer_echo
toy.ECHO = Route("toy/echo", parse_echo, answer_echo, TEI, "toy echo")


class ToyEmbeddingKind(EmbeddingKind):
    """The embedding kind with the toy dialect's row added: what a kind's routes() gains for a new dialect."""

    def routes(self) -> tuple[Route, ...]:
        return (*super().routes(), toy.ECHO)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    root = tmp_path_factory.mktemp("dialects")
    source = text_models.make_mpnet_mean_normalize_embedder(root / "source")
    prepare_text_model.stage(str(source), root / "staged", None, None)
    shutil.copy2(REPO / "models" / "text-model" / "model-config.yaml", root / "staged" / "model-config.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(KINDS, "embedding", ToyEmbeddingKind())
        handler, context = load_handler(root / "staged", "text-model", {"precision": "fp32", "cache_size": 0})
    return handler, context


def post(worker, path, *bodies):
    handler, context = worker
    set_requests(context, [{"Content-Type": "application/json", "url_path": path}] * len(bodies))
    answers = handler.handle([{"body": body} for body in bodies], context)
    return statuses(context, len(bodies)), [json.loads(answer) for answer in answers]


def test_a_new_dialect_is_served_from_its_route_row_through_the_text_model_path(worker):
    status, [native] = post(worker, "", {"text": "hello there"})
    assert status == [200]
    status, answers = post(worker, "toy/echo", {"say": "hello there"}, {"say": {"a": 1}}, {"shout": "x"})
    assert status == [200, 400, 400]
    assert answers[0]["said"] == "hello there" and answers[0]["tokens"] >= 3
    assert answers[0]["first"] == native["embedding"][0]  # the same row as the model's own answer
    assert answers[1] == {"error": "'say' is dict, not a string", "error_type": "Validation"}  # the row's shape
    assert "unknown field(s) ['shout']" in answers[2]["error"]
    assert worker[0].describe()["routes"]["toy/echo"] == "toy echo"


def test_the_other_routes_are_untouched_by_the_new_row(worker):
    status, [answer] = post(worker, "v1/embeddings", {"input": ["hello there"]})
    assert status == [200] and answer["object"] == "list" and len(answer["data"]) == 1
    status, [missing] = post(worker, "toy/nothing", {"say": "x"})
    assert status == [404] and "toy/echo" in json.dumps(missing)
