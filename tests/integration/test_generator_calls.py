"""Several decoding steps in one TorchServe call (handler.decode_call_ms), through a real TorchServe.

The generator's archive is served here with a budget no call reaches (a variant of the built archive with only that
key changed), so which steps share a call does not depend on the machine's speed: a call goes on decoding until a
request ends or gets its first token. Each step's text still goes out as it comes, as pieces of the running call
(the project's patched frontend reads them: scripts/frontend_fixes), so streams get as many pieces as with one step a
call, which must add up to the non-streamed answers, per choice and in order, with well-formed server-sent events and
the usage chunk at the end. The shipped budget (0) is served by the session server, whose tests
(test_generator_api.py) cover the rest.
"""

import concurrent.futures
import json

import pytest
import requests

from loadtests.variants import variant_archive

MODEL = "generator"
ALL_STEPS = {"decode_call_ms": 10_000_000}


@pytest.fixture(scope="module")
def server(start_ts_server, model_store, tmp_path_factory):
    source = model_store / f"{MODEL}.mar"
    if not source.exists():
        pytest.skip(f"{MODEL} is not built for this session (TS_TEST_MODELS)")
    store = tmp_path_factory.mktemp("all-steps-store")
    variant_archive(source, store / source.name, {}, ALL_STEPS)
    return start_ts_server(models=[MODEL], name="all-steps", store=store)


@pytest.fixture(scope="module")
def url(server):
    return f"{server.inference_url}/predictions/{MODEL}"


def sse_events(body):
    """The JSON events of a server-sent-events body, checked to end with OpenAI's [DONE]."""
    events = [event for event in body.split("\n\n") if event]
    assert events[-1] == "data: [DONE]"
    assert all(event.startswith("data: ") and "\n" not in event for event in events)
    return [json.loads(event.removeprefix("data: ")) for event in events[:-1]]


def test_the_description_shows_the_budget(url):
    described = requests.post(f"{url}/1.0/describe", timeout=60).json()
    assert described["scheduling"]["decode_call_ms"] == ALL_STEPS["decode_call_ms"]
    assert described["scheduling"]["step_pieces"] is True  # the session's TorchServe is the patched one


def test_a_lone_stream_gets_its_text_step_by_step_in_calls_of_many_steps(url):
    body = {"prompt": "Once upon a time", "max_new_tokens": 48, "temperature": 0.9, "seed": 7}
    plain = requests.post(url, json=body, timeout=60).json()
    response = requests.post(url, json={**body, "stream": True}, stream=True, timeout=60)
    chunks = [chunk for chunk in response.iter_content(chunk_size=None) if chunk]
    lines = [json.loads(line) for line in b"".join(chunks).decode().splitlines()]
    assert response.status_code == 200 and lines[-1]["done"] is True
    assert lines[-1]["completion_tokens"] == plain["completion_tokens"] == 48
    # The prefill's call sends the first token's text (if it completes any); the next call runs the 47 other steps
    # and sends each step's text as it comes (a byte-level token may complete no character), then closes the stream.
    # Before the frontend read pieces of a running call, those 47 steps' text came in one line.
    assert len(lines) > 2
    assert "".join(line["text"] for line in lines) == plain["text"]


def test_concurrent_openai_streams_get_pieces_step_by_step_that_add_up_to_their_answers(url):
    completions = f"{url}/1.0/v1/completions"
    bodies = [
        {"prompt": f"Story {seed}:", "max_tokens": 48 + 8 * seed, "temperature": 0.9, "seed": seed} for seed in range(8)
    ]

    def streamed(body):
        response = requests.post(
            completions,
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
            stream=True,
            timeout=120,
        )
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        return sse_events(b"".join(response.iter_content(chunk_size=None)).decode())

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        streams = list(pool.map(streamed, bodies))
    pieces = tokens = 0
    for body, events in zip(bodies, streams, strict=True):
        plain = requests.post(completions, json=body, timeout=60).json()
        content = [event for event in events if event["choices"]]
        assert "".join(event["choices"][0]["text"] for event in content) == plain["choices"][0]["text"]
        assert content[-1]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
        usage = events[-1]
        assert usage["choices"] == [] and usage["usage"] == plain["usage"]
        pieces, tokens = pieces + len(content), tokens + usage["usage"]["completion_tokens"]
    # A call ends only when one of the eight requests gets its first token or ends: at most 16 calls, so at most
    # 16 pieces a stream if only calls' answers carried them. Steps' pieces of running calls carry the rest.
    assert pieces > 2 * len(bodies) * len(bodies) and pieces <= tokens
