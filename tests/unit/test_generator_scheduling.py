"""Per-step scheduling in-process: the generator handler under TorchServe's continuous batching, played by
scripts.ops.handler_loader.ContinuousFrontend (the worker's answers read off TorchServe's wire format), and the
pieces under it (handlers.generation.running, scheduler, prefix_cache, kv_cache) on the demo model.

No expected text is hard-coded (the weights are random): every answer is compared with the same request decoded
alone by the whole-batch path, whatever joined or left the batch around it.
"""

import json

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.prefix_cache import PrefixCache
from handlers.generation.running import RunningBatch, generate
from scripts.ops.handler_loader import ContinuousFrontend, load_handler, record_metrics, set_requests

LONG = {"prompt": "Once upon a time", "max_new_tokens": 120, "temperature": 0.9, "seed": 3}
# One decoding step per handle() call, whatever the machine's speed: the tests below count steps by calls.
ONE_STEP = {"decode_call_ms": 0}
# Every decoding step that may share a call does (a budget no call reaches): the calls are the same on any machine.
ALL_STEPS = {"decode_call_ms": 10_000_000}
SHORT = {"prompt": "Hello world", "max_new_tokens": 4}


@pytest.fixture(scope="module")
def model_dir(prepared_model_dir):
    return prepared_model_dir("generator")


@pytest.fixture(scope="module")
def stepper(model_dir, decode_step):
    """The handler as TorchServe's continuous batching runs it (per step), on each decoding step."""
    torch.set_num_threads(1)
    return load_handler(model_dir, "generator", {**ONE_STEP, "decode_step": decode_step}, continuous_batching=True)


@pytest.fixture(scope="module")
def whole(model_dir):
    """The same model decoding whole batches eagerly: the reference answers (for either decoding step)."""
    return load_handler(model_dir, "generator", {"decode_step": "eager"})


def reference(whole, body):
    """The answer's text for ``body`` decoded alone, not streamed."""
    handler, context = whole
    set_requests(context, [{"Content-Type": "application/json"}])
    [answer] = handler.handle([{"body": {**body, "stream": False}}], context)
    return json.loads(answer)


def received(job):
    """(text, final object) a client of ``job`` reads: the whole answer, or the stream's lines joined."""
    if job.body is not None:
        answer = json.loads(job.body)
        return answer.get("text"), answer
    lines = [json.loads(line) for chunk in job.chunks for line in chunk.splitlines()]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    return "".join(line["text"] for line in lines), lines[-1]


@pytest.fixture(scope="module")
def chunked(model_dir, decode_step):
    """Per step with chunked prefill of 3 tokens a pass (the shipped budget takes these short prompts whole)."""
    overrides = {"prefill_chunk_tokens": 3, **ONE_STEP, "decode_step": decode_step}
    return load_handler(model_dir, "generator", overrides, continuous_batching=True)


@pytest.fixture(scope="module")
def unchunked(model_dir, decode_step):
    """Per step with whole prompts prefilled in a pass of their own (prefill_chunk_tokens 0)."""
    overrides = {"prefill_chunk_tokens": 0, **ONE_STEP, "decode_step": decode_step}
    return load_handler(model_dir, "generator", overrides, continuous_batching=True)


@pytest.mark.parametrize("handler_under_test", ["stepper", "chunked", "unchunked"])
def test_requests_that_join_and_leave_a_running_batch_get_their_answers_alone(
    handler_under_test, request, whole, decode_step
):
    handler, context = request.getfixturevalue(handler_under_test)  # (on decode_step's step)
    frontend = ContinuousFrontend(handler, context)
    first = [
        {**LONG, "stream": True},
        {"prompt": "The quick brown fox", "max_new_tokens": 30, "temperature": 1.2, "top_k": 40, "seed": 9},
        {"prompt": "A", "max_new_tokens": 16},
    ]
    later = [
        SHORT,
        {**SHORT, "stream": True, "max_new_tokens": 9},
        {"prompt": "Tell me a story about a model", "max_new_tokens": 25, "temperature": 0.7, "seed": 1},
    ]
    jobs = [frontend.submit(body) for body in first]
    for _ in range(5):
        frontend.step()
    jobs += [frontend.submit(body) for body in later]
    frontend.run()
    for job, body in zip(jobs, first + later, strict=True):
        text, final = received(job)
        expected = reference(whole, body)
        assert job.status == 200 and text == expected["text"], body
        assert final["completion_tokens"] == expected["completion_tokens"]
        assert final["finish_reason"] == expected["finish_reason"]
        if body.get("stream"):
            assert job.content_type == "application/x-ndjson" and len(job.chunks) >= 3
        else:
            assert job.body is not None and not job.chunks and job.content_type == "application/json"
    assert not handler.loop.scheduler.active and handler.loop.scheduler.batch.rows == 0


def test_a_short_request_leaves_within_a_step_of_its_last_token_while_long_ones_go_on(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    longs = [frontend.submit({**LONG, "seed": seed, "stream": True}) for seed in range(3)]
    for _ in range(10):
        frontend.step()
    short = frontend.submit(SHORT)
    calls = 0
    while not short.done:
        frontend.step()
        calls += 1
    # One call prefills it (its first token), three more steps give tokens 2..4; the answer goes with the last.
    assert calls == SHORT["max_new_tokens"]
    assert not any(job.done for job in longs) and handler.loop.scheduler.batch.rows == 3
    frontend.run()


def test_a_disconnected_stream_is_dropped_and_its_rows_freed(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    metrics = record_metrics(context)
    try:
        leaving = frontend.submit({**LONG, "stream": True})
        staying = frontend.submit({**LONG, "seed": 4, "stream": True})
        for _ in range(6):
            frontend.step()
        frontend.disconnect(leaving)
        steps = 0
        while leaving.request_id in frontend.jobs:  # at its next chunk TorchServe sees the closed connection
            frontend.step()
            steps += 1
        assert steps <= 3  # a step whose token completes no text (part of a character) sends no chunk
        tokens_when_gone = handler.loop.scheduler.active[leaving.request_id].sequence.token_ids.copy()
        frontend.step()  # the worker no longer gets it: cancelled, rows freed
        assert leaving.request_id not in handler.loop.scheduler.active
        assert handler.loop.scheduler.batch.rows == 1 and len(tokens_when_gone) < LONG["max_new_tokens"]
        assert metrics.values("CancelledRequests") == [1]
        frontend.run()
        assert staying.done and received(staying)[1]["completion_tokens"] == LONG["max_new_tokens"]
    finally:
        context.metrics = None


@pytest.fixture(scope="module")
def several(model_dir):
    """Per step with every decoding step that may share a call sharing it (handler.decode_call_ms never reached)."""
    return load_handler(model_dir, "generator", ALL_STEPS, continuous_batching=True)


def test_a_lone_stream_gets_a_piece_per_step_whether_or_not_steps_share_calls(stepper, several, whole):
    body = {**LONG, "stream": True}
    expected = reference(whole, body)
    calls, chunks = {}, {}
    for name, (handler, context) in (("one step a call", stepper), ("steps share calls", several)):
        frontend = ContinuousFrontend(handler, context)
        job = frontend.submit(body)
        calls[name] = frontend.run()
        text, final = received(job)
        assert text == expected["text"] and final["completion_tokens"] == expected["completion_tokens"], name
        chunks[name] = (job.chunks, job.step_pieces)
    # One call per token: the prefill gives the first, each decoding step one more.
    assert calls["one step a call"] == LONG["max_new_tokens"]
    # The first token goes out at once (its own call); every other step runs in the next call, which ends with the
    # stream. Each of its steps' text still goes out as it comes (pieces of a running call, on the patched
    # frontend): the client gets the same chunks as with one step a call.
    assert calls["steps share calls"] == 2
    assert chunks["steps share calls"][0] == chunks["one step a call"][0]
    assert chunks["one step a call"][1] == 0 and chunks["steps share calls"][1] >= len(chunks["one step a call"][0]) - 3


def test_steps_share_a_call_until_a_request_ends_and_its_answer_leaves_with_its_last_token(several, whole):
    handler, context = several
    frontend = ContinuousFrontend(handler, context)
    metrics = record_metrics(context)
    try:
        bodies = [{**LONG, "seed": seed, "stream": True, "max_new_tokens": 20 + 10 * seed} for seed in range(4)]
        streams = [frontend.submit(body) for body in bodies]
        short = frontend.submit(SHORT)
        frontend.step()  # the prefill: every request's first token, at once
        assert all(len(job.chunks) <= 1 for job in streams) and not short.done
        frontend.step()  # steps 2..4: the short one ends, and the call with it
        assert short.done and short.status == 200
        assert sum(metrics.values("DecodeSteps")) == SHORT["max_new_tokens"] - 1
        # Each stream got the text of each of those three steps as it came (the demo's byte-level tokens may add
        # none): two as pieces of the running call, the third with the call's answer.
        assert all(len(job.chunks) <= 4 and job.step_pieces <= 2 for job in streams)
        first_tokens = len(metrics.values("TimeToFirstTokenSeconds"))
        frontend.submit({**SHORT, "prompt": "Joining", "stream": True})
        frontend.step()  # a request handed over while others decode joins at the next call: its first token
        assert len(metrics.values("TimeToFirstTokenSeconds")) == first_tokens + 1
        calls = frontend.run()
    finally:
        context.metrics = None
    # A call ends when one of them ends: at most one call per request after the first two.
    assert calls <= len(bodies) + 1
    for job, body in zip(streams, bodies, strict=True):
        text, final = received(job)
        assert text == reference(whole, body)["text"] and final["completion_tokens"] == body["max_new_tokens"]
        assert job.step_pieces > 0  # sent in the middle of calls
    assert received(short)[0] == reference(whole, SHORT)["text"]


def test_a_call_stops_decoding_once_its_budget_is_spent(model_dir, whole, monkeypatch):
    import handlers.generation.loop as loop

    handler, context = load_handler(model_dir, "generator", {"decode_call_ms": 3500}, continuous_batching=True)
    ticks = iter(range(10**6))  # a clock that moves one second each time the loop reads it (passes take none)
    monkeypatch.setattr(loop, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: float(next(ticks)))}))
    frontend = ContinuousFrontend(handler, context)
    metrics = record_metrics(context)
    try:
        body = {**LONG, "stream": True, "max_new_tokens": 40}
        job = frontend.submit(body)
        frontend.step()  # the prefill
        frontend.step()
        # Read at the start (0) and after each pass: passes end at 1, 2 and 3 s, and one more (as long as the last,
        # ~0 s here) still fits 3.5 s; after the fourth (4 s) the next would not.
        assert sum(metrics.values("DecodeSteps")) == 4
        frontend.run()
    finally:
        context.metrics = None
    assert received(job)[0] == reference(whole, body)["text"]


def test_a_refused_request_is_answered_at_once_with_its_status_beside_running_ones(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    running = frontend.submit({**LONG, "stream": True})
    frontend.step()
    frontend.step()
    bad = frontend.submit({"prompt": "x", "max_new_tokens": 0})
    frontend.step()
    assert bad.done and bad.status == 400 and "'max_new_tokens' is 0" in json.loads(bad.body)["message"]
    assert not running.done
    frontend.run()
    assert running.status == 200


def test_a_request_that_does_not_fit_waits_for_room(model_dir, whole):
    limits_sum = 256 + 256  # the demo's max_prompt_tokens + max_new_tokens: room for one request at its longest
    overrides = {"max_batch_tokens": limits_sum, **ONE_STEP}
    handler, context = load_handler(model_dir, "generator", overrides, continuous_batching=True)
    frontend = ContinuousFrontend(handler, context)
    # The first may need its prompt + 256 tokens: two rows that long would exceed the room, so the second waits.
    bodies = [{**SHORT, "max_new_tokens": 256}, {**SHORT, "prompt": "Second", "max_new_tokens": 3}]
    first, second = (frontend.submit(body) for body in bodies)
    frontend.step()
    assert handler.loop.scheduler.batch.rows == 1 and len(handler.loop.scheduler.waiting) == 1
    frontend.run()
    assert second.steps > first.steps  # it waited for the first to finish
    for job, body in ((first, bodies[0]), (second, bodies[1])):
        assert received(job)[0] == reference(whole, body)["text"]
    with pytest.raises(ConfigError, match="max_batch_tokens"):
        load_handler(model_dir, "generator", {"max_batch_tokens": 100}, continuous_batching=True)


def test_a_failed_step_fails_the_requests_in_it_and_the_worker_goes_on(stepper, monkeypatch):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    stream, plain = frontend.submit({**LONG, "stream": True}), frontend.submit({**LONG, "seed": 8})
    for _ in range(4):
        frontend.step()
    import handlers.generation.paged_openvino as paged_openvino
    import handlers.generation.running as running

    def broken(*args, **kwargs):
        raise RuntimeError("simulated decoding failure")

    with monkeypatch.context() as patched:  # whichever step serves fails once
        patched.setattr(running, "model_step", broken)
        patched.setattr(paged_openvino.PagedModel, "run", broken)
        frontend.step()
    assert stream.done and plain.done
    assert plain.status == 500 and "simulated decoding failure" in json.loads(plain.body)["message"]
    last = json.loads(stream.chunks[-1])
    assert stream.status == 200 and last["done"] is True and last["code"] == 500  # the stream had started
    after = frontend.submit(SHORT)
    frontend.run()
    assert after.status == 200 and not handler.loop.scheduler.active


def test_each_request_records_its_time_to_first_token_and_steps_are_counted(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    metrics = record_metrics(context)
    try:
        frontend.submit(SHORT)
        frontend.submit({**SHORT, "stream": True})
        frontend.run()
    finally:
        context.metrics = None
    assert len(metrics.values("TimeToFirstTokenSeconds")) == 2
    assert sum(metrics.values("GeneratedTokens")) == 2 * SHORT["max_new_tokens"]
    assert sum(metrics.values("DecodeSteps")) == SHORT["max_new_tokens"] - 1  # the prefill gave the first tokens


def test_a_grpc_stream_gets_its_answer_in_one_message_under_continuous_batching(stepper, whole):
    """TorchServe 0.12's continuous batching drops a gRPC call it sent a piece to (GRPCJob.isOpen answers the
    opposite): a StreamPredictions caller gets the whole stream in its last message, which says it is the last."""
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    body = {**SHORT, "stream": True, "max_new_tokens": 8}
    job = frontend.submit(body, over_grpc=True, stream_pieces=b"true")
    frontend.run()
    assert job.chunks == [] and job.body is not None and job.done
    lines = [json.loads(line) for line in job.body.splitlines()]
    assert lines[-1]["done"] is True and "".join(line["text"] for line in lines) == reference(whole, body)["text"]


def test_the_describe_route_answers_the_description(stepper):
    handler, context = stepper
    frontend = ContinuousFrontend(handler, context)
    job = frontend.submit(b"", headers={"url_path": "describe"})
    frontend.run()
    described = json.loads(job.body)
    assert job.status == 200 and described["scheduling"]["per_step"] is True
    assert described["prefix_cache"]["block_tokens"] == 16


# ------------------------------------------------------------------------------ the pieces, without the handler
@pytest.fixture(scope="module")
def lm(stepper):
    handler, _ = stepper
    return handler.loaded.model, handler.loaded.tokenizer


def alone(model, prompt_ids, settings):
    sequence = Sequence(list(prompt_ids), settings)
    with torch.inference_mode():
        generate(model, [sequence], [], pad_token_id=0)
    return sequence.token_ids


def test_prefix_reuse_gives_the_tokens_of_a_full_prefill_and_skips_the_cached_part(lm):
    model, tokenizer = lm
    system = tokenizer.encode("You are a terse assistant. Answer in one line. " * 3)
    prompts = [system + tokenizer.encode(question) for question in (" What is TorchServe?", " Why a cache?")]
    settings = [SamplingSettings(12), SamplingSettings(12, temperature=1.0, seed=2)]
    expected = [alone(model, ids, s) for ids, s in zip(prompts, settings, strict=True)]
    cache = PrefixCache(max_bytes=1 << 24, block_tokens=8, identity="sha256:test")
    batch = RunningBatch(model, 0, [], cache)
    with torch.inference_mode():
        first = Sequence(prompts[0], settings[0])
        batch.prefill([first])
        computed_alone = batch.computed_prompt_tokens
        second = Sequence(prompts[1], settings[1])
        batch.prefill([second])
        while batch.rows:
            batch.step()
            batch.remove_finished()
    assert [first.token_ids, second.token_ids] == expected
    shared_blocks = len(system) // 8
    assert cache.stats.hits == 1 and cache.stats.reused_tokens == shared_blocks * 8
    assert batch.computed_prompt_tokens - computed_alone == len(prompts[1]) - shared_blocks * 8


def test_the_prefix_cache_stays_within_its_bytes_and_evicts_least_recently_used_chains_last_block_first():
    layers, heads, head_dim = 2, 2, 4

    def kv(tokens):
        return [(torch.randn(heads, tokens, head_dim), torch.randn(heads, tokens, head_dim)) for _ in range(layers)]

    block_bytes = layers * 2 * heads * 4 * head_dim * 4  # 4 tokens of fp32 keys and values
    cache = PrefixCache(max_bytes=5 * block_bytes, block_tokens=4, identity="sha256:test")
    a, b = list(range(12)), list(range(100, 112))
    cache.store(a, 0, kv(12))  # 3 blocks
    cache.store(b, 0, kv(12))  # 3 more: one block of a's chain must go, its last
    assert cache.bytes <= cache.max_bytes and len(cache.blocks) == 5
    assert cache.lookup(a + [7]).length == 8  # a's first two blocks are still there
    assert cache.lookup(b + [7]).length == 12
    assert cache.lookup([999] + a).length == 0 and cache.stats.misses == 1
    assert cache.lookup(a[:4]).length == 0  # at least one prompt token is always computed


def test_rows_join_with_padding_and_leave_freeing_their_columns(lm):
    model, tokenizer = lm
    batch = RunningBatch(model, 0, [])
    long_prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again.")
    with torch.inference_mode():
        long = Sequence(long_prompt, SamplingSettings(40))
        batch.prefill([long])
        for _ in range(5):
            batch.step()
        short = Sequence(tokenizer.encode("Hi"), SamplingSettings(3))
        batch.prefill([short])
        assert batch.rows == 2 and batch.width == len(long_prompt) + 5
        assert batch.mask[1].sum() == len(short.prompt_ids)  # padded on its left
        batch.step()
        batch.step()
        assert batch.remove_finished() == [short] and batch.rows == 1
        assert batch.width == len(long_prompt) + 7  # no column only the short row used is kept
        while batch.rows:
            batch.step()
            batch.remove_finished()
    assert long.token_ids == alone(model, long_prompt, SamplingSettings(40))


def test_chunked_prefill_gives_the_tokens_of_a_whole_prefill_while_running_rows_keep_decoding(lm):
    model, tokenizer = lm
    running_prompt = tokenizer.encode("Once upon a time")
    long_prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again, all day long.")
    settings = [SamplingSettings(40, temperature=0.9, seed=5), SamplingSettings(12)]
    expected = [alone(model, running_prompt, settings[0]), alone(model, long_prompt, settings[1])]
    for mixed in (True, False):
        batch = RunningBatch(model, 0, [], chunk_tokens=4)
        assert batch.mixable  # GPT-2 runs sdpa through transformers' attention interface
        batch.mixable = mixed  # False: chunks in passes of their own, alternating with decoding steps
        running, joining = Sequence(running_prompt, settings[0]), Sequence(long_prompt, settings[1])
        with torch.inference_mode():
            batch.prefill([running])
            batch.step()
            batch.begin_filling([joining])
            passes = 0
            while batch.filling is not None:
                before = len(running.token_ids)
                batch.advance()
                passes += 1
                assert len(running.token_ids) == before + (1 if mixed or passes % 2 == 0 else 0)
            assert joining.token_ids and batch.rows == 2
            chunks = -(-len(long_prompt) // 4)
            assert passes == (chunks if mixed else 2 * chunks - 1)  # mixed: the running row decoded in every one
            while batch.rows:
                batch.advance()
                batch.remove_finished()
        assert [running.token_ids, joining.token_ids] == expected, mixed


def test_n_choices_share_one_chunked_prefill_and_equal_single_requests_seeded_s_and_s_plus_1(lm):
    model, tokenizer = lm
    running_prompt = tokenizer.encode("Once upon a time")
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again, all day long.")
    settings = [SamplingSettings(12, temperature=0.9, seed=seed) for seed in (7, 8)]  # choice i: seed + i
    expected = [alone(model, prompt, s) for s in settings]
    assert expected[0] != expected[1]
    chunks = -(-len(prompt) // 4)
    for mixed in (True, False):
        batch = RunningBatch(model, 0, [], chunk_tokens=4)
        batch.mixable = mixed
        choices = [Sequence(prompt, s) for s in settings]
        with torch.inference_mode():
            batch.prefill([Sequence(running_prompt, SamplingSettings(30))])
            before = batch.computed_prompt_tokens
            batch.begin_filling(choices)
            passes = 0
            while batch.filling is not None:
                batch.advance()
                passes += 1
            # One row of 4 columns a pass: the prompt computed once (two rows would get 2 columns a pass), then
            # copied to both choices.
            assert batch.computed_prompt_tokens - before == len(prompt)
            assert passes == (chunks if mixed else 2 * chunks - 1)
            assert batch.rows == 3 and all(len(choice.token_ids) == 1 for choice in choices)
            while batch.rows:
                batch.advance()
                batch.remove_finished()
        assert [choice.token_ids for choice in choices] == expected, mixed


def test_n_choices_of_a_chunked_request_are_the_request_seeded_s_and_s_plus_1(chunked, whole):
    handler, context = chunked
    frontend = ContinuousFrontend(handler, context)
    body = {"prompt": "A model served tokens to many clients at once", "max_new_tokens": 10, "temperature": 1.1}
    running = frontend.submit({**LONG, "max_new_tokens": 30, "stream": True})
    frontend.step()
    job = frontend.submit({**body, "seed": 21, "n": 2})
    frontend.run()
    assert job.status == 200 and running.status == 200
    texts = [choice["text"] for choice in json.loads(job.body)["choices"]]
    assert texts == [reference(whole, {**body, "seed": 21 + i})["text"] for i in range(2)]
    assert received(running)[0] == reference(whole, {**LONG, "max_new_tokens": 30})["text"]


def test_logprobs_in_a_mixed_pass_equal_those_of_the_unchunked_path(lm):
    model, tokenizer = lm
    running_prompt = tokenizer.encode("Once upon a time")
    joining_prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog, again and again.")
    running_settings = SamplingSettings(24, temperature=0.9, seed=5, logprobs=3)
    joining_settings = [SamplingSettings(8, temperature=0.8, seed=seed, logprobs=2) for seed in (1, 2)]
    plain = SamplingSettings(24)  # a row that did not ask, beside them

    def decoded(prompt, settings):
        sequence = Sequence(list(prompt), settings)
        with torch.inference_mode():
            generate(model, [sequence], [], pad_token_id=0)
        return sequence

    expected = [decoded(running_prompt, running_settings)] + [decoded(joining_prompt, s) for s in joining_settings]
    batch = RunningBatch(model, 0, [], chunk_tokens=4)
    assert batch.mixable
    running = [Sequence(running_prompt, running_settings), Sequence(running_prompt, plain)]
    joining = [Sequence(joining_prompt, s) for s in joining_settings]
    with torch.inference_mode():
        batch.prefill(running)
        batch.begin_filling(joining)
        mixed_steps = 0
        while batch.filling is not None:
            batch.advance()
            mixed_steps += 1
        assert len(running[0].token_ids) == 1 + mixed_steps > 2  # the running rows decoded in every chunk's pass
        while batch.rows:
            batch.advance()
            batch.remove_finished()
    assert not running[1].logprobs
    for got, want in zip([running[0], *joining], expected, strict=True):
        assert got.token_ids == want.token_ids
        assert len(got.logprobs) == len(got.token_ids)  # the joining rows' first token (from the chunk) included
        for ours, theirs in zip(got.logprobs, want.logprobs, strict=True):
            assert ours.token_id == theirs.token_id
            assert ours.logprob == pytest.approx(
                theirs.logprob, abs=1e-4
            )  # fp32, shared products summed in another order
            assert [i for i, _ in ours.top] == [i for i, _ in theirs.top]
            assert [v for _, v in ours.top] == pytest.approx([v for _, v in theirs.top], abs=1e-4)


def test_a_request_cancelled_while_its_prompt_is_computed_leaves_the_others_untouched(lm):
    model, tokenizer = lm
    prompts = [tokenizer.encode(text) for text in ("Once upon a time", "A model served tokens", "Hello there")]
    settings = SamplingSettings(10)
    batch = RunningBatch(model, 0, [], chunk_tokens=4)
    running, leaving, staying = (Sequence(prompt, settings) for prompt in prompts)
    with torch.inference_mode():
        batch.prefill([running])
        batch.begin_filling([leaving, staying])
        batch.advance()  # 2 columns of each of the two joining prompts
        batch.remove([leaving])
        assert batch.filling is not None and batch.filling.sequences == [staying]
        while batch.rows or batch.filling is not None:
            batch.advance()
            batch.remove_finished()
    assert not leaving.token_ids
    assert [running.token_ids, staying.token_ids] == [alone(model, prompt, settings) for prompt in prompts[::2]]


def test_a_failed_pass_with_a_prompt_chunk_prefills_the_prompt_alone_and_keeps_the_tokens(
    model_dir, whole, monkeypatch
):
    overrides = {"prefill_chunk_tokens": 2, **ONE_STEP}
    handler, context = load_handler(model_dir, "generator", overrides, continuous_batching=True)
    frontend = ContinuousFrontend(handler, context)
    first = frontend.submit({**LONG, "max_new_tokens": 12, "stream": True})
    frontend.step()
    import handlers.generation.mixed_pass as mixed_pass

    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure of a mixed pass")

    monkeypatch.setattr(mixed_pass, "forward", broken)
    second = frontend.submit({"prompt": "Tell me a story about a model", "max_new_tokens": 6})
    frontend.run()
    for job, body in (
        (first, {**LONG, "max_new_tokens": 12}),
        (second, {"prompt": "Tell me a story about a model", "max_new_tokens": 6}),
    ):
        assert job.status == 200 and received(job)[0] == reference(whole, body)["text"]


def test_the_running_cache_grows_in_place_and_a_failed_step_leaves_it_as_it_was(lm):
    model, tokenizer = lm
    batch = RunningBatch(model, 0, [])
    with torch.inference_mode():
        batch.prefill([Sequence(tokenizer.encode("Once upon a time"), SamplingSettings(40))])
        batch.step()  # the prefill's cache gets spare columns here
        layer = batch.cache.layers[0]
        buffer = layer.key_buffer.data_ptr()
        width = layer.keys.shape[-2]
        for _ in range(5):
            batch.step()
        assert layer.key_buffer.data_ptr() == buffer and layer.keys.data_ptr() == buffer  # no copy per step
        assert layer.keys.shape[-2] == width + 5 == batch.width
        kept = layer.keys.clone()
        import handlers.generation.running as running

        real = running.model_step

        def half_done(model, input_ids, mask, positions, cache):
            real(model, input_ids, mask, positions, cache)  # writes its column, then fails
            raise RuntimeError("simulated failure after the cache was written")

        running.model_step = half_done
        try:
            with pytest.raises(RuntimeError):
                batch.step()
        finally:
            running.model_step = real
        assert torch.equal(layer.keys, kept) and batch.width == width + 5
        batch.step()
        assert layer.keys.data_ptr() == buffer and batch.width == width + 6


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"prefill_chunk_tokens": -1}, "handler.prefill_chunk_tokens: -1 is below the minimum"),
        ({"prefix_cache": {"max_bytes": -1}}, "handler.prefix_cache: max_bytes: -1 is outside"),
        ({"prefix_cache": {"block_tokens": 0}}, "block_tokens: 0 is outside"),
        ({"prefix_cache": {"blocks": 4}}, "unknown field(s) ['blocks']"),
        ({"max_batch_tokens": 0}, "handler.max_batch_tokens: 0 is below the minimum"),
        ({"max_batch_tokens": "lots"}, "expected auto or an integer"),
    ],
)
def test_scheduling_options_are_checked_at_load(model_dir, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_handler(model_dir, "generator", overrides, continuous_batching=True)


def test_on_a_frontend_without_the_fix_a_calls_steps_reach_a_stream_in_one_piece(model_dir, whole, monkeypatch):
    """TorchServe's jar as released takes any message for the call's answer: the worker then sends no pieces in the
    middle of a call, and a call's steps go out together with its answer."""
    import handlers.generator

    monkeypatch.setattr(handlers.generator, "frontend_takes_step_pieces", lambda: False)
    handler, context = load_handler(model_dir, "generator", ALL_STEPS, continuous_batching=True)
    assert handler.describe()["scheduling"]["step_pieces"] is False
    frontend = ContinuousFrontend(handler, context)
    job = frontend.submit({**LONG, "stream": True})
    assert frontend.run() == 2 and job.step_pieces == 0 and len(job.chunks) <= 2
    assert received(job)[0] == reference(whole, {**LONG, "stream": True})["text"]


def test_the_worker_sends_step_pieces_only_where_the_installed_jar_lists_the_fix(tmp_path, monkeypatch):
    import json as json_module
    import zipfile

    import ts

    from handlers.generation import streaming

    monkeypatch.setattr(ts, "__file__", str(tmp_path / "__init__.py"))
    assert streaming.frontend_takes_step_pieces() is False  # no jar at all
    (tmp_path / "frontend").mkdir()
    jar = tmp_path / "frontend" / "model-server.jar"
    for fixes, expected in (([], False), ([f"WorkerThread.class:run {streaming.STEP_PIECES_FIX}"], True)):
        with zipfile.ZipFile(jar, "w") as archive:
            archive.writestr("META-INF/serving-fixes.json", json_module.dumps({"fixes": fixes}))
        assert streaming.frontend_takes_step_pieces() is expected
