"""The embedding kind's own bodies, at ``/predictions/<model>`` (docs/embeddings.md):

- plain text (``Content-Type: text/*``): the whole body is one text;
- ``{"text": "...", "truncate": bool?, "prompt_name": str?, "long_input": "truncate"|"windows"?}`` ->
  ``{"embedding": [...], "truncated": bool}``, plus ``"windows": n`` where windows were asked for
  (handlers/text/windows.py);
- OpenAI's embeddings body (``{"input": ...}``), answered as OpenAI answers it (handlers/text/dialects/openai.py).

Size limits (``handler:`` config, :class:`handlers.text.requests.common.TextLimits`) are checked before any text
reaches the tokenizer; each refusal is a 413 whose message names the limit key and its value. The other kinds' own
bodies are their request modules (handlers/text/requests/classification.py, sparse.py, multi_vector.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError, ServerError
from handlers.core.http import RequestView, float32_list
from handlers.text.dialects import openai
from handlers.text.requests.common import (
    RequestContext,
    TextLimits,
    check_fields,
    check_request_chars,
    check_text,
    decoded_body,
    truncate_flag,
)
from handlers.text.requests.embedding import (
    NO_PROMPTS,
    EmbeddingRow,
    TextPreparation,
    VectorSpace,
    split_long_texts,
    text_preparation,
    text_rows,
    vector_space,
)
from handlers.text.rows import RowOptions
from handlers.text.windows import LONG_INPUT_FIELD, WindowSettings

TEXT_FIELDS = {"text", "truncate", "prompt_name", LONG_INPUT_FIELD}


@dataclass
class EmbeddingRequest:
    """One text (``{"text"}`` or a plain-text body), answered as one vector and whether the text was cut."""

    texts: list[str]
    names: list[str]  # how error messages name the text: "'text'" or "body"
    truncate: bool  # False: a text over the token limit is an error instead of being cut
    options: list[RowOptions] | None = None  # where not the defaults (a prompt the pooling leaves out)
    long_input: str = "truncate"  # "windows": a text over the token limit is embedded by windows
    prompt: str = ""  # the prompt in front of the text, as prepared
    windows: list[int] | None = None  # once split: the windows the text became (None: not windowed)


def parse_embedding(
    body: Any,
    content_type: str,
    space: VectorSpace,
    limits: TextLimits,
    preparation: TextPreparation = NO_PROMPTS,
    windows: WindowSettings | None = None,
) -> EmbeddingRequest | openai.OpenAIEmbeddingRequest:
    """Validate one request body (as TorchServe hands it over) into a request whose texts are the model's inputs
    (the request's prompt in front); ``windows``: the model's long-input settings (None: windows are refused)."""
    body = decoded_body(body, content_type)
    request: EmbeddingRequest | openai.OpenAIEmbeddingRequest
    if isinstance(body, str):
        prompt = preparation.prompt({})
        texts = preparation.apply([check_text(body, "body", limits.max_text_chars)], prompt)
        request = EmbeddingRequest(texts, ["body"], True, preparation.options(1, prompt))
        request.long_input, request.prompt = long_input_of({}, windows), preparation.prepared(prompt)
    else:
        if not isinstance(body, dict):
            raise RequestError(f"body must be a JSON object with 'text' or 'input', got {type(body).__name__}")
        if "text" in body and "input" in body:
            raise RequestError("send either 'text' or 'input', not both")
        if "text" not in body and "input" not in body:
            raise RequestError("missing field 'text' (or 'input' for the OpenAI embeddings shape)")
        if "input" in body:
            request = openai.parse_embeddings_body(body, space, limits, preparation, windows=windows)
        else:
            check_fields(body, TEXT_FIELDS if windows is not None else TEXT_FIELDS - {LONG_INPUT_FIELD})
            truncate = truncate_flag(body)
            prompt = preparation.prompt(body)
            texts = preparation.apply([check_text(body["text"], "'text'", limits.max_text_chars)], prompt)
            request = EmbeddingRequest(texts, ["'text'"], truncate, preparation.options(1, prompt))
            request.long_input, request.prompt = long_input_of(body, windows), preparation.prepared(prompt)
    check_request_chars(sum(len(text) for text in request.texts), limits)
    return request


def long_input_of(body: dict[str, Any], windows: WindowSettings | None) -> str:
    return windows.mode(body) if windows is not None else "truncate"


def write_embedding(
    request: EmbeddingRequest | openai.OpenAIEmbeddingRequest,
    rows: Sequence[EmbeddingRow],
    model_name: str,
    space: VectorSpace,
) -> dict[str, Any] | ServerError:
    """The answer to one request from its rows: an OpenAI-shaped body is answered as OpenAI answers it."""
    if isinstance(request, openai.OpenAIEmbeddingRequest):
        return openai.write_embeddings(request, rows, model_name, space)
    [row] = rows
    answer = {"embedding": float32_list(row.value), "truncated": row.truncated}
    if request.windows is not None:
        answer["windows"] = request.windows[0]
    return answer


def parse_route(api: RequestContext, body: Any, request: RequestView) -> Any:
    preparation = text_preparation(api.info, api.tokenizer)
    parsed = parse_embedding(body, request.content_type, vector_space(api), api.limits, preparation, api.windows)
    split_long_texts(api, parsed)
    return parsed


def answer_route(api: RequestContext, request: Any, rows: list[Any]) -> Any:
    return write_embedding(request, text_rows(api, request, rows), api.model_name, vector_space(api))
