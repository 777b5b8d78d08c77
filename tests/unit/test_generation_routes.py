"""The generator's route table (handlers/generation/routes.py): each row's parser, answer writer and error shape, and a
new dialect added by one parser and one row, with nothing else changed."""

import json

import pytest

from handlers.core.errors import RequestError
from handlers.core.http import RequestView
from handlers.core.routes import Route, route_table
from handlers.generation.decoding import SamplingSettings
from handlers.generation.native import NATIVE_ANSWERS, NativeAnswers
from handlers.generation.requests import GenerationRequest, prompt_text, prompt_tokens
from handlers.generation.routes import DESCRIBE, GENERATION_ROUTES, DescribeRequest
from scripts.ops.handler_loader import load_handler, set_requests, statuses

JSON = {"Content-Type": "application/json"}
BODIES = {
    "": {"prompt": "Hi"},
    "v1/completions": {"prompt": "Hi"},
    "v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}]},
}
VIEW = RequestView(None, 0)  # no TorchServe context: what a parser reads besides the body is absent


@pytest.fixture(scope="module")
def generator(prepared_model_dir):
    return load_handler(prepared_model_dir("generator"), "generator")


@pytest.fixture(scope="module")
def served(generator):
    handler, _ = generator
    return handler.served


def test_the_table_has_one_row_per_api_surface_in_the_order_the_404_lists_them():
    assert list(GENERATION_ROUTES) == ["", "v1/completions", "v1/chat/completions", "describe"]
    with pytest.raises(ValueError, match="two routes serve 'describe'"):
        route_table((*GENERATION_ROUTES.values(), DESCRIBE))


def test_each_rows_parser_makes_a_request_its_rows_answer_writer_frames(served):
    for path, body in BODIES.items():
        route = GENERATION_ROUTES[path]
        request = route.parse(body, VIEW, served)
        assert isinstance(request, GenerationRequest) and isinstance(request.answers, route.answer), path
    assert isinstance(DESCRIBE.parse({"anything": 1}, VIEW, served), DescribeRequest)


def test_a_refusal_takes_its_rows_error_shape(served):
    for path, body in BODIES.items():
        route = GENERATION_ROUTES[path]
        with pytest.raises(RequestError) as refused:
            route.parse({**body, "stream": "yes"}, VIEW, served)
        shown = route.refusal(refused.value).to_body()
        message = "'stream' must be true or false, got str"
        if path:  # OpenAI's shape names the field as param
            assert shown["error"]["param"] == "stream" and shown["error"]["message"] == message
        else:
            assert shown == {"code": 400, "type": "InvalidRequest", "message": message}


# A dialect of its own: a text/plain body is the prompt, decoded greedily to the model's default length, answered as
# the native API answers. This parser and the row below are all it takes.
def parse_plain(body, request, served):
    prompt = prompt_text(body, "'body'", served.limits)
    prompt_ids = prompt_tokens(served.tokenizer.encode(prompt), "'body'", served.limits)
    settings = SamplingSettings(max_new_tokens=served.limits.default_max_new_tokens)
    return GenerationRequest(prompt_ids, settings, stream=False, seed_reported=False, answers=NATIVE_ANSWERS)


PLAIN = Route("v1/plain", parse_plain, NativeAnswers, api="plain text")


def test_a_new_dialect_is_one_parser_and_one_route_row(generator):
    handler, context = generator
    handler.route_table = route_table((*GENERATION_ROUTES.values(), PLAIN))
    try:
        set_requests(context, [{"Content-Type": "text/plain", "url_path": "v1/plain"}])
        [plain] = handler.handle([{"body": "Once upon a time"}], context)
        set_requests(context, [{"Content-Type": "text/plain", "url_path": "v1/plain"}])
        [empty] = handler.handle([{"body": ""}], context)
        assert statuses(context, 1) == [400] and json.loads(empty)["message"] == "'body' is empty"
        set_requests(context, [{**JSON, "url_path": "v1/other"}])
        [unknown] = handler.handle([{"body": {}}], context)
        assert statuses(context, 1) == [404] and "/predictions/generator/<version>/v1/plain" in unknown
    finally:
        del handler.route_table  # the class's table again
    set_requests(context, [JSON])
    [native] = handler.handle([{"body": {"prompt": "Once upon a time"}}], context)
    assert json.loads(plain) == json.loads(native)  # greedy, default length: the native API's answer
    assert handler.routes == tuple(GENERATION_ROUTES)
