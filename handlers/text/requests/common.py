"""What every text model's requests share: the body as TorchServe hands it over, the checks of one text, the size
limits, and what a request module may read of the served model (:class:`RequestContext`).

Size limits (``handler:`` config, :class:`TextLimits`) are checked before any text reaches the tokenizer: the tokenizer
reads a whole text even though only its first tokens are kept, so its cost grows with characters. Each refusal is a
413 whose message names the limit key and its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handlers.core.errors import RequestError, shown, surrogate_at, too_large
from handlers.core.http import decode_json
from handlers.text.folder import TextModelFolder
from handlers.text.tokenization import ServedTokenizer
from handlers.text.windows import LONG_INPUT_FIELD, WindowSettings


@dataclass(frozen=True)
class TextLimits:
    """What one request may cost before tokenizing (tokens after truncation are checked by the batch step)."""

    max_inputs: int  # texts in one list
    max_text_chars: int  # characters (code points) of one text
    max_request_chars: int  # characters of all the request's texts together


@dataclass(frozen=True)
class RequestContext:
    """What parsing a request and shaping its answer may read of the served model."""

    info: TextModelFolder
    tokenizer: ServedTokenizer
    limits: TextLimits
    model_name: str  # the archive's model name (answers' "model" at /predictions/<model>)
    served_name: str  # the name it is registered under (what OpenAI-style clients send as 'model')
    # Embedding models: the sizes 'dimensions' may ask for (None: any size up to the model's own; the model's own
    # size is always allowed) and the calibration int8/uint8 answers are scaled with (None: not packaged with one).
    dimensions: tuple[int, ...] | None = ()
    calibration: Any = None
    max_request_tokens: int = 0  # handler.max_request_tokens (/decode bounds its ids with it)
    # Models whose rows are pooled vectors (the embedding kind): how a text over the token limit may be windowed
    # (handlers/text/windows.py); None: no request of this model may ask for windows.
    windows: WindowSettings | None = None


def check_model_name(body: dict[str, Any], served: str) -> None:
    """An API's optional ``model`` field must name the model at this URL: a client configured for another model fails
    loudly (404 model_not_found) instead of getting this one's answers."""
    if "model" not in body:
        return
    model = body["model"]
    if not isinstance(model, str):
        raise RequestError(f"'model' must be a string, got {type(model).__name__}")
    if model != served:
        shown = model if len(model) <= 80 else model[:80] + "..."
        raise RequestError(
            f"model {shown!r} is not served at this URL, which serves {served!r}: send model={served!r}",
            code=404,
            error_type="ModelNotFound",
        )


def check_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false, got {shown(value)}")
    return value


def json_object(body: Any, content_type: str, wanted: str) -> dict[str, Any]:
    """The body as a JSON object (the shape every API route takes), or a refusal naming what it should hold."""
    body = decoded_body(body, content_type, wanted)
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with {wanted}, got {type(body).__name__}")
    return body


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


def check_count(count: int, where: str, limits: TextLimits) -> None:
    """A list of texts over handler.max_inputs is a 413 naming the limit (every text-model request shape)."""
    if count > limits.max_inputs:
        raise too_large(
            f"{where} has {count} items; at most {limits.max_inputs} are allowed per request (handler.max_inputs)"
        )


def check_request_chars(chars: int, limits: TextLimits) -> None:
    if chars > limits.max_request_chars:
        raise too_large(
            f"the request's texts have {chars} characters together; handler.max_request_chars is "
            f"{limits.max_request_chars}"
        )


def decoded_body(body: Any, content_type: str, wanted: str = "'text' or 'input'") -> Any:
    """The body as text (a plain-text request) or a decoded JSON value, whichever form TorchServe handed over."""
    if isinstance(body, (bytes, bytearray)):
        if content_type.startswith("text/"):
            try:
                return bytes(body).decode("utf-8")
            except UnicodeDecodeError as error:
                raise RequestError(f"body is not valid UTF-8 (byte {error.start})") from None
        body = decode_json(body)
        if isinstance(body, str):
            raise RequestError(f"body must be a JSON object with {wanted} (or send text/plain)")
    if body is None:
        raise RequestError("body is empty")
    if isinstance(body, str) and content_type == "application/json":  # TorchServe parsed a bare JSON string
        raise RequestError(f"body must be a JSON object with {wanted} (or send text/plain)")
    return body


def check_fields(body: dict[str, Any], allowed: set[str], shape: str = "") -> None:
    unknown = sorted(set(body) - allowed)
    if LONG_INPUT_FIELD in unknown:  # a known field of other bodies: say where it is taken, not just "unknown"
        raise RequestError(
            f"'{LONG_INPUT_FIELD}' is not accepted here: long inputs by windows are for embedding models' own body "
            f"and OpenAI embeddings (docs/embeddings.md, Long inputs)"
        )
    if unknown:
        where = f" with {shape}" if shape else ""
        raise RequestError(f"unknown field(s) {unknown}; accepted{where}: {sorted(allowed)}")


def truncate_flag(body: dict[str, Any]) -> bool:
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RequestError(f"'truncate' must be true or false, got {truncate!r}")
    return truncate


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise RequestError(f"'{name}' must be a positive integer or null, got {value!r}")
    return value


def text_list(inputs: Any, field: str, limits: TextLimits) -> tuple[list[str], list[str]]:
    """(texts, names) of a field holding one text or a non-empty list of them."""
    if isinstance(inputs, str):
        return [check_text(inputs, f"'{field}'", limits.max_text_chars)], [f"'{field}'"]
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(f"'{field}' must be a string or a non-empty list of strings")
    if token_ids(inputs):  # before the count: one token array of 500 ids is not "500 inputs"
        raise RequestError(f"'{field}' is token ids: {TOKEN_IDS}")
    check_count(len(inputs), f"'{field}'", limits)
    names = [f"'{field}'[{i}]" for i in range(len(inputs))]
    return [check_text(item, name, limits.max_text_chars) for item, name in zip(inputs, names, strict=True)], names


# What a client that sends token ids instead of text has to change (LangChain's default, langchain-openai 1.7.4).
TOKEN_IDS = (
    "token-id arrays are not supported, send text (LangChain's OpenAIEmbeddings sends token ids unless it is "
    "created with check_embedding_ctx_length=False)"
)


def default_if_none(value: Any, default: Any) -> Any:
    """A field's value, or ``default`` where it is absent or null. Not ``value or default``: a falsy value of the
    wrong type (false, 0, "", []) must reach the field's check and be refused, not read as the default."""
    return default if value is None else value


def check_right_truncation(body: dict[str, Any], what: str) -> None:
    """TEI's ``truncation_direction``: only "right" (case as TEI accepts it) is served; absent or null means it."""
    direction = default_if_none(body.get("truncation_direction"), "right")
    if not isinstance(direction, str) or direction.lower() not in ("right", "left"):
        raise RequestError(f"'truncation_direction' must be 'right' or 'left', got {shown(direction)}")
    if direction.lower() == "left":
        raise RequestError(f"'truncation_direction' 'left' is not served: {what} are cut at their end")


def token_ids(inputs: list[Any]) -> bool:
    """Whether an 'input' list is one token-id array or a list of them (what OpenAI's API also accepts)."""
    if all(type(item) is int for item in inputs):
        return True
    return all(isinstance(item, list) and item and all(type(i) is int for i in item) for item in inputs)


@dataclass(frozen=True)
class TextsBody:
    """The texts of a body in the shapes every text kind takes: text/plain (one text), {"text": "..."} (one), or
    {"input": "..." | [...]} (a list); ``fields`` is the JSON object ({} for plain text), its options checked by the
    caller."""

    texts: list[str]
    names: list[str]
    shape: str  # "text" (plain or {"text"}) or "list" ({"input"})
    fields: dict[str, Any]


def text_or_input(body: Any, content_type: str, limits: TextLimits, options: set[str]) -> TextsBody:
    """Read a body of one of those shapes; any field other than its text and ``options`` is refused."""
    body = decoded_body(body, content_type)
    if isinstance(body, str):
        return TextsBody([check_text(body, "body", limits.max_text_chars)], ["body"], "text", {})
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object with 'text' or 'input', got {type(body).__name__}")
    shapes = [name for name in ("text", "input") if name in body]
    if len(shapes) != 1:
        raise RequestError("send exactly one of 'text' (one text) or 'input' (a text or a list of texts)")
    shape = shapes[0]
    check_fields(body, options | {shape}, f"'{shape}'")
    if shape == "text":
        return TextsBody([check_text(body["text"], "'text'", limits.max_text_chars)], ["'text'"], "text", body)
    texts, names = text_list(body["input"], "input", limits)
    return TextsBody(texts, names, "list", body)


def cut_to_tokens(tokenizer: ServedTokenizer, texts: list[str], limit: int) -> list[str]:
    """Each text cut after its first ``limit`` tokens (special tokens not counted), at the end of that token's
    characters: Cohere's ``max_tokens_per_doc`` (rerank) and ``max_tokens`` (embed). Cutting the text, not the ids,
    keeps one tokenizer for every request whatever limit it names (a tokenizer per limit would be a copy each)."""
    encodings = tokenizer.untruncated().encode_batch(texts, add_special_tokens=False)
    return [
        text if len(encoding.ids) <= limit else text[: encoding.offsets[limit - 1][1]]
        for text, encoding in zip(texts, encodings, strict=True)
    ]


def tokens_over(tokenizer: ServedTokenizer, texts: list[str], limit: int, names: list[str]) -> None:
    """Refuse the first text with more than ``limit`` tokens (special tokens not counted)."""
    encodings = tokenizer.untruncated().encode_batch(texts, add_special_tokens=False)
    for name, encoding in zip(names, encodings, strict=True):
        if len(encoding.ids) > limit:
            raise RequestError(
                f"{name} has {len(encoding.ids)} tokens, more than 'max_tokens' {limit}, and 'truncate' is 'NONE'"
            )
