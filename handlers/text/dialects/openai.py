"""OpenAI's embeddings API (what the official client and LangChain's ``OpenAIEmbeddings`` send), at
``/predictions/<model>/<version>/v1/embeddings``:

``{"input": "..." | ["...", ...], "model": str?, "encoding_format": str?, "dimensions": int?, "user": str?,
"truncate": bool?, "prompt_name": str?, "long_input": "truncate"|"windows"?}`` -> ``{"object": "list", "data":
[{"object": "embedding", "index", "embedding", "truncated"}], "model": ..., "usage": {...}}`` (a windowed text is one
item, its usage the tokens of all its windows: handlers/text/windows.py). ``encoding_format`` is one of
handlers/text/quantization.py's types: ``"float"`` (default), ``"base64"`` (each embedding the base64 of its
little-endian float32 bytes: what the official OpenAI client asks for, and decodes), ``"int8"``, ``"uint8"``,
``"binary"``, ``"ubinary"`` (lists of integers). Token-id arrays are refused (LangChain sends them by default).

At this route ``model``, if sent, must name the served model (404 otherwise). The same body is also accepted at the
model's own URL (handlers/text/dialects/native.py), where ``model`` and ``user`` are accepted and ignored (the URL
picks the model) and the answer names the archive's model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import OPENAI, RequestError, ServerError, shown
from handlers.core.http import RequestView
from handlers.text.quantization import EMBEDDING_TYPES
from handlers.text.requests.common import (
    TOKEN_IDS,
    RequestContext,
    TextLimits,
    check_count,
    check_fields,
    check_model_name,
    check_request_chars,
    check_text,
    decoded_body,
    token_ids,
    truncate_flag,
)
from handlers.text.requests.embedding import (
    NO_PROMPTS,
    EmbeddingRow,
    TextPreparation,
    VectorSpace,
    answered_array,
    encoded_as,
    split_long_texts,
    text_preparation,
    text_rows,
    vector_space,
)
from handlers.text.routes import Route
from handlers.text.rows import RowOptions
from handlers.text.windows import LONG_INPUT_FIELD, WindowSettings

EMBEDDINGS_PATH = "v1/embeddings"  # /predictions/<model>/<version>/v1/embeddings: what the OpenAI client posts to
FIELDS = {"input", "model", "encoding_format", "dimensions", "user", "truncate", "prompt_name", LONG_INPUT_FIELD}
ENCODINGS = EMBEDDING_TYPES


@dataclass
class OpenAIEmbeddingRequest:
    texts: list[str]
    names: list[str]  # how error messages name each text: "'input'", "'input'[3]"
    truncate: bool  # False: a text over the token limit is an error instead of being cut
    encoding: str = "float"  # one of handlers/text/quantization.py EMBEDDING_TYPES
    served_model: str | None = None  # at this route: the name its answer gives (None: the archive's)
    options: list[RowOptions] | None = None  # per text, where not the defaults (a prompt the pooling leaves out)
    dimensions: int | None = None  # cut to this size (None: the model's own)
    normalize: bool = False  # re-normalise each cut vector (a normalising model)
    long_input: str = "truncate"  # "windows": a text over the token limit is embedded by windows
    prompt: str = ""  # the prompt in front of each text, as prepared
    windows: list[int] | None = None  # once split: the windows each text became (None: not windowed)


def parse_embeddings_body(
    body: dict[str, Any],
    space: VectorSpace,
    limits: TextLimits,
    preparation: TextPreparation = NO_PROMPTS,
    served_model: str | None = None,
    windows: WindowSettings | None = None,
) -> OpenAIEmbeddingRequest:
    """A JSON object with ``input`` into a request whose texts are the model's inputs (the prompt in front);
    ``served_model``: the name ``model`` must give (None: any string); ``windows``: the model's long-input settings
    (None: windows are refused)."""
    check_fields(body, FIELDS if windows is not None else FIELDS - {LONG_INPUT_FIELD})
    truncate = truncate_flag(body)
    prompt = preparation.prompt(body)
    encoding, dimensions = check_options(body, space, served_model)
    request = input_texts(body["input"], truncate, limits)
    request.texts = preparation.apply(request.texts, prompt)
    request.options = preparation.options(len(request.texts), prompt)
    request.encoding = encoding
    request.served_model = served_model
    request.dimensions, request.normalize = dimensions, dimensions is not None and space.normalizes
    request.long_input = windows.mode(body) if windows is not None else "truncate"
    request.prompt = preparation.prepared(prompt)
    return request


def parse_embeddings(
    body: Any,
    content_type: str,
    space: VectorSpace,
    limits: TextLimits,
    preparation: TextPreparation,
    served_model: str,
    windows: WindowSettings | None = None,
) -> OpenAIEmbeddingRequest:
    """The body as this route takes it: only OpenAI's shape, whose ``model`` must name ``served_model``."""
    body = decoded_body(body, content_type)
    if not (isinstance(body, dict) and "input" in body):
        raise RequestError(
            f"/{EMBEDDINGS_PATH} takes OpenAI's embeddings body, a JSON object with 'input' (a string or a list "
            f"of strings) and 'model' ('{served_model}'); {{\"text\": ...}} and plain text go to "
            f"/predictions/{served_model}"
        )
    if "text" in body:
        raise RequestError("send either 'text' or 'input', not both")
    request = parse_embeddings_body(body, space, limits, preparation, served_model, windows)
    check_request_chars(sum(len(text) for text in request.texts), limits)
    return request


def input_texts(inputs: Any, truncate: bool, limits: TextLimits) -> OpenAIEmbeddingRequest:
    """The texts of an OpenAI-style ``input``: one string or a list of them."""
    if isinstance(inputs, str):
        return OpenAIEmbeddingRequest([check_text(inputs, "'input'", limits.max_text_chars)], ["'input'"], truncate)
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("'input' must be a string or a non-empty list of strings")
    if token_ids(inputs):  # before the count: one token array of 500 ids is not "500 inputs"
        raise RequestError(f"'input' is token ids: {TOKEN_IDS}")
    check_count(len(inputs), "'input'", limits)
    names = [f"'input'[{i}]" for i in range(len(inputs))]
    texts = [check_text(item, name, limits.max_text_chars) for item, name in zip(inputs, names, strict=True)]
    return OpenAIEmbeddingRequest(texts, names, truncate)


def check_options(body: dict[str, Any], space: VectorSpace, served_model: str | None = None) -> tuple[str, int | None]:
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


def write_embeddings(
    request: OpenAIEmbeddingRequest, rows: Sequence[EmbeddingRow], model_name: str, space: VectorSpace
) -> dict[str, Any] | ServerError:
    """OpenAI's answer from the request's rows, in order (``model_name``: the archive's, where the request came to
    the model's own URL)."""
    array = answered_array(request, rows)
    if isinstance(array, ServerError):
        return array
    tokens = sum(row.tokens for row in rows)
    embeddings = encoded_as(array, request.encoding, request, space)
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


def parse_route(api: RequestContext, body: Any, request: RequestView) -> OpenAIEmbeddingRequest:
    preparation = text_preparation(api.info, api.tokenizer)
    parsed = parse_embeddings(
        body, request.content_type, vector_space(api), api.limits, preparation, api.served_name, api.windows
    )
    split_long_texts(api, parsed)
    return parsed


def answer_route(api: RequestContext, request: OpenAIEmbeddingRequest, rows: list[Any]) -> Any:
    return write_embeddings(request, text_rows(api, request, rows), api.model_name, vector_space(api))


EMBEDDINGS = Route(EMBEDDINGS_PATH, parse_route, answer_route, OPENAI, "OpenAI embeddings")
