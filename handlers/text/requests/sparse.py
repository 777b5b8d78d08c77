"""Sparse (SPLADE) encoder requests: what a body may say, validated into texts; and the answers.

Accepted bodies (docs/your-model.md):

- plain text (``Content-Type: text/*``): the whole body is one text;
- ``{"text": "...", "top_k": int?, "decode": bool?, "truncate": bool?, "prompt_name": str?}`` ->
  ``{"sparse": [{"index": token id, "value": weight}, ...], "truncated": bool}`` (+ ``"tokens": {token: weight}``
  with ``decode``);
- ``{"input": "..." | ["...", ...], same options}`` -> ``{"object": "list", "data": [{"index", "sparse"[, "tokens"]}],
  "model": ..., "usage": {...}}``.

At ``/predictions/<model>/<version>/embed_sparse`` the model also speaks text-embeddings-inference's shape
(handlers/text/dialects/tei.py).

Entries come largest weight first (ties by token id); ``top_k`` keeps the k largest of a text (the folder's own
``max_active_dims`` has already been applied, as ``SparseEncoder.encode()`` applies it). ``decode`` names each kept
entry's vocabulary token, as ``SparseEncoder.decode()`` does. ``prompt_name`` picks one of the folder's prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError
from handlers.core.http import Float32
from handlers.text.requests.common import (
    RequestContext,
    check_request_chars,
    positive_int,
    text_or_input,
    truncate_flag,
)
from handlers.text.requests.embedding import TextPreparation
from handlers.text.rows import RowOptions

OPTIONS = {"top_k", "decode", "truncate", "prompt_name"}
MAX_TOP_K = 1 << 20


@dataclass
class SparseRequest:
    texts: list[str]
    names: list[str]
    shape: str  # "text" (plain or {"text"}) or "list" ({"input"})
    truncate: bool
    top_k: int | None = None
    decode: bool = False
    options: list[RowOptions] | None = None


def parse_sparse_request(api: RequestContext, body: Any, content_type: str) -> SparseRequest:
    preparation = TextPreparation(dict(api.info.prompts), api.info.default_prompt_name, api.info.lowercase)
    read = text_or_input(body, content_type, api.limits, OPTIONS)
    decode = read.fields.get("decode", False)
    if not isinstance(decode, bool):
        raise RequestError(f"'decode' must be true or false, got {decode!r}")
    top_k = positive_int(read.fields, "top_k")
    prompt = preparation.prompt(read.fields)
    request = SparseRequest(
        preparation.apply(read.texts, prompt),
        read.names,
        read.shape,
        truncate_flag(read.fields),
        top_k=None if top_k is None else min(top_k, MAX_TOP_K),
        decode=decode,
    )
    check_request_chars(sum(len(text) for text in request.texts), api.limits)
    return request


def row_answer(api: RequestContext, request: SparseRequest, value: Any) -> dict[str, Any]:
    ids, weights = value
    ids, weights = ids[: request.top_k].tolist(), weights[: request.top_k].tolist()
    answer: dict[str, Any] = {
        "sparse": [{"index": index, "value": Float32(weight)} for index, weight in zip(ids, weights, strict=True)]
    }
    if request.decode:
        token = api.tokenizer.tokenizer.id_to_token
        answer["tokens"] = {str(token(index)): Float32(weight) for index, weight in zip(ids, weights, strict=True)}
    return answer


def format_sparse_answer(api: RequestContext, request: SparseRequest, rows: Sequence[Any]) -> Any:
    if request.shape == "text":
        [row] = rows
        return {**row_answer(api, request, row.value), "truncated": row.truncated}
    tokens = sum(row.tokens for row in rows)
    data = [
        {"index": index, **row_answer(api, request, row.value), "truncated": row.truncated}
        for index, row in enumerate(rows)
    ]
    return {
        "object": "list",
        "data": data,
        "model": api.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
