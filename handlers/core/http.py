"""The HTTP side of a request as TorchServe hands it to a worker: headers, the body, JSON in and JSON out."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import torch

from handlers.core.errors import RequestError

# Content types TorchServe splits into form fields, dropping the raw body.
FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class RequestView:
    """What a handler may read about one request of the batch besides its body."""

    def __init__(self, context: Any, idx: int, request: Any = None) -> None:
        self._context = context
        self.idx = idx
        self._request = request if isinstance(request, dict) else {}

    @property
    def over_grpc(self) -> bool:
        """Every HTTP request has a Host header; TorchServe's gRPC frontend passes none."""
        return self.header("Host") is None

    def input(self, name: str) -> str | None:
        """Another named input of the request besides its body (a gRPC PredictionsRequest's ``input`` map)."""
        value = self._request.get(name)
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("utf-8", "replace")
        return value if isinstance(value, str) else None

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


class Float32List(list[float]):
    """A row of float32 numbers (an embedding, a classifier's probabilities): an ordinary list of the values (as
    Python floats), marked so that :func:`to_json` prints each with the shortest decimal text that reads back as the
    same float32 ("0.1", where the float64 repr says "0.10000000149011612"). Make one with :func:`float32_list`."""

    __slots__ = ()


class Float32(float):
    """One float32 number (a score), marked as :class:`Float32List` marks a row: to_json prints its shortest text."""

    __slots__ = ()


def float32_list(values: Any) -> Float32List:
    """A 1-D tensor (any dtype, any device), array or sequence of numbers as a :class:`Float32List` (values rounded
    to float32, as the model computed them)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float32).numpy()
    array = np.asarray(values, dtype=np.float32)
    if array.ndim != 1:
        raise ValueError(f"float32_list takes one row, got shape {array.shape}")
    return Float32List(array.tolist())


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_ATOMS = frozenset({str, int, float, bool, type(None)})  # exact types json encodes as they are (not Float32)
_TEXT = np.dtypes.StringDType()
_EXPONENT = re.compile(r"e\+?(-?)0*(?=\d)")  # an exponent's '+' and leading zeros


def to_json(value: Any) -> str:
    """Strict, compact JSON for a response body or stream line: the one serializer every answer goes through.

    Strict: NaN and Infinity have no JSON spelling (json.dumps would write the non-standard tokens that strict parsers
    reject), so a non-finite number raises ValueError here instead of reaching a client; so does text that cannot be
    sent as UTF-8 (a lone surrogate). Compact: TorchServe would pretty-print (indent=2) a dict or list a handler
    returns, with its slow pure-Python encoder; a string goes out as its UTF-8 bytes. Float32 values (a
    :class:`Float32List` row, a :class:`Float32` number) are printed with the shortest text that reads back as the
    same float32, as Rust's serde (ryu) and TEI print them: 'float32 shortest' in docs/clients.md.

    Everything else is json.dumps' own output: containers that hold a marked value are walked here, any other value
    (a whole container of plain values included) goes to json's C encoder in one call."""
    parts: list[str] = []
    _write(value, parts)
    text = "".join(parts)
    text.encode("utf-8")  # UnicodeEncodeError (a ValueError) now, rather than in TorchServe for the whole batch
    return text


def _write(value: Any, parts: list[str]) -> None:
    if isinstance(value, Float32List):
        parts.append(float32_json(value))
    elif isinstance(value, Float32):
        parts.append(float32_json([value])[1:-1])
    elif isinstance(value, dict) and not _plain(value.values()):
        parts.append("{")
        for number, (key, item) in enumerate(value.items()):
            parts.append(("," if number else "") + _key(key) + ":")
            _write(item, parts)
        parts.append("}")
    elif isinstance(value, (list, tuple)) and not _plain(value):
        parts.append("[")
        for number, item in enumerate(value):
            if number:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        parts.append(_ENCODE(value))


def _plain(values: Any) -> bool:
    """Whether json's encoder can write these values as they are: no container, no marked float32 among them."""
    return all(type(item) in _ATOMS for item in values)


def _key(key: Any) -> str:
    # json turns int, float, bool and None keys into strings and refuses other types: the same, through json itself.
    return _ENCODE(key) if type(key) is str else _ENCODE({key: None})[1:-6]


def float32_json(values: Any) -> str:
    """A JSON array of the shortest decimal texts that read back as these float32 values: numpy's float32 to text
    cast (Dragon4 in its shortest round-trip mode, in C: about as fast as json.dumps of the float64 values), which
    gives the digits ryu gives (tests/unit/test_json_float32.py checks both properties and the digits)."""
    array = np.asarray(values, dtype=np.float32)
    if not np.isfinite(array).all():
        bad = array[~np.isfinite(array)][0]
        raise ValueError(f"Out of range float values are not JSON compliant: {bad}")
    if np.get_printoptions()["legacy"] is not False:  # numpy's legacy print modes (1.13) would round to 6 digits
        with np.printoptions(legacy=False):
            return float32_json(array)
    text = ",".join(array.astype(_TEXT).tolist())
    if "e" in text:  # numpy writes 5e-05 and 1e+16: the same numbers, shorter, are 5e-5 and 1e16 (as ryu writes them)
        text = _EXPONENT.sub(r"e\1", text)
    return "[" + text + "]"


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
