"""The tensor grammar (scripts/reliability/tensor_grammar.py) against the network engine and its OIP codec, in process:
a few hundred seeded requests per tiny program, every dialect, valid and invalid. Nothing escapes as a crash, every
invalid request gets its own status with the input (or header) named, every valid one the answer the engine gives
that request alone; huge claimed shapes are refused without allocating them; and the judge fails wrong answers."""

import json
import os
import random
import tracemalloc
from collections import Counter

import pytest
import torch

from handlers.core.errors import RequestError
from handlers.network import oip
from handlers.network.binary import HEADER
from handlers.network.engine import NetworkEngine
from handlers.network.signature import parse_file
from scripts.reliability.tensor_grammar import ERROR, OK, TensorGrammar, judge, reference
from tests.unit.network_programs import program_of, signature_of

CASES = int(os.environ.get("TS_TENSOR_CASES", "300"))

# (program, signature file, engine options): every tiny program, and the signature file's additions (an id range
# inside the embedding's, NaN allowed in one input, a row limit, class labels).
PROGRAMS = {
    "mlp": ("mlp", None, {"max_rows_per_request": 40}),
    "mlp_min3": ("mlp_min3", None, {"max_rows_per_request": 24, "max_rows_per_pass": 5}),
    "ranker": ("ranker", None, {}),
    "ranker_file": (
        "ranker",
        {"inputs": {"item_ids": {"range": [0, 29]}, "features": {"allow_nan": True}}, "max_rows_per_request": 8},
        {},
    ),
    "sequence": ("sequence", None, {"max_rows_per_request": 16}),
    "two_heads": ("two_heads", {"outputs": {"logits": {"labels": ["ant", "bee", "cat", "dog"]}}}, {}),
}


def engine_of(key):
    name, settings, options = PROGRAMS[key]
    return NetworkEngine(program_of(name), signature_of(name, parse_file(settings) if settings else None), options)


def serve(engine, case):
    """(status, headers, body) as a server answers the case alone: parse, compute, encode; a refusal as the
    protocol's error body. Any other exception escapes: a crash."""
    try:
        request = oip.parse_request(case.body, case.header_value(), engine.signature)
        [answer] = engine.infer([request.inputs])
        if isinstance(answer, RequestError):
            raise answer
        body, headers = oip.encode_answer(request, answer, engine.signature)
        return 200, headers, body
    except RequestError as error:
        status, body = oip.error_answer(error)
        return status, {}, body


@pytest.mark.parametrize("key", list(PROGRAMS))
def test_every_case_gets_what_it_requires(key):
    engine = engine_of(key)
    grammar = TensorGrammar(engine.signature, seed=1, max_rows=engine.max_rows_per_request, model=key)
    crashes, problems, statuses, dialects = [], [], Counter(), Counter()
    for case in grammar.cases(CASES):
        try:
            status, headers, body = serve(engine, case)
        except Exception as error:  # noqa: BLE001 - any escape would be a 500 for the whole batch
            crashes.append(f"case {case.index} ({case.production}): {type(error).__name__}: {error}")
            continue
        problem = judge(case, status, headers, body, reference(engine, case))
        if problem:
            problems.append(f"case {case.index} ({case.production}, expected {case.expect}): {problem}")
        statuses[(case.expect, status)] += 1
        dialects[(case.dialect, case.expect)] += 1
    assert not crashes, "\n".join(crashes[:10])
    assert not problems, "\n".join(problems[:10])
    assert statuses[(OK, 200)] > CASES // 5 and statuses[(ERROR, 400)] > CASES // 5, statuses
    assert statuses[(ERROR, 413)], statuses  # the row limit was reached
    assert all(dialects[(d, OK)] for d in ("oip-json", "oip-binary", "native")), dialects
    assert all(dialects[(d, ERROR)] for d in ("oip-json", "oip-binary", "native")), dialects


def test_nan_where_allowed_is_served_in_binary_and_refused_with_422_in_json():
    engine = engine_of("ranker_file")
    grammar = TensorGrammar(engine.signature, seed=2, max_rows=engine.max_rows_per_request)
    seen = Counter()
    for index in range(60):
        case = grammar.good_nan_allowed(random.Random(index))
        status, headers, body = serve(engine, case)
        assert judge(case, status, headers, body, reference(engine, case)) is None
        seen[status] += 1
    assert seen[200] and seen[422], seen


def test_huge_shapes_are_refused_without_allocating_them():
    """A shape claiming up to 2**62 elements with a few bytes of data: refused from the shape alone. The peak of
    Python allocations while refusing stays far below what even one claimed row of a billion floats would take."""
    engine = engine_of("sequence")
    grammar = TensorGrammar(engine.signature, seed=3, max_rows=engine.max_rows_per_request)
    rng = random.Random(3)
    for _ in range(40):
        case = grammar.huge_shape(rng)
        tracemalloc.start()
        try:
            status, _, body = serve(engine, case)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert status == 400 and case.names[0] in json.loads(body)["error"], body
        assert peak < 4 * 2**20, f"{peak} bytes allocated refusing {case.preview()}"


def test_the_grammar_is_reproducible():
    signature = engine_of("ranker").signature
    first, again = TensorGrammar(signature, seed=5), TensorGrammar(signature, seed=5)
    for index in (0, 9, 44, 187):
        a, b = first.case(index), again.case(index)
        assert (a.body, a.headers, a.expect, a.production) == (b.body, b.headers, b.expect, b.production)
    assert TensorGrammar(signature, seed=6).case(187).body != first.case(187).body


def answered(key, production, seed=0):
    """A case of ``production`` and the in-process answer to it."""
    engine = engine_of(key)
    grammar = TensorGrammar(engine.signature, seed=seed, max_rows=engine.max_rows_per_request)
    case = getattr(grammar, production)(random.Random(seed))
    return engine, case, serve(engine, case)


def with_value_changed(body, headers):
    """The answer with its first output value moved by 1%."""
    length = headers.get(HEADER)
    head = json.loads(body[: int(length)] if length else body)
    rest = body[int(length) :] if length else b""
    entry = head["outputs"][0]
    if "data" in entry:
        entry["data"][0] = entry["data"][0] * 1.01 + 0.01
        text = json.dumps(head).encode()
        return text + rest, ({HEADER: str(len(text))} if length else {})
    value = torch.frombuffer(bytearray(rest[:4]), dtype=torch.float32) * 1.01 + 0.01
    return body[: int(length)] + value.numpy().tobytes() + rest[4:], headers


def test_the_judge_fails_wrong_answers():
    engine, case, (status, headers, body) = answered("mlp", "good_oip_binary", seed=4)
    expected = reference(engine, case)
    assert judge(case, status, headers, body, expected) is None
    changed = with_value_changed(body, headers)
    assert "the reference's" in judge(case, 200, changed[1], changed[0], expected)
    assert judge(case, 200, headers, body + b"\0", expected) is not None  # a byte after the answer
    assert "must be answered 200" in judge(case, 400, {}, b'{"error": "no"}', expected)
    assert "must be answered 200" in judge(case, 500, {}, b'{"error": "inference failed"}', expected)
    flipped = {} if headers.get(HEADER) else {HEADER: "10"}
    assert judge(case, 200, flipped, body, expected) is not None  # the binary header where none belongs, or missing
    _, native, (_, _, native_body) = answered("two_heads", "good_native", seed=1)
    answer = json.loads(native_body)
    name = next(iter(answer["outputs"]))
    answer["outputs"][name] = torch.tensor(answer["outputs"][name]).neg().tolist()
    wrong = json.dumps(answer).encode()
    assert "the reference's" in judge(native, 200, {}, wrong, reference(engine_of("two_heads"), native))


def test_the_judge_fails_wrong_refusals():
    _, case, (status, headers, body) = answered("ranker", "id_out_of_range", seed=2)
    assert case.expect == ERROR and status == 400 and judge(case, status, headers, body, None) is None
    assert "expected 400" in judge(case, 200, {}, b'{"outputs": {}}', None)
    assert "expected 400" in judge(case, 500, {}, b'{"error": "inference failed"}', None)
    assert "does not name 'item_ids'" in judge(case, 400, {}, b'{"error": "bad request"}', None)
    assert "no message" in judge(case, 400, {}, b'{"error": ""}', None)
    assert "not strict JSON" in judge(case, 400, {}, b'{"error": NaN}', None)
