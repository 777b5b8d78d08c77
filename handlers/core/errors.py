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


class OpenAIShaped(RequestError):
    """A request's error reported in OpenAI's shape (:meth:`RequestError.to_openai_body`): raise it from
    ``parse_request`` for a request of an OpenAI-compatible route (errors after that are shaped by the handler's
    ``error_value``, which knows the request's route from its payload)."""

    def __init__(self, error: RequestError) -> None:
        super().__init__(error.message, code=error.code, error_type=error.error_type)
        self.param = getattr(error, "param", None)

    def to_body(self) -> dict[str, object]:
        return self.to_openai_body()


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
