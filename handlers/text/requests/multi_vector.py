"""Multi-vector (ColBERT-style) encoder requests: what a body may say, validated into texts; and the answers.

Accepted bodies (docs/your-model.md):

- plain text (``Content-Type: text/*``): the whole body is one document;
- ``{"text": "...", "input_type": "query" | "document"?, "truncate": bool?}`` ->
  ``{"embeddings": [[...], ...] one vector per scored token, "truncated": bool}``;
- ``{"input": "..." | ["...", ...], same options}`` -> ``{"object": "list", "data": [{"index", "embeddings"}], "model":
  ..., "usage": {...}}``.

``input_type`` (default "document") picks the folder's query or document prompt and length, and whether its skip list
applies, as ``MultiVectorEncoder.encode_query()`` / ``encode_document()`` do.

``encoding_format`` (default "float") is how each text's vectors are written: "float" (JSON numbers, a list per
token), "base64" (the base64 of the vectors' little-endian float32 bytes, token after token, with ``"shape": [tokens,
width]`` beside it) or "base64_float16" (the same with little-endian float16, half the bytes again). An answer is
bounded by the server's max_response_size (handlers/core/answer_size.py): its largest size follows from the tokens
and the encoding, so a request whose answer cannot be sent is refused with 413 before its rows are computed.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from handlers.core.answer_size import JSON_FLOAT_BYTES, base64_bytes
from handlers.core.errors import RequestError, shown
from handlers.core.http import float32_list
from handlers.text.folder import TextModelFolder
from handlers.text.requests.common import RequestContext, check_request_chars, text_or_input, truncate_flag
from handlers.text.rows import RowOptions

INPUT_TYPES = ("query", "document")
OPTIONS = {"input_type", "truncate", "encoding_format"}
# encoding_format -> the little-endian dtype of its bytes (None: JSON numbers)
ENCODINGS: dict[str, str | None] = {"float": None, "base64": "<f4", "base64_float16": "<f2"}
# What an answer holds besides its vectors, at most: per text its index, truncated flag and shape; per answer the
# list's wrapper, the model's name and the usage counts.
TEXT_OVERHEAD_BYTES = 96
ANSWER_OVERHEAD_BYTES = 256


@dataclass
class MultiVectorRequest:
    texts: list[str]
    names: list[str]
    shape: str  # "text" or "list"
    truncate: bool
    options: list[RowOptions] | None = None
    encoding: str = "float"  # a key of ENCODINGS
    width: int = 0  # floats per token vector (the model's)
    model_name_bytes: int = 0

    def answer_bytes(self, row_tokens: Sequence[int]) -> int:
        """The most bytes the answer can have, with each text's token count after truncation (its scored tokens are
        at most that many): exact for the base64 encodings, the worst case of each number for "float"."""
        dtype = ENCODINGS[self.encoding]
        total = ANSWER_OVERHEAD_BYTES + self.model_name_bytes + TEXT_OVERHEAD_BYTES * len(row_tokens)
        for tokens in row_tokens:
            floats = tokens * self.width
            if dtype is None:
                total += floats * JSON_FLOAT_BYTES + 3 * tokens  # each vector's brackets and comma
            else:
                total += base64_bytes(floats * np.dtype(dtype).itemsize)
        return total

    @property
    def fit_hint(self) -> str:
        fewer = "send fewer or shorter texts"
        if self.encoding == "float":
            return (
                f"{fewer}, or ask for a compact encoding: 'encoding_format': 'base64' (float32 bytes, about a third "
                f"of the size) or 'base64_float16' (about a sixth)"
            )
        if self.encoding == "base64":
            return f"{fewer}, or ask for 'encoding_format': 'base64_float16' (half the size)"
        return fewer


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
    encoding = read.fields.get("encoding_format")
    encoding = "float" if encoding is None else encoding
    if not isinstance(encoding, str) or encoding not in ENCODINGS:
        raise RequestError(f"'encoding_format' must be one of {list(ENCODINGS)}, got {shown(encoding)}")
    rows, options = prepared(api.info, read.texts, task)
    request = MultiVectorRequest(
        rows,
        read.names,
        read.shape,
        truncate_flag(read.fields),
        options,
        encoding,
        api.info.output_size,
        len(api.model_name.encode("utf-8")),
    )
    check_request_chars(sum(len(text) for text in request.texts), api.limits)
    return request


def encoded_vectors(value: Any, encoding: str) -> dict[str, Any]:
    """One text's token vectors as ``encoding`` writes them: {"embeddings": [[...], ...]} or {"embeddings": base64,
    "shape": [tokens, width]}."""
    dtype = ENCODINGS[encoding]
    if dtype is None:
        return {"embeddings": [float32_list(vector) for vector in value]}
    array = value.detach().to("cpu").float().numpy()
    packed = array.astype(dtype)
    if not np.isfinite(packed).all():  # float16 stops at 65504: a larger value would arrive as infinity
        raise ValueError(f"a token vector has a value that {encoding} cannot hold")
    return {"embeddings": base64.b64encode(packed.tobytes()).decode("ascii"), "shape": list(array.shape)}


def format_multi_vector_answer(api: RequestContext, request: MultiVectorRequest, rows: Sequence[Any]) -> Any:
    try:
        encoded = [encoded_vectors(row.value, request.encoding) for row in rows]
    except ValueError as error:  # this request's answer only: the rest of the batch is answered
        return RequestError(f"{error}: ask for 'encoding_format': 'float' or 'base64' (float32)")
    if request.shape == "text":
        [row] = rows
        return {**encoded[0], "truncated": row.truncated}
    tokens = sum(row.tokens for row in rows)
    data = [
        {"index": index, **vectors, "truncated": row.truncated}
        for index, (row, vectors) in enumerate(zip(rows, encoded, strict=True))
    ]
    return {
        "object": "list",
        "data": data,
        "model": api.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
