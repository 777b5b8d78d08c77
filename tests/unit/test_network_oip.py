"""handlers/network/oip.py and binary.py: Open Inference Protocol v2 bodies as the real Triton client (tritonclient)
builds them, JSON and binary, parsed and answered; the answers decoded by that client's own InferResult; the native
JSON form as curl sends it; and every lying or malformed body refused on its own with a 400 naming the input."""

import json
import re

import numpy as np
import pytest
import torch
import tritonclient.http as triton
from tritonclient.utils import np_to_triton_dtype

from handlers.core.errors import RequestError
from handlers.network import oip
from handlers.network.binary import HEADER
from handlers.network.datatypes import DATATYPES, from_bytes
from handlers.network.engine import NetworkEngine
from handlers.network.signature import Signature, TensorSpec, parse_file
from tests.unit.network_programs import exported, program_of, signature_of

rng = np.random.default_rng(0)


def engine_of(name, settings=None):
    return NetworkEngine(program_of(name), signature_of(name, settings))


def triton_body(inputs, outputs=None, **options):
    """A request body exactly as tritonclient's HTTP client sends it, and its Inference-Header-Content-Length."""
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **options)
    return body, json_size


def triton_input(name, array, binary=True, datatype=None):
    tensor = triton.InferInput(name, list(array.shape), datatype or np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def serve(engine, body, header=None, **names):
    """Parse, compute and answer one request as a server would; a refusal as (status, error message)."""
    try:
        request = oip.parse_request(body, header, engine.signature)
        [answer] = engine.infer([request.inputs])
        if isinstance(answer, RequestError):
            raise answer
        return oip.encode_answer(request, answer, engine.signature, **names)
    except RequestError as error:
        status, error_body = oip.error_answer(error)
        return status, json.loads(error_body)["error"]


def decoded(answer):
    body, headers = answer
    length = headers.get(HEADER)
    return triton.InferResult.from_response_body(body, header_length=int(length) if length else None)


def test_a_binary_request_from_tritonclient_is_answered_in_binary_that_tritonclient_decodes():
    module, _ = exported("mlp")
    x = rng.standard_normal((5, 6), dtype=np.float32)
    body, json_size = triton_body([triton_input("x", x)], request_id="7")
    result = decoded(serve(engine_of("mlp"), body, str(json_size), model_name="mlp", model_version="3"))
    expected = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(result.as_numpy("output0"), expected, rtol=1e-5, atol=1e-6)
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("mlp", "3", "7")
    assert response["outputs"][0]["parameters"]["binary_data_size"] == expected.nbytes


def test_a_json_request_from_tritonclient_is_answered_in_json():
    module, _ = exported("two_heads")
    x = rng.standard_normal((3, 3), dtype=np.float32)
    outputs = [triton.InferRequestedOutput("embedding", binary_data=False)]
    body, json_size = triton_body([triton_input("x", x, binary=False)], outputs=outputs)
    assert json_size is None  # nothing binary: the whole body is JSON, and no header
    answer = serve(engine_of("two_heads"), body)
    assert answer[1] == {}
    result = decoded(answer)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["embedding"]  # only the output asked for
    expected = module(torch.from_numpy(x))["embedding"].detach().numpy()
    np.testing.assert_array_equal(result.as_numpy("embedding"), expected)  # float32 shortest text reads back exact
    written = json.loads(answer[0])["outputs"][0]["data"]
    assert max(len(re.sub(r"e.*|[^0-9]", "", repr(v)).strip("0")) for v in written) <= 9  # float32's digits, not 17


def test_binary_and_json_inputs_mix_and_outputs_may_mix_too():
    module, _ = exported("ranker")
    ids, features = np.array([3, 0, 39], dtype=np.int64), rng.standard_normal((3, 5), dtype=np.float32)
    inputs = [triton_input("item_ids", ids, binary=True), triton_input("features", features, binary=False)]
    body, json_size = triton_body(inputs, outputs=[triton.InferRequestedOutput("output0", binary_data=False)])
    result = decoded(serve(engine_of("ranker"), body, json_size))
    expected = module(torch.from_numpy(ids), torch.from_numpy(features)).detach().numpy()
    np.testing.assert_allclose(result.as_numpy("output0"), expected, rtol=1e-5, atol=1e-6)
    assert "data" in result.get_output("output0")


def test_binary_data_output_makes_every_output_binary():
    x = rng.standard_normal((2, 3), dtype=np.float32)
    body, _ = triton_body([triton_input("x", x, binary=False)])  # no outputs named: tritonclient asks all in binary
    assert json.loads(body)["parameters"] == {"binary_data_output": True}
    result = decoded(serve(engine_of("two_heads"), body))
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    assert result.as_numpy("logits").shape == (2, 4) and result.as_numpy("embedding").shape == (2, 5)


def test_classification_answers_the_top_classes_with_their_labels():
    module, _ = exported("two_heads")
    settings = parse_file({"outputs": {"logits": {"labels": ["ant", "bee", "cat", "dog"]}}})
    x = rng.standard_normal((2, 3), dtype=np.float32)
    outputs = [triton.InferRequestedOutput("logits", binary_data=True, class_count=2)]
    body, json_size = triton_body([triton_input("x", x)], outputs=outputs)
    result = decoded(serve(engine_of("two_heads", settings), body, json_size))
    logits = module(torch.from_numpy(x))["logits"].detach()
    scores, indices = logits.topk(2)
    texts = result.as_numpy("logits")
    assert texts.shape == (2, 2)
    for row in range(2):
        for rank in range(2):
            score, index, label = texts[row, rank].decode().split(":")
            assert int(index) == int(indices[row, rank]) and label == ["ant", "bee", "cat", "dog"][int(index)]
            assert float(score) == pytest.approx(float(scores[row, rank]), rel=1e-6)


@pytest.mark.parametrize("name", [n for n in DATATYPES if n not in ("BYTES",)])
def test_every_numeric_datatype_reads_as_tritonclient_writes_it_and_back(name):
    numpy_type = {"BF16": np.float32, "BOOL": np.bool_}.get(name) or np.dtype(name.lower().replace("fp", "float"))
    array = (np.arange(6).reshape(2, 3) % 2 == 0) if name == "BOOL" else (np.arange(6).reshape(2, 3) * 1.5 - 2)
    array = array.astype(numpy_type)
    if name.startswith("UINT"):
        array = np.arange(6, dtype=numpy_type).reshape(2, 3) + 200
    body, json_size = triton_body([triton_input("t", array, datatype=name)])
    request = oip.parse_request(body, json_size, signature_of("mlp"))
    wire = request.inputs["t"]
    tensor = from_bytes(wire.raw, wire.datatype, wire.shape)
    assert wire.datatype.name == name and tensor.dtype == DATATYPES[name].dtype
    assert torch.equal(tensor.to(torch.float64), torch.from_numpy(array.astype(np.float64)))
    # ... and an answer of that dtype, in binary and in JSON, as tritonclient reads it
    answering = Signature(inputs=(), outputs=(TensorSpec("t", tensor.dtype, ()),))
    for binary in (True, False):
        request = oip.InferRequest("oip", {}, (oip.RequestedOutput("t", binary),))
        answer = oip.encode_answer(request, {"t": tensor}, answering)
        got = decoded(answer).as_numpy("t")
        np.testing.assert_array_equal(got.astype(np.float64), array.astype(np.float64))


def test_the_native_form_takes_nested_lists_and_answers_nested_lists():
    module, _ = exported("sequence")
    tokens, mask = [[1, 2, 3], [4, 5, 6]], [[1, 1, 0], [1, 1, 1]]
    body = json.dumps({"inputs": {"tokens": tokens, "mask": mask}, "outputs": ["output0"]}).encode()
    answer_body, headers = serve(engine_of("sequence"), body)
    assert headers == {}
    answer = json.loads(answer_body)
    pooled = module(torch.tensor(tokens), torch.tensor(mask, dtype=torch.float32))[0].detach()
    assert list(answer) == ["outputs"] and list(answer["outputs"]) == ["output0"]
    assert torch.equal(torch.tensor(answer["outputs"]["output0"], dtype=torch.float32), pooled)


def test_the_native_form_of_one_row_without_its_rows_dimension_is_answered_the_same_way():
    engine = engine_of("mlp")
    row = [0.5, -1, 2, 0, 1, 3]
    alone = json.loads(serve(engine, json.dumps({"inputs": {"x": row}}))[0])["outputs"]["output0"]
    as_list = json.loads(serve(engine, json.dumps({"inputs": [row]}))[0])["outputs"]["output0"]  # one input: a list
    assert len(alone) == 3 and as_list == [alone]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": [[1, 2]]}, "'inputs' must be an object of the model's inputs by name: ['item_ids', 'features']"),
        ({"inputs": {"item_ids": [1]}, "extra": 1}, "unknown field 'extra'"),
        ({"instances": [1]}, "unknown field 'instances'"),
        ({"inputs": {"item_ids": [1], "features": [[1, 2, 3, 4, 5]]}, "outputs": ["nope"]}, "unknown output 'nope'"),
        ({"inputs": {"item_ids": [1], "features": [[1, "2", 3, 4, 5]]}}, "input 'features': data holds strings"),
        (
            {"inputs": {"item_ids": [1], "features": [[1, 2], [3]]}},
            "input 'features': data holds nested lists of unequal",
        ),
        (
            {"inputs": {"item_ids": [True], "features": [[1, 2, 3, 4, 5]]}},
            "input 'item_ids' is INT64; the request sent booleans",
        ),
    ],
)
def test_a_bad_native_body_is_refused_naming_the_problem(body, message):
    status, error = serve(engine_of("ranker"), json.dumps(body))
    assert status == 400 and message in error


def mlp_binary_body(rows=2):
    x = rng.standard_normal((rows, 6), dtype=np.float32)
    return triton_body([triton_input("x", x)])


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("12.5", "must be an integer"),
        ("abc", "must be an integer"),
        ("-1", "cannot be negative"),
        ("100000", "beyond the body's"),
    ],
)
def test_a_lying_or_malformed_header_is_refused(header, message):
    body, _ = mlp_binary_body()
    status, error = serve(engine_of("mlp"), body, header)
    assert status == 400 and HEADER in error and message in error


def edited(body, json_size, edit):
    head = json.loads(body[:json_size])
    edit(head)
    new_head = json.dumps(head).encode()
    return new_head + body[json_size:], len(new_head)


@pytest.mark.parametrize(
    ("edit", "extra", "message"),
    [
        (None, b"\0", "add up to 48 bytes ('x': 48), but 49 bytes follow"),
        (None, -1, "add up to 48 bytes ('x': 48), but 47 bytes follow"),
        (
            lambda h: h["inputs"][0]["parameters"].update(binary_data_size=-48),
            b"",
            "input 'x': binary_data_size must be",
        ),
        (
            lambda h: h["inputs"][0]["parameters"].update(binary_data_size=47.5),
            b"",
            "input 'x': binary_data_size must be",
        ),
        (
            lambda h: h["inputs"][0].update(shape=[3, 6]),
            b"",
            "input 'x' has binary_data_size 48; its shape [3, 6] of FP32 takes 72",
        ),
        (lambda h: h["inputs"][0].update(datatype="FLOAT32"), b"", "input 'x': unknown datatype 'FLOAT32'"),
        (lambda h: h["inputs"][0].update(datatype="BYTES"), b"", "input 'x' is BYTES (strings)"),
        (lambda h: h["inputs"][0].update(data=[1]), b"", "input 'x' has both 'data' and parameters.binary_data_size"),
        (lambda h: h["inputs"][0].update(shape=[2, -6]), b"", "input 'x': 'shape' must be a list of non-negative"),
        (lambda h: h["inputs"].append(dict(h["inputs"][0])), b"", "input 'x' is given twice"),
    ],
)
def test_a_lying_binary_body_is_refused_naming_the_input(edit, extra, message):
    body, json_size = mlp_binary_body()
    if edit is not None:
        body, json_size = edited(body, json_size, edit)
    body = body[:-1] if extra == -1 else body + extra
    status, error = serve(engine_of("mlp"), body, str(json_size))
    assert (status, message in error) == (400, True), error


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (
            {"shape": [2, 6], "datatype": "FP32", "data": [1] * 11},
            "input 'x' has 11 values in 'data'; its shape [2, 6] holds 12",
        ),
        ({"shape": [1, 6], "datatype": "FP8", "data": [1] * 6}, "input 'x': unknown datatype 'FP8'"),
        ({"shape": [1, 6], "datatype": "BYTES", "data": ["a"] * 6}, "input 'x' is BYTES (strings)"),
        ({"shape": [1, 6], "datatype": "FP32", "data": ["a"] * 6}, "input 'x': data holds strings (BYTES)"),
        (
            {"shape": [1, 6], "datatype": "INT64", "data": [1.5] * 6},
            "input 'x' is INT64 but its data holds numbers with",
        ),
        ({"shape": [1, 6], "datatype": "FP32"}, "input 'x' has no 'data'"),
        ({"shape": [1, 6], "datatype": "FP32", "data": [1] * 6, "parameters": {"binary_data_size": 24}}, "both"),
        ({"shape": [1, 6], "datatype": "FP32", "parameters": {"binary_data_size": 24}}, f"has no {HEADER} header"),
        (
            {"shape": [1, 6], "datatype": "FP32", "data": [1] * 6, "parameters": {"shared_memory_region": "r"}},
            "shared memory",
        ),
    ],
)
def test_a_bad_json_tensor_is_refused_naming_the_input(tensor, message):
    status, error = serve(engine_of("mlp"), json.dumps({"inputs": [{"name": "x", **tensor}]}))
    assert status == 400 and message in error, error


def test_a_binary_bool_must_be_0_or_1():
    body, json_size = triton_body([triton_input("t", np.array([True, False]))])
    lying = body[:-1] + b"\x02"
    oip.parse_request(body, json_size, signature_of("mlp"))
    with pytest.raises(RequestError, match="input 't' is BOOL; each of its bytes must be 0 or 1"):
        oip.parse_request(lying, json_size, signature_of("mlp"))


@pytest.mark.parametrize(
    ("output", "count", "message"),
    [
        ("logits", 5, "output 'logits': classification asks for 5 classes; the output has 4"),
        ("logits", 0, "output 'logits': classification must be a positive integer"),
    ],
)
def test_a_classification_the_output_cannot_give_is_refused(output, count, message):
    outputs = [{"name": output, "parameters": {"classification": count}}]
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}], "outputs": outputs}
    status, error = serve(engine_of("two_heads"), json.dumps(body))
    assert status == 400 and message in error, error


def test_classification_of_an_output_of_one_value_per_row_is_refused():
    body = {
        "inputs": [{"name": "item_ids", "shape": [1], "datatype": "INT64", "data": [1]}],
        "outputs": [{"name": "output0", "parameters": {"classification": 1}}],
    }
    status, error = serve(engine_of("ranker"), json.dumps(body))
    assert status == 400 and "output 'output0': classification: the output has no classes" in error


def test_nested_data_is_read_as_flat_data():
    engine = engine_of("mlp")
    flat = [float(v) for v in range(12)]
    nested = [flat[:6], flat[6:]]
    answers = [
        serve(engine, json.dumps({"inputs": [{"name": "x", "shape": [2, 6], "datatype": "FP32", "data": data}]}))
        for data in (flat, nested)
    ]
    assert answers[0] == answers[1] and json.loads(answers[0][0])["outputs"][0]["shape"] == [2, 3]


def test_a_nan_output_is_refused_in_json_and_sent_in_binary():
    settings = parse_file({"inputs": {"x": {"allow_nan": True}}})
    engine = engine_of("mlp", settings)
    tensor = {"name": "x", "shape": [1, 6], "datatype": "FP32", "data": [float("nan")] + [0.0] * 5}
    body = json.dumps({"inputs": [tensor], "outputs": [{"name": "output0"}]})  # json writes NaN: Python's json reads it
    status, error = serve(engine, body)
    assert status == 422 and "output 'output0' holds NaN or Infinity" in error and "binary" in error
    binary_body = json.dumps(
        {"inputs": [tensor], "outputs": [{"name": "output0", "parameters": {"binary_data": True}}]}
    )
    assert np.isnan(decoded(serve(engine, binary_body)).as_numpy("output0")).any()


def test_refusals_are_the_protocol_s_error_object():
    status, body = oip.error_answer(RequestError("input 'x' is missing", code=400))
    assert (status, json.loads(body)) == (400, {"error": "input 'x' is missing"})


def test_metadata_describes_each_tensor_as_the_protocol_does():
    meta = oip.metadata(signature_of("ranker"), "ranker")
    assert meta["inputs"] == [
        {"name": "item_ids", "datatype": "INT64", "shape": [-1]},
        {"name": "features", "datatype": "FP32", "shape": [-1, 5]},
    ]
    assert meta["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [-1]}]
