"""The generator's API surfaces, one row each (handlers/core/routes.py ``Route``): the native API, OpenAI's
completions and chat completions, and the worker's description.

Each dialect is a module with its parser and answer writer (:mod:`handlers.generation.native`,
:mod:`handlers.generation.openai_api`); a row's ``parse(body, request, served)`` returns its typed request (a
:class:`GenerationRequest` carrying the dialect's answer writer, the row's ``answer``), and its refusals take the row's
error shape. The TorchServe adapter (handlers/generator.py) looks the path up here once; nothing after that tests the
URL. gRPC is not a surface of its own: TorchServe sends its Predictions and StreamPredictions calls without a
``url_path``, so they take the native row (handlers/generation/native.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handlers.core.http import RequestView, to_json
from handlers.core.routes import Route, route_table
from handlers.generation import native, openai_api
from handlers.generation.requests import Served

# /predictions/<model>/<version>/describe answers what the customized describe answers. With continuousBatching,
# TorchServe 0.12 puts a customized describe (GET /models/<model>?customized=true) back in the queue each time it
# takes it, for ever: the worker then serves nothing else. This route is the safe way to ask.
DESCRIBE_PATH = "describe"


@dataclass(frozen=True)
class DescribeRequest:
    """A request to the describe route: answered at once with the worker's description, never decoded."""


def parse_describe(body: Any, request: RequestView, served: Served) -> DescribeRequest:
    return DescribeRequest()  # whatever the body says: there is nothing to ask


DESCRIBE = Route(DESCRIBE_PATH, parse_describe, to_json, api="the worker's description")

GENERATION_ROUTES = route_table((native.ROUTE, openai_api.COMPLETIONS, openai_api.CHAT, DESCRIBE))
