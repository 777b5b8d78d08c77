"""Cohere's APIs (what ``cohere.ClientV2`` and ``cohere.Client`` send under their base URL
``/predictions/<model>/<version>``):

- embed v2, ``/v2/embed``: ``{"model", "texts", "input_type", "embedding_types": [...], "truncate", "max_tokens",
  "output_dimension"}`` -> ``{"id", "embeddings": {type: [...]}, "texts", "meta", "response_type":
  "embeddings_by_type"}``; ``input_type`` picks the folder's prompt that means it; ``max_tokens`` below the model's
  own limit cuts each text there (``truncate: NONE``: refuses a longer one);
- rerank v2, ``/v2/rerank``: ``{"model", "query", "documents": [str | {"text"}], "top_n", "return_documents",
  "max_tokens_per_doc"}`` -> ``{"id", "results": [{"index", "relevance_score"[, "document": {"text"}]}], "meta":
  {"api_version", "billed_units", "tokens"}}``;
- rerank v1: the same body (also ``rank_fields: ["text"]`` and ``max_chunks_per_doc: 1``), served at ``/v1/rerank``
  with Jina's answer fields beside Cohere's (handlers/text/dialects/jina.py).

Every document is cut to the model's token limit after ``max_tokens_per_doc`` (default 4096) has cut it alone;
``return_documents`` defaults to false (Cohere's default).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from handlers.core.errors import COHERE, RequestError, ServerError, shown
from handlers.core.http import RequestView
from handlers.text.quantization import EMBEDDING_TYPES
from handlers.text.requests.common import (
    RequestContext,
    TextLimits,
    check_bool,
    check_fields,
    check_model_name,
    check_request_chars,
    cut_to_tokens,
    decoded_body,
    default_if_none,
    json_object,
    positive_int,
    text_list,
    tokens_over,
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
from handlers.text.routes import Route
from handlers.text.rows import RowOptions
from handlers.text.tokenization import ServedTokenizer

EMBED_FIELDS = {
    "texts",
    "model",
    "input_type",
    "embedding_types",
    "truncate",
    "max_tokens",
    "output_dimension",
    "priority",
    "images",
    "inputs",
}
RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc"}
RERANK_V2_FIELDS = RERANK_FIELDS | {"priority"}
RERANK_V1_FIELDS = RERANK_FIELDS | {"rank_fields", "max_chunks_per_doc"}
# Cohere's input_type -> the folder's named prompts that mean it, first found wins (none: the model's default).
INPUT_TYPE_PROMPTS = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
TRUNCATE = ("NONE", "START", "END")
MAX_TOKENS_PER_DOC = 4096  # Cohere's default


# ----------------------------------------------------------------------------------------------------------- embed
@dataclass
class CohereEmbedRequest:
    texts: list[str]
    names: list[str]
    truncate: bool  # 'truncate' END (False: NONE, a text over the token limit is refused)
    options: list[RowOptions] | None = None
    encodings: tuple[str, ...] = ()  # every type asked for, in order
    dimensions: int | None = None  # cut to this size (None: the model's own)
    normalize: bool = False  # re-normalise each cut vector (a normalising model)
    inputs: list[str] = field(default_factory=list)  # the texts as sent (the answer echoes them)


def input_type_prompt(preparation: TextPreparation, input_type: Any) -> str:
    """The folder's prompt for an ``input_type`` (search_query -> its "query" prompt, ...), else the model's default
    prompt."""
    if input_type is None:
        return preparation.prompt({})
    if input_type == "image":
        raise RequestError("'input_type' 'image': this model embeds text only")
    if input_type not in INPUT_TYPE_PROMPTS:
        raise RequestError(f"'input_type' must be one of {sorted(INPUT_TYPE_PROMPTS)}, got {shown(input_type)}")
    for name in INPUT_TYPE_PROMPTS[input_type]:
        if name in preparation.prompts:
            return preparation.prompt({"prompt_name": name})
    return preparation.prompt({})


def embedding_types(body: dict[str, Any], space: VectorSpace) -> list[str]:
    types = default_if_none(body.get("embedding_types"), ["float"])
    if not isinstance(types, list) or not types or not all(isinstance(kind, str) for kind in types):
        raise RequestError(f"'embedding_types' must be a list of {list(EMBEDDING_TYPES)}, got {shown(types)}")
    unknown = [kind for kind in types if kind not in EMBEDDING_TYPES]
    if unknown:
        raise RequestError(f"'embedding_types' {shown(unknown)} are not served; use {list(EMBEDDING_TYPES)}")
    space.check_types(types, "embedding_types")
    return types


def truncate_mode(body: dict[str, Any]) -> str:
    truncate = default_if_none(body.get("truncate"), "END")
    if truncate not in TRUNCATE:
        raise RequestError(f"'truncate' must be one of {list(TRUNCATE)}, got {shown(truncate)}")
    if truncate == "START":
        raise RequestError("'truncate' 'START' is not served: texts are cut at their end ('END'), or refused ('NONE')")
    return str(truncate)


def parse_embed(
    body: Any,
    content_type: str,
    space: VectorSpace,
    limits: TextLimits,
    preparation: TextPreparation,
    served: str,
    tokenizer: ServedTokenizer,
) -> CohereEmbedRequest:
    """Cohere's embed v2 body (what ``cohere.ClientV2.embed`` sends) into a :class:`CohereEmbedRequest`."""
    body = decoded_body(body, content_type, "'texts' (a list of strings)")
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with 'texts' (a list of strings), got {type(body).__name__}")
    check_fields(body, EMBED_FIELDS)
    check_model_name(body, served)
    for name in ("images", "inputs"):
        if body.get(name) is not None:
            raise RequestError(f"'{name}': this model embeds text only; send 'texts'")
    if "texts" not in body or body["texts"] is None:
        raise RequestError("missing field 'texts' (a list of strings)")
    if isinstance(body["texts"], str):
        raise RequestError("'texts' must be a list of strings, not one string")
    texts, names = text_list(body["texts"], "texts", limits)
    types = embedding_types(body, space)
    truncate = truncate_mode(body)
    priority = body.get("priority")
    if priority is not None and type(priority) is not int:
        raise RequestError(f"'priority' must be an integer, got {shown(priority)}")
    prompt = input_type_prompt(preparation, body.get("input_type"))
    dimensions = space.check_size(body.get("output_dimension"), "output_dimension")
    inputs = texts
    max_tokens = positive_int(body, "max_tokens")
    if max_tokens is not None and max_tokens < tokenizer.max_tokens:
        if truncate == "NONE":
            tokens_over(tokenizer, texts, max_tokens, names)
        texts = cut_to_tokens(tokenizer, texts, max_tokens)
    request = CohereEmbedRequest(
        preparation.apply(texts, prompt),
        names,
        truncate == "END",
        options=preparation.options(len(texts), prompt),
        encodings=tuple(dict.fromkeys(types)),
        dimensions=dimensions,
        normalize=dimensions is not None and space.normalizes,
        inputs=inputs,
    )
    check_request_chars(sum(map(len, request.texts)), limits)
    return request


def write_embed(
    request: CohereEmbedRequest, rows: Sequence[EmbeddingRow], space: VectorSpace
) -> dict[str, Any] | ServerError:
    array = answered_array(request, rows)
    if isinstance(array, ServerError):
        return array
    tokens = sum(row.tokens for row in rows)
    return {
        "id": uuid.uuid4().hex,
        "embeddings": {kind: encoded_as(array, kind, request, space) for kind in request.encodings},
        "texts": request.inputs,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
        "response_type": "embeddings_by_type",
    }


def parse_embed_route(api: RequestContext, body: Any, request: RequestView) -> CohereEmbedRequest:
    preparation = text_preparation(api.info, api.tokenizer)
    return parse_embed(
        body, request.content_type, vector_space(api), api.limits, preparation, api.served_name, api.tokenizer
    )


def answer_embed_route(api: RequestContext, request: CohereEmbedRequest, rows: list[Any]) -> Any:
    return write_embed(request, rows, vector_space(api))


# ----------------------------------------------------------------------------------------------------------- rerank
def check_v1_extras(body: dict[str, Any]) -> None:
    """Cohere v1's options, served where they mean what is computed: ranking the text, one chunk per document."""
    fields = body.get("rank_fields")
    if fields is not None and fields != ["text"]:
        raise RequestError(f"'rank_fields' {shown(fields)} is not served: documents are ranked by their 'text'")
    chunks = body.get("max_chunks_per_doc")
    if chunks is not None and chunks != 1:
        raise RequestError(f"'max_chunks_per_doc' {shown(chunks)} is not served: each document is one chunk (1)")


def parse_rerank(
    api: RequestContext,
    body: Any,
    content_type: str,
    fields: set[str],
    extras: Callable[[dict[str, Any]], None] | None = None,
) -> RerankRequest:
    """A Cohere rerank body (``fields``: the version's; ``extras``: its own options' checks)."""
    body = json_object(body, content_type, "'query' and 'documents'")
    check_fields(body, fields)
    check_model_name(body, api.served_name)
    query, documents = query_and_documents(api, body, "documents")
    if extras is not None:
        extras(body)
    returned = check_bool(body, "return_documents", False)
    top_n = positive_int(body, "top_n")
    limit = positive_int(body, "max_tokens_per_doc") or MAX_TOKENS_PER_DOC
    cut = cut_to_tokens(api.tokenizer, documents, limit) if limit < api.info.max_tokens else documents
    request = RerankRequest(
        [(query, text) for text in cut],
        document_names("documents", len(documents)),
        True,
        top_n=None if top_n is None else min(top_n, len(documents)),
        documents=documents if returned else [],
    )
    check_request_chars(sum(len(query) + len(text) for text in documents), api.limits)
    return request


def rerank_answer(api: RequestContext, request: RerankRequest, rows: Sequence[Any], version: str) -> dict[str, Any]:
    """What both versions answer: ``id``, the ranked ``results`` and ``meta`` (its ``api_version``)."""
    results = ranked_results(rerank_scores(api, request, rows), request.top_n, request.documents)
    meta: dict[str, Any] = {"api_version": {"version": version}, "billed_units": {"search_units": 1}}
    return {"id": uuid.uuid4().hex, "results": results, "meta": meta}


def parse_rerank_v2(api: RequestContext, body: Any, request: RequestView) -> RerankRequest:
    return parse_rerank(api, body, request.content_type, RERANK_V2_FIELDS)


def parse_rerank_v1(api: RequestContext, body: Any, request: RequestView) -> RerankRequest:
    return parse_rerank(api, body, request.content_type, RERANK_V1_FIELDS, check_v1_extras)


def answer_rerank_v2(api: RequestContext, request: RerankRequest, rows: list[Any]) -> Any:
    answer = rerank_answer(api, request, rows, "2")
    tokens = sum(row.tokens for row in rows)
    answer["meta"]["tokens"] = {"input_tokens": tokens, "output_tokens": 0}
    return answer


EMBED = Route("v2/embed", parse_embed_route, answer_embed_route, COHERE, "Cohere embed v2")
RERANK_V2 = Route("v2/rerank", parse_rerank_v2, answer_rerank_v2, COHERE, "Cohere rerank v2")
