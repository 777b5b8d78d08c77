"""The network comparison's traffic: the same seeded tensors in each system's own request shape, and the judge of
their answers.

A request carries one row of every input of the network (loadtests/networks.py): one image, or one user with its 8
candidate items and 16 context features. Values are drawn from the seed (floats standard normal, rounded to 4
decimals so that the JSON bodies stay compact and every format carries exactly the same numbers; ids uniform over the
table). Each load-generator stream draws a pool of :data:`POOL` requests once, encodes them once in its format and
then sends them in a seeded order: the generator spends its CPU on sending, not on encoding 150,528 floats a request.

Formats (the traffic name is ``<network>-<format>``, e.g. ``resnet50-size-oip``; loadtests/payloads.py resolves it):

- ``oip``: the Open Inference Protocol v2 with Triton's binary tensor extension, to ``/v2/models/<network>/infer``,
  the body built by ``tritonclient.http``'s own encoder with its defaults (inputs as binary, every output asked back
  as binary) and the answer read by its own parser: byte for byte what ``tritonclient.http.InferenceServerClient
  .infer`` sends and reads. Triton (PyTriton) is sent this, and this project's network engine will be.
- ``torchserve``: JSON ``{input: nested rows}`` to ``/predictions/<network>``, answered ``{output: nested rows}``
  (the TorchServe handler, loadtests/baselines/network_torchserve_handler.py).
- ``litserve``: the same JSON to LitServe's ``/predict``.
- ``native``: this project's short JSON form, ``{"inputs": {input: nested rows}}`` to ``/predictions/<network>``,
  answered ``{"outputs": {output: nested rows}}``: what curl sends to this project's network engine.

:func:`judge` is the parity rule every system passes before it is measured: the same output names and shapes as the
module in process, and every value within fp32 tolerance of it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtests.images import RawBody
from loadtests.networks import NETWORKS, Network, network

POOL = 8  # distinct requests per stream
DECIMALS = 4
OIP_HEADER = "Inference-Header-Content-Length"  # the JSON part's length in a binary-extension body
OIP_CONTENT_TYPE = "application/octet-stream"
FORMATS = ("oip", "torchserve", "litserve", "native")


def traffic_name(network_name: str, form: str) -> str:
    return f"{network_name}-{form}"


def parse_name(name: str) -> tuple[Network, str] | None:
    """(network, format) of a traffic name such as ``ranking-oip``; None for a name that is no network traffic."""
    for form in FORMATS:
        base = name.removesuffix(f"-{form}")
        if base != name and base in NETWORKS:
            return NETWORKS[base], form
    return None


def path_of(spec: Network, form: str) -> str:
    return {
        "oip": f"/v2/models/{spec.name}/infer",
        "torchserve": f"/predictions/{spec.name}",
        "litserve": "/predict",
        "native": f"/predictions/{spec.name}",
    }[form]


def draw_request(spec: Network, rng: np.random.Generator, rows: int = 1) -> dict[str, np.ndarray]:
    """One request's tensors: the network's inputs, floats rounded to DECIMALS (exactly representable in JSON)."""
    drawn = spec.random_inputs(rows, rng)
    return {
        name: np.round(array, DECIMALS).astype(np.float32) if array.dtype == np.float32 else array
        for name, array in drawn.items()
    }


def oip_request(tensors: Mapping[str, np.ndarray]) -> RawBody:
    """The binary-extension body tritonclient.http sends for these tensors (its defaults), with its header."""
    import tritonclient.http as triton_http
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, array in tensors.items():
        tensor = triton_http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)  # binary_data=True: the client's default
        inputs.append(tensor)
    body, json_size = triton_http.InferenceServerClient.generate_request_body(inputs)
    headers = () if json_size is None else ((OIP_HEADER, str(json_size)),)
    return RawBody(bytes(body), OIP_CONTENT_TYPE, headers)


def oip_answer(content: bytes, headers: Mapping[str, str]) -> dict[str, np.ndarray]:
    """An OIP answer (JSON or binary extension) read by tritonclient.http's own parser: every output by name."""
    import tritonclient.http as triton_http

    length = headers.get(OIP_HEADER) or headers.get(OIP_HEADER.lower())
    result = triton_http.InferenceServerClient.parse_response_body(
        content, header_length=int(length) if length is not None else None
    )
    return {output["name"]: result.as_numpy(output["name"]) for output in result.get_response()["outputs"]}


def json_request(tensors: Mapping[str, np.ndarray]) -> dict[str, Any]:
    return {name: array.tolist() for name, array in tensors.items()}


def json_answer(content: bytes, headers: Mapping[str, str]) -> dict[str, np.ndarray]:
    """A JSON answer ``{output: nested rows}`` as arrays; anything else raises ValueError."""
    return output_arrays(json.loads(content))


def output_arrays(body: Any) -> dict[str, np.ndarray]:
    """An object of outputs ``{output: nested rows}`` as arrays; anything else raises ValueError."""
    if not isinstance(body, dict) or not body:
        raise ValueError(f"expected an object of outputs, got {str(body)[:80]!r}")
    return {name: np.asarray(value, dtype=np.float32) for name, value in body.items()}


def native_answer(content: bytes, headers: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The native form's answer ``{"outputs": {output: nested rows}}`` as arrays; anything else raises ValueError."""
    body = json.loads(content)
    if not isinstance(body, dict) or set(body) != {"outputs"}:
        raise ValueError(f"expected {{'outputs': ...}}, got {str(body)[:80]!r}")
    return output_arrays(body["outputs"])


def encode(tensors: Mapping[str, np.ndarray], form: str) -> RawBody | dict[str, Any]:
    if form == "native":
        return {"inputs": json_request(tensors)}
    return oip_request(tensors) if form == "oip" else json_request(tensors)


def decode(form: str):
    """The answer reader of a format: (content bytes, headers) -> {output: array}."""
    return {"oip": oip_answer, "native": native_answer}.get(form, json_answer)


def judge(expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], tolerance: float = 1e-4) -> str | None:
    """None when ``got`` answers as ``expected`` does: the same output names and shapes, finite values, each within
    ``tolerance`` of the reference relative to its largest magnitude (at least 1); else the first difference."""
    if set(got) != set(expected):
        return f"outputs {sorted(got)}, expected {sorted(expected)}"
    for name, reference in expected.items():
        answer = np.asarray(got[name])
        if answer.shape != reference.shape:
            return f"{name}: shape {list(answer.shape)}, expected {list(reference.shape)}"
        if not np.issubdtype(answer.dtype, np.floating) or not np.all(np.isfinite(answer)):
            return f"{name}: not all finite floats ({answer.dtype})"
        scale = max(1.0, float(np.max(np.abs(reference))) if reference.size else 1.0)
        worst = float(np.max(np.abs(answer.astype(np.float64) - reference))) if reference.size else 0.0
        if worst > tolerance * scale:
            return f"{name}: differs by up to {worst:.3g} (allowed {tolerance * scale:.3g})"
    return None


def shape_check(spec: Network):
    """The load test's check of one answer: the output, one row of its shape, finite (values are judged by parity
    before the run, not per request)."""
    expected = (1, *spec.output_shape)

    def check(answer: Mapping[str, np.ndarray]) -> str | None:
        value = answer.get(spec.output) if isinstance(answer, Mapping) else None
        if value is None:
            return f"no output {spec.output!r} in {str(answer)[:80]!r}"
        if tuple(np.shape(value)) != expected:
            return f"{spec.output}: shape {list(np.shape(value))}, expected {list(expected)}"
        if not np.all(np.isfinite(value)):
            return f"{spec.output}: not finite"
        return None

    return check


def pooled(body: RawBody | dict[str, Any]) -> RawBody:
    """A body as the bytes sent: a JSON body serialised once here, not by the HTTP client at every send (an image's
    JSON is 150,528 numbers; serialising it per request held the load generator to about one request a second)."""
    if isinstance(body, RawBody):
        return body
    return RawBody(json.dumps(body).encode("utf-8"), "application/json")


@dataclass
class NetworkPayloads:
    """Seeded stream of one network's requests in one format: POOL requests drawn and encoded once, then sent in a
    seeded order. Subclassed per traffic name (loadtests/payloads.py) with ``spec`` and ``form`` set."""

    seed: int = 0
    stream: int = 0
    spec: Network = NETWORKS["ranking"]
    form: str = "oip"

    def __post_init__(self):
        rng = np.random.default_rng([self.seed, self.stream, sum(map(ord, self.spec.name))])
        self.pool = [pooled(encode(draw_request(self.spec, rng), self.form)) for _ in range(POOL)]
        self.order = random.Random(f"network-{self.seed}-{self.stream}")

    def next(self) -> RawBody | dict[str, Any]:
        return self.order.choice(self.pool)


def reference_answers(spec: Network, module, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """What the module in process answers to each request: the parity check's expected values."""
    import torch

    from loadtests.networks import as_tensors

    answers = []
    with torch.no_grad():
        for tensors in requests:
            answers.append({spec.output: module(*as_tensors(tensors)).numpy()})
    return answers


def parity_requests(name: str, count: int = 3, seed: int = 1234) -> list[dict[str, np.ndarray]]:
    """The few random requests every system must answer as the module does (not the load test's pool)."""
    spec = network(name)
    rng = np.random.default_rng(seed)
    return [draw_request(spec, rng) for _ in range(count)]
