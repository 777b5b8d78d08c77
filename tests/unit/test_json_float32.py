"""The one serializer (handlers/core/http.py to_json): float32 values marked as such print with the shortest decimal
text that reads back as the same float32 (what Rust's serde/ryu and TEI print), strict JSON kept, everything else
exactly json.dumps' compact output."""

import json
import math
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from handlers.core.http import Float32, Float32List, float32_json, float32_list, to_json

EDGE = [0.0, -0.0, 1.0, -1.0, 0.1, 0.3, 1 / 3, 2.0**-149, 2.0**-126, 3.4028234663852886e38, 1e-5, 1e-4, 9.99999e-5]
EDGE += [1e15, 1e16, 1.2345679e15, 16777216.0, 16777217.0, 123456789.0, 0.0063856714]
EDGE += [2.0**k for k in range(-149, 128, 7)]


def sample(count, seed=0):
    """Random float32 bit patterns (every exponent, subnormals included), finite ones only, plus the edge cases."""
    bits = np.random.default_rng(seed).integers(0, 2**32, size=count, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    return np.concatenate([values, np.array(EDGE, dtype=np.float32), -np.array(EDGE, dtype=np.float32)])


OVERFLOW = Fraction(float(np.finfo(np.float32).max)) + Fraction(2) ** 103  # + half the last float32 step


def float32_of(text):
    """The float32 a decimal text denotes, correctly rounded (ties to even) with exact arithmetic."""
    exact = Fraction(Decimal(text))
    if exact == 0:
        return np.float32(text)
    if abs(exact) >= OVERFLOW:  # halfway to the next power of two past the largest float32, or beyond: infinity
        return np.float32(math.copysign(math.inf, exact))
    low = np.float32(float(exact))  # a neighbour of the answer; step to the nearest float32 exactly
    candidates = [np.nextafter(low, np.float32(-np.inf)), low, np.nextafter(low, np.float32(np.inf))]
    candidates = [c for c in candidates if np.isfinite(c)]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))


def digits(text):
    """Significant digits of a decimal text ('0.00120' -> 2)."""
    mantissa = text.lstrip("-").split("e")[0].replace(".", "").lstrip("0").rstrip("0")
    return max(len(mantissa), 1)


def test_each_value_reads_back_as_the_same_float32_through_json_and_exactly():
    values = sample(200_000)
    text = float32_json(values)
    back = np.array(json.loads(text), dtype=np.float64).astype(np.float32)  # what a Python client does
    assert np.array_equal(back.view(np.uint32), values.view(np.uint32))
    for item, value in zip(text[1:-1].split(",")[:3000], values[:3000], strict=False):  # exact decimal -> float32
        assert float32_of(item).view(np.uint32) == value.view(np.uint32), item


def test_no_shorter_decimal_reads_back_as_the_same_float32():
    """Shortest: with one significant digit fewer, neither neighbouring decimal of the value reads back as it."""
    values = sample(4000, seed=1)
    for item, value in zip(float32_json(values)[1:-1].split(","), values, strict=True):
        count = digits(item)
        if count == 1 or value == 0:
            continue
        exact = Decimal(float(value))
        exponent = exact.adjusted() - (count - 2)  # the last kept digit's place with count - 1 digits
        quantum = Decimal(1).scaleb(exponent)
        for rounding in ("ROUND_FLOOR", "ROUND_CEILING"):
            shorter = exact.quantize(quantum, rounding=rounding)
            assert float32_of(str(shorter)).view(np.uint32) != value.view(np.uint32), (item, shorter)


def test_the_digits_are_ryu_s_where_orjson_is_installed():
    orjson = pytest.importorskip("orjson")  # Rust ryu's f32 path, as serde and TEI print; not a serving dependency
    values = sample(200_000, seed=2)
    ours = float32_json(values)[1:-1].split(",")
    ryu = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).decode()[1:-1].split(",")
    assert [Decimal(a) for a in ours] == [Decimal(b) for b in ryu]


def test_exponents_are_written_without_plus_sign_or_leading_zeros():
    values = np.array([5e-05, 1e-45, 1e16, 3.4028235e38, 12345678.0, -1.5e-10], dtype=np.float32)
    assert float32_json(values) == "[5e-5,1e-45,1e16,3.4028235e38,1.2345678e7,-1.5e-10]"


def test_json_grammar_and_strictness():
    texts = float32_json(sample(50_000, seed=3))[1:-1].split(",")
    number = r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?"
    assert all(re.fullmatch(number, text) for text in texts)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            to_json({"embedding": float32_list([0.5, bad])})
        with pytest.raises(ValueError):
            to_json([{"score": Float32(bad)}])
        with pytest.raises(ValueError):
            to_json({"plain": bad})
    with pytest.raises(ValueError):
        to_json({"text": "lone \ud800 surrogate", "row": float32_list([1.0])})


def test_marked_values_anywhere_and_everything_else_as_json_dumps():
    value = {
        "data": [{"index": 0, "embedding": float32_list(torch.tensor([0.1, 0.2], dtype=torch.bfloat16))}],
        "results": [{"label": 'é\n"', "score": Float32(np.float32(0.7)), "scores": (Float32(0.25), 1, None)}],
        1: [[], {}, True],
        "plain": [0.1, 2, "x"],
    }
    assert to_json(value) == (
        '{"data":[{"index":0,"embedding":[0.100097656,0.20019531]}],'
        '"results":[{"label":"é\\n\\"","score":0.7,"scores":[0.25,1,null]}],"1":[[],{},true],"plain":[0.1,2,"x"]}'
    )
    plain = {"a": [1, 2.5, {"b": None, 3: "ü"}], "c": "\u2028", "d": 1e300, "e": [[0.1], []]}
    assert to_json(plain) == json.dumps(plain, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert to_json(float32_list([])) == "[]" and to_json("text") == '"text"'
    with pytest.raises(TypeError):
        to_json({"tensor": torch.zeros(2)})  # unmarked tensors are refused, as json.dumps refuses them


def test_float32_list_is_a_list_of_the_values_and_takes_one_row():
    row = float32_list(torch.tensor([0.1, 0.5]))
    assert isinstance(row, Float32List) and row == [float(np.float32(0.1)), 0.5]
    with pytest.raises(ValueError):
        float32_list(torch.zeros(2, 3))


def test_numpy_legacy_print_options_do_not_change_the_text():
    values = np.array([0.12345679, 123456789.0], dtype=np.float32)
    expected = float32_json(values)
    with np.printoptions(legacy="1.13"):  # numpy's legacy mode would print 6 digits: '0.123457'
        assert float32_json(values) == expected == "[0.12345679,1.2345679e8]"
        assert to_json(Float32(values[0])) == "0.12345679"
