"""handlers/network/engine.py and inputs.py: requests grouped by shape, concatenated, computed in bounded passes and
sliced back, each answer what the request gets alone (and what the eager module computes); every bad tensor refused
alone, naming its input, while the requests beside it are answered."""

import numpy as np
import pytest
import torch

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.network.datatypes import DATATYPES
from handlers.network.engine import NetworkEngine
from handlers.network.inputs import WireTensor, native_tensor
from handlers.network.signature import SignatureError, parse_file
from tests.unit.network_programs import exported, program_of, signature_of


class Counting:
    """The program, counting its passes and the rows each got."""

    def __init__(self, program):
        self.program = program
        self.rows = []

    def __call__(self, *tensors, **keywords):
        self.rows.append(tensors[0].shape[0])
        return self.program(*tensors, **keywords)


def engine_of(name, settings=None, **options):
    program = Counting(program_of(name))
    return NetworkEngine(program, signature_of(name, settings), options), program


def native(**inputs):
    return {name: native_tensor(name, value) for name, value in inputs.items()}


def sequence_request(rows, length, seed):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 20, (rows, length), generator=generator)
    mask = (torch.rand(rows, length, generator=generator) > 0.3).float()
    return native(tokens=tokens.tolist(), mask=mask.tolist()), (tokens, mask)


def assert_same(answer, expected):
    assert not isinstance(answer, RequestError), answer.message if isinstance(answer, RequestError) else ""
    assert answer.keys() == expected.keys()
    for name in expected:
        assert answer[name].shape == expected[name].shape, name
        torch.testing.assert_close(answer[name], expected[name], rtol=1e-5, atol=1e-6)


def test_requests_of_one_length_share_a_pass_and_each_answer_is_its_own():
    engine, program = engine_of("sequence")
    module, _ = exported("sequence")
    shapes = [(1, 3), (2, 5), (3, 3), (1, 5), (2, 7), (4, 3)]
    requests = [sequence_request(rows, length, seed) for seed, (rows, length) in enumerate(shapes)]
    answers = engine.infer([wires for wires, _ in requests])
    assert sorted(program.rows) == [2, 3, 8]  # one pass per length: 7 (2 rows), 5 (1 + 2), 3 (1 + 3 + 4)
    for (wires, tensors), answer in zip(requests, answers, strict=True):
        [alone] = engine.infer([wires])
        assert_same(answer, alone)
        pooled, per_token = module(*tensors)
        assert_same(answer, {"output0": pooled.detach(), "output1": per_token.detach()})


def test_a_large_group_is_computed_in_passes_of_max_rows_per_pass():
    engine, program = engine_of("mlp", max_rows_per_pass=4)
    rows = [torch.randn(n, 6, generator=torch.Generator().manual_seed(n)) for n in (3, 6, 2)]
    answers = engine.infer([native(x=r.tolist()) for r in rows])
    assert program.rows == [4, 4, 3]  # 11 rows
    module, _ = exported("mlp")
    for r, answer in zip(rows, answers, strict=True):
        assert_same(answer, {"output0": module(r).detach()})


def test_limits_take_the_lowest_of_option_signature_file_and_exported_rows():
    engine, _ = engine_of("mlp", parse_file({"max_rows_per_pass": 8, "max_rows_per_request": 100}))
    assert (engine.max_rows_per_pass, engine.max_rows_per_request) == (8, 100)
    engine, _ = engine_of("mlp", max_rows_per_pass=1000, max_rows_per_request=10)
    assert (engine.max_rows_per_pass, engine.max_rows_per_request) == (64, 10)  # the program was exported for <= 64


def test_a_pass_below_the_exported_minimum_rows_is_padded_and_the_padding_dropped():
    engine, program = engine_of("mlp_min3")
    row = torch.randn(1, 6)
    [answer] = engine.infer([native(x=row[0].tolist())])  # one row, without the rows dimension
    assert program.rows == [3]
    assert_same(answer, {"output0": exported("mlp")[0](row)[0].detach()})


def test_an_answer_to_one_row_leaves_out_the_rows_dimension_as_the_request_did():
    engine, _ = engine_of("ranker")
    [one, many] = engine.infer(
        [native(item_ids=5, features=[0, 1, 2, 3, 4]), native(item_ids=[5], features=[[0, 1, 2, 3, 4]])]
    )
    assert one["output0"].shape == () and many["output0"].shape == (1,)
    assert torch.equal(one["output0"], many["output0"][0])


def ranker_good():
    return native(item_ids=[1, 2], features=[[0.5] * 5, [1.5] * 5])


def binary(name, array, datatype):
    return WireTensor(name=name, shape=array.shape, datatype=DATATYPES[datatype], raw=array.tobytes())


RANKER_BAD = [
    ({"item_ids": [1]}, 400, "input 'features' is missing"),
    ({"item_ids": [1], "features": [[0] * 5], "user": [1]}, 400, "unknown input 'user'"),
    (
        {"item_ids": [[1]], "features": [[0] * 5]},
        400,
        "input 'item_ids' has 2 dimensions (shape [1, 1]); the model takes 1",
    ),
    ({"item_ids": [1], "features": [[0] * 4]}, 400, "input 'features' dimension 1 is 4; the model takes 5"),
    (
        {"item_ids": [1, 2], "features": [[0] * 5]},
        400,
        "input 'features' dimension 0 is 1 but input 'item_ids' dimension 0 is 2",
    ),
    (
        {"item_ids": [1.5], "features": [[0] * 5]},
        400,
        "input 'item_ids' is INT64; the request sent numbers with a fraction",
    ),
    ({"item_ids": [1], "features": [[True] * 5]}, 400, "input 'features' is FP32; the request sent booleans"),
    (
        {"item_ids": [40], "features": [[0] * 5]},
        400,
        "input 'item_ids' holds 40 at [0]; it takes ids in [0, 39] (it indexes an embedding of 40 rows)",
    ),
    (
        {"item_ids": [3, -1], "features": [[0] * 5] * 2},
        400,
        "input 'item_ids' holds -1 at [1]; it takes ids in [0, 39]",
    ),
    ({"item_ids": [2**70], "features": [[0] * 5]}, 400, "input 'item_ids' is INT64, which holds"),
    (
        {"item_ids": [1], "features": [[0, 1, float("nan"), 3, 4]]},
        400,
        "input 'features' holds nan at [0, 2]: NaN, Infinity",
    ),
    ({"item_ids": [1], "features": [[0, 1, 2, float("inf"), 4]]}, 400, "input 'features' holds inf at [0, 3]"),
    (
        {"item_ids": [1], "features": [[0, 1, 2, 3, 1e39]]},
        400,
        "input 'features' holds inf at [0, 4]: NaN, Infinity and values beyond FP32's range",
    ),
    ({"item_ids": [1] * 9, "features": [[0] * 5] * 9}, 413, "the request has 9 rows; at most 8"),
    (
        {"item_ids": [1], "features": [0] * 5},
        400,
        "input 'features' is one row without the rows dimension, but input 'item_ids' is not",
    ),
]


@pytest.mark.parametrize(("inputs", "code", "message"), RANKER_BAD, ids=[m[:40] for _, _, m in RANKER_BAD])
def test_a_bad_request_is_refused_alone_naming_its_input(inputs, code, message):
    engine, _ = engine_of("ranker", max_rows_per_request=8)
    good = ranker_good()
    [before, refused, after] = engine.infer([good, native(**inputs), good])
    assert isinstance(refused, RequestError) and refused.code == code and message in refused.message, refused.message
    [alone] = engine.infer([good])
    assert_same(before, alone)
    assert_same(after, alone)


def test_a_request_of_no_rows_is_refused():
    engine, _ = engine_of("ranker")
    empty = {
        "item_ids": WireTensor("item_ids", (0,), DATATYPES["INT64"], values=[]),
        "features": WireTensor("features", (0, 5), DATATYPES["FP32"], values=[]),
    }
    [refused] = engine.infer([empty])
    assert refused.message == "input 'item_ids' has no rows"


def test_dynamic_sizes_outside_the_exported_range_and_unequal_shared_sizes_are_refused():
    engine, _ = engine_of("sequence")
    refusals = engine.infer(
        [
            native(tokens=[[1]], mask=[[1]]),
            native(tokens=[[1] * 33], mask=[[1] * 33]),
            native(tokens=[[1, 2, 3]], mask=[[1, 1, 1, 1]]),
            native(tokens=[[1, 2, 3]], mask=[[1, 1, 1]]),
        ]
    )
    messages = [r.message if isinstance(r, RequestError) else "answered" for r in refusals]
    assert (
        messages[0] == "input 'tokens' dimension 1 is 1; the model takes 2..32 (the range it was exported for: 2..32)"
    )
    assert "input 'tokens' dimension 1 is 33" in messages[1]
    assert messages[2] == "input 'mask' dimension 1 is 4 but input 'tokens' dimension 1 is 3: the size must be equal"
    assert messages[3] == "answered"


def test_binary_data_converts_only_without_loss():
    engine, _ = engine_of("ranker")
    ids32 = np.array([1, 2], dtype=np.int32)
    features = np.array([[0.5] * 5, [1.5] * 5], dtype=np.float32)
    widened, narrowed, floats_for_ids, halves = engine.infer(
        [
            {"item_ids": binary("item_ids", ids32, "INT32"), "features": binary("features", features, "FP32")},
            {
                "item_ids": binary("item_ids", ids32, "INT32"),
                "features": binary("features", features.astype(np.float64), "FP64"),
            },
            {
                "item_ids": binary("item_ids", ids32.astype(np.float32), "FP32"),
                "features": binary("features", features, "FP32"),
            },
            {
                "item_ids": binary("item_ids", ids32, "INT32"),
                "features": binary("features", features.astype(np.float16), "FP16"),
            },
        ]
    )
    assert_same(widened, engine.infer([ranker_good()])[0])  # INT32 ids for an INT64 input: exact
    assert_same(halves, widened)  # FP16 into FP32: exact (these values are)
    assert narrowed.message == "input 'features' is FP32; FP64 data would not convert without loss: send FP32"
    assert floats_for_ids.message == "input 'item_ids' is INT64; FP32 data would not convert without loss: send INT64"


def test_json_integers_are_fine_for_a_float_input():
    engine, _ = engine_of("ranker")
    [ints, floats] = engine.infer(
        [
            native(item_ids=[1, 2], features=[[1, 2, 3, 4, 5]] * 2),
            native(item_ids=[1, 2], features=[[1.0, 2.0, 3.0, 4.0, 5.0]] * 2),
        ]
    )
    assert_same(ints, floats)


def test_a_signature_file_may_allow_nan_and_narrow_an_id_range():
    settings = parse_file(
        {"inputs": {"features": {"allow_nan": True}, "item_ids": {"range": [0, 9]}}}, "signature.yaml"
    )
    engine, _ = engine_of("ranker", settings)
    nan_row, out_of_range = engine.infer(
        [native(item_ids=[1], features=[[float("nan"), 0, 0, 0, 0]]), native(item_ids=[10], features=[[0] * 5])]
    )
    assert torch.isnan(nan_row["output0"]).all()
    assert (
        out_of_range.message
        == "input 'item_ids' holds 10 at [0]; it takes ids in [0, 9] (signature.yaml: inputs.item_ids.range)"
    )


def test_a_request_that_breaks_the_program_fails_alone():
    signature = signature_of("mlp")
    module, _ = exported("mlp")

    def fragile(x):
        if bool((x == 999).any()):
            raise ValueError("the model cannot take 999")
        return module(x)

    engine = NetworkEngine(fragile, signature)
    rows = [[[0.5] * 6], [[999.0] * 6], [[1.5] * 6]]
    good, broken, other = engine.infer([native(x=r) for r in rows])
    assert isinstance(broken, RequestError) and broken.code == 500 and "ValueError" in broken.message
    assert_same(good, {"output0": module(torch.tensor(rows[0])).detach()})
    assert_same(other, {"output0": module(torch.tensor(rows[2])).detach()})


def test_the_signature_file_example_must_be_a_request_the_program_answers():
    engine, program = engine_of("ranker", parse_file({"example": {"item_ids": [1], "features": [[0, 1, 2, 3, 4]]}}))
    assert program.rows == [1]  # computed at construction
    with pytest.raises(SignatureError, match="signature example: input 'item_ids' holds 77 at \\[0\\]"):
        engine_of("ranker", parse_file({"example": {"item_ids": [77], "features": [[0, 1, 2, 3, 4]]}}))


def test_unknown_engine_options_are_refused():
    with pytest.raises(ConfigError, match="unknown key"):
        engine_of("mlp", max_rows=3)
