"""Log probabilities of generated tokens, in process: the values are the model's own (recomputed here with the model,
fp32, over the whole text at every position), in the native, completions and chat shapes, streamed and not, through
whole batches and per-step scheduling; rows that did not ask compute none; bad values are refused naming the field.

The demo model's weights are random: the tests compare numbers computed two ways, never what the text means.
"""

import json

import pytest
import torch

from handlers.generation.logprobs import BYTE_LEVEL, token_text
from handlers.generation.openai_api import CHAT_ROUTE, COMPLETIONS_ROUTE
from scripts.ops.handler_loader import ContinuousFrontend, load_handler, statuses
from tests.unit.test_generation_openai import HI, one, parse_openai, run, stream_events

PROMPT = "Once upon a time"
TOLERANCE = 1e-4  # a cached step and a whole-text forward pass add the same numbers in another order (fp32)


@pytest.fixture(scope="module")
def generator(prepared_model_dir, decode_step):
    return load_handler(prepared_model_dir("generator"), "generator", {"decode_step": decode_step})


@pytest.fixture(scope="module")
def stepper(prepared_model_dir, decode_step):
    overrides = {"decode_step": decode_step}
    return load_handler(prepared_model_dir("generator"), "generator", overrides, continuous_batching=True)


def model_logprobs(handler, prompt_ids, token_ids):
    """The model's log-softmax before each generated token, from one forward pass over the whole text (no cache)."""
    model = handler.loaded.model
    ids = torch.tensor([prompt_ids + token_ids[:-1]])
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(prompt_ids) - 1 :]


def assert_model_values(handler, prompt_ids, entries, top):
    """Native-shape ``entries`` (token_id, logprob, top) equal the model's own values at each position."""
    expected = model_logprobs(handler, prompt_ids, [entry["token_id"] for entry in entries])
    assert len(expected) == len(entries) > 0
    for row, entry in zip(expected, entries, strict=True):
        assert entry["logprob"] == pytest.approx(float(row[entry["token_id"]]), abs=TOLERANCE)
        values, ids = torch.topk(row, top)
        assert [alt["token_id"] for alt in entry["top"]] == ids.tolist()
        assert [alt["logprob"] for alt in entry["top"]] == pytest.approx(values.tolist(), abs=TOLERANCE)


def native(handler, context, body):
    answer, _ = one(handler, context, "", body)
    assert statuses(context, 1) == [200], answer
    return json.loads(answer)


# ------------------------------------------------------------------------------------------------------ values
def test_greedy_logprobs_are_the_models_own_and_the_chosen_token_is_the_likeliest(generator):
    handler, context = generator
    answer = native(handler, context, {"prompt": PROMPT, "max_new_tokens": 12, "logprobs": 3})
    entries = answer["logprobs"]
    assert len(entries) == answer["completion_tokens"] == 12
    prompt_ids = handler.loaded.tokenizer.encode(PROMPT)
    assert_model_values(handler, prompt_ids, entries, 3)
    assert all(entry["top"][0]["token_id"] == entry["token_id"] for entry in entries)  # greedy
    assert "".join(entry["token"] for entry in entries) == answer["text"] or "\ufffd" in answer["text"]


def test_sampled_tokens_report_the_raw_model_logprobs_not_the_tempered_ones(generator):
    handler, context = generator
    body = {"prompt": PROMPT, "max_new_tokens": 10, "temperature": 1.7, "top_k": 5, "seed": 4, "logprobs": 2}
    answer = native(handler, context, body)
    assert_model_values(handler, handler.loaded.tokenizer.encode(PROMPT), answer["logprobs"], 2)
    without = native(handler, context, {key: value for key, value in body.items() if key != "logprobs"})
    assert without["text"] == answer["text"] and "logprobs" not in without  # asking changes no token


def test_rows_that_did_not_ask_compute_no_logprobs(generator, monkeypatch):
    import handlers.generation.decoding as decoding

    handler, context = generator
    calls = []
    real = decoding.token_logprob
    monkeypatch.setattr(decoding, "token_logprob", lambda *args: calls.append(args[1]) or real(*args))
    answers, _ = run(
        handler,
        context,
        [("", {"prompt": "Hi", "max_new_tokens": 5}), ("", {"prompt": PROMPT, "max_new_tokens": 7, "logprobs": 0})],
    )
    assert statuses(context, 2) == [200, 200]
    asked = json.loads(answers[1])
    assert len(calls) == 7 and calls == [entry["token_id"] for entry in asked["logprobs"]]
    assert all(entry["top"] == [] for entry in asked["logprobs"]) and "logprobs" not in json.loads(answers[0])


# ------------------------------------------------------------------------------------------------------ shapes
def test_chat_shape_is_openais_with_the_same_values(generator):
    handler, context = generator
    body = {"messages": HI, "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 4}
    answer = json.loads(one(handler, context, CHAT_ROUTE, body)[0])
    [choice] = answer["choices"]
    content = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None and len(content) == answer["usage"]["completion_tokens"]
    text = token_text(handler.loaded.tokenizer)
    prompt_ids = parse_openai(CHAT_ROUTE, body, handler.served).prompt_ids
    greedy = greedy_ids(handler, prompt_ids, len(content))
    for row, token_id, entry in zip(model_logprobs(handler, prompt_ids, greedy), greedy, content, strict=True):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 4
        assert entry["token"] == text.text(token_id) and entry["bytes"] == text.bytes(token_id)
        assert entry["logprob"] == pytest.approx(float(row[token_id]), abs=TOLERANCE)
        values, ids = torch.topk(row, 4)
        assert [alt["token"] for alt in entry["top_logprobs"]] == [text.text(i) for i in ids.tolist()]
        assert [alt["logprob"] for alt in entry["top_logprobs"]] == pytest.approx(values.tolist(), abs=TOLERANCE)
    joined = bytes(byte for entry in content for byte in entry["bytes"]).decode("utf-8", errors="replace")
    assert joined == choice["message"]["content"]


def greedy_ids(handler, prompt_ids, count):
    """The model's greedy continuation, one whole-text forward pass per token (no cache)."""
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(count):
            logits = handler.loaded.model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt_ids) :]


def test_completion_legacy_shape_with_offsets_and_top_dicts(generator):
    handler, context = generator
    body = {"prompt": PROMPT, "max_tokens": 9, "temperature": 0.8, "seed": 2, "logprobs": 5}
    answer = json.loads(one(handler, context, COMPLETIONS_ROUTE, body)[0])
    logprobs = answer["choices"][0]["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    reference = native(
        handler, context, {"prompt": PROMPT, "max_new_tokens": 9, "temperature": 0.8, "seed": 2, "logprobs": 5}
    )
    assert logprobs["tokens"] == [entry["token"] for entry in reference["logprobs"]]
    assert logprobs["token_logprobs"] == [entry["logprob"] for entry in reference["logprobs"]]
    for top, entry in zip(logprobs["top_logprobs"], reference["logprobs"], strict=True):
        assert 1 <= len(top) <= 5 and max(top.values()) == entry["top"][0]["logprob"]
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0 and all(
        later - earlier == len(token)
        for earlier, later, token in zip(offsets[:-1], offsets[1:], logprobs["tokens"][:-1], strict=True)
    )


def test_streamed_chunks_carry_their_tokens_logprobs_and_add_up_to_the_plain_answer(generator):
    handler, context = generator
    body = {"messages": HI, "max_tokens": 16, "temperature": 0.9, "seed": 7, "logprobs": True, "top_logprobs": 2}
    plain = json.loads(one(handler, context, CHAT_ROUTE, body)[0])["choices"][0]["logprobs"]["content"]
    final, messages = one(handler, context, CHAT_ROUTE, {**body, "stream": True})
    chunks = [event for event in stream_events(messages, final) if event != "[DONE]"]
    assert len(chunks) >= 3
    streamed = [entry for chunk in chunks for entry in chunk["choices"][0]["logprobs"]["content"]]
    assert streamed == plain

    completion = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 1}
    plain = json.loads(one(handler, context, COMPLETIONS_ROUTE, completion)[0])["choices"][0]["logprobs"]
    final, messages = one(handler, context, COMPLETIONS_ROUTE, {**completion, "stream": True})
    chunks = [event["choices"][0]["logprobs"] for event in stream_events(messages, final) if event != "[DONE]"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [value for chunk in chunks for value in chunk[key]] == plain[key], key

    final, messages = one(handler, context, "", {"prompt": PROMPT, "max_new_tokens": 12, "logprobs": 1, "stream": True})
    lines = [json.loads(message[0]) for message in messages] + [json.loads(final)]
    reference = native(handler, context, {"prompt": PROMPT, "max_new_tokens": 12, "logprobs": 1})
    assert [entry for line in lines for entry in line["logprobs"]] == reference["logprobs"]


def test_per_step_scheduling_gives_the_same_logprobs_beside_rows_that_did_not_ask(stepper, generator):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    asked = {"prompt": PROMPT, "max_new_tokens": 10, "temperature": 0.7, "seed": 5, "logprobs": 3}
    plain = frontend.submit({"prompt": "Hello world", "max_new_tokens": 20})
    for _ in range(3):
        frontend.step()
    job = frontend.submit(asked)
    frontend.run()
    answer = json.loads(job.body)
    whole, whole_context = generator
    reference = native(whole, whole_context, asked)
    assert answer["text"] == reference["text"]
    for got, expected in zip(answer["logprobs"], reference["logprobs"], strict=True):
        assert got["token_id"] == expected["token_id"]
        assert got["logprob"] == pytest.approx(expected["logprob"], abs=TOLERANCE)
    assert "logprobs" not in json.loads(plain.body)


def test_byte_level_table_covers_every_byte_once():
    assert sorted(BYTE_LEVEL.values()) == list(range(256)) and BYTE_LEVEL["Ġ"] == ord(" ")


# ------------------------------------------------------------------------------------------------------ refusals
BAD = [
    (CHAT_ROUTE, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
    (CHAT_ROUTE, {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "'top_logprobs' is -1"),
    (CHAT_ROUTE, {"logprobs": True, "top_logprobs": "3"}, "top_logprobs", "must be an integer"),
    (CHAT_ROUTE, {"logprobs": True, "top_logprobs": 2.0}, "top_logprobs", "must be an integer"),
    (CHAT_ROUTE, {"top_logprobs": 3}, "top_logprobs", "needs 'logprobs': true"),
    (CHAT_ROUTE, {"logprobs": 1}, "logprobs", "must be true or false"),
    (CHAT_ROUTE, {"logprobs": "true"}, "logprobs", "must be true or false"),
    (COMPLETIONS_ROUTE, {"logprobs": 6}, "logprobs", "between 0 and 5"),
    (COMPLETIONS_ROUTE, {"logprobs": True}, "logprobs", "must be an integer"),
    (COMPLETIONS_ROUTE, {"logprobs": -1}, "logprobs", "'logprobs' is -1"),
]


@pytest.mark.parametrize("route, change, param, message", BAD)
def test_bad_logprobs_are_refused_naming_the_field(generator, route, change, param, message):
    handler, context = generator
    base = {"messages": HI} if route == CHAT_ROUTE else {"prompt": "Hi"}
    answers, _ = run(handler, context, [(route, {**base, **change}), (route, {**base, "max_tokens": 2})])
    assert statuses(context, 2) == [400, 200]
    error = json.loads(answers[0])["error"]
    assert error["param"] == param and message in error["message"] and error["type"] == "invalid_request_error"


@pytest.mark.parametrize("value, message", [(21, "between 0 and 20"), ("3", "must be an integer"), (None, "integer")])
def test_bad_native_logprobs_are_refused(generator, value, message):
    handler, context = generator
    answer, _ = one(handler, context, "", {"prompt": "Hi", "logprobs": value})
    assert statuses(context, 1) == [400] and message in json.loads(answer)["message"]


def test_null_logprobs_on_the_openai_routes_mean_not_asked(generator):
    handler, context = generator
    answer = json.loads(one(handler, context, CHAT_ROUTE, {"messages": HI, "max_tokens": 2, "logprobs": None})[0])
    assert answer["choices"][0]["logprobs"] is None
