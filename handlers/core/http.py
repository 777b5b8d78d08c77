"""The HTTP side of a request as TorchServe hands it to a worker: headers, the body, JSON in and JSON out."""

from __future__ import annotations

import json
from typing import Any

from handlers.core.errors import RequestError

# Content types TorchServe splits into form fields, dropping the raw body.
FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class RequestView:
    """What a handler may read about one request of the batch besides its body."""

    def __init__(self, context: Any, idx: int) -> None:
        self._context = context
        self.idx = idx

    def header(self, name: str) -> str | None:
        getter = getattr(self._context, "get_request_header", None)
        if getter is None:
            return None
        value = getter(self.idx, name)
        if value is None:
            value = getter(self.idx, name.lower())
        return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value

    @property
    def content_type(self) -> str:
        return (self.header("Content-Type") or "").split(";")[0].strip().lower()

    @property
    def url_path(self) -> str:
        """What followed the model (and version) in the URL: '' for /predictions/<model>[/<version>], 'v1/embeddings'
        for /predictions/<model>/<version>/v1/embeddings. TorchServe 0.12 routes every such path to the model and
        passes the rest in the request header ``url_path``."""
        return (self.header("url_path") or "").strip("/")


def request_body(request: Any) -> Any:
    """TorchServe hands each request as a dict; a raw body is under ``body`` (or ``data`` for some clients).

    A JSON ``null`` body arrives as None under its key; a missing body is returned as b"" (empty)."""
    if not isinstance(request, dict):
        return request
    for key in ("body", "data"):
        if key in request:
            return request[key]
    return b""


def to_json(value: Any) -> str:
    """Strict, compact JSON for a response body or stream line: the one serializer every answer goes through.

    Strict: NaN and Infinity have no JSON spelling (json.dumps would write the non-standard tokens that strict parsers
    reject), so a non-finite number raises ValueError here instead of reaching a client; so does text that cannot be
    sent as UTF-8 (a lone surrogate). Compact: TorchServe would pretty-print (indent=2) a dict or list a handler
    returns, with its slow pure-Python encoder; a string goes out as its UTF-8 bytes."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # UnicodeEncodeError (a ValueError) now, rather than in TorchServe for the whole batch
    return text


def decode_json(raw: bytes | bytearray | None) -> Any:
    """Parse a body TorchServe could not decode (no JSON content type, or invalid JSON) with a precise message."""
    if raw is None or len(raw) == 0:
        raise RequestError("request body is empty")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"body is not valid UTF-8 (byte {error.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(f"body is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except RecursionError:
        raise RequestError("body is not valid JSON: nested too deeply") from None
    except ValueError as error:  # e.g. an integer literal longer than Python's 4300-digit limit
        raise RequestError(f"body is not valid JSON: {error}"[:300]) from None


def json_body(body: Any, request: RequestView) -> Any:
    """The request's JSON value, whether TorchServe parsed it (JSON content type) or left raw bytes/text.

    TorchServe parses a body sent as application/json; for other content types, or JSON it failed to parse, the
    body arrives as bytes (or str for text/*), and we parse it here so that errors name the problem."""
    if isinstance(body, (bytes, bytearray)):
        return decode_json(body)
    if isinstance(body, str) and request.content_type != "application/json":
        return decode_json(body.encode("utf-8"))
    return body
