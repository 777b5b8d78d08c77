"""text-embeddings-inference's (TEI's) API, under ``/predictions/<model>/<version>`` (what huggingface_hub's
``InferenceClient`` and TEI's own clients send):

- ``/embed`` (``InferenceClient.feature_extraction``): ``{"inputs", "normalize", "truncate", "truncation_direction",
  "prompt_name", "dimensions"}`` -> a bare list of vectors;
- ``/embed_sparse``: ``{"inputs": "..." | ["...", ...], "truncate", "truncation_direction", "prompt_name"}`` -> one
  list per input of ``{"index", "value"}``, in token-id order;
- ``/rerank``: ``{"query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction"}`` -> a bare list
  ``[{"index", "score"[, "text"]}]``, best first; ``raw_scores`` answers the logit;
- ``/tokenize``, ``/decode``, ``/info``: the tokenizer's routes, served by every text model
  (handlers/text/requests/tokenize.py).

``truncate`` defaults to false, as TEI's does (a text or pair over the token limit is then a 400); only
``truncation_direction: right`` is served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import TEI, RequestError, ServerError
from handlers.core.http import Float32, RequestView
from handlers.text.requests.common import (
    RequestContext,
    TextLimits,
    check_bool,
    check_fields,
    check_request_chars,
    check_right_truncation,
    decoded_body,
    json_object,
    text_list,
)
from handlers.text.requests.embedding import (
    EmbeddingRow,
    TextPreparation,
    VectorSpace,
    answered_array,
    encoded_as,
    text_preparation,
    vector_space,
)
from handlers.text.requests.rerank import (
    RerankRequest,
    document_names,
    query_and_documents,
    ranked_results,
    rerank_scores,
)
from handlers.text.requests.tokenize import answer_tokenizer, parse_decode, parse_info, parse_tokenize
from handlers.text.routes import Route
from handlers.text.rows import RowOptions

EMBED_FIELDS = {"inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions"}
SPARSE_FIELDS = {"inputs", "truncate", "truncation_direction", "prompt_name"}
RERANK_FIELDS = {"query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction"}


@dataclass
class TeiEmbedRequest:
    texts: list[str]
    names: list[str]
    truncate: bool
    options: list[RowOptions] | None = None
    dimensions: int | None = None  # cut to this size (None: the model's own)
    normalize: bool = True  # make each answered vector unit length


@dataclass
class TeiSparseRequest:
    texts: list[str]
    names: list[str]
    truncate: bool
    options: list[RowOptions] | None = None


# ----------------------------------------------------------------------------------------------------------- /embed
def parse_embed(
    body: Any, content_type: str, space: VectorSpace, limits: TextLimits, preparation: TextPreparation
) -> TeiEmbedRequest:
    body = decoded_body(body, content_type, "'inputs' (a text or a list of texts)")
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with 'inputs', got {type(body).__name__}")
    check_fields(body, EMBED_FIELDS)
    if "inputs" not in body:
        raise RequestError("missing field 'inputs' (a text or a list of texts)")
    texts, names = text_list(body["inputs"], "inputs", limits)
    normalize = check_bool(body, "normalize", True)
    if not normalize and space.normalizes:
        raise RequestError("'normalize' false: this model's own modules normalise its vectors (send true)")
    check_right_truncation(body, "texts")
    prompt = preparation.prompt(body)
    dimensions = space.check_size(body.get("dimensions"), "dimensions")
    request = TeiEmbedRequest(
        preparation.apply(texts, prompt),
        names,
        check_bool(body, "truncate", False),
        options=preparation.options(len(texts), prompt),
        dimensions=dimensions,
        # A normalising model's whole vectors are unit already: normalising them again is no change in exact
        # arithmetic but moves the last bit on some CPUs (an AMX Xeon's), so /embed would differ from the other
        # routes' answers for the same text. A cut is re-normalised, as OpenAI's and Cohere's routes do.
        normalize=normalize and (dimensions is not None or not space.normalizes),
    )
    check_request_chars(sum(map(len, request.texts)), limits)
    return request


def write_embed(request: TeiEmbedRequest, rows: Sequence[EmbeddingRow], space: VectorSpace) -> list[Any] | ServerError:
    array = answered_array(request, rows)
    if isinstance(array, ServerError):
        return array
    return encoded_as(array, "float", request, space)


def parse_embed_route(api: RequestContext, body: Any, request: RequestView) -> TeiEmbedRequest:
    preparation = text_preparation(api.info, api.tokenizer)
    return parse_embed(body, request.content_type, vector_space(api), api.limits, preparation)


def answer_embed_route(api: RequestContext, request: TeiEmbedRequest, rows: list[Any]) -> Any:
    return write_embed(request, rows, vector_space(api))


# ----------------------------------------------------------------------------------------------------- /embed_sparse
def parse_sparse(api: RequestContext, body: Any, request: RequestView) -> TeiSparseRequest:
    body = json_object(body, request.content_type, "'inputs' (a text or a list of texts)")
    check_fields(body, SPARSE_FIELDS)
    if "inputs" not in body:
        raise RequestError("missing field 'inputs' (a text or a list of texts)")
    texts, names = text_list(body["inputs"], "inputs", api.limits)
    check_right_truncation(body, "texts")
    preparation = TextPreparation(dict(api.info.prompts), api.info.default_prompt_name, api.info.lowercase)
    prompt = preparation.prompt(body)
    parsed = TeiSparseRequest(preparation.apply(texts, prompt), names, check_bool(body, "truncate", False))
    check_request_chars(sum(len(text) for text in parsed.texts), api.limits)
    return parsed


def answer_sparse(api: RequestContext, request: TeiSparseRequest, rows: list[Any]) -> Any:
    """Each text's non-zero weights in token-id order (the kind keeps them largest first)."""
    answer = []
    for row in rows:
        ids, weights = row.value
        order = sorted(range(len(ids)), key=lambda i: int(ids[i]))
        answer.append([{"index": int(ids[i]), "value": Float32(weights[i])} for i in order])
    return answer


# ----------------------------------------------------------------------------------------------------------- /rerank
def parse_rerank(api: RequestContext, body: Any, request: RequestView) -> RerankRequest:
    body = json_object(body, request.content_type, "'query' and 'texts'")
    check_fields(body, RERANK_FIELDS)
    query, documents = query_and_documents(api, body, "texts")
    check_right_truncation(body, "pairs")
    returned = check_bool(body, "return_text", False)
    parsed = RerankRequest(
        [(query, text) for text in documents],
        document_names("texts", len(documents)),
        check_bool(body, "truncate", False),
        documents=documents if returned else [],
        raw_scores=check_bool(body, "raw_scores", False),
    )
    check_request_chars(sum(len(query) + len(text) for text in documents), api.limits)
    return parsed


def answer_rerank(api: RequestContext, request: RerankRequest, rows: list[Any]) -> Any:
    return ranked_results(rerank_scores(api, request, rows), request.top_n, request.documents, "score", str)


EMBED = Route("embed", parse_embed_route, answer_embed_route, TEI, "text-embeddings-inference /embed")
EMBED_SPARSE = Route("embed_sparse", parse_sparse, answer_sparse, TEI, "text-embeddings-inference /embed_sparse")
RERANK = Route("rerank", parse_rerank, answer_rerank, TEI, "text-embeddings-inference /rerank")
# Every text model's tokenizer.
TOKENIZER = (
    Route("tokenize", parse_tokenize, answer_tokenizer, TEI, "text-embeddings-inference /tokenize"),
    Route("decode", parse_decode, answer_tokenizer, TEI, "text-embeddings-inference /decode"),
    Route("info", parse_info, answer_tokenizer, TEI, "text-embeddings-inference /info"),
)
