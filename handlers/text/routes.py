"""The route table of a text model, one row per API surface: where a request comes in, how its body is read, how it
is answered and in which shape its refusals go out.

TorchServe 0.12 hands ``/predictions/<model>/<version>/<path>`` to the model with ``<path>`` in the request header
``url_path`` (handlers/core/http.py RequestView.url_path). The rows are defined by the API dialects' modules
(handlers/text/dialects/) and listed by the kind (:meth:`handlers.text.kinds.base.TextKind.routes`); the handler looks
the path up in that table once per request and from then on carries the row with the request (:class:`Routed`), so
parsing, answering and refusing never test the URL or the dialect again. A route's rows go through the one
text-model path like every other request's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from handlers.core.routes import Route, route_table

if TYPE_CHECKING:
    from handlers.core.http import RequestView
    from handlers.text.cache import CachedRow
    from handlers.text.requests.common import RequestContext
    from handlers.text.rows import Row, RowOptions

Parse = Callable[["RequestContext", Any, "RequestView"], Any]
Answer = Callable[["RequestContext", Any, "list[CachedRow]"], Any]

__all__ = ["Answer", "Parse", "Route", "Routed", "route_table"]  # Route and route_table: handlers/core/routes.py


@dataclass(frozen=True)
class Routed:
    """A parsed request and the route it came by: what batch assembly reads (its rows) and what answers it."""

    route: Route
    request: Any

    @property
    def texts(self) -> Sequence[Row]:
        return self.request.texts

    @property
    def names(self) -> Sequence[str]:
        return self.request.names

    @property
    def truncate(self) -> bool:
        return self.request.truncate

    @property
    def options(self) -> Sequence[RowOptions] | None:
        return self.request.options

    def answer_bytes(self, row_tokens: Sequence[int]) -> int | None:
        """The most bytes the answer can have, from each row's token count (after truncation), where the request
        can say (one vector per token); None where its size does not grow with tokens."""
        estimate = getattr(self.request, "answer_bytes", None)
        return estimate(row_tokens) if estimate is not None else None

    @property
    def fit_hint(self) -> str | None:
        """How a request whose answer is too large to send can be made to fit, in the route's own terms (None: fewer
        inputs is the only way)."""
        return getattr(self.request, "fit_hint", None)
