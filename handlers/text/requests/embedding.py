"""Embedding requests: what a body may say, validated into texts; and the JSON answers for each request shape.

Accepted bodies (docs/embeddings.md):

- plain text (``Content-Type: text/*``): the whole body is one text;
- ``{"text": "...", "truncate": bool?, "prompt_name": str?}`` -> ``{"embedding": [...], "truncated": bool}``;
- OpenAI style ``{"input": "..." | ["...", ...], "model": str?, "encoding_format": str?, "dimensions": int?,
  "user": str?, "truncate": bool?}`` -> ``{"object": "list", "data": [...], "model": ..., "usage": {...}}``;
  ``encoding_format`` is one of handlers/text/quantization.py's types: ``"float"`` (default), ``"base64"`` (each
  embedding the base64 of its little-endian float32 bytes: what the official OpenAI client asks for, and decodes),
  ``"int8"``, ``"uint8"``, ``"binary"``, ``"ubinary"`` (lists of integers);
- Cohere's embed v2 at ``/v2/embed`` (:func:`parse_cohere_embed`): ``{"model", "texts", "input_type",
  "embedding_types": [...], "truncate", "max_tokens", "output_dimension"}`` -> ``{"id", "embeddings": {type:
  [...]}, "texts", "meta", "response_type": "embeddings_by_type"}``;
- text-embeddings-inference's ``/embed`` (:func:`parse_tei_embed`): ``{"inputs", "normalize", "truncate",
  "truncation_direction", "prompt_name", "dimensions"}`` -> a bare list of vectors.

The OpenAI embeddings route, ``/predictions/<model>/<version>/v1/embeddings`` (``served_model`` given), takes only the
OpenAI shape, and its ``model``, if sent, must name the served model (404 otherwise); at ``/predictions/<model>``
``model`` and ``user`` are accepted and ignored (the URL picks the model). ``prompt_name`` (either shape) picks one of
the model's named prompts (config_sentence_transformers.json), as sentence-transformers' ``encode(prompt_name=...)``
does; without it the model's default prompt applies, if it has one; ``null`` asks for none. ``dimensions`` cuts each
vector to its first N values (re-normalised where the model normalises) where the model declares that size
(:class:`VectorSpace`); its own size is always accepted. Fields that would change the answer and that we cannot honour
are refused instead of silently ignored: another ``encoding_format``, a size the model does not declare, token-id
arrays, and any field not listed above.

Size limits (``handler:`` config, :class:`handlers.text.requests.common.TextLimits`) are checked here, before any
text reaches the tokenizer. Each refusal is a 413 whose message names the limit key and its value.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from handlers.core.errors import RequestError, ServerError, shown
from handlers.core.http import float32_list
from handlers.text.quantization import (
    EMBEDDING_TYPES,
    INTEGER_TYPES,
    Calibration,
    cut,
    float32_base64,
    quantize,
)
from handlers.text.requests.common import (
    TOKEN_IDS,
    TextLimits,
    check_bool,
    check_count,
    check_fields,
    check_model_name,
    check_request_chars,
    check_right_truncation,
    check_text,
    cut_to_tokens,
    decoded_body,
    default_if_none,
    positive_int,
    text_list,
    token_ids,
    tokens_over,
    truncate_flag,
)
from handlers.text.rows import RowOptions
from handlers.text.tokenization import ServedTokenizer

TEXT_FIELDS = {"text", "truncate", "prompt_name"}
OPENAI_FIELDS = {"input", "model", "encoding_format", "dimensions", "user", "truncate", "prompt_name"}
COHERE_FIELDS = {
    "texts",
    "model",
    "input_type",
    "embedding_types",
    "truncate",
    "max_tokens",
    "output_dimension",
    "priority",
    "images",
    "inputs",
}
TEI_FIELDS = {"inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions"}
ENCODINGS = EMBEDDING_TYPES
OPENAI_ROUTE = "v1/embeddings"  # /predictions/<model>/<version>/v1/embeddings: what the OpenAI client posts to
COHERE_ROUTE = "v2/embed"  # what the cohere client (ClientV2.embed) posts to under its base URL
TEI_ROUTE = "embed"  # text-embeddings-inference's /embed (huggingface_hub's InferenceClient.feature_extraction)
# Cohere's input_type -> the folder's named prompts that mean it, first found wins (none: the model's default).
INPUT_TYPE_PROMPTS = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
COHERE_TRUNCATE = ("NONE", "START", "END")


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


@dataclass(frozen=True)
class VectorSpace:
    """What the served vectors allow a request to ask for: their size, the shorter sizes the model declares
    (``sizes``; None: any size, for a folder with ``truncate_dim``), whether its modules normalise (a cut vector is
    then re-normalised) and the calibration int8/uint8 are scaled with."""

    dimension: int
    sizes: tuple[int, ...] | None = ()
    normalizes: bool = False
    calibration: Calibration | None = None

    def check_size(self, value: Any, name: str) -> int | None:
        """The size a request cuts to (None: the model's own)."""
        if value is None:
            return None
        if type(value) is int and value == self.dimension:
            return None
        if type(value) is int and 1 <= value < self.dimension and (self.sizes is None or value in self.sizes):
            return value
        if self.sizes is None:
            served = f"any size from 1 to {self.dimension}"
        elif self.sizes:
            served = f"{sorted({*self.sizes, self.dimension})}"
        else:
            raise RequestError(
                f"'{name}' {shown(value)} is not supported: this model's embeddings have a fixed {self.dimension} "
                f"dimensions (send {self.dimension} or leave '{name}' out)"
            )
        raise RequestError(f"'{name}' {shown(value)} is not supported: this model serves {served} dimensions")

    def check_types(self, types: Sequence[str], name: str) -> None:
        for kind in types:
            if kind in INTEGER_TYPES and self.calibration is None:
                raise RequestError(
                    f"'{name}' {kind!r} needs the model's int8 calibration, which this archive lacks: package the "
                    f"model again (python -m scripts.package) to serve {kind}; float, base64, binary and ubinary work"
                )


FIXED = VectorSpace(0)


@dataclass
class EmbeddingRequest:
    texts: list[str]
    names: list[str]  # how error messages name each text: "'text'", "'input'[3]", "body"
    shape: str  # "text" (plain body or {"text"}), "openai", "cohere" or "tei"
    truncate: bool  # False: a text over the token limit is an error instead of being cut
    encoding: str = "float"  # OpenAI shape: one of handlers/text/quantization.py EMBEDDING_TYPES
    served_model: str | None = None  # set on the OpenAI route: the name its answer (and its errors' shape) gives
    options: list[RowOptions] | None = None  # per text, where not the defaults (a prompt the pooling leaves out)
    encodings: tuple[str, ...] = ()  # Cohere: every type asked for, in order
    dimensions: int | None = None  # cut to this size (None: the model's own)
    normalize: bool = False  # make each answered vector unit length (a cut of a normalising model; TEI normalize)
    inputs: list[str] = field(default_factory=list)  # Cohere: the texts as sent (its answer echoes them)


def parse_embedding_request(
    body: Any,
    content_type: str,
    dimension: int,
    limits: TextLimits,
    preparation: TextPreparation = NO_PROMPTS,
    served_model: str | None = None,
    space: VectorSpace | None = None,
) -> EmbeddingRequest:
    """Validate one request body (as TorchServe hands it over) into an :class:`EmbeddingRequest` whose texts are the
    model's inputs (the request's prompt in front). ``served_model``: the request came by the OpenAI route, which
    takes only the OpenAI shape, whose ``model`` must then name this model. ``space``: what the model's vectors
    allow (default: ``dimension`` only, no calibration)."""
    space = space or VectorSpace(dimension)
    body = decoded_body(body, content_type)
    if served_model is not None and not (isinstance(body, dict) and "input" in body):
        raise RequestError(
            f"/{OPENAI_ROUTE} takes OpenAI's embeddings body, a JSON object with 'input' (a string or a list "
            f"of strings) and 'model' ('{served_model}'); {{\"text\": ...}} and plain text go to "
            f"/predictions/{served_model}"
        )
    request = parse_body(body, space, limits, preparation, served_model)
    check_request_chars(sum(len(text) for text in request.texts), limits)
    return request


def parse_body(
    body: Any, space: VectorSpace, limits: TextLimits, preparation: TextPreparation, served_model: str | None
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
    truncate = truncate_flag(body)
    prompt = preparation.prompt(body)
    if shape == "text":
        texts = preparation.apply([check_text(body["text"], "'text'", limits.max_text_chars)], prompt)
        return EmbeddingRequest(texts, ["'text'"], shape, truncate, options=preparation.options(1, prompt))
    encoding, dimensions = check_openai_options(body, space, served_model)
    request = openai_request(body["input"], truncate, limits)
    request.texts = preparation.apply(request.texts, prompt)
    request.options = preparation.options(len(request.texts), prompt)
    request.encoding = encoding
    request.served_model = served_model
    request.dimensions, request.normalize = dimensions, dimensions is not None and space.normalizes
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


def check_openai_options(
    body: dict[str, Any], space: VectorSpace, served_model: str | None = None
) -> tuple[str, int | None]:
    """(encoding_format, the size to cut to) of an OpenAI-shaped body, or a refusal naming the field."""
    if "user" in body and not isinstance(body["user"], str):
        raise RequestError(f"'user' must be a string, got {type(body['user']).__name__}")
    if served_model is not None:
        check_model_name(body, served_model)
    elif "model" in body and not isinstance(body["model"], str):
        raise RequestError(f"'model' must be a string, got {type(body['model']).__name__}")
    encoding = body.get("encoding_format", "float")
    if encoding not in ENCODINGS:
        raise RequestError(
            f"'encoding_format' {shown(encoding)} is not supported; use one of {', '.join(map(repr, ENCODINGS))}"
        )
    space.check_types([encoding], "encoding_format")
    return encoding, space.check_size(body.get("dimensions"), "dimensions")


def input_type_prompt(preparation: TextPreparation, input_type: Any) -> str:
    """The folder's prompt for a Cohere ``input_type`` (search_query -> its "query" prompt, ...), else the model's
    default prompt."""
    if input_type is None:
        return preparation.prompt({})
    if input_type == "image":
        raise RequestError("'input_type' 'image': this model embeds text only")
    if input_type not in INPUT_TYPE_PROMPTS:
        raise RequestError(f"'input_type' must be one of {sorted(INPUT_TYPE_PROMPTS)}, got {shown(input_type)}")
    for name in INPUT_TYPE_PROMPTS[input_type]:
        if name in preparation.prompts:
            return preparation.prompt({"prompt_name": name})
    return preparation.prompt({})


def cohere_types(body: dict[str, Any], space: VectorSpace) -> list[str]:
    types = default_if_none(body.get("embedding_types"), ["float"])
    if not isinstance(types, list) or not types or not all(isinstance(kind, str) for kind in types):
        raise RequestError(f"'embedding_types' must be a list of {list(EMBEDDING_TYPES)}, got {shown(types)}")
    unknown = [kind for kind in types if kind not in EMBEDDING_TYPES]
    if unknown:
        raise RequestError(f"'embedding_types' {shown(unknown)} are not served; use {list(EMBEDDING_TYPES)}")
    space.check_types(types, "embedding_types")
    return types


def cohere_truncate(body: dict[str, Any]) -> str:
    truncate = default_if_none(body.get("truncate"), "END")
    if truncate not in COHERE_TRUNCATE:
        raise RequestError(f"'truncate' must be one of {list(COHERE_TRUNCATE)}, got {shown(truncate)}")
    if truncate == "START":
        raise RequestError("'truncate' 'START' is not served: texts are cut at their end ('END'), or refused ('NONE')")
    return str(truncate)


def parse_cohere_embed(
    body: Any,
    content_type: str,
    space: VectorSpace,
    limits: TextLimits,
    preparation: TextPreparation,
    served: str,
    tokenizer: ServedTokenizer,
) -> EmbeddingRequest:
    """Cohere's embed v2 body (what ``cohere.ClientV2.embed`` sends) into an :class:`EmbeddingRequest`;
    ``max_tokens`` below the model's own limit cuts each text there (``truncate: NONE``: refuses a longer one)."""
    body = decoded_body(body, content_type, "'texts' (a list of strings)")
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with 'texts' (a list of strings), got {type(body).__name__}")
    check_fields(body, COHERE_FIELDS)
    check_model_name(body, served)
    for name in ("images", "inputs"):
        if body.get(name) is not None:
            raise RequestError(f"'{name}': this model embeds text only; send 'texts'")
    if "texts" not in body or body["texts"] is None:
        raise RequestError("missing field 'texts' (a list of strings)")
    if isinstance(body["texts"], str):
        raise RequestError("'texts' must be a list of strings, not one string")
    texts, names = text_list(body["texts"], "texts", limits)
    types = cohere_types(body, space)
    truncate = cohere_truncate(body)
    priority = body.get("priority")
    if priority is not None and type(priority) is not int:
        raise RequestError(f"'priority' must be an integer, got {shown(priority)}")
    prompt = input_type_prompt(preparation, body.get("input_type"))
    dimensions = space.check_size(body.get("output_dimension"), "output_dimension")
    inputs = texts
    max_tokens = positive_int(body, "max_tokens")
    if max_tokens is not None and max_tokens < tokenizer.max_tokens:
        if truncate == "NONE":
            tokens_over(tokenizer, texts, max_tokens, names)
        texts = cut_to_tokens(tokenizer, texts, max_tokens)
    request = EmbeddingRequest(
        preparation.apply(texts, prompt),
        names,
        "cohere",
        truncate == "END",
        options=preparation.options(len(texts), prompt),
        encodings=tuple(dict.fromkeys(types)),
        dimensions=dimensions,
        normalize=dimensions is not None and space.normalizes,
        inputs=inputs,
    )
    check_request_chars(sum(map(len, request.texts)), limits)
    return request


def parse_tei_embed(
    body: Any, content_type: str, space: VectorSpace, limits: TextLimits, preparation: TextPreparation
) -> EmbeddingRequest:
    """text-embeddings-inference's /embed body (what huggingface_hub's InferenceClient.feature_extraction sends)."""
    body = decoded_body(body, content_type, "'inputs' (a text or a list of texts)")
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with 'inputs', got {type(body).__name__}")
    check_fields(body, TEI_FIELDS)
    if "inputs" not in body:
        raise RequestError("missing field 'inputs' (a text or a list of texts)")
    texts, names = text_list(body["inputs"], "inputs", limits)
    normalize = check_bool(body, "normalize", True)
    if not normalize and space.normalizes:
        raise RequestError("'normalize' false: this model's own modules normalise its vectors (send true)")
    check_right_truncation(body, "texts")
    prompt = preparation.prompt(body)
    dimensions = space.check_size(body.get("dimensions"), "dimensions")
    request = EmbeddingRequest(
        preparation.apply(texts, prompt),
        names,
        "tei",
        check_bool(body, "truncate", False),
        options=preparation.options(len(texts), prompt),
        dimensions=dimensions,
        normalize=normalize,
    )
    check_request_chars(sum(map(len, request.texts)), limits)
    return request


class EmbeddingRow(Protocol):
    """One text's computed row as an answer needs it (a cache entry is one)."""

    @property
    def value(self) -> torch.Tensor: ...

    @property
    def tokens(self) -> int: ...

    @property
    def truncated(self) -> bool: ...


NON_FINITE = "the model produced a non-finite number (NaN or Infinity); no answer was sent"


def answered_vectors(request: EmbeddingRequest, rows: Sequence[EmbeddingRow]) -> torch.Tensor:
    """The request's rows as answered: cut to its size and re-normalised where it asks."""
    vectors = torch.stack([row.value.detach().to("cpu", torch.float32) for row in rows])
    if request.dimensions is not None or request.normalize:
        vectors = cut(vectors, request.dimensions or vectors.shape[-1], request.normalize)
    return vectors


def encoded(vectors: np.ndarray, kind: str, space: VectorSpace, normalized_cut: bool) -> list[Any]:
    """Each row as ``kind`` (one of EMBEDDING_TYPES)."""
    if kind == "float":
        return [float32_list(vector) for vector in vectors]
    if kind == "base64":
        return [float32_base64(vector) for vector in vectors]
    ranges = None
    if kind in INTEGER_TYPES:
        if space.calibration is None:
            raise ValueError("int8/uint8 without a calibration (refused when parsed)")
        ranges = space.calibration.ranges(vectors.shape[-1], normalized_cut)
    return quantize(vectors, kind, ranges).tolist()


def format_response(
    request: EmbeddingRequest, rows: Sequence[EmbeddingRow], model_name: str, space: VectorSpace = FIXED
) -> dict[str, Any] | list[Any] | RequestError:
    """The answer to one request (the base serializes it); ``rows`` are its cached-row entries in order.

    Embeddings are float32 rows (printed with the shortest text that reads back as the same float32), or with
    another encoding (OpenAI's ``encoding_format``, Cohere's ``embedding_types``) that type's values."""
    if request.shape == "text":
        [row] = rows
        return {"embedding": float32_list(row.value), "truncated": row.truncated}
    vectors = answered_vectors(request, rows)
    if not bool(torch.isfinite(vectors).all()):  # never NaN as bytes or integers: what to_json refuses for floats
        return ServerError(NON_FINITE)
    array = vectors.numpy()
    cut_normalized = request.dimensions is not None and request.normalize
    tokens = sum(row.tokens for row in rows)
    if request.shape == "tei":
        return encoded(array, "float", space, cut_normalized)
    if request.shape == "cohere":
        return {
            "id": uuid.uuid4().hex,
            "embeddings": {kind: encoded(array, kind, space, cut_normalized) for kind in request.encodings},
            "texts": request.inputs,
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
            "response_type": "embeddings_by_type",
        }
    embeddings = encoded(array, request.encoding, space, cut_normalized)
    data = [
        {"object": "embedding", "index": index, "embedding": embedding, "truncated": row.truncated}
        for index, (embedding, row) in enumerate(zip(embeddings, rows, strict=True))
    ]
    return {
        "object": "list",
        "data": data,
        "model": request.served_model or model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
