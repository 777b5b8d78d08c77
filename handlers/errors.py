"""Per-request errors and the JSON body that reports them.

A handler raises :class:`RequestError` while it validates one request; the base handler turns it into that request's
own HTTP status and JSON body, so the rest of the batch is answered normally and the worker keeps running.
"""

from http import HTTPStatus


class RequestError(Exception):
    """A client error that belongs to one request (never to the whole batch)."""

    def __init__(self, message, code=400, error_type="InvalidRequest"):
        super().__init__(message)
        self.message = message
        self.code = int(code)
        self.error_type = error_type

    def to_body(self):
        return {"code": self.code, "type": self.error_type, "message": self.message}

    @property
    def phrase(self):
        try:
            return HTTPStatus(self.code).phrase
        except ValueError:
            return "Error"


class ServerError(RequestError):
    """Something failed on our side while answering a valid request (500, or 507 when out of memory)."""

    def __init__(self, message, code=500, error_type="InternalServerError"):
        super().__init__(message, code=code, error_type=error_type)


def too_large(message):
    """A request over one of a model's size limits: 413, so a client can tell 'too big' from 'malformed'."""
    return RequestError(message, code=413, error_type="RequestTooLarge")


def shown(value, width=40):
    """A client's value for an error message, shortened so the message keeps what it says about it."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width - 3]}..."
