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

Size limits (``handler:`` config, :class:`EmbeddingLimits`) are checked here, before any text reaches the tokenizer:
the tokenizer reads a whole text even though only its first 256 tokens are kept, so its cost grows with characters.
Each refusal is a 413 whose message names the limit key and its value.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from handlers.core.errors import RequestError, ServerError, surrogate_at, too_large
from handlers.core.http import decode_json, float32_list

TEXT_FIELDS = {"text", "truncate", "prompt_name"}
OPENAI_FIELDS = {"input", "model", "encoding_format", "dimensions", "user", "truncate", "prompt_name"}
ENCODINGS = ("float", "base64")
OPENAI_ROUTE = "v1/embeddings"  # /predictions/<model>/<version>/v1/embeddings: what the OpenAI client posts to
# What a client that sends token ids instead of text has to change (LangChain's default, langchain-openai 1.7.4).
TOKEN_IDS = (
    "token-id arrays are not supported, send text (LangChain's OpenAIEmbeddings sends token ids unless it is "
    "created with check_embedding_ctx_length=False)"
)


@dataclass(frozen=True)
class EmbeddingLimits:
    """What one request may cost before tokenizing (tokens after truncation are checked by the handler)."""

    max_inputs: int  # texts in one 'input' list
    max_text_chars: int  # characters (code points) of one text
    max_request_chars: int  # characters of all the request's texts together


@dataclass(frozen=True)
class TextPreparation:
    """How the model's own folder says a text becomes its input: a named prompt in front (sentence-transformers'
    ``encode(prompt_name=...)``), lower-casing (sentence_bert_config.json ``do_lower_case``)."""

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    lowercase: bool = False

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


NO_PROMPTS = TextPreparation()


@dataclass
class EmbeddingRequest:
    texts: list[str]
    names: list[str]  # how error messages name each text: "'text'", "'input'[3]", "body"
    shape: str  # "text" (plain body or {"text"}) or "openai"
    truncate: bool  # False: a text over the token limit is an error instead of being cut
    encoding: str = "float"  # OpenAI shape: "float" (a JSON array) or "base64" (little-endian float32 bytes)
    served_model: str | None = None  # set on the OpenAI route: the name its answer (and its errors' shape) gives


def check_text(value: Any, where: str, max_chars: int) -> str:
    if not isinstance(value, str):
        hint = ": token-id arrays are not supported, send text" if isinstance(value, (int, list)) else ""
        raise RequestError(f"{where} is {type(value).__name__}, not a string{hint}")
    if len(value) > max_chars:  # first: the checks below copy or scan the whole text
        raise too_large(f"{where} has {len(value)} characters; handler.max_text_chars is {max_chars}")
    if not value.strip():
        raise RequestError(f"{where} is empty (or only whitespace)")
    surrogate = surrogate_at(value)
    if surrogate is not None:
        raise RequestError(f"{where} is not valid Unicode (unpaired surrogate at character {surrogate})")
    return value


def parse_embedding_request(
    body: Any,
    content_type: str,
    dimension: int,
    limits: EmbeddingLimits,
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
    chars = sum(len(text) for text in request.texts)
    if chars > limits.max_request_chars:
        raise too_large(
            f"the request's texts have {chars} characters together; handler.max_request_chars is "
            f"{limits.max_request_chars}"
        )
    return request


def parse_body(
    body: Any, dimension: int, limits: EmbeddingLimits, preparation: TextPreparation, served_model: str | None
) -> EmbeddingRequest:
    if isinstance(body, str):
        texts = preparation.apply([check_text(body, "body", limits.max_text_chars)], preparation.prompt({}))
        return EmbeddingRequest(texts, ["body"], "text", True)
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
        return EmbeddingRequest(texts, ["'text'"], shape, truncate)
    check_openai_options(body, dimension, served_model)
    request = openai_request(body["input"], truncate, limits)
    request.texts = preparation.apply(request.texts, prompt)
    request.encoding = body.get("encoding_format", "float")
    request.served_model = served_model
    return request


def decoded_body(body: Any, content_type: str) -> Any:
    """The body as text (a plain-text request) or a decoded JSON value, whichever form TorchServe handed over."""
    if isinstance(body, (bytes, bytearray)):
        if content_type.startswith("text/"):
            try:
                return bytes(body).decode("utf-8")
            except UnicodeDecodeError as error:
                raise RequestError(f"body is not valid UTF-8 (byte {error.start})") from None
        body = decode_json(body)
        if isinstance(body, str):
            raise RequestError("body must be a JSON object with 'text' or 'input' (or send text/plain)")
    if body is None:
        raise RequestError("body is empty")
    if isinstance(body, str) and content_type == "application/json":  # TorchServe parsed a bare JSON string
        raise RequestError("body must be a JSON object with 'text' or 'input' (or send text/plain)")
    return body


def openai_request(inputs: Any, truncate: bool, limits: EmbeddingLimits) -> EmbeddingRequest:
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


def token_ids(inputs: list[Any]) -> bool:
    """Whether an 'input' list is one token-id array or a list of them (what OpenAI's API also accepts)."""
    if all(type(item) is int for item in inputs):
        return True
    return all(isinstance(item, list) and item and all(type(i) is int for i in item) for item in inputs)


def check_count(count: int, where: str, limits: EmbeddingLimits) -> None:
    """A list of texts over handler.max_inputs is a 413 naming the limit (every text-model request shape)."""
    if count > limits.max_inputs:
        raise too_large(
            f"{where} has {count} items; at most {limits.max_inputs} are allowed per request (handler.max_inputs)"
        )


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
    def embedding(self) -> torch.Tensor: ...

    @property
    def tokens(self) -> int: ...

    @property
    def truncated(self) -> bool: ...


def format_response(
    request: EmbeddingRequest, rows: Sequence[EmbeddingRow], model_name: str
) -> dict[str, Any] | RequestError:
    """The answer to one request (the base serializes it); ``rows`` are its CachedEmbedding-like entries in order.

    Embeddings are float32 rows (printed with the shortest text that reads back as the same float32), or with
    ``encoding_format: "base64"`` the base64 of their little-endian float32 bytes."""
    if request.shape == "text":
        [row] = rows
        return {"embedding": float32_list(row.embedding), "truncated": row.truncated}
    tokens = sum(row.tokens for row in rows)
    data = []
    for index, row in enumerate(rows):
        embedding = float32_list(row.embedding) if request.encoding == "float" else float32_base64(row.embedding)
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
