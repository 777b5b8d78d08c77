"""Tools on chat in-process: ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` on the demo generator (random
weights), decoded through the generation loop per step (ContinuousFrontend plays TorchServe's continuous batching)
and as whole batches.

Every call's arguments are checked with ``jsonschema`` against its function's parameters: the random weights would
write anything, so a valid call can only come from the grammar's mask.
"""

import json

import jsonschema
import pytest
import torch

from handlers.generation import chat, tools
from handlers.generation.openai_api import CHAT_ROUTE
from handlers.generation.requests import FieldError
from scripts.ops.handler_loader import ContinuousFrontend, load_handler, set_requests, statuses
from tests.unit.test_generation_structured import served  # noqa: F401  (a fixture)

CHAT = {"Content-Type": "application/json", "url_path": CHAT_ROUTE}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "ping"}},  # no parameters: an empty object
]
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": TIME}}
PARAMETERS = {"weather": WEATHER, "clock": TIME, "ping": tools.EMPTY_PARAMETERS}


@pytest.fixture(scope="module")
def model_dir(prepared_model_dir):
    return prepared_model_dir("generator")


@pytest.fixture(scope="module")
def stepper(model_dir, decode_step):
    torch.set_num_threads(1)
    return load_handler(model_dir, "generator", {"decode_step": decode_step}, continuous_batching=True)


@pytest.fixture(scope="module")
def whole(model_dir, decode_step):
    return load_handler(model_dir, "generator", {"decode_step": decode_step})


def body(seed, **extra):
    return {"messages": ASK, "tools": TOOLS, "max_tokens": 120, "temperature": 1.0, "seed": seed, **extra}


def answer(handler, context, *bodies):
    set_requests(context, [CHAT] * len(bodies))
    answers = handler.handle([{"body": item} for item in bodies], context)
    return statuses(context, len(bodies)), [json.loads(item) for item in answers]


def assert_valid_calls(message, allowed=tuple(PARAMETERS)):
    assert message["content"] is None
    assert message["tool_calls"]
    for call in message["tool_calls"]:
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"]["name"] in allowed
        jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMETERS[call["function"]["name"]])


def test_required_and_named_choices_answer_calls_that_validate_through_the_step_loop(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    named = {"type": "function", "function": {"name": "weather"}}
    jobs = []
    for seed in range(12):
        # parallel_tool_calls false: one call, then the grammar is complete (the random weights would otherwise add
        # calls until max_tokens, as the parallel test below allows)
        one = {"parallel_tool_calls": False}
        jobs.append(("required", frontend.submit(body(seed, tool_choice="required", **one), CHAT)))
        jobs.append(("named", frontend.submit(body(seed, tool_choice=named, **one), CHAT)))
        frontend.submit({"prompt": "free text", "max_new_tokens": 8, "seed": seed, "temperature": 1.0})
    frontend.run()
    for kind, job in jobs:
        assert job.status == 200, job.text
        [choice] = json.loads(job.text)["choices"]
        assert choice["finish_reason"] == "tool_calls", choice
        assert len(choice["message"]["tool_calls"]) == 1
        assert_valid_calls(choice["message"], ("weather",) if kind == "named" else tuple(PARAMETERS))


def test_n_choices_each_get_their_own_calls(whole):
    handler, context = whole
    codes, [item] = answer(handler, context, body(2, tool_choice="required", parallel_tool_calls=False, n=2))
    assert codes == [200]
    assert [choice["index"] for choice in item["choices"]] == [0, 1]
    for choice in item["choices"]:
        assert choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) == 1
        assert_valid_calls(choice["message"])


def test_parallel_calls_are_each_valid_and_a_cut_one_stays_text(whole):
    handler, context = whole
    codes, answers = answer(handler, context, *(body(seed, tool_choice="required", max_tokens=80) for seed in range(4)))
    assert codes == [200] * 4
    for item in answers:
        [choice] = item["choices"]
        message = choice["message"]
        calls = message["tool_calls"]
        assert all(json.loads(call["function"]["arguments"]) is not None for call in calls)
        assert_valid_calls({**message, "content": None})
        if choice["finish_reason"] == "length":  # max_tokens ended it during a further call: that one is text
            cut = message["content"] or ""
            assert tools.MARKER.startswith(cut) or cut.startswith(tools.MARKER)
        else:
            assert choice["finish_reason"] == "tool_calls" and message["content"] is None


def test_auto_answers_text_or_valid_calls_and_none_answers_text(whole):
    handler, context = whole
    codes, answers = answer(handler, context, body(1, max_tokens=12), body(1, tool_choice="none", max_tokens=12))
    assert codes == [200, 200]
    for item in answers:
        [choice] = item["choices"]
        message = choice["message"]
        if "tool_calls" in message:
            assert_valid_calls(message)
        else:
            assert isinstance(message["content"], str) and tools.MARKER not in message["content"]


def test_tools_in_the_prompt_and_a_follow_up_turn_with_the_tool_result(whole, served):  # noqa: F811
    """The plain template shows the tools and an earlier call; the follow-up is answered."""
    handler, context = whole
    call = {"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": '{"zone": "utc"}'}}
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]
    checked = chat.checked_messages(messages, served.limits)
    ids = chat.chat_prompt_ids(checked, served.tokenizer, served.limits, [CLOCK])
    prompt = served.tokenizer.decode(ids)
    assert prompt.startswith('tools (<tool_call>{"name": ..., "arguments": ...}</tool_call>): {"name":')
    assert json.dumps(CLOCK["function"], separators=(",", ":")) in prompt
    assert '<tool_call>{"name": "clock", "arguments": {"zone": "utc"}}</tool_call>' in prompt
    assert "tool (call_1): 12:00\nassistant:" in prompt
    without_tools = chat.chat_prompt_ids(chat.checked_messages(ASK, served.limits), served.tokenizer, served.limits)
    assert served.tokenizer.decode(without_tools) == "user: Weather in Paris?\nassistant:"
    codes, [item] = answer(handler, context, {"messages": messages, "tools": [CLOCK], "max_tokens": 8})
    assert codes == [200]
    assert item["choices"][0]["message"]["role"] == "assistant"


def test_streamed_calls_add_up_to_the_whole_answer(stepper, whole):
    handler, context = stepper
    request = body(3, tool_choice="required", stream=True)
    frontend = ContinuousFrontend(handler, context)
    job = frontend.submit(request, CHAT)
    frontend.run()
    events = [json.loads(line[6:]) for line in job.text.splitlines() if line.startswith("data: {")]
    calls, reasons = {}, []
    for event in events:
        [choice] = event["choices"]
        reasons.append(choice["finish_reason"])
        for delta in choice["delta"].get("tool_calls", []):
            calls[delta["index"]] = delta
        assert not choice["delta"].get("content")
    assert reasons[-1] == "tool_calls"
    _, [whole_answer] = answer(*whole, {**request, "stream": False})
    streamed = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls.values()]
    expected = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in whole_answer["choices"][0]["message"]["tool_calls"]
    ]
    assert streamed == expected


def test_a_call_cut_by_max_tokens_is_text_with_length():
    reader = tools.ToolCallReader()
    assert reader.feed("<tool") == ("", [])
    assert reader.feed('_call>{"name": "ping", "arguments": {}}</tool_call>\n<tool_call>{"na')[1][0]["function"] == {
        "name": "ping",
        "arguments": "{}",
    }
    assert reader.finish() == '<tool_call>{"na'
    text_reader = tools.ToolCallReader()
    assert text_reader.feed("<b>hi") == ("<b>hi", [])


BAD = [
    ({"tools": "x"}, "tools", "must be a list"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "letters, digits"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools", "1 to 64"),
    ({"tools": [TOOLS[1], TOOLS[1]]}, "tools", "more than once"),
    ({"tools": [TOOLS[1]] * 129}, "tools", "at most 128"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"properties": {"a": {"type": "string"}}, "description": "d" * 70_000},
                    },
                }
            ]
        },
        "tools",
        "characters",
    ),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}, "tools", "JSON schema object"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", '"type": "function"'),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "must be one of"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        "not in 'tools'",
    ),
    ({"tool_choice": "required"}, "tool_choice", "no 'tools'"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "two output formats"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}},
                    },
                }
            ]
        },
        "tools",
        "cannot be compiled",
    ),
    (
        {"messages": [{"role": "user", "content": "x", "tool_calls": []}, {"role": "tool", "content": "r"}]},
        "messages",
        "tool_call_id",
    ),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{"}}],
                }
            ]
        },
        "messages",
        "arguments must be a JSON string",
    ),
]


@pytest.mark.parametrize(("extra", "param", "words"), BAD, ids=[f"{case[1]}-{index}" for index, case in enumerate(BAD)])
def test_hostile_tools_are_400s_naming_the_field(whole, extra, param, words):
    handler, context = whole
    codes, [item] = answer(handler, context, {"messages": ASK, "max_tokens": 4, **extra})
    assert codes == [400], item
    assert item["error"]["param"] == param, item
    assert words in item["error"]["message"], item


def test_a_template_without_tools_is_refused_naming_it(served):  # noqa: F811
    tokenizer = served.tokenizer
    saved = tokenizer.chat_template
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    try:
        with pytest.raises(FieldError) as refused:
            chat.chat_prompt_ids(chat.checked_messages(ASK, served.limits), tokenizer, served.limits, TOOLS)
    finally:
        tokenizer.chat_template = saved
    assert refused.value.field == "tools" and "no tools support" in str(refused.value)
    assert chat.template_takes_tools("{% if tools %}{{ tools | tojson }}{% endif %}")


def test_the_fuzzers_chat_oracle_flags_arguments_off_the_parameters():
    """scripts/reliability's tools productions are judged by this check: it must see a call that breaks its schema."""
    from scripts.reliability.fuzz import GeneratorShapes
    from scripts.reliability.fuzz_grammar import CLOCK_TOOL

    body = {"messages": ASK, "tools": [CLOCK_TOOL], "tool_choice": "required"}

    def answer_with(arguments, finish_reason="tool_calls"):
        call = {"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": arguments}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}

    shapes = GeneratorShapes()
    assert shapes.chat_problem(body, answer_with('{"zone": "utc", "hour": 3}')) is None
    assert "do not follow its parameters" in shapes.chat_problem(body, answer_with('{"zone": "utc", "hour": 30}'))
    assert "do not follow its parameters" in shapes.chat_problem(body, answer_with('{"zone": '))
    assert "finish_reason 'stop'" in shapes.chat_problem(body, answer_with('{"zone": "cet", "hour": 1}', "stop"))


def test_a_request_with_tools_skips_the_similarity_cache(served):  # noqa: F811
    """The cache compares messages only: a stored answer to the same question without tools is not this one's."""
    from tests.unit.test_generation_openai import parse_openai

    for choice in ("none", "required"):
        request = parse_openai(CHAT_ROUTE, {"messages": ASK, "tools": TOOLS, "tool_choice": choice}, served)
        assert request.lookup.text is None and request.lookup.skip == "tools"
    assert parse_openai(CHAT_ROUTE, {"messages": ASK}, served).lookup.text == ASK[0]["content"]
