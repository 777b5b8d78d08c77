"""The dialects a network is asked in: the Open Inference Protocol v2 (KServe v2, Triton's HTTP API) with Triton's
binary tensor extension, and a short native JSON form for curl. Parsing a request body into :class:`WireTensor`
inputs (checked against the signature later, by the engine) and the outputs it asks for; writing the answer in the
dialect of the request; refusals as ``{"error": "..."}`` with their 4xx status.

Open Inference Protocol request (``POST /v2/models/<name>/infer``)::

    {"id": "42", "inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}],
     "outputs": [{"name": "y", "parameters": {"binary_data": true}}], "parameters": {"binary_data_output": false}}

``data`` is flat (row-major) or nested; either way it holds exactly the elements ``shape`` says. With the binary
extension the body is that JSON head, then each binary input's raw bytes in the order the inputs are listed (the
``Inference-Header-Content-Length`` header gives the head's length; an input's ``parameters.binary_data_size`` its
bytes, instead of ``data``): handlers/network/binary.py. ``outputs`` (optional: every output) picks outputs and, per
output, ``binary_data`` and ``classification`` (the top k classes as "score:index:label" strings, Triton's
classification extension, labels from the signature file); ``parameters.binary_data_output`` makes every output
binary. The answer: ``{"model_name", "model_version", "id", "outputs": [{"name", "datatype", "shape", "data"}]}``, an
output in binary with ``parameters.binary_data_size`` and its bytes after the head (and the header).

Native form (one obvious JSON for curl): ``{"inputs": {"x": [[1, 2, 3], [4, 5, 6]]}}``, each input a nested list
whose nesting is its shape; a model with one input also takes ``{"inputs": [[1, 2, 3]]}``; one row may leave out the
rows dimension (``{"inputs": {"x": [1, 2, 3]}}``, answered the same way). ``"outputs": ["y"]`` picks outputs. The
answer: ``{"outputs": {"y": [[...], [...]]}}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from handlers.core.errors import OIP, RequestError, error_body
from handlers.core.http import Float32, Float32List, decode_json, to_json
from handlers.network import binary
from handlers.network.datatypes import DataType, named, of_dtype, to_bytes
from handlers.network.inputs import JSON_TYPES, WireTensor, json_values, kind_words, native_tensor
from handlers.network.signature import Signature, TensorSpec

OIP_FIELDS = {"id", "parameters", "inputs", "outputs"}
NATIVE_FIELDS = {"inputs", "outputs"}
INPUT_FIELDS = {"name", "shape", "datatype", "parameters", "data"}
OUTPUT_FIELDS = {"name", "parameters"}
KIND_OF_DATATYPE = {"b": "b", "u": "i", "i": "i", "f": "if"}  # the JSON values each datatype's kind takes


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool = False
    classification: int = 0  # > 0: the top k classes as strings instead of the tensor


@dataclass(frozen=True)
class InferRequest:
    dialect: str  # "oip" or "native": the answer is written in it
    inputs: dict[str, WireTensor]
    outputs: tuple[RequestedOutput, ...]  # what to answer, in order
    id: str | None = None


# ---------------------------------------------------------------------------------------------------- requests
def parse_request(body: Any, header_value: object, signature: Signature) -> InferRequest:
    """A request body (bytes as received, or the JSON value TorchServe already parsed) in either dialect.

    ``header_value``: the Inference-Header-Content-Length header, None when absent."""
    rest: memoryview | None = None
    if header_value is not None:
        if not isinstance(body, bytes | bytearray):
            raise RequestError(f"header {binary.HEADER} needs the raw request body")
        head, rest = binary.split(bytes(body), header_value)
        body = head
    if isinstance(body, str):
        body = body.encode("utf-8")
    value = decode_json(body) if isinstance(body, bytes | bytearray) else body
    if not isinstance(value, dict):
        raise RequestError(f"body must be a JSON object with 'inputs', got {JSON_TYPES.get(type(value), 'a value')}")
    inputs = value.get("inputs")
    if rest is not None or (isinstance(inputs, list) and (not inputs or isinstance(inputs[0], dict))):
        return parse_oip(value, rest, signature)
    return parse_native(value, signature)


def parse_oip(value: dict[str, Any], rest: memoryview | None, signature: Signature) -> InferRequest:
    refuse_unknown(value, OIP_FIELDS, "the request")
    inputs = value.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("'inputs' must be a non-empty list of input tensors")
    parameters = object_field(value, "parameters", "the request")
    request_id = value.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(f"'id' must be a string, got {JSON_TYPES.get(type(request_id), type(request_id).__name__)}")
    wires, sizes = oip_inputs(inputs)
    if rest is None and sizes:
        raise RequestError(f"input {sizes[0][0]!r} has binary_data_size, but the request has no {binary.HEADER} header")
    buffers = binary.cut(rest, sizes) if rest is not None else {}
    for name, raw in buffers.items():
        wires[name] = binary_tensor(wires[name], raw)
    binary_default = flag(parameters, "binary_data_output", "the request's parameters")
    outputs = oip_outputs(value.get("outputs"), signature, binary_default)
    return InferRequest("oip", wires, outputs, request_id)


def oip_inputs(inputs: list[Any]) -> tuple[dict[str, WireTensor], list[tuple[str, int]]]:
    """Each input (binary ones without their bytes yet), and the binary ones' sizes in order."""
    wires: dict[str, WireTensor] = {}
    sizes: list[tuple[str, int]] = []
    for number, item in enumerate(inputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(f"inputs[{number}] must be an object with a string 'name'")
        name = item["name"]
        where = f"input {name!r}"
        if name in wires:
            raise RequestError(f"{where} is given twice")
        refuse_unknown(item, INPUT_FIELDS, where)
        shape = shape_field(item.get("shape"), where)
        datatype = datatype_field(item.get("datatype"), where)
        parameters = object_field(item, "parameters", where)
        if any(key.startswith("shared_memory") for key in parameters):
            raise RequestError(f"{where}: shared memory is not supported; send the data in the request")
        size = parameters.get("binary_data_size")
        if size is not None:
            if "data" in item:
                raise RequestError(f"{where} has both 'data' and parameters.binary_data_size; send one")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise RequestError(f"{where}: binary_data_size must be a non-negative integer, got {size!r}")
            sizes.append((name, size))
            wires[name] = WireTensor(name=name, shape=shape, datatype=datatype)
        else:
            wires[name] = json_tensor(item, name, shape, datatype)
    return wires, sizes


def json_tensor(item: Mapping[str, Any], name: str, shape: tuple[int, ...], datatype: DataType) -> WireTensor:
    where = f"input {name!r}"
    if "data" not in item:
        raise RequestError(f"{where} has no 'data' (nor parameters.binary_data_size)")
    if datatype.kind == "s":
        raise RequestError(f"{where} is BYTES (strings); this model's inputs are numeric tensors")
    flat, _, kind = json_values(item["data"], where)
    expected = math.prod(shape)
    if len(flat) != expected:
        raise RequestError(f"{where} has {len(flat)} values in 'data'; its shape {list(shape)} holds {expected}")
    if flat and kind not in KIND_OF_DATATYPE[datatype.kind]:
        raise RequestError(f"{where} is {datatype.name} but its data holds {kind_words(kind)}")
    return WireTensor(name=name, shape=shape, datatype=datatype, values=flat, kind=kind)


def binary_tensor(wire: WireTensor, raw: memoryview) -> WireTensor:
    where = f"input {wire.name!r}"
    datatype = wire.datatype
    assert datatype is not None
    if datatype.kind == "s":
        raise RequestError(f"{where} is BYTES (strings); this model's inputs are numeric tensors")
    expected = math.prod(wire.shape) * datatype.itemsize
    if len(raw) != expected:
        raise RequestError(
            f"{where} has binary_data_size {len(raw)}; its shape {list(wire.shape)} of {datatype.name} takes "
            f"{expected} bytes"
        )
    if datatype.name == "BOOL" and not set(bytes(raw)) <= {0, 1}:
        raise RequestError(f"{where} is BOOL; each of its bytes must be 0 or 1")
    return WireTensor(name=wire.name, shape=wire.shape, datatype=datatype, raw=raw)


def oip_outputs(value: Any, signature: Signature, binary_default: bool) -> tuple[RequestedOutput, ...]:
    if value is None:
        return tuple(RequestedOutput(spec.name, binary_default) for spec in signature.outputs)
    if not isinstance(value, list) or not value:
        raise RequestError("'outputs' must be a non-empty list of {'name': ...} objects")
    outputs = []
    for number, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(f"outputs[{number}] must be an object with a string 'name'")
        spec = known_output(item["name"], signature)
        where = f"output {spec.name!r}"
        refuse_unknown(item, OUTPUT_FIELDS, where)
        parameters = object_field(item, "parameters", where)
        is_binary = flag(parameters, "binary_data", f"{where} parameters", binary_default)
        classes = classification(parameters.get("classification"), spec)
        outputs.append(RequestedOutput(spec.name, is_binary, classes))
    return tuple(outputs)


def classification(value: Any, spec: TensorSpec) -> int:
    if value is None:
        return 0
    where = f"output {spec.name!r}: classification"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{where} must be a positive integer (how many top classes), got {value!r}")
    if spec.rank < 2:
        raise RequestError(f"{where}: the output has no classes (one value per row, shape [rows])")
    width = spec.dims[-1].size
    if width is not None and value > width:
        raise RequestError(f"{where} asks for {value} classes; the output has {width}")
    return value


def parse_native(value: dict[str, Any], signature: Signature) -> InferRequest:
    refuse_unknown(value, NATIVE_FIELDS, "the request")
    if "inputs" not in value:
        raise RequestError('missing field \'inputs\' (e.g. {"inputs": {"x": [[1, 2, 3]]}})')
    inputs = value["inputs"]
    if not isinstance(inputs, dict):
        if len(signature.inputs) != 1:
            expected = [spec.name for spec in signature.inputs]
            raise RequestError(f"'inputs' must be an object of the model's inputs by name: {expected}")
        inputs = {signature.inputs[0].name: inputs}
    wires = {str(name): native_tensor(str(name), data) for name, data in inputs.items()}
    names = value.get("outputs")
    if names is None:
        outputs = tuple(RequestedOutput(spec.name) for spec in signature.outputs)
    elif isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        outputs = tuple(RequestedOutput(known_output(name, signature).name) for name in names)
    else:
        raise RequestError("'outputs' must be a non-empty list of output names")
    return InferRequest("native", wires, outputs)


def shape_field(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise RequestError(f"{where}: 'shape' must be a list of non-negative integers, got {value!r}"[:300])
    return tuple(value)


def datatype_field(value: Any, where: str) -> DataType:
    datatype = named(value)
    if datatype is None:
        raise RequestError(
            f"{where}: unknown datatype {value!r}; the protocol's datatypes are BOOL, UINT8, UINT16, UINT32, UINT64, "
            "INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16, BYTES"[:400]
        )
    return datatype


def object_field(item: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"{where}: '{key}' must be an object")
    return value


def flag(parameters: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def refuse_unknown(item: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(item) - known)
    if unknown:
        raise RequestError(f"{where}: unknown field {unknown[0]!r}; known fields are {sorted(known)}")


def known_output(name: str, signature: Signature) -> TensorSpec:
    spec = signature.output(name)
    if spec is None:
        raise RequestError(f"unknown output {name!r}; the model returns {[s.name for s in signature.outputs]}")
    return spec


# ----------------------------------------------------------------------------------------------------- answers
def encode_answer(
    request: InferRequest,
    outputs: Mapping[str, torch.Tensor],
    signature: Signature,
    model_name: str = "model",
    model_version: str = "1",
) -> tuple[bytes, dict[str, str]]:
    """The answer's body and headers (the binary extension's header when an output is binary).

    A float output that holds NaN or Infinity cannot be written as JSON: refused (422) naming the output, unless it
    is asked for in binary."""
    if request.dialect == "native":
        values = {o.name: nested_json(outputs[o.name], o.name) for o in request.outputs}
        return to_json({"outputs": values}).encode("utf-8"), {}
    entries, buffers = [], []
    for wanted in request.outputs:
        spec = signature.output(wanted.name)
        assert spec is not None
        tensor = outputs[wanted.name]
        entry: dict[str, Any]
        if wanted.classification:
            entry, raw = classes_entry(wanted, tensor, spec)
        else:
            entry, raw = tensor_entry(wanted, tensor)
        entries.append(entry)
        if raw is not None:
            buffers.append(raw)
    head: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        head["id"] = request.id
    head["outputs"] = entries
    return binary.join(to_json(head).encode("utf-8"), buffers)


def tensor_entry(wanted: RequestedOutput, tensor: torch.Tensor) -> tuple[dict[str, Any], bytes | None]:
    entry: dict[str, Any] = {"name": wanted.name, "datatype": of_dtype(tensor.dtype).name, "shape": list(tensor.shape)}
    if wanted.binary:
        raw = to_bytes(tensor)
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw
    entry["data"] = flat_json(tensor, wanted.name)
    return entry, None


def classes_entry(
    wanted: RequestedOutput, tensor: torch.Tensor, spec: TensorSpec
) -> tuple[dict[str, Any], bytes | None]:
    """The top k classes of each row as "score:index[:label]" strings (BYTES), best first."""
    k = min(wanted.classification, tensor.shape[-1])
    scores, indices = torch.topk(tensor.detach().to("cpu", torch.float64), k, dim=-1)
    labels = spec.labels or ()
    texts = []
    for score, index in zip(scores.reshape(-1).tolist(), indices.reshape(-1).tolist(), strict=True):
        shown = str(np.float32(score)) if tensor.dtype != torch.float64 else repr(score)
        texts.append(f"{shown}:{index}" + (f":{labels[index]}" if labels else ""))
    entry: dict[str, Any] = {"name": wanted.name, "datatype": "BYTES", "shape": [*tensor.shape[:-1], k]}
    if wanted.binary:
        raw = binary.encode_strings([text.encode("utf-8") for text in texts])
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw
    entry["data"] = texts
    return entry, None


def check_finite(tensor: torch.Tensor, name: str) -> None:
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise RequestError(
            f"output {name!r} holds NaN or Infinity, which JSON cannot carry; ask for it in binary "
            "(Open Inference Protocol: parameters.binary_data)",
            code=422,
            error_type="NonFiniteOutput",
        )


def flat_json(tensor: torch.Tensor, name: str) -> Any:
    check_finite(tensor, name)
    flat = tensor.detach().to("cpu").reshape(-1)
    if flat.is_floating_point() and flat.dtype != torch.float64:
        return Float32List(flat.to(torch.float32).tolist())  # float32 exactly: shortest text
    return flat.tolist()


def nested_json(tensor: torch.Tensor, name: str) -> Any:
    check_finite(tensor, name)
    tensor = tensor.detach().to("cpu")
    if not tensor.is_floating_point() or tensor.dtype == torch.float64:
        return tensor.tolist()
    return float32_rows(tensor.to(torch.float32))


def float32_rows(tensor: torch.Tensor) -> Any:
    if tensor.dim() == 0:
        return Float32(tensor.item())
    if tensor.dim() == 1:
        return Float32List(tensor.tolist())
    return [float32_rows(row) for row in tensor]


def error_answer(error: RequestError) -> tuple[int, bytes]:
    """A refusal's status and body, as the protocol writes one: ``{"error": "..."}``."""
    return error.code, to_json(error_body(error, OIP)).encode("utf-8")


def metadata(signature: Signature, name: str, versions: Sequence[str] = ("1",)) -> dict[str, Any]:
    """The protocol's model metadata (``GET /v2/models/<name>``): each tensor's datatype, -1 for dynamic sizes."""
    return {
        "name": name,
        "versions": list(versions),
        "platform": "pytorch_torchexport",
        "inputs": [spec.metadata() for spec in signature.inputs],
        "outputs": [spec.metadata() for spec in signature.outputs],
    }
