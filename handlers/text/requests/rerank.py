"""Reranking in the shapes rerank clients speak, on any cross-encoder (a classification model with one output):

- Cohere v2, ``/v2/rerank`` (``cohere.ClientV2.rerank``): ``{"model", "query", "documents": [str | {"text"}],
  "top_n", "return_documents", "max_tokens_per_doc"}`` -> ``{"id", "results": [{"index", "relevance_score"[,
  "document": {"text"}]}], "meta": {"api_version", "billed_units", "tokens"}}``;
- Cohere v1 and Jina, both ``/v1/rerank`` (``cohere.Client.rerank``, LangChain's and LlamaIndex's Cohere and Jina
  rerankers): the same body (v1 also ``rank_fields: ["text"]`` and ``max_chunks_per_doc: 1``) -> one answer both
  read: Cohere's ``id``, ``results`` and ``meta`` with Jina's ``model`` and ``usage``; refusals carry Cohere's
  ``message`` and Jina's ``detail``. ``return_documents`` defaults to false (Cohere's default; Jina's clients that
  want the texts back send true);
- text-embeddings-inference, ``/rerank``: ``{"query", "texts", "raw_scores", "return_text", "truncate",
  "truncation_direction"}`` -> a bare list ``[{"index", "score"[, "text"]}]``, best first.

``relevance_score`` / ``score`` is what the model's head means (CrossEncoder's activation, a sigmoid by default:
handlers/text/labels.py); TEI's ``raw_scores`` answers the logit. Every document is one (query, document) row of the
one text-model path, cut to the model's token limit (Cohere: after ``max_tokens_per_doc``, default 4096, cuts the
document alone); TEI's ``truncate`` defaults to false, as TEI's does (a pair over the limit is then a 400).
Size limits are the model's (``handler:`` config): documents per request (max_inputs), characters (the query counts
once per document, as it is computed once per document) and tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from handlers.core.errors import RequestError, shown
from handlers.core.http import Float32
from handlers.text.labels import probabilities
from handlers.text.requests.common import (
    RequestContext,
    check_bool,
    check_count,
    check_fields,
    check_model_name,
    check_request_chars,
    check_right_truncation,
    check_text,
    cut_to_tokens,
    json_object,
    positive_int,
)
from handlers.text.rows import Row, RowOptions

COHERE_V1, COHERE_V2, TEI_RERANK = "v1/rerank", "v2/rerank", "rerank"
COHERE_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc"}
FIELDS = {
    COHERE_V2: COHERE_FIELDS | {"priority"},
    COHERE_V1: COHERE_FIELDS | {"rank_fields", "max_chunks_per_doc"},
    TEI_RERANK: {"query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction"},
}
COHERE_MAX_TOKENS_PER_DOC = 4096  # Cohere's default


@dataclass
class RerankRequest:
    texts: list[Row]  # one (query, document) pair per document
    names: list[str]
    truncate: bool
    api: str  # the route: COHERE_V1, COHERE_V2 or TEI_RERANK
    top_n: int | None = None
    documents: list[str] = field(default_factory=list)  # the documents as sent, where the answer returns them
    raw_scores: bool = False
    options: list[RowOptions] | None = None


def check_reranker(api: RequestContext) -> None:
    labels = api.info.labels
    if len(labels) != 1:
        raise RequestError(
            f"this model has {len(labels)} outputs ({', '.join(labels[:8])}); reranking needs a model with one "
            f"relevance score (a cross-encoder): send 'text' or 'inputs' to /predictions/{api.served_name} instead"
        )


def document_texts(api: RequestContext, documents: Any, where: str) -> list[str]:
    """Documents as strings or ``{"text": ...}`` objects (Cohere's and Jina's structured documents)."""
    if not isinstance(documents, list) or not documents:
        raise RequestError(f"'{where}' must be a non-empty list of texts")
    check_count(len(documents), f"'{where}'", api.limits)
    texts = []
    for index, document in enumerate(documents):
        name = f"'{where}'[{index}]"
        if isinstance(document, dict):
            if set(document) != {"text"}:
                raise RequestError(f"{name} must be a text or an object with only 'text', got keys {sorted(document)}")
            document, name = document["text"], f"{name}.text"
        texts.append(check_text(document, name, api.limits.max_text_chars))
    return texts


def check_v1_extras(body: dict[str, Any]) -> None:
    """Cohere v1's options, served where they mean what is computed: ranking the text, one chunk per document."""
    fields = body.get("rank_fields")
    if fields is not None and fields != ["text"]:
        raise RequestError(f"'rank_fields' {shown(fields)} is not served: documents are ranked by their 'text'")
    chunks = body.get("max_chunks_per_doc")
    if chunks is not None and chunks != 1:
        raise RequestError(f"'max_chunks_per_doc' {shown(chunks)} is not served: each document is one chunk (1)")


def parse_rerank(api: RequestContext, body: Any, content_type: str, route: str) -> RerankRequest:
    documents_field = "texts" if route == TEI_RERANK else "documents"
    body = json_object(body, content_type, f"'query' and '{documents_field}'")
    check_fields(body, FIELDS[route])
    if route != TEI_RERANK:
        check_model_name(body, api.served_name)
    check_reranker(api)
    for name in ("query", documents_field):
        if body.get(name) is None:
            raise RequestError(f"missing field '{name}'")
    query = check_text(body["query"], "'query'", api.limits.max_text_chars)
    documents = document_texts(api, body[documents_field], documents_field)
    names = [f"'{documents_field}'[{i}]" for i in range(len(documents))]
    if route == TEI_RERANK:
        check_right_truncation(body, "pairs")
        returned = check_bool(body, "return_text", False)
        request = RerankRequest([], names, check_bool(body, "truncate", False), route)
        request.raw_scores = check_bool(body, "raw_scores", False)
    else:
        if route == COHERE_V1:
            check_v1_extras(body)
        returned = check_bool(body, "return_documents", False)
        top_n = positive_int(body, "top_n")
        request = RerankRequest([], names, True, route, None if top_n is None else min(top_n, len(documents)))
        limit = positive_int(body, "max_tokens_per_doc") or COHERE_MAX_TOKENS_PER_DOC
        if limit < api.info.max_tokens:
            cut = cut_to_tokens(api.tokenizer, documents, limit)
            request.texts = [(query, text) for text in cut]
    if not request.texts:
        request.texts = [(query, text) for text in documents]
    request.documents = documents if returned else []
    check_request_chars(sum(len(query) + len(text) for text in documents), api.limits)
    return request


def ranked_results(
    scores: list[float],
    top_n: int | None,
    documents: list[str],
    score_key: str = "relevance_score",
    text: Callable[[str], Any] = lambda document: {"text": document},
) -> list[dict[str, Any]]:
    """Documents best first (equal scores in document order), at most ``top_n``: ``{"index", score_key[, "document"
    or "text"]}`` (TEI names them "score" and "text"); the documents are returned where ``documents`` holds them."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_n]
    text_key = "document" if score_key == "relevance_score" else "text"
    results = []
    for index in order:
        result: dict[str, Any] = {"index": index, score_key: Float32(scores[index])}
        if documents:
            result[text_key] = text(documents[index])
        results.append(result)
    return results


def format_rerank(api: RequestContext, request: RerankRequest, rows: Sequence[Any]) -> Any:
    logits = torch.stack([row.value.to(torch.float32) for row in rows])
    scores = (logits if request.raw_scores else probabilities(logits, api.info.activation))[:, 0].tolist()
    tokens = sum(row.tokens for row in rows)
    if request.api == TEI_RERANK:
        return ranked_results(scores, request.top_n, request.documents, "score", str)
    results = ranked_results(scores, request.top_n, request.documents)
    version = "1" if request.api == COHERE_V1 else "2"
    meta: dict[str, Any] = {"api_version": {"version": version}, "billed_units": {"search_units": 1}}
    answer: dict[str, Any] = {"id": uuid.uuid4().hex, "results": results, "meta": meta}
    if request.api == COHERE_V1:  # Jina's clients read these at the same URL
        answer["model"] = api.served_name
        answer["usage"] = {"total_tokens": tokens, "prompt_tokens": tokens}
    else:
        meta["tokens"] = {"input_tokens": tokens, "output_tokens": 0}
    return answer
