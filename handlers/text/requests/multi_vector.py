"""Multi-vector (ColBERT-style) encoder requests: what a body may say, validated into texts; and the answers.

Accepted bodies (docs/your-model.md):

- plain text (``Content-Type: text/*``): the whole body is one document;
- ``{"text": "...", "input_type": "query" | "document"?, "truncate": bool?}`` ->
  ``{"embeddings": [[...], ...] one vector per scored token, "truncated": bool}``;
- ``{"input": "..." | ["...", ...], same options}`` -> ``{"object": "list", "data": [{"index", "embeddings"}], "model":
  ..., "usage": {...}}``.

``input_type`` (default "document") picks the folder's query or document prompt and length, and whether its skip list
applies, as ``MultiVectorEncoder.encode_query()`` / ``encode_document()`` do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError
from handlers.core.http import float32_list
from handlers.text.folder import TextModelFolder
from handlers.text.requests.common import RequestContext, check_request_chars, text_or_input, truncate_flag
from handlers.text.rows import RowOptions

INPUT_TYPES = ("query", "document")
OPTIONS = {"input_type", "truncate"}


@dataclass
class MultiVectorRequest:
    texts: list[str]
    names: list[str]
    shape: str  # "text" or "list"
    truncate: bool
    options: list[RowOptions] | None = None


def prepared(info: TextModelFolder, texts: list[str], task: str) -> tuple[list[str], list[RowOptions]]:
    """Texts as the model reads them for ``task``: its prompt in front, lower-cased where the folder says, truncated at
    the task's length."""
    prompt = info.prompts.get(task) or ""
    rows = [prompt + text for text in texts] if prompt else list(texts)
    rows = [row.lower() for row in rows] if info.lowercase else rows
    options = RowOptions(max_tokens=info.task_lengths.get(task, 0), task=task)
    return rows, [options] * len(rows)


def parse_multi_vector_request(api: RequestContext, body: Any, content_type: str) -> MultiVectorRequest:
    read = text_or_input(body, content_type, api.limits, OPTIONS)
    task = read.fields.get("input_type", "document")
    if task not in INPUT_TYPES:
        raise RequestError(f"'input_type' must be one of {list(INPUT_TYPES)}, got {task!r}")
    rows, options = prepared(api.info, read.texts, task)
    request = MultiVectorRequest(rows, read.names, read.shape, truncate_flag(read.fields), options)
    check_request_chars(sum(len(text) for text in request.texts), api.limits)
    return request


def format_multi_vector_answer(api: RequestContext, request: MultiVectorRequest, rows: Sequence[Any]) -> dict[str, Any]:
    def vectors(value: Any) -> list[Any]:
        return [float32_list(vector) for vector in value]

    if request.shape == "text":
        [row] = rows
        return {"embeddings": vectors(row.value), "truncated": row.truncated}
    tokens = sum(row.tokens for row in rows)
    data = [
        {"index": index, "embeddings": vectors(row.value), "truncated": row.truncated} for index, row in enumerate(rows)
    ]
    return {
        "object": "list",
        "data": data,
        "model": api.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
