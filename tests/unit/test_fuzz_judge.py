"""The fuzzer's verdicts can fail: each fabricated bad answer lands in its failure class, good answers pass, and the
grammar is reproducible from its seed."""

import json

import pytest

from scripts.reliability import fuzz
from scripts.reliability.fuzz_grammar import EITHER, ERROR, OK, Case, Grammar, Limits, Pairs, Raw, dumps


class FakeOracle:
    """Accepts an answer iff it equals `wanted`; records what it was shown."""

    def __init__(self, wanted):
        self.wanted, self.seen = wanted, []

    def check(self, case, answer):
        self.seen.append(answer)
        return None if answer == self.wanted else f"got {answer!r}"


def case(expect, body=b"{}", oversize=False, content_type="application/json"):
    return Case("classifier", 0, 7, "test", body, content_type, expect, oversize=oversize)


def answer(status, body, content_type="application/json"):
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    return fuzz.Answer(status, content_type, payload, 0.01)


ERROR_BODY = {"code": 400, "type": "InvalidRequest", "message": "'inputs' has 3 values; expected 128"}


@pytest.mark.parametrize(
    "the_case, the_answer, verdict",
    [
        (case(OK), answer(200, b'{"label": 1, "probabilities": [NaN]}'), "not_strict_json"),
        (case(OK), answer(200, b'{"x": Infinity}'), "not_strict_json"),
        (case(OK), answer(200, b'{"x": 1'), "not_strict_json"),
        (case(ERROR), answer(200, b"\xff\xfe"), "not_strict_json"),
        (case(ERROR), answer(500, {"code": 500, "message": "inference failed"}), "server_error_on_client_body"),
        (case(EITHER), answer(503, {"code": 503, "message": "Prediction failed"}), "server_error_on_client_body"),
        (case(OK), answer(500, {"code": 500, "message": "inference failed: RuntimeError"}), "good_failed"),
        (case(OK), answer(400, ERROR_BODY), "good_failed"),
        (case(OK), answer(200, {"label": 2}), "wrong_answer"),
        (case(ERROR), answer(200, {"label": 1}), "bad_accepted"),
        (case(ERROR), answer(400, {"code": 400}), "error_without_message"),
        (case(ERROR), answer(400, {"code": 400, "message": "  "}), "error_without_message"),
        (case(ERROR), answer(400, [1, 2]), "error_without_message"),
        (case(ERROR, oversize=True), answer(400, ERROR_BODY), "error_without_message"),
        (case(ERROR, oversize=True), answer(200, {"label": 1}), "bad_accepted"),
        (case(OK), fuzz.Answer(0, "", b"", 60.0, "TimeoutError"), "lost"),
    ],
)
def test_bad_answers_fail(the_case, the_answer, verdict):
    result = fuzz.judge(the_case, the_answer, FakeOracle({"label": 1}))
    assert result is not None and result[0] == verdict, result


@pytest.mark.parametrize(
    "the_case, the_answer",
    [
        (case(OK), answer(200, {"label": 1})),
        (case(EITHER), answer(200, {"label": 1})),
        (case(EITHER), answer(422, {"code": 422, "message": "the input overflows float32 inside the model"})),
        (case(ERROR), answer(415, {"code": 415, "message": "form fields"})),
        (case(ERROR, oversize=True), answer(413, b"<html>not ours to check</html>", "text/html")),
    ],
)
def test_right_answers_pass(the_case, the_answer):
    assert fuzz.judge(the_case, the_answer, FakeOracle({"label": 1})) is None


def test_a_stream_is_strict_ndjson_and_is_judged_as_one_answer():
    oracle = FakeOracle({"text": "ab", "finish_reason": "length"})
    lines = b'{"text": "a", "done": false}\n{"text": "b", "done": true, "finish_reason": "length"}\n'
    assert fuzz.judge(case(OK), answer(200, lines, fuzz.NDJSON), oracle) is None
    assert oracle.seen == [{"text": "ab", "finish_reason": "length"}]
    bad_line = b'{"text": "a", "done": false}\n{"text": "b", "done": true, "score": NaN}\n'
    assert fuzz.judge(case(OK), answer(200, bad_line, fuzz.NDJSON), oracle)[0] == "not_strict_json"
    unfinished = b'{"text": "a", "done": false}\n'
    assert fuzz.judge(case(OK), answer(200, unfinished, fuzz.NDJSON), oracle)[0] == "wrong_answer"


def test_a_stream_of_n_choices_with_logprobs_is_joined_per_choice():
    lp = [{"token": "a", "token_id": 1, "logprob": -1.0, "top": []}]
    lines = [
        {"index": 1, "text": "x", "logprobs": lp, "done": False},
        {"index": 0, "text": "a", "logprobs": lp, "done": False},
        {
            "choices": [
                {"index": 0, "text": "b", "logprobs": lp, "finish_reason": "length", "completion_tokens": 2},
                {"index": 1, "text": "", "logprobs": lp, "finish_reason": "stop", "completion_tokens": 2},
            ],
            "done": True,
            "completion_tokens": 4,
        },
    ]
    joined = fuzz.joined_stream(lines)
    assert [c["text"] for c in joined["choices"]] == ["ab", "x"] and joined["completion_tokens"] == 4
    assert [len(c["logprobs"]) for c in joined["choices"]] == [2, 2] and "done" not in joined
    assert fuzz.joined_stream([{"index": 2, "text": "x", "done": False}, lines[-1]]) is None  # no such choice
    single = fuzz.joined_stream(
        [{"text": "a", "logprobs": lp, "done": False}, {"text": "b", "logprobs": lp, "done": True}]
    )
    assert single == {"text": "ab", "logprobs": lp + lp}


def test_evaluate_counts_every_class_and_keeps_reproducers():
    cases = [case(OK), case(ERROR), case(OK)]
    answers = [answer(200, {"label": 1}), answer(500, {"message": "boom"}), answer(200, b"[NaN]")]
    counts, examples, productions = fuzz.evaluate(cases, answers, FakeOracle({"label": 1}), "http://h/predictions/m")
    assert counts["server_error_on_client_body"] == 1 and counts["not_strict_json"] == 1
    assert sum(counts.values()) == 2 and set(counts) == set(fuzz.CLASSES)
    assert "curl" in examples["not_strict_json"][0]["reproduce"]
    assert productions["test"] == {"ok:200": 2, "error:500": 1}


def test_dumps_writes_what_the_standard_encoder_cannot():
    text = dumps(Pairs([("a", Raw("NaN")), ("a", [Raw("1e400"), -0.0])]), style=(",", ":"))
    assert text == '{"a":NaN,"a":[1e400,-0.0]}'
    with pytest.raises(ValueError):
        fuzz.strict_json(text.encode())


def test_grammar_is_reproducible_and_walks_every_production():
    limits = Limits(max_request_size=4096, handler={"max_rows_per_request": 4})
    first, again = Grammar("classifier", limits, seed=3), Grammar("classifier", limits, seed=3)
    count = len(first.productions) + 50
    cases = first.cases(count)
    assert [(c.body, c.content_type, c.expect) for c in cases] == [
        (c.body, c.content_type, c.expect) for c in again.cases(count)
    ]
    assert again.case(count - 1).body == cases[-1].body  # one case alone: the reproducer's path
    walked = {c.production for c in cases[: len(first.productions)]}
    assert len(walked) == len(first.productions)
    assert any(c.oversize and c.expect == ERROR for c in cases)
    assert Grammar("classifier", limits, seed=4).case(count - 1).body != cases[-1].body


def test_classifier_oracle_expects_overflow_to_be_refused(model_store):
    oracle = fuzz.ClassifierOracle(model_store / "classifier.mar", 6553500)
    normal = case(OK, json.dumps({"inputs": [0.1] * 128}).encode())
    overflow = case(OK, json.dumps({"inputs": [3e38] * 128}).encode())
    beyond = case(OK, json.dumps({"inputs": [1e39] + [0.0] * 127}).encode())
    for index, item in enumerate((normal, overflow, beyond)):
        item.index = index
    oracle.prepare([normal, overflow, beyond])
    assert (normal.expect, overflow.expect, beyond.expect) == (OK, ERROR, ERROR)
    assert oracle.check(normal, {"label": 0, "probabilities": [0.1] * 10}) is not None


@pytest.mark.parametrize(
    "model, handler",
    [
        ("classifier", {"max_rows_per_request": 64}),
        ("minilm", {"max_inputs": 64, "max_text_chars": 20000}),
        ("generator", {"max_new_tokens": 256, "max_prompt_tokens": 256, "max_temperature": 5.0, "max_n": 8}),
    ],
)
def test_every_production_builds_its_bodies(model, handler):
    """A thousand draws per grammar without a production failing to build its body (a campaign would stop)."""
    limits = Limits(max_request_size=70000, handler=handler, vocab_size=512, max_prompt_chars=3584)
    cases = Grammar(model, limits, seed=5).cases(1000)
    assert {c.expect for c in cases} == {OK, ERROR, EITHER}
    assert all(isinstance(c.body, bytes) for c in cases)


def test_a_text_models_answer_is_judged_by_its_structure_and_by_cosine_for_its_numbers():
    from scripts.reliability.fuzz import same_answer

    want = {
        "object": "list",
        "data": [{"index": 0, "sparse": [{"index": 7, "value": 1.5}, {"index": 3, "value": 0.5}], "truncated": False}],
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
    }
    close = json.loads(json.dumps(want).replace("1.5", "1.49"))
    assert same_answer(close, want, "answer", 0.99) is None
    moved = json.loads(json.dumps(want).replace('"index": 7', '"index": 8'))  # another token's weight
    assert "cosine" in same_answer(moved, want, "answer", 0.99)
    usage = json.loads(json.dumps(want).replace('"prompt_tokens": 4', '"prompt_tokens": 5'))
    assert "prompt_tokens" in same_answer(usage, want, "answer", 0.99)
    flipped = json.loads(json.dumps(want).replace("false", "true"))
    assert "truncated" in same_answer(flipped, want, "answer", 0.99)
    assert same_answer({"embeddings": [[0.6, 0.8]]}, {"embeddings": [[0.6, 0.8]]}, "a", 0.99) is None
    assert "cosine" in same_answer({"embeddings": [[0.8, -0.6]]}, {"embeddings": [[0.6, 0.8]]}, "a", 0.99)
    assert "not finite" in same_answer({"embedding": "x"}, {"embedding": [0.6, 0.8]}, "a", 0.99)


def image_archive(path, kind, **recorded):
    """An image archive's identity and records only (no weights): what the image oracle reads."""
    import zipfile

    with zipfile.ZipFile(path, "w") as mar:
        mar.writestr(
            "MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": path.stem, "handler": "image_model.py"}})
        )
        mar.writestr("model-config.yaml", "handler:\n  max_images: 4\n")
        mar.writestr("model_source.json", json.dumps({"kind": kind, **recorded}))
    return path


def image_case(body, content_type="application/json", index=0):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Case("t-img", 0, index, "test", raw, content_type, OK)


def test_the_image_oracle_checks_the_shape_of_every_answer(tmp_path):
    labels = ["cat", "dog", "bird"]
    oracle = fuzz.ORACLES["image-classification"](
        image_archive(tmp_path / "vit.mar", "image-classification", labels=labels, activation="softmax"), 6_553_500
    )
    assert oracle.limits.handler["max_images"] == 4
    raw, listed = image_case(b"\x89PNG", "image/png", 0), image_case({"images": ["a", "b"]}, index=1)
    top1 = image_case({"image": "a", "top_k": 1}, index=2)
    unreadable = image_case({"pictures": ["a"]}, index=3)
    oracle.prepare([raw, listed, top1, unreadable])
    good = [{"label": "dog", "score": 0.5}, {"label": "cat", "score": 0.3}, {"label": "bird", "score": 0.2}]
    assert oracle.check(raw, good) is None
    assert oracle.check(listed, [good, good]) is None
    assert oracle.check(top1, good[:1]) is None
    assert "3 {label, score} expected" in oracle.check(raw, good[:2])
    assert "2 image(s) sent, 1 answered" in oracle.check(listed, [good])
    assert "not best first" in oracle.check(raw, [good[1], good[0], good[2]])
    assert "not in [0, 1]" in oracle.check(raw, [{"label": "dog", "score": 1.5}, *good[1:]])
    assert "sum to" in oracle.check(raw, [{"label": "dog", "score": 0.9}, {"label": "cat", "score": 0.8}, good[2]])
    assert "not distinct labels" in oracle.check(raw, [{"label": "cow", "score": 0.5}, *good[1:]])
    assert "no image could be read" in oracle.check(unreadable, good)

    clip = fuzz.ORACLES["image-text"](
        image_archive(tmp_path / "clip.mar", "image-text", dimension=2, normalized=True), 6_553_500
    )
    clip.prepare([raw, listed])
    assert clip.check(raw, {"embedding": [0.6, 0.8]}) is None
    assert clip.check(listed, {"image_embeddings": [[0.6, 0.8], [1.0, 0.0]]}) is None
    assert "expected {'embedding'}" in clip.check(raw, [0.6, 0.8])
    assert "a vector of 2 numbers" in clip.check(raw, {"embedding": [0.6, 0.8, 0.0]})
    assert "unit length" in clip.check(listed, {"image_embeddings": [[0.6, 0.8], [2.0, 0.0]]})
