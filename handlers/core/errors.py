"""Per-request errors, the JSON body that reports them, and the error a failed computation maps to.

A handler raises :class:`RequestError` while it validates one request; the base handler turns it into that request's
own HTTP status and JSON body, so the rest of the batch is answered normally and the worker keeps running.
"""

from __future__ import annotations

import re
from http import HTTPStatus

import torch


class RequestError(Exception):
    """A client error that belongs to one request (never to the whole batch)."""

    def __init__(self, message: str, code: int = 400, error_type: str = "InvalidRequest") -> None:
        super().__init__(message)
        self.message = message
        self.code = int(code)
        self.error_type = error_type

    def to_body(self) -> dict[str, object]:
        return {"code": self.code, "type": self.error_type, "message": self.message}

    def to_openai_body(self) -> dict[str, object]:
        """The error as OpenAI's API reports one, for OpenAI-compatible routes: OpenAI's clients raise the exception
        class of the HTTP status and read ``message``, ``type`` and ``code`` from this object."""
        kind = "server_error" if self.code >= 500 else "invalid_request_error"
        code = re.sub(r"(?<!^)(?=[A-Z])", "_", self.error_type).lower()  # ModelNotFound -> model_not_found
        # The field a refusal is about, where the error names one (shared checks record it as ``field``).
        param = getattr(self, "param", None) or getattr(self, "field", None)
        return {"error": {"message": self.message, "type": kind, "param": param, "code": code}}

    @property
    def phrase(self) -> str:
        try:
            return HTTPStatus(self.code).phrase
        except ValueError:
            return "Error"


# The error bodies of the APIs this project speaks, by name: a route says which one its refusals take.
NATIVE, OPENAI, COHERE, RERANK_V1, TEI, OIP = "native", "openai", "cohere", "rerank-v1", "tei", "oip"


def error_body(error: RequestError, shape: str) -> dict[str, object]:
    """``error`` as the API named by ``shape`` reports one, so that its clients raise their own exception with the
    message: OpenAI's ``{"error": {"message", "type", "param", "code"}}``, Cohere's ``{"message"}``, Cohere v1's and
    Jina's (both at /v1/rerank) ``{"message", "detail"}``, TEI's ``{"error", "error_type"}``, the Open Inference
    Protocol's (KServe v2, Triton) ``{"error"}``; anything else is this project's own ``{"code", "type",
    "message"}``. Every shape keeps ``message`` reachable where its clients look."""
    if shape == OPENAI:
        return error.to_openai_body()
    if shape == COHERE:
        return {"message": error.message}
    if shape == RERANK_V1:
        return {"message": error.message, "detail": error.message}
    if shape == TEI:
        kind = "Backend" if error.code >= 500 else "Validation"
        return {"error": error.message, "error_type": kind}
    if shape == OIP:
        return {"error": error.message}
    return error.to_body()


class ShapedError(RequestError):
    """A refusal whose body takes the shape of the API the request came by (:func:`error_body`), with the field it is
    about (``param``, OpenAI's name for it). Raise it (or :func:`shaped`) where a request is refused before its route
    is known to the code that answers; after that, a route's own error shape applies."""

    def __init__(
        self,
        message: str,
        code: int = 400,
        param: str | None = None,
        error_type: str = "InvalidRequest",
        shape: str = OPENAI,
    ) -> None:
        super().__init__(message, code=code, error_type=error_type)
        self.param = param
        self.shape = shape

    def to_body(self) -> dict[str, object]:
        return error_body(self, self.shape)


def shaped(error: RequestError, shape: str) -> ShapedError:
    """``error`` in ``shape`` (the field a shared check names, ``field`` or ``param``, is kept as ``param``)."""
    if isinstance(error, ShapedError) and error.shape == shape:
        return error
    param = getattr(error, "param", None) or getattr(error, "field", None)
    return ShapedError(error.message, error.code, param, error.error_type, shape)


class ServerError(RequestError):
    """Something failed on our side while answering a valid request (500, or 507 when out of memory)."""

    def __init__(self, message: str, code: int = 500, error_type: str = "InternalServerError") -> None:
        super().__init__(message, code=code, error_type=error_type)


def too_large(message: str) -> RequestError:
    """A request over one of a model's size limits: 413, so a client can tell 'too big' from 'malformed'."""
    return RequestError(message, code=413, error_type="RequestTooLarge")


def server_failure(error: BaseException) -> ServerError:
    """The 500 (or 507 when memory ran out) that answers a request whose computation raised ``error``.

    Out of memory is recognised by the exception's type, never by its message."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return ServerError(
            f"out of memory while computing the answer ({type(error).__name__}); retry later or send a smaller request",
            code=507,
            error_type="InsufficientStorage",
        )
    return ServerError(f"inference failed: {type(error).__name__}")


def surrogate_at(text: str) -> int | None:
    """Where ``text`` holds an unpaired surrogate, or None. JSON's "\\ud800" parses to one; it is not valid Unicode, and
    UTF-8 encoding (a tokenizer, the answer's JSON) fails on it: each field that takes text refuses it by name."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def shown(value: object, width: int = 40) -> str:
    """A client's value for an error message, shortened so the message keeps what it says about it."""
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 3]}..."
