"""What every rerank dialect shares (handlers/text/dialects/: the project's own body, Cohere v1/v2, Jina, TEI), on any
cross-encoder (a classification model with one output): the typed request, the documents' checks and the ranking.

Every document is one (query, document) row of the one text-model path. ``relevance_score`` / ``score`` is what the
model's head means (CrossEncoder's activation, a sigmoid by default: handlers/text/labels.py); a request may ask for the
logit instead (TEI's ``raw_scores``). Size limits are the model's (``handler:`` config): documents per request
(max_inputs), characters (the query counts once per document, as it is computed once per document) and tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from handlers.core.errors import RequestError
from handlers.core.http import Float32
from handlers.text.labels import probabilities
from handlers.text.requests.common import RequestContext, check_count, check_text
from handlers.text.rows import Row, RowOptions


@dataclass
class RerankRequest:
    texts: list[Row]  # one (query, document) pair per document
    names: list[str]
    truncate: bool
    top_n: int | None = None
    documents: list[str] = field(default_factory=list)  # the documents as sent, where the answer returns them
    raw_scores: bool = False
    options: list[RowOptions] | None = None


def check_reranker(api: RequestContext, instead: str) -> None:
    """Reranking needs one relevance score; ``instead`` says where the model's other requests go."""
    labels = api.info.labels
    if len(labels) != 1:
        raise RequestError(
            f"this model has {len(labels)} outputs ({', '.join(labels[:8])}); reranking needs a model with one "
            f"relevance score (a cross-encoder): send 'text' or 'inputs' {instead}"
        )


def document_texts(api: RequestContext, documents: Any, where: str, structured: bool = True) -> list[str]:
    """Documents as strings, or (``structured``: Cohere's and Jina's documents) ``{"text": ...}`` objects."""
    if not isinstance(documents, list) or not documents:
        raise RequestError(f"'{where}' must be a non-empty list of texts")
    check_count(len(documents), f"'{where}'", api.limits)
    texts = []
    for index, document in enumerate(documents):
        name = f"'{where}'[{index}]"
        if structured and isinstance(document, dict):
            if set(document) != {"text"}:
                raise RequestError(f"{name} must be a text or an object with only 'text', got keys {sorted(document)}")
            document, name = document["text"], f"{name}.text"
        texts.append(check_text(document, name, api.limits.max_text_chars))
    return texts


def query_and_documents(api: RequestContext, body: dict[str, Any], documents_field: str) -> tuple[str, list[str]]:
    """The query and the documents of an API's rerank body (both required; the model must be a reranker)."""
    check_reranker(api, f"to /predictions/{api.served_name} instead")
    for name in ("query", documents_field):
        if body.get(name) is None:
            raise RequestError(f"missing field '{name}'")
    query = check_text(body["query"], "'query'", api.limits.max_text_chars)
    return query, document_texts(api, body[documents_field], documents_field)


def document_names(field: str, count: int) -> list[str]:
    return [f"'{field}'[{i}]" for i in range(count)]


def rerank_scores(api: RequestContext, request: RerankRequest, rows: Sequence[Any]) -> list[float]:
    """Each document's score, in document order: what the head means, or the logit where the request asks."""
    logits = torch.stack([row.value.to(torch.float32) for row in rows])
    return (logits if request.raw_scores else probabilities(logits, api.info.activation))[:, 0].tolist()


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
