"""Embedding requests: what a body may say, validated into texts; and the JSON answers for each request shape.

Accepted bodies (docs/embeddings.md):

- plain text (``Content-Type: text/*``): the whole body is one text;
- ``{"text": "...", "truncate": bool?, "prompt_name": str?}`` -> ``{"embedding": [...], "truncated": bool}``;
- OpenAI style ``{"input": "..." | ["...", ...], "model": str?, "encoding_format": "float" | "base64"?,
  "dimensions": int?, "user": str?, "truncate": bool?}`` -> ``{"object": "list", "data": [...], "model": ...,
  "usage": {...}}``; ``"base64"``: each embedding is the base64 text of its little-endian float32 bytes (what the
  official OpenAI client asks for by default, and decodes).

The OpenAI embeddings route, ``/predictions/<model>/<version>/v1/embeddings`` (``served_model`` given), takes only the
OpenAI shape, and its ``model``, if sent, must name the served model (404 otherwise); at ``/predictions/<model>``
``model`` and ``user`` are accepted and ignored (the URL picks the model). ``prompt_name`` (either shape) picks one of
the model's named prompts (config_sentence_transformers.json), as sentence-transformers' ``encode(prompt_name=...)``
does; without it the model's default prompt applies, if it has one; ``null`` asks for none. Fields that would change
the answer and that we cannot honour are refused instead of silently ignored: another ``encoding_format``,
``dimensions`` other than the model's own, token-id arrays, and any field not listed above.

Size limits (``handler:`` config, :class:`handlers.text.requests.common.TextLimits`) are checked here, before any
text reaches the tokenizer. Each refusal is a 413 whose message names the limit key and its value.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from handlers.core.errors import RequestError, ServerError
from handlers.core.http import float32_list
from handlers.text.requests.common import (
    TOKEN_IDS,
    TextLimits,
    check_count,
    check_request_chars,
    check_text,
    decoded_body,
    token_ids,
)
from handlers.text.rows import RowOptions

TEXT_FIELDS = {"text", "truncate", "prompt_name"}
OPENAI_FIELDS = {"input", "model", "encoding_format", "dimensions", "user", "truncate", "prompt_name"}
ENCODINGS = ("float", "base64")
OPENAI_ROUTE = "v1/embeddings"  # /predictions/<model>/<version>/v1/embeddings: what the OpenAI client posts to


@dataclass(frozen=True)
class TextPreparation:
    """How the model's own folder says a text becomes its input: a named prompt in front (sentence-transformers'
    ``encode(prompt_name=...)``), lower-casing (sentence_bert_config.json ``do_lower_case``), and, where the pooling
    leaves the prompt out (``include_prompt: false``), the prompt's token count (``prompt_tokens``)."""

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    lowercase: bool = False
    prompt_tokens: Callable[[str], int] | None = None

    def prompt(self, body: dict[str, Any]) -> str:
        """The prompt a request picked: 'prompt_name' (null: none), else the model's default prompt, else none."""
        if "prompt_name" not in body:
            return self.prompts.get(self.default_prompt_name, "") if self.default_prompt_name else ""
        name = body["prompt_name"]
        if name is None:
            return ""
        if not isinstance(name, str):
            raise RequestError(f"'prompt_name' must be a string or null, got {type(name).__name__}")
        if name not in self.prompts:
            shown = name if len(name) <= 64 else name[:64] + "..."
            known = f"this model's prompts are {sorted(self.prompts)}" if self.prompts else "this model has none"
            raise RequestError(f"'prompt_name' {shown!r} is not a prompt of this model; {known}")
        return self.prompts[name]

    def apply(self, texts: list[str], prompt: str) -> list[str]:
        texts = [prompt + text for text in texts] if prompt else texts
        return [text.lower() for text in texts] if self.lowercase else texts

    def options(self, count: int, prompt: str) -> list[RowOptions] | None:
        """Each row's options: the prompt's token count where the pooling leaves it out, else the defaults."""
        if self.prompt_tokens is None or not prompt:
            return None
        length = self.prompt_tokens(prompt.lower() if self.lowercase else prompt)
        return [RowOptions(prompt_length=length)] * count


NO_PROMPTS = TextPreparation()


@dataclass
class EmbeddingRequest:
    texts: list[str]
    names: list[str]  # how error messages name each text: "'text'", "'input'[3]", "body"
    shape: str  # "text" (plain body or {"text"}) or "openai"
    truncate: bool  # False: a text over the token limit is an error instead of being cut
    encoding: str = "float"  # OpenAI shape: "float" (a JSON array) or "base64" (little-endian float32 bytes)
    served_model: str | None = None  # set on the OpenAI route: the name its answer (and its errors' shape) gives
    options: list[RowOptions] | None = None  # per text, where not the defaults (a prompt the pooling leaves out)


def parse_embedding_request(
    body: Any,
    content_type: str,
    dimension: int,
    limits: TextLimits,
    preparation: TextPreparation = NO_PROMPTS,
    served_model: str | None = None,
) -> EmbeddingRequest:
    """Validate one request body (as TorchServe hands it over) into an :class:`EmbeddingRequest` whose texts are the
    model's inputs (the request's prompt in front). ``served_model``: the request came by the OpenAI route, which
    takes only the OpenAI shape, whose ``model`` must then name this model."""
    body = decoded_body(body, content_type)
    if served_model is not None and not (isinstance(body, dict) and "input" in body):
        raise RequestError(
            f"/{OPENAI_ROUTE} takes OpenAI's embeddings body, a JSON object with 'input' (a string or a list "
            f"of strings) and 'model' ('{served_model}'); {{\"text\": ...}} and plain text go to "
            f"/predictions/{served_model}"
        )
    request = parse_body(body, dimension, limits, preparation, served_model)
    check_request_chars(sum(len(text) for text in request.texts), limits)
    return request


def parse_body(
    body: Any, dimension: int, limits: TextLimits, preparation: TextPreparation, served_model: str | None
) -> EmbeddingRequest:
    if isinstance(body, str):
        prompt = preparation.prompt({})
        texts = preparation.apply([check_text(body, "body", limits.max_text_chars)], prompt)
        return EmbeddingRequest(texts, ["body"], "text", True, options=preparation.options(1, prompt))
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with 'text' or 'input', got {type(body).__name__}")
    if "text" in body and "input" in body:
        raise RequestError("send either 'text' or 'input', not both")
    if "text" not in body and "input" not in body:
        raise RequestError("missing field 'text' (or 'input' for the OpenAI embeddings shape)")
    shape, allowed = ("text", TEXT_FIELDS) if "text" in body else ("openai", OPENAI_FIELDS)
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}; accepted: {sorted(allowed)}")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RequestError(f"'truncate' must be true or false, got {truncate!r}")
    prompt = preparation.prompt(body)
    if shape == "text":
        texts = preparation.apply([check_text(body["text"], "'text'", limits.max_text_chars)], prompt)
        return EmbeddingRequest(texts, ["'text'"], shape, truncate, options=preparation.options(1, prompt))
    check_openai_options(body, dimension, served_model)
    request = openai_request(body["input"], truncate, limits)
    request.texts = preparation.apply(request.texts, prompt)
    request.options = preparation.options(len(request.texts), prompt)
    request.encoding = body.get("encoding_format", "float")
    request.served_model = served_model
    return request


def openai_request(inputs: Any, truncate: bool, limits: TextLimits) -> EmbeddingRequest:
    """The texts of an OpenAI-style ``input``: one string or a list of them."""
    if isinstance(inputs, str):
        return EmbeddingRequest([check_text(inputs, "'input'", limits.max_text_chars)], ["'input'"], "openai", truncate)
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("'input' must be a string or a non-empty list of strings")
    if token_ids(inputs):  # before the count: one token array of 500 ids is not "500 inputs"
        raise RequestError(f"'input' is token ids: {TOKEN_IDS}")
    check_count(len(inputs), "'input'", limits)
    names = [f"'input'[{i}]" for i in range(len(inputs))]
    texts = [check_text(item, name, limits.max_text_chars) for item, name in zip(inputs, names, strict=True)]
    return EmbeddingRequest(texts, names, "openai", truncate)


def check_openai_options(body: dict[str, Any], dimension: int, served_model: str | None = None) -> None:
    for name in ("model", "user"):
        if name in body and not isinstance(body[name], str):
            raise RequestError(f"'{name}' must be a string, got {type(body[name]).__name__}")
    if served_model is not None and body.get("model", served_model) != served_model:
        shown = body["model"] if len(body["model"]) <= 80 else body["model"][:80] + "..."
        raise RequestError(
            f"model {shown!r} is not served at this URL, which serves {served_model!r}: send model={served_model!r}",
            code=404,
            error_type="ModelNotFound",
        )
    encoding = body.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise RequestError(f"'encoding_format' {encoding!r} is not supported; use 'float' or 'base64'")
    if "dimensions" in body and (type(body["dimensions"]) is not int or body["dimensions"] != dimension):
        raise RequestError(
            f"'dimensions' {body['dimensions']!r} is not supported: this model's embeddings have a fixed {dimension} "
            f"dimensions (send {dimension} or leave 'dimensions' out)"
        )


class EmbeddingRow(Protocol):
    """One text's computed row as an answer needs it (a cache entry is one)."""

    @property
    def value(self) -> torch.Tensor: ...

    @property
    def tokens(self) -> int: ...

    @property
    def truncated(self) -> bool: ...


def format_response(
    request: EmbeddingRequest, rows: Sequence[EmbeddingRow], model_name: str
) -> dict[str, Any] | RequestError:
    """The answer to one request (the base serializes it); ``rows`` are its cached-row entries in order.

    Embeddings are float32 rows (printed with the shortest text that reads back as the same float32), or with
    ``encoding_format: "base64"`` the base64 of their little-endian float32 bytes."""
    if request.shape == "text":
        [row] = rows
        return {"embedding": float32_list(row.value), "truncated": row.truncated}
    tokens = sum(row.tokens for row in rows)
    data = []
    for index, row in enumerate(rows):
        embedding = float32_list(row.value) if request.encoding == "float" else float32_base64(row.value)
        if embedding is None:  # what to_json refuses on the float path, refused here too: never NaN as bytes
            return ServerError("the model produced a non-finite number (NaN or Infinity); no answer was sent")
        data.append({"object": "embedding", "index": index, "embedding": embedding, "truncated": row.truncated})
    return {
        "object": "list",
        "data": data,
        "model": request.served_model or model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def float32_base64(embedding: torch.Tensor) -> str | None:
    """OpenAI's ``encoding_format: "base64"``: the row's little-endian float32 bytes, base64 (None if not finite)."""
    values = embedding.detach().to("cpu", torch.float32)
    if not bool(torch.isfinite(values).all()):
        return None
    return base64.b64encode(values.numpy().astype("<f4", copy=False).tobytes()).decode("ascii")
