"""n > 1 choices per request, in process: choice i is the same request with seed + i decoded alone, the prompt is
prefilled once for all choices (its row copied), usage counts the prompt once, streams say which choice each chunk
is of, a cancelled request frees every choice's row, and bad values of n are refused naming the field.

The demo model's weights are random: texts are compared with the same request decoded another way, never read.
"""

import json

import pytest
import torch

from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.openai_api import CHAT_ROUTE, COMPLETIONS_ROUTE
from handlers.generation.running import RunningBatch, generate
from scripts.ops.handler_loader import ContinuousFrontend, load_handler, record_metrics, statuses
from tests.unit.test_generation_openai import HI, one, run, stream_events

NO_PREFIX_CACHE = {"prefix_cache": {"max_bytes": 0, "block_tokens": 16}}


@pytest.fixture(scope="module")
def generator(prepared_model_dir, decode_step):
    return load_handler(prepared_model_dir("generator"), "generator", {"decode_step": decode_step})


@pytest.fixture(scope="module")
def stepper(prepared_model_dir, decode_step):
    torch.set_num_threads(1)
    overrides = {**NO_PREFIX_CACHE, "decode_step": decode_step}
    return load_handler(prepared_model_dir("generator"), "generator", overrides, continuous_batching=True)


def answer_of(handler, context, route, body):
    answer, _ = one(handler, context, route, body)
    assert statuses(context, 1) == [200], answer
    return json.loads(answer)


def test_choice_i_is_the_request_with_seed_plus_i_and_usage_counts_the_prompt_once(generator):
    handler, context = generator
    body = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 1.1, "seed": 40}
    answer = answer_of(handler, context, COMPLETIONS_ROUTE, {**body, "n": 3})
    alone = [answer_of(handler, context, COMPLETIONS_ROUTE, {**body, "seed": 40 + i}) for i in range(3)]
    assert [choice["index"] for choice in answer["choices"]] == [0, 1, 2]
    assert [choice["text"] for choice in answer["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert len({choice["text"] for choice in answer["choices"]}) > 1  # the choices are different draws
    assert answer["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]
    assert answer["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)

    native = answer_of(handler, context, "", {"prompt": "Once upon a time", "max_new_tokens": 10, "n": 2})
    assert [choice["text"] for choice in native["choices"]] == [native["choices"][0]["text"]] * 2  # greedy
    assert native["completion_tokens"] == sum(choice["completion_tokens"] for choice in native["choices"])
    assert "text" not in native and all(choice["finish_reason"] == "length" for choice in native["choices"])


def test_the_prompt_is_prefilled_once_and_its_row_copied_to_every_choice(generator):
    handler, _ = generator
    loaded = handler.loaded
    prompt = loaded.tokenizer.encode("The quick brown fox jumps over")
    settings = [SamplingSettings(12, temperature=0.9, seed=seed) for seed in (1, 2, 3)]
    batch = RunningBatch(loaded.model, loaded.pad_token_id, loaded.stop_token_ids)
    sequences = [Sequence(prompt, s) for s in settings]
    with torch.inference_mode():
        batch.prefill(sequences)
        assert batch.computed_prompt_tokens == len(prompt) and batch.rows == 3
        while batch.rows:
            batch.step()
            batch.remove_finished()
        for sequence, s in zip(sequences, settings, strict=True):
            [alone] = generate(loaded.model, [Sequence(prompt, s)], loaded.stop_token_ids, loaded.pad_token_id)
            assert sequence.token_ids == alone.token_ids


def test_per_step_choices_stream_with_their_index_and_join_to_the_plain_answer(stepper, generator):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    body = {"messages": HI, "max_tokens": 12, "temperature": 0.8, "seed": 9, "n": 3, "logprobs": True}
    other = frontend.submit({"prompt": "Hello world", "max_new_tokens": 30})
    frontend.step()
    streamed = frontend.submit({**body, "stream": True}, headers={"url_path": CHAT_ROUTE})
    metrics = record_metrics(context)
    try:
        frontend.step()  # its prefill: one row computed for the three choices
    finally:
        context.metrics = None
    prompt_tokens = len(handler.loop.scheduler.running[-1].sequence.prompt_ids)
    assert metrics.values("PrefillTokens") == [prompt_tokens] and handler.loop.scheduler.batch.rows == 4
    frontend.run()
    whole, whole_context = generator
    plain = answer_of(whole, whole_context, CHAT_ROUTE, body)
    chunks = [event for chunk in streamed.chunks for event in stream_events([], chunk) if event != "[DONE]"]
    for index, choice in enumerate(plain["choices"]):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("content", "") for c in mine) == choice["message"]["content"]
        assert [c["finish_reason"] for c in mine][-1] == choice["finish_reason"]
        logprobs = [entry for c in mine if c["logprobs"] for entry in c["logprobs"]["content"]]
        assert [e["token"] for e in logprobs] == [e["token"] for e in choice["logprobs"]["content"]]
    assert json.loads(other.body)["completion_tokens"] == 30
    assert not handler.loop.groups and not handler.loop.scheduler.active


def test_a_cancelled_request_frees_every_choice(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    job = frontend.submit({"prompt": "Once upon a time", "max_new_tokens": 60, "n": 4, "stream": True})
    staying = frontend.submit({"prompt": "Hello", "max_new_tokens": 40, "stream": True})
    for _ in range(4):
        frontend.step()
    assert handler.loop.scheduler.batch.rows == 5 and handler.loop.knows(job.request_id)
    frontend.disconnect(job)
    while job.request_id in frontend.jobs:  # at its next chunk TorchServe sees the closed connection
        frontend.step()
    frontend.step()  # the next call no longer hands it over: its rows are freed
    assert handler.loop.scheduler.batch.rows == 1 and not handler.loop.groups
    assert not handler.loop.knows(job.request_id)
    frontend.run()
    assert staying.done and not handler.loop.scheduler.active


BAD_N = [
    ({"n": 0}, "'n' is 0; it must be between 1 and 8 (handler.max_n)"),
    ({"n": 9}, "'n' is 9"),
    ({"n": 10**9}, "'n' is 1000000000"),
    ({"n": 1e9}, "'n' must be an integer"),
    ({"n": "2"}, "'n' must be an integer"),
    ({"n": True}, "'n' must be an integer"),
    ({"n": 4, "max_tokens": 256}, "tokens of the running batch's room, which holds 1024 (handler.max_batch_tokens)"),
]


@pytest.mark.parametrize("change, message", BAD_N)
def test_bad_n_is_refused_naming_the_field(small_room, change, message):
    handler, context = small_room
    for route, base in ((COMPLETIONS_ROUTE, {"prompt": "Hi"}), (CHAT_ROUTE, {"messages": HI})):
        answers, _ = run(handler, context, [(route, {**base, **change}), (route, {**base, "max_tokens": 2, "n": 2})])
        assert statuses(context, 2) == [400, 200]
        error = json.loads(answers[0])["error"]
        assert error["param"] == "n" and message in error["message"], error
    native = {"prompt": "Hi", "max_new_tokens": change.get("max_tokens", 2), "n": change["n"]}
    answer, _ = one(handler, context, "", native)
    assert statuses(context, 1) == [400] and message in json.loads(answer)["message"]


@pytest.fixture(scope="module")
def small_room(prepared_model_dir):
    """A generator whose running batch holds two requests at their longest (256 + 256 tokens each)."""
    return load_handler(prepared_model_dir("generator"), "generator", {"max_batch_tokens": 1024})
