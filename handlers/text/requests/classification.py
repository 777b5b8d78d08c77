"""Text classification and reranking requests: what a body may say, validated into rows; and their answers.

Accepted bodies (docs/your-model.md):

- plain text (``Content-Type: text/*``): the whole body is one text;
- ``{"text": "...", "text_pair": "..."?, "top_k": int | null?, "truncate": bool?}`` -> one row's answer;
- ``{"inputs": "..." | ["...", ["premise", "hypothesis"], ...], "top_k"?, "truncate"?}`` ->
  ``{"results": [one answer per input, in order], "model": ..., "usage": {...}}``;
- a reranker (a model with one output, e.g. a cross-encoder): ``{"query": "...", "documents": ["...", ...],
  "top_n": int?, "return_documents": bool?, "truncate"?}`` -> ``{"results": [{"index", "relevance_score"
  [, "document"]}, ...] best first, "model": ..., "usage": {...}}``.

One row's answer: ``{"label": <best label>, "score": <its probability>}``; with ``top_k`` also ``"scores"``, the k best
labels with their probabilities (``null``: all labels), best first; a multi-label model also answers ``"labels"``,
every label whose sigmoid is at least 0.5. Probabilities are what the folder says the model's head means
(handlers/text/folder.py ``score_activation``): softmax, a sigmoid per label, or the raw value of a regression head.

Limits are the embedding kind's (``handler:`` config): inputs per request, characters per text and per request
(a pair counts both of its texts; a reranker's query counts once per document, as it is computed once per document),
and tokens per request after truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from handlers.core.errors import RequestError
from handlers.core.http import Float32
from handlers.text.folder import TextModelFolder
from handlers.text.labels import MULTI_LABEL, probabilities
from handlers.text.requests.common import (
    RequestContext,
    TextLimits,
    check_count,
    check_request_chars,
    check_text,
    decoded_body,
    positive_int,
)
from handlers.text.requests.embedding import EmbeddingRow
from handlers.text.requests.rerank import (
    RerankRequest,
    check_reranker,
    document_names,
    document_texts,
    ranked_results,
    rerank_scores,
)
from handlers.text.rows import Row, RowOptions

SINGLE_FIELDS = {"text", "text_pair", "top_k", "truncate"}
LIST_FIELDS = {"inputs", "top_k", "truncate"}
RERANK_FIELDS = {"query", "documents", "top_n", "return_documents", "truncate"}
MULTI_LABEL_THRESHOLD = 0.5


@dataclass
class ClassificationRequest:
    texts: list[Row]  # model inputs: a text or a (text, text pair) per row
    names: list[str]  # how error messages name each row
    shape: str  # "single" or "list"
    truncate: bool
    top_k: int | None = 1  # labels in "scores" (None: all); 1 without "top_k": no "scores" at all
    scores: bool = False  # the request asked for top_k
    options: list[RowOptions] | None = None  # every row computes with the defaults


def parse_classification_request(
    api: RequestContext, body: Any, content_type: str
) -> ClassificationRequest | RerankRequest:
    """Validate one request body (as TorchServe hands it over) into a :class:`ClassificationRequest`, or for the
    rerank body a :class:`RerankRequest`."""
    limits, info = api.limits, api.info
    body = decoded_body(body, content_type)
    if isinstance(body, str):
        return ClassificationRequest([check_text(body, "body", limits.max_text_chars)], ["body"], "single", True)
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with 'text', 'inputs' or 'query', got {type(body).__name__}")
    shapes = [name for name in ("text", "inputs", "query") if name in body]
    if len(shapes) != 1:
        raise RequestError(
            "send exactly one of 'text' (one text), 'inputs' (a list) or 'query' with 'documents' (reranking)"
            + (f"; got {shapes}" if shapes else "")
        )
    shape = shapes[0]
    allowed = {"text": SINGLE_FIELDS, "inputs": LIST_FIELDS, "query": RERANK_FIELDS}[shape]
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}; accepted with '{shape}': {sorted(allowed)}")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RequestError(f"'truncate' must be true or false, got {truncate!r}")
    request: ClassificationRequest | RerankRequest
    if shape == "query":
        request = rerank_request(api, body, truncate)
    else:
        request = classify_request(body, shape, truncate, limits)
        request.top_k, request.scores = top_k(body, len(info.labels))
    check_request_chars(
        sum(len(row) if isinstance(row, str) else len(row[0]) + len(row[1]) for row in request.texts), limits
    )
    return request


def top_k(body: dict[str, Any], labels: int) -> tuple[int | None, bool]:
    """(labels to list in "scores", whether to list them): absent -> no list; null -> all; k -> at most k."""
    if "top_k" not in body:
        return 1, False
    value = positive_int(body, "top_k")
    return (None if value is None else min(value, labels)), True


def pair_row(item: Any, where: str, max_chars: int) -> Row:
    if isinstance(item, list):
        if len(item) != 2:
            raise RequestError(f"{where} must be a text or a pair [text, text_pair], got a list of {len(item)}")
        return (check_text(item[0], f"{where}[0]", max_chars), check_text(item[1], f"{where}[1]", max_chars))
    return check_text(item, where, max_chars)


def classify_request(body: dict[str, Any], shape: str, truncate: bool, limits: TextLimits) -> ClassificationRequest:
    if shape == "text":
        text = check_text(body["text"], "'text'", limits.max_text_chars)
        if "text_pair" in body and body["text_pair"] is not None:
            row: Row = (text, check_text(body["text_pair"], "'text_pair'", limits.max_text_chars))
        else:
            row = text
        return ClassificationRequest([row], ["'text'"], "single", truncate)
    inputs = body["inputs"]
    if isinstance(inputs, str):
        return ClassificationRequest(
            [check_text(inputs, "'inputs'", limits.max_text_chars)], ["'inputs'"], "list", truncate
        )
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("'inputs' must be a text or a non-empty list of texts and [text, text_pair] pairs")
    check_count(len(inputs), "'inputs'", limits)
    names = [f"'inputs'[{i}]" for i in range(len(inputs))]
    rows = [pair_row(item, name, limits.max_text_chars) for item, name in zip(inputs, names, strict=True)]
    return ClassificationRequest(rows, names, "list", truncate)


def rerank_request(api: RequestContext, body: dict[str, Any], truncate: bool) -> RerankRequest:
    check_reranker(api, "instead")
    query = check_text(body["query"], "'query'", api.limits.max_text_chars)
    texts = document_texts(api, body.get("documents"), "documents", structured=False)
    return_documents = body.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise RequestError(f"'return_documents' must be true or false, got {return_documents!r}")
    top_n = positive_int(body, "top_n")
    return RerankRequest(
        [(query, text) for text in texts],
        document_names("documents", len(texts)),
        truncate,
        top_n=None if top_n is None else min(top_n, len(texts)),
        documents=texts if return_documents else [],
    )


def row_answer(scores: torch.Tensor, info: TextModelFolder, request: ClassificationRequest) -> dict[str, Any]:
    """One row's answer; its probabilities are float32 numbers (:class:`Float32`: shortest JSON text)."""
    ranked = sorted(range(len(info.labels)), key=lambda i: (-float(scores[i]), i))
    best = ranked[0]
    answer: dict[str, Any] = {"label": info.labels[best], "score": Float32(scores[best])}
    if info.problem_type == MULTI_LABEL:
        answer["labels"] = [info.labels[i] for i in ranked if float(scores[i]) >= MULTI_LABEL_THRESHOLD]
    if request.scores:
        kept = ranked if request.top_k is None else ranked[: request.top_k]
        answer["scores"] = [{"label": info.labels[i], "score": Float32(scores[i])} for i in kept]
    return answer


def format_answer(
    request: ClassificationRequest, rows: Sequence[EmbeddingRow], info: TextModelFolder, model_name: str
) -> dict[str, Any]:
    """The answer to one request from its rows' logits, in its own order."""
    scores = probabilities(torch.stack([row.value for row in rows]), info.activation)
    if request.shape == "single":
        return row_answer(scores[0], info, request)
    tokens = sum(row.tokens for row in rows)
    results = [row_answer(row_scores, info, request) for row_scores in scores]
    return {"results": results, "model": model_name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def format_rerank(api: RequestContext, request: RerankRequest, rows: Sequence[EmbeddingRow]) -> dict[str, Any]:
    """The rerank body's answer: the documents best first."""
    tokens = sum(row.tokens for row in rows)
    ranked = ranked_results(rerank_scores(api, request, rows), request.top_n, request.documents)
    return {"results": ranked, "model": api.model_name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
