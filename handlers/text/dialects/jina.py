"""Jina's rerank API, at ``/v1/rerank``: the URL where Cohere v1's client (``cohere.Client.rerank``) and Jina's
(LangChain's and LlamaIndex's Jina rerankers) both post, with the same body (handlers/text/dialects/cohere.py
``parse_rerank_v1``). One answer serves both: Cohere v1's ``id``, ``results`` and ``meta`` with Jina's ``model``
and ``usage``; refusals carry Cohere's ``message`` and Jina's ``detail`` (handlers/core/errors.py RERANK_V1).
``return_documents`` defaults to false (Cohere's default; Jina's clients that want the texts back send true).
"""

from __future__ import annotations

from typing import Any

from handlers.core.errors import RERANK_V1
from handlers.text.dialects.cohere import parse_rerank_v1, rerank_answer
from handlers.text.requests.common import RequestContext
from handlers.text.requests.rerank import RerankRequest
from handlers.text.routes import Route


def answer_rerank(api: RequestContext, request: RerankRequest, rows: list[Any]) -> Any:
    answer = rerank_answer(api, request, rows, "1")
    tokens = sum(row.tokens for row in rows)
    answer["model"] = api.served_name
    answer["usage"] = {"total_tokens": tokens, "prompt_tokens": tokens}
    return answer


RERANK = Route("v1/rerank", parse_rerank_v1, answer_rerank, RERANK_V1, "Cohere rerank v1 and Jina rerank")
