"""handlers/network/signature.py: what a saved torch.export program says about its inputs and outputs, the refusal of
a program that cannot batch, and the signature file's additions and refusals (each naming its key)."""

import json

import pytest
import torch
from torch import nn
from torch.export import Dim, export

from handlers.network import signature
from handlers.network.signature import SignatureError, parse_file
from tests.unit.network_programs import exported, signature_of


def dims(spec):
    return [d.describe() for d in spec.dims]


def test_an_mlp_has_its_argument_name_dtype_and_a_dynamic_batch():
    sig = signature_of("mlp")
    [x] = sig.inputs
    assert (x.name, x.dtype, dims(x), x.value_range) == ("x", torch.float32, ["0..64", "6"], None)
    assert [(o.name, dims(o)) for o in sig.outputs] == [("output0", ["0..64", "3"])]
    assert sig.rows.symbol == x.dims[0].symbol and sig.rows.high == 64


def test_a_ranker_s_ids_take_the_range_of_the_embedding_they_index():
    sig = signature_of("ranker")
    ids, features = sig.inputs
    assert (ids.name, ids.dtype, features.name, features.dtype) == ("item_ids", torch.int64, "features", torch.float32)
    assert (ids.value_range.low, ids.value_range.high) == (0, 39)
    assert "embedding of 40 rows" in ids.value_range.source
    assert features.value_range is None


def test_a_sequence_model_shares_its_dynamic_length_between_inputs_and_outputs():
    sig = signature_of("sequence")
    tokens, mask = sig.inputs
    assert dims(tokens) == dims(mask) == ["0..64", "2..32"]
    assert tokens.dims[1].symbol == mask.dims[1].symbol != tokens.dims[0].symbol
    pooled, per_token = sig.outputs
    assert (pooled.name, per_token.name) == ("output0", "output1")
    assert per_token.dims[1].symbol == tokens.dims[1].symbol and dims(per_token) == ["0..64", "2..32", "2"]


def test_a_dict_returning_program_names_its_outputs_by_its_keys():
    sig = signature_of("two_heads")
    assert [(o.name, dims(o)) for o in sig.outputs] == [("logits", ["0..64", "4"]), ("embedding", ["0..64", "5"])]


def test_a_program_specialised_to_batch_1_is_refused_with_the_fix():
    with pytest.raises(SignatureError) as refused:
        signature_of("mlp_batch1")
    message = str(refused.value)
    assert "batch size 1" in message and 'Dim("batch")' in message and "dynamic_shapes={'x': {0: batch}}" in message


def test_independent_batch_dimensions_are_refused():
    class Two(nn.Module):
        def forward(self, a, b):
            return a.sum(1) + b.sum(1).mean()

    program = export(Two(), (torch.randn(3, 2), torch.randn(4, 2)), dynamic_shapes=({0: Dim("n")}, {0: Dim("m")}))
    with pytest.raises(SignatureError, match="dimension 0 of input 'b' is not the same dynamic dimension"):
        signature.from_exported(program)


def test_an_output_without_one_row_per_input_row_is_refused():
    class Total(nn.Module):
        def forward(self, x):
            return x * 2, x.sum(0)

    program = export(Total(), (torch.randn(3, 2),), dynamic_shapes=({0: Dim("batch")},))
    with pytest.raises(SignatureError, match="output 'output1' .*does not have one row per input row"):
        signature.from_exported(program)


def test_keyword_inputs_are_passed_by_keyword():
    class Keyed(nn.Module):
        def forward(self, x, *, scale):
            return x * scale

    batch = Dim("batch")
    program = export(
        Keyed(),
        (torch.randn(3, 2),),
        {"scale": torch.ones(3, 1)},
        dynamic_shapes={"x": {0: batch}, "scale": {0: batch}},
    )
    sig = signature.from_exported(program)
    assert [s.name for s in sig.inputs] == ["x", "scale"] and sig.keyword_inputs == ("scale",)
    x, scale = torch.randn(2, 2), torch.tensor([[2.0], [3.0]])
    assert torch.equal(sig.call(program.module(), [x, scale])["output0"], x * scale)


def test_the_signature_file_names_a_tuple_s_outputs_and_adds_ranges_labels_nan_and_limits(tmp_path):
    path = tmp_path / "signature.yaml"
    path.write_text(
        "inputs:\n  tokens: {range: [0, 9]}\n  mask: {allow_nan: true}\n"
        "outputs:\n  pooled: {labels: [a, b, c, d]}\n  per_token:\n"
        "max_rows_per_request: 50\nmax_rows_per_pass: 8\nexample: {tokens: [[1, 2]], mask: [[1, 1]]}\n"
    )
    sig = signature_of("sequence", signature.read_file(path))
    tokens, mask = sig.inputs
    assert (tokens.value_range.low, tokens.value_range.high) == (0, 9)
    assert "signature.yaml: inputs.tokens.range" in tokens.value_range.source
    assert mask.allow_nan and not tokens.allow_nan
    assert [o.name for o in sig.outputs] == ["pooled", "per_token"]
    assert sig.outputs[0].labels == ("a", "b", "c", "d")
    assert (sig.limits.max_rows_per_request, sig.limits.max_rows_per_pass) == (50, 8)
    assert sig.example == {"tokens": [[1, 2]], "mask": [[1, 1]]}


def test_a_json_signature_file_reads_the_same(tmp_path):
    path = tmp_path / "signature.json"
    path.write_text(json.dumps({"outputs": {"logits": {"labels": ["w", "x", "y", "z"]}}}))
    assert signature_of("two_heads", signature.read_file(path)).output("logits").labels == ("w", "x", "y", "z")


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ({"input": {}}, "signature: input: unknown key"),
        ({"inputs": {"x": {"range": [5, 1]}}}, "inputs.x.range: expected [smallest, largest]"),
        ({"inputs": {"x": {"range": [0, 1.5]}}}, "inputs.x.range"),
        ({"inputs": {"x": {"allow_nan": "yes"}}}, "inputs.x.allow_nan: expected true or false"),
        ({"inputs": {"x": {"nan": True}}}, "inputs.x: nan: unknown key"),
        ({"outputs": {"y": {"labels": "cat"}}}, "outputs.y.labels: expected a non-empty list of strings"),
        ({"outputs": {"y": {"labels": ["a", "a"]}}}, "outputs.y.labels: labels repeat"),
        ({"max_rows_per_pass": 0}, "max_rows_per_pass: expected a positive integer"),
        ({"max_rows_per_request": True}, "max_rows_per_request: expected a positive integer"),
        ({"example": [1, 2]}, "example: expected a mapping"),
        ([1, 2], "signature: expected a mapping"),
    ],
)
def test_a_bad_signature_file_value_is_refused_naming_its_key(content, key):
    with pytest.raises(SignatureError) as refused:
        parse_file(content)
    assert key in str(refused.value)


@pytest.mark.parametrize(
    ("name", "content", "key"),
    [
        ("ranker", {"inputs": {"item_ids": {"range": [0, 99]}}}, "inputs.item_ids.range: [0, 99] goes beyond [0, 39]"),
        ("ranker", {"inputs": {"features": {"range": [0, 9]}}}, "inputs.features.range: input 'features' is FP32"),
        (
            "ranker",
            {"inputs": {"item_ids": {"allow_nan": True}}},
            "inputs.item_ids.allow_nan: input 'item_ids' is INT64",
        ),
        ("ranker", {"inputs": {"users": {}}}, "inputs.users: the program has no input 'users'"),
        ("two_heads", {"outputs": {"probs": None}}, "outputs.probs: the program has no output 'probs'"),
        ("two_heads", {"outputs": {"logits": {"labels": ["a", "b"]}}}, "outputs.logits.labels: 2 labels; output"),
        ("sequence", {"outputs": {"pooled": None}}, "outputs names 1 outputs (pooled); the program returns 2"),
        ("mlp", {"example": {"y": [1]}}, "example.y: the program has no input 'y'"),
    ],
)
def test_a_signature_file_that_does_not_fit_the_program_is_refused_naming_its_key(name, content, key):
    with pytest.raises(SignatureError) as refused:
        signature_of(name, parse_file(content, "signature.yaml"))
    assert key in str(refused.value)


def test_an_unreadable_signature_file_says_so(tmp_path):
    path = tmp_path / "signature.yaml"
    path.write_text("inputs: [unclosed\n")
    with pytest.raises(SignatureError, match="signature.yaml: not valid YAML or JSON"):
        signature.read_file(path)


def test_load_reads_a_saved_program_and_its_signature_file(tmp_path):
    program_path = tmp_path / "ranker.pt2"
    torch.export.save(exported("ranker")[1], str(program_path))
    (tmp_path / "signature.yaml").write_text("inputs:\n  item_ids: {range: [0, 9]}\n")
    program, sig = signature.load(program_path, tmp_path / "signature.yaml")
    assert sig.input("item_ids").value_range.high == 9
    ids, features = torch.tensor([1, 2]), torch.randn(2, 5)
    assert torch.allclose(sig.call(program, [ids, features])["output0"], exported("ranker")[0](ids, features))


def test_tensor_metadata_lists_dynamic_sizes_as_minus_one():
    assert [s.metadata() for s in signature_of("sequence").inputs] == [
        {"name": "tokens", "datatype": "INT64", "shape": [-1, -1]},
        {"name": "mask", "datatype": "FP32", "shape": [-1, -1]},
    ]
