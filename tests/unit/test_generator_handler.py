"""The generator handler called directly (no server): answers, streaming inside a batch, validation, config checks."""

import json
import struct

import pytest
import torch

from handlers.generation.decoding import SamplingSettings, Sequence, generate
from scripts.ops.handler_loader import load_handler, set_requests, statuses

JSON = {"Content-Type": "application/json"}


def load(model_dir, **handler_overrides):
    return load_handler(model_dir, "generator", handler_overrides)


@pytest.fixture(scope="module")
def generator(prepared_model_dir):
    return load(prepared_model_dir("generator"))


class ChunkRecorder:
    """Stands in for the socket to the frontend: keeps every intermediate response as {batch index: text}."""

    def __init__(self):
        self.messages = []

    def __call__(self, context, chunks):
        self.messages.append(dict(chunks))


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


def read_int(buffer, offset):
    return struct.unpack_from("!i", buffer, offset)[0], offset + 4


def read_bytes(buffer, offset):
    length, offset = read_int(buffer, offset)
    return bytes(buffer[offset : offset + length]), offset + length


def parse_predict_response(message):
    """TorchServe's worker-to-frontend predict response (ts/protocol/otf_message_handler.py) -> per request id."""
    code, offset = read_int(message, 0)
    _, offset = read_bytes(message, offset)
    predictions = {}
    while True:
        length, _ = read_int(message, offset)
        if length == -1:
            return code, predictions
        request_id, offset = read_bytes(message, offset)
        content_type, offset = read_bytes(message, offset)
        status, offset = read_int(message, offset)
        _, offset = read_bytes(message, offset)
        header_count, offset = read_int(message, offset)
        headers = {}
        for _ in range(header_count):
            key, offset = read_bytes(message, offset)
            value, offset = read_bytes(message, offset)
            headers[key.decode()] = value.decode()
        body, offset = read_bytes(message, offset)
        predictions[request_id.decode()] = {
            "status": status,
            "content_type": content_type.decode(),
            "headers": headers,
            "body": body.decode(),
        }


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
