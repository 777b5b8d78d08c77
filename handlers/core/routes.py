"""The API surfaces of a model, one row each, and the table a handler looks a request's path up in once.

TorchServe 0.12 hands ``/predictions/<model>/<version>/<path>`` to the model with ``<path>`` in the request header
``url_path`` (handlers/core/http.py RequestView.url_path). A handler looks the path up in its table once per request
and from then on carries the row (or what its parser made) with the request, so parsing, answering and refusing never
test the URL again. Each model family fills the rows with its own parsers and answer writers (text models:
handlers/text/routes.py; the generator: handlers/generation/routes.py); the row and the table are the same for all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from handlers.core.errors import NATIVE, RequestError, shaped


@dataclass(frozen=True)
class Route:
    """One API surface: its path after ``/predictions/<model>/<version>/`` ('' = the model's own URL,
    ``/predictions/<model>``), the function that validates a body into its request (raising RequestError), the one
    that answers it, and the error shape of its refusals (handlers/core/errors.py ``error_body``). What ``parse`` and
    ``answer`` take is the model family's own (handlers/text/routes.py, handlers/generation/routes.py)."""

    path: str
    parse: Callable[..., Any]
    answer: Callable[..., Any]
    error_shape: str = NATIVE
    api: str = ""  # what clients speak it (for the 404 that lists routes, describe and the docs)

    def refusal(self, error: RequestError) -> RequestError:
        """A refusal raised while parsing, in this route's error shape (a native one as it was raised)."""
        return error if self.error_shape == NATIVE else shaped(error, self.error_shape)


def route_table(routes: Sequence[Route]) -> dict[str, Route]:
    table: dict[str, Route] = {}
    for route in routes:
        if route.path in table:
            raise ValueError(f"two routes serve '{route.path}'")
        table[route.path] = route
    return table
