"""The generator handler called directly (no server), decoding whole batches (continuousBatching off): answers,
streaming inside a batch, validation, config checks. Per-step scheduling: test_generator_scheduling.py."""

import json

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.generation import paged_openvino
from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.running import generate
from scripts.ops.handler_loader import ChunkRecorder, load_handler, parse_predict_response, set_requests, statuses

JSON = {"Content-Type": "application/json"}


def load(model_dir, **handler_overrides):
    return load_handler(model_dir, "generator", handler_overrides)


@pytest.fixture(scope="module")
def generator(prepared_model_dir, decode_step):
    return load(prepared_model_dir("generator"), decode_step=decode_step)


def run(handler, context, bodies):
    set_requests(context, [JSON] * len(bodies))
    recorder = ChunkRecorder()
    handler.stream_sink = recorder
    answers = handler.handle([{"body": body} for body in bodies], context)
    # A streamed answer's last chunk is an NDJSON line (kept as text); any other answer is one compact JSON object.
    return [a if a.endswith("\n") else json.loads(a) for a in answers], recorder.messages


def alone(handler, prompt, settings):
    """What handlers.generation.decoding produces for this prompt by itself (the reference for answers in a batch)."""
    loaded = handler.loaded
    sequence = Sequence(loaded.tokenizer.encode(prompt), settings)
    with torch.inference_mode():
        generate(loaded.model, [sequence], loaded.stop_token_ids, loaded.pad_token_id)
    return sequence


def streamed_lines(messages, idx, final):
    lines = [json.loads(message[idx]) for message in messages if idx in message]
    return lines + [json.loads(final)]


def test_answer_has_text_counts_finish_reason_and_labelled_model(generator):
    handler, context = generator
    [answer], messages = run(handler, context, [{"prompt": "Hello world", "max_new_tokens": 12}])
    reference = alone(handler, "Hello world", SamplingSettings(12))
    assert statuses(context, 1) == [200] and messages == []
    assert answer["text"] == handler.loaded.tokenizer.decode(reference.token_ids, skip_special_tokens=True)
    assert answer["prompt_tokens"] == len(reference.prompt_ids)
    assert answer["completion_tokens"] == len(reference.token_ids)
    assert answer["finish_reason"] == reference.finish_reason
    assert answer["model"] == {"name": "tiny-gpt2-random", "weights": "random (demo)"}  # labelled; no paths
    assert "seed" not in answer  # greedy: no seed to report


def test_sampling_without_seed_reports_the_seed_that_reproduces_it(generator):
    handler, context = generator
    [first], _ = run(handler, context, [{"prompt": "Hello", "temperature": 1.0, "max_new_tokens": 16}])
    [again], _ = run(
        handler, context, [{"prompt": "Hello", "temperature": 1.0, "max_new_tokens": 16, "seed": first["seed"]}]
    )
    assert again["text"] == first["text"] and again["seed"] == first["seed"]


def test_streams_go_only_to_streaming_requests_and_add_up_to_the_plain_answer(generator):
    handler, context = generator
    sampled = {"prompt": "Once upon a time", "max_new_tokens": 20, "temperature": 0.9, "top_k": 50, "seed": 4}
    greedy = {"prompt": "The quick brown fox jumps over the lazy dog", "max_new_tokens": 9}
    bodies = [{**sampled, "stream": True}, greedy, {**greedy, "stream": True}, sampled]
    answers, messages = run(handler, context, bodies)
    assert statuses(context, 4) == [200] * 4
    assert all(set(message) <= {0, 2} for message in messages)  # the plain requests get no chunks
    for stream_idx, plain_idx in ((0, 3), (2, 1)):
        lines = streamed_lines(messages, stream_idx, answers[stream_idx])
        assert len(lines) >= 3 and [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
        assert "".join(line["text"] for line in lines) == answers[plain_idx]["text"]
        final, plain = lines[-1], answers[plain_idx]
        for key in ("finish_reason", "prompt_tokens", "completion_tokens"):
            assert final[key] == plain[key]
    assert answers[3]["text"] == handler.loaded.tokenizer.decode(
        alone(handler, sampled["prompt"], SamplingSettings(20, 0.9, 50, 4)).token_ids, skip_special_tokens=True
    )


class FakeSocket:
    def __init__(self):
        self.sent = []

    def sendall(self, data):
        self.sent.append(bytes(data))


def test_intermediate_responses_on_the_wire_carry_stream_next_for_streaming_requests_only(generator):
    from handlers.generation.streaming import send_chunks

    handler, context = generator
    bodies = [{"prompt": "Hello world", "max_new_tokens": 10, "stream": True}, {"prompt": "Hi", "max_new_tokens": 4}]
    set_requests(context, [{**JSON, "Host": "127.0.0.1:8080"}] * 2)  # over HTTP
    context.request_ids = {0: "request-0", 1: "request-1"}
    context.cl_socket = FakeSocket()
    handler.stream_sink = send_chunks  # the real path: ts.handler_utils.utils.send_intermediate_predict_response
    try:
        handler.handle([{"body": body} for body in bodies], context)
        messages = [parse_predict_response(message) for message in context.cl_socket.sent]
    finally:
        del context.cl_socket
        context.request_ids = None
    assert len(messages) >= 2
    for code, predictions in messages:
        assert code == 200 and list(predictions) == ["request-0"]
        chunk = predictions["request-0"]
        assert chunk["headers"]["ts_stream_next"] == "true" and chunk["content_type"] == "application/x-ndjson"
        assert json.loads(chunk["body"])["done"] is False
    # the normal return then closes the stream: TorchServe turns the header to "false" for the last chunk
    assert context.get_response_headers(0)["ts_stream_next"] == "true"
    assert "ts_stream_next" not in context.get_response_headers(1)


def test_an_answer_over_grpc_says_it_is_the_last_message(generator):
    """A gRPC request (no Host header) gets ts_stream_next false on its final answer, streamed or not: TorchServe's
    StreamPredictions otherwise waits for more and kills the worker (docs/clients.md, gRPC)."""
    handler, context = generator
    set_requests(context, [JSON] * 2, over_grpc=True)  # no Host header: TorchServe's gRPC frontend sends none
    handler.handle([{"body": {"prompt": "Hi", "max_new_tokens": 2}}, {"body": {"prompt": 5}}], context)
    assert statuses(context, 2) == [200, 400]
    assert [context.get_response_headers(i)["ts_stream_next"] for i in range(2)] == ["false", "false"]


def test_a_grpc_request_streams_its_pieces_only_when_its_caller_asks(generator):
    """A unary gRPC call must get no piece ahead of its answer (TorchServe 0.12 would fail the worker); the answer is
    then the whole stream in one NDJSON line. A StreamPredictions caller that sends stream_pieces gets the pieces."""
    handler, context = generator
    body = {"prompt": "Hello world", "max_new_tokens": 6, "stream": True}
    recorder = ChunkRecorder()
    handler.stream_sink = recorder
    set_requests(context, [JSON], over_grpc=True)
    [whole] = handler.handle([{"body": body}], context)
    assert recorder.messages == [] and json.loads(whole)["done"] is True
    set_requests(context, [JSON], over_grpc=True)
    [last] = handler.handle([{"body": body, "stream_pieces": b"true"}], context)
    assert recorder.messages and json.loads(last)["done"] is True
    pieces = "".join(json.loads(message[0])["text"] for message in recorder.messages)
    assert pieces + json.loads(last)["text"] == json.loads(whole)["text"]


BAD_BODIES = {
    "invalid json": (b'{"prompt": "x"', "not valid JSON"),
    "not an object": (["Hello"], "JSON object"),
    "null": (None, "JSON object"),
    "missing prompt": ({"max_new_tokens": 3}, "missing field 'prompt'"),
    "empty prompt": ({"prompt": ""}, "'prompt' is empty"),
    "prompt not a string": ({"prompt": 42}, "'prompt' must be a string"),
    "lone surrogate": ({"prompt": "a\ud800b"}, "unpaired surrogate"),
    "unknown field": ({"prompt": "x", "max_tokens": 3}, "unknown field(s) ['max_tokens']"),
    "max_new_tokens zero": ({"prompt": "x", "max_new_tokens": 0}, "'max_new_tokens' is 0"),
    "max_new_tokens negative": ({"prompt": "x", "max_new_tokens": -5}, "'max_new_tokens' is -5"),
    "max_new_tokens too large": ({"prompt": "x", "max_new_tokens": 257}, "between 1 and 256"),
    "max_new_tokens float": ({"prompt": "x", "max_new_tokens": 3.5}, "'max_new_tokens' must be an integer"),
    "max_new_tokens string": ({"prompt": "x", "max_new_tokens": "3"}, "'max_new_tokens' must be an integer"),
    "max_new_tokens bool": ({"prompt": "x", "max_new_tokens": True}, "'max_new_tokens' must be an integer"),
    "temperature negative": ({"prompt": "x", "temperature": -0.1}, "'temperature' is -0.1"),
    "temperature too large": ({"prompt": "x", "temperature": 50}, "between 0 (greedy) and 5.0"),
    "temperature string": ({"prompt": "x", "temperature": "hot"}, "'temperature' must be a number"),
    "temperature nan": ({"prompt": "x", "temperature": float("nan")}, "'temperature' is nan"),
    "temperature huge int": ({"prompt": "x", "temperature": 10**400}, "'temperature' is 1000"),
    "top_k negative": ({"prompt": "x", "top_k": -1}, "'top_k' is -1"),
    "top_k above vocabulary": ({"prompt": "x", "top_k": 513}, "between 0 and 512"),
    "seed negative": ({"prompt": "x", "seed": -1}, "'seed' is -1"),
    "seed too large": ({"prompt": "x", "seed": 2**64}, "'seed' is 18446744073709551616"),
    "seed string": ({"prompt": "x", "seed": "7"}, "'seed' must be an integer"),
    "stream string": ({"prompt": "x", "stream": "yes"}, "'stream' must be true or false"),
    "prompt too many tokens": ({"prompt": "\x01" * 257}, "257 tokens; at most 256"),
    "prompt far too long": ({"prompt": "x" * 1_000_000}, "cannot fit the limit of 256 tokens"),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_bad_request_gets_its_own_400_and_the_rest_of_the_batch_is_answered(generator, name):
    handler, context = generator
    body, message = BAD_BODIES[name]
    good = {"prompt": "Hello", "max_new_tokens": 3}
    answers, _ = run(handler, context, [good, body, good])
    assert statuses(context, 3) == [200, 400, 200]
    assert answers[1]["code"] == 400 and answers[1]["type"] == "InvalidRequest"
    assert message in answers[1]["message"]
    assert answers[0]["text"] == answers[2]["text"] and answers[0]["completion_tokens"] == 3


def test_failure_during_decoding_closes_a_stream_with_an_ndjson_error_line(generator, monkeypatch):
    handler, context = generator
    import handlers.generation.loop as loop_module

    def broken_generate(*args, **kwargs):
        raise RuntimeError("simulated decoding failure")

    monkeypatch.setattr(loop_module, "generate", broken_generate)
    answers, _ = run(handler, context, [{"prompt": "Hi", "stream": True}, {"prompt": "Hi"}])
    assert statuses(context, 2) == [500, 500]
    assert answers[0].endswith("\n") and json.loads(answers[0])["done"] is True
    assert json.loads(answers[0])["code"] == 500 and answers[1]["code"] == 500


def test_describe_reports_model_info_and_limits(generator, decode_step):
    handler, context = generator
    set_requests(context, [{"describe": "True"}])
    [described] = handler.handle([{"body": b""}], context)
    described = json.loads(described)
    assert described["model"]["weights"] == "random (demo)"
    assert described["limits"]["max_new_tokens"] == 256
    assert described["decode_step"]["setting"] == described["decode_step"]["serving"] == decode_step


def test_a_whole_batch_the_paged_pool_cannot_hold_is_decoded_eagerly_with_the_same_answer(generator, decode_step):
    handler, context = generator
    body = {"prompt": "Hello world", "max_new_tokens": 12}
    [expected], _ = run(handler, context, [body])
    paged = handler.loop.paged
    if paged is None:
        assert decode_step == "eager"
        return
    taken = paged_openvino.PagedRow()
    paged.reserve(taken, paged.free_blocks * paged.block_size)  # no block left for the batch
    try:
        passes = paged.passes
        [answer], _ = run(handler, context, [body])
        assert paged.passes == passes  # no paged pass ran
    finally:
        paged.release(taken)
    assert statuses(context, 1) == [200] and answer == expected


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"default_max_new_tokens": 300}, "handler.default_max_new_tokens (300) is above handler.max_new_tokens"),
        ({"max_prompt_tokens": 900}, "exceeds the model's 1024 positions"),
        ({"model_subdir": "missing"}, "handler.model_subdir"),
    ],
)
def test_inconsistent_config_is_refused_at_load(prepared_model_dir, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(prepared_model_dir("generator"), **overrides)


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_is_near_greedy_and_cannot_fail_its_batch(generator, temperature):
    """Regression (issue 11, repro 1): temperature 1e-40 divided logits into inf/NaN and failed the whole batch."""
    handler, context = generator
    good = {"prompt": "Hello", "max_new_tokens": 4}
    tiny = {"prompt": "Hello", "max_new_tokens": 4, "temperature": temperature, "seed": 1}
    answers, _ = run(handler, context, [good, tiny, good, {**good, "temperature": 0.7, "seed": 3}])
    assert statuses(context, 4) == [200, 200, 200, 200]
    # Dividing by a vanishing temperature leaves all the probability on the best token: greedy's choice.
    assert answers[1]["text"] == answers[0]["text"] == answers[2]["text"]
    assert answers[1]["completion_tokens"] == 4


def test_non_finite_logits_stop_only_their_own_request(generator, monkeypatch):
    handler, context = generator
    import handlers.generation.decoding as decoding

    real_choose = decoding.choose_token

    def choose(logits, settings, generator_):
        if settings.seed == 13:  # this request's row: as if the model produced NaN for it
            logits = torch.full_like(logits, float("nan"))
        return real_choose(logits, settings, generator_)

    monkeypatch.setattr(decoding, "choose_token", choose)
    good = {"prompt": "Hello", "max_new_tokens": 3}
    broken = {"prompt": "Hello", "max_new_tokens": 3, "temperature": 1.0, "seed": 13}
    answers, _ = run(handler, context, [good, broken, {**broken, "stream": True}, good])
    assert statuses(context, 4) == [200, 500, 500, 200]
    assert "non-finite logits" in answers[1]["message"]
    assert answers[2].endswith("\n") and json.loads(answers[2])["done"] is True
    assert answers[0] == answers[3] and answers[0]["completion_tokens"] == 3


def test_every_batch_records_rows_generated_tokens_and_each_requests_time_to_first_token(generator):
    from scripts.ops.handler_loader import record_metrics

    handler, context = generator
    metrics = record_metrics(context)
    try:
        answers, _ = run(
            handler,
            context,
            [{"prompt": "Hello", "max_new_tokens": 3}, {"prompt": "Hi", "stream": True, "max_new_tokens": 2}],
        )
    finally:
        context.metrics = None
    assert metrics.values("BatchRows") == [2] and metrics.values("Batches") == [1]
    assert metrics.values("GeneratedTokens") == [answers[0]["completion_tokens"] + 2]
    assert len(metrics.values("TimeToFirstTokenSeconds")) == 2  # one per request, from its arrival
