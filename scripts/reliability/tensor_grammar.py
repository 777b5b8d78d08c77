"""The tensor grammar: seeded requests for a served network (handlers/network/), valid and invalid, in every dialect
it takes, and the judge of their answers.

Everything is drawn from the network's :class:`~handlers.network.signature.Signature` (each input's dtype, rank,
static and dynamic dimensions with their ranges, id ranges, whether NaN is allowed) and the rows a request may hold:

- valid requests in the Open Inference Protocol's JSON (flat and nested ``data``), its binary form (Triton's
  extension: the JSON head's length in ``Inference-Header-Content-Length``, each binary input's raw little-endian bytes
  after it with ``parameters.binary_data_size``, answers asked in binary or not with ``binary_data_output`` and per
  output ``binary_data``, binary and JSON inputs mixed, top-k ``classification``) and the native JSON form (nested
  lists; one row without its rows dimension). Rows from 1 to the limit, dynamic dimensions within their range,
  ids within their range, binary data in any datatype that converts to the input's without loss, numeric extremes
  that are still finite (-0.0, subnormals, the largest float32: an answer that overflows is the reference's too);
- invalid requests, each with the status it must get and what its message must name (the input, the output or the
  header): a wrong datatype (BYTES, floats for an integer input, a narrowing binary datatype, a BOOL byte other than
  0 or 1), a wrong rank, a wrong static size, a dynamic size outside its range or unequal where dimensions share a
  symbol, unequal rows, no rows, more rows than allowed (413), NaN and Infinity (unless the signature allows them),
  JSON numbers that overflow the input's float type, ids outside their range (below 0, one past the table, int64's
  extremes, beyond int64), binary sizes that lie (sum too big or too small, shifted between inputs, negative or not
  an integer), a header that lies (beyond the body, negative, not an integer, inside the head), truncated bodies,
  unknown, missing and repeated inputs, malformed fields, UTF-16 and BOM-prefixed JSON, and shapes that claim
  billions of elements with a few bytes of data (refused from the shape alone, without allocating them).

:func:`judge` checks one answer: a refusal must have exactly the status and name what it must; a valid request's
answer must equal the in-process reference (``NetworkEngine.infer`` of that request alone, :func:`reference`) within
a tolerance, written in the request's dialect (binary outputs framed as the extension frames them, classification
strings that agree with the reference's scores), or be the 422 naming an output whose NaN or Infinity JSON cannot
carry. A case is a pure function of (seed, index): :meth:`TensorGrammar.case` rebuilds it.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from handlers.core.errors import RequestError
from handlers.network.binary import HEADER
from handlers.network.datatypes import (
    DATATYPES,
    DataType,
    converts_exactly,
    from_bytes,
    integer_limits,
    of_dtype,
    to_bytes,
)
from handlers.network.engine import NetworkEngine
from handlers.network.inputs import WireTensor
from handlers.network.signature import Signature, TensorSpec
from scripts.reliability.corpus import error_message

# fuzz_grammar's expectations, spelled as it spells them (it may import this module for its PRODUCTIONS table).
EITHER, ERROR, OK = "either", "error", "ok"
JSON_TYPE, OCTETS = "application/json", "application/octet-stream"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
OPEN_HIGH = 8  # how far above its low bound an unbounded dynamic dimension is drawn
MARKER = 123456.75  # a value no generated float is, written alike by json and torch: replaced in a written body
ODD_NUMBERS = [2**63, 10**30, -(2**64), 60000, 1e-50, -1e-300, 5e-324, 0.1000000000000000055511151231257827]


@dataclass(frozen=True)
class Wanted:
    """An output the answer must hold, as the request asked for it."""

    name: str
    binary: bool = False
    classification: int = 0  # > 0: the top k classes as "score:index[:label]" strings
    labels: tuple[str, ...] | None = None  # the output's class labels (signature file), written after the index


@dataclass
class TensorCase:
    index: int
    production: str
    dialect: str  # "oip-json", "oip-binary" or "native": the answer comes in the request's protocol
    body: bytes
    headers: dict[str, str]  # as sent: Content-Type, and Inference-Header-Content-Length for a binary body
    expect: str  # OK, ERROR or EITHER
    status: int | None = None  # ERROR: the status it must get
    names: tuple[str, ...] = ()  # ERROR: text its message must hold (an input or output's repr, or the header)
    tensors: dict[str, torch.Tensor] | None = None  # OK / EITHER: each input as the program takes it (rows first)
    outputs: tuple[Wanted, ...] = ()
    one_row: bool = False  # native form without the rows dimension: answered without it
    request_id: str | None = None

    @property
    def protocol(self) -> str:
        return "native" if self.dialect == "native" else "oip"

    def header_value(self) -> str | None:
        return self.headers.get(HEADER)

    def preview(self, width: int = 160) -> str:
        text = self.body[:width].decode("utf-8", "backslashreplace")
        return text + (f"... ({len(self.body)} bytes)" if len(self.body) > width else "")

    def reproducer(self, url: str) -> str:
        """A shell command that sends exactly these bytes and headers (curl reading the body from stdin)."""
        headers = "".join(f" -H '{name}: {value}'" for name, value in self.headers.items())
        return (
            f"python3 -c \"import sys; sys.stdout.buffer.write(bytes.fromhex('{self.body.hex()}'))\" | "
            f"curl -s -X POST {url}{headers} --data-binary @-"
        )


# ------------------------------------------------------------------------------------------------ OIP bodies
@dataclass
class Entry:
    """One input of an OIP request before it is written: the values sent and how; every field may be made to lie."""

    name: str
    values: torch.Tensor  # in the wire datatype's dtype
    datatype: str
    binary: bool = False
    nested: bool = False
    shape: Any = None  # as claimed (None: the values' shape)
    data: Any = None  # JSON data written instead of the values
    raw: bytes | None = None  # binary bytes sent instead of the values'
    size: Any = None  # binary_data_size claimed instead of the bytes' length
    fields: dict[str, Any] = field(default_factory=dict)  # more fields of the entry

    def json(self) -> dict[str, Any]:
        shape = list(self.values.shape) if self.shape is None else self.shape
        entry: dict[str, Any] = {"name": self.name, "shape": shape, "datatype": self.datatype}
        if self.binary:
            entry["parameters"] = {"binary_data_size": len(self.bytes()) if self.size is None else self.size}
        elif self.data is not None:
            entry["data"] = self.data
        else:
            values = self.values if self.nested else self.values.reshape(-1)
            entry["data"] = values.tolist()
        entry.update(self.fields)
        return entry

    def bytes(self) -> bytes:
        return to_bytes(self.values) if self.raw is None else self.raw


@dataclass
class Draft:
    """An OIP request before it is written."""

    entries: list[Entry]
    head: dict[str, Any] = field(default_factory=dict)  # id, outputs, parameters (and stray fields)
    header: bool = False  # send the binary header even with no binary input

    def encode(self) -> tuple[bytes, dict[str, str]]:
        head = {**({"id": self.head["id"]} if "id" in self.head else {}), "inputs": [e.json() for e in self.entries]}
        head.update({key: value for key, value in self.head.items() if key != "id"})
        text = json.dumps(head).encode("utf-8")
        buffers = [entry.bytes() for entry in self.entries if entry.binary]
        if not buffers and not self.header:
            return text, {"Content-Type": JSON_TYPE}
        return text + b"".join(buffers), {"Content-Type": OCTETS, HEADER: str(len(text))}

    def entry(self, name: str) -> Entry:
        return next(e for e in self.entries if e.name == name)


def holds(values: torch.Tensor, datatype: DataType) -> bool:
    """Whether every value survives a trip through ``datatype`` unchanged."""
    assert datatype.dtype is not None
    if values.numel() == 0:
        return True
    if datatype.kind in "ui":
        low, high = integer_limits(datatype)
        wide = values.to(torch.float64)
        return bool((wide == wide.round()).all()) and float(wide.min()) >= low and float(wide.max()) <= high
    if datatype.kind == "b":
        return bool(((values == 0) | (values == 1)).all())
    back = values.to(datatype.dtype).to(values.dtype)
    return bool(torch.equal(back, values))


# ------------------------------------------------------------------------------------------------ the grammar
class TensorGrammar:
    """Requests for one network; ``case(index)`` is a pure function of (seed, model, index).

    ``max_rows``: the rows one request may hold (the engine's ``max_rows_per_request``: 413 beyond it)."""

    def __init__(self, signature: Signature, seed: int = 0, max_rows: int = 1024, model: str = "network"):
        self.signature, self.seed, self.max_rows, self.model = signature, seed, max_rows, model
        self.productions = [(p, w) for p, w in self.weighted() if w > 0]

    def case(self, index: int) -> TensorCase:
        rng = random.Random(f"{self.seed}:{self.model}:{index}")
        if index < len(self.productions):  # the first cases walk every production once
            production = self.productions[index][0]
        else:
            production = rng.choices([p for p, _ in self.productions], [w for _, w in self.productions])[0]
        return replace(production(rng), index=index, production=production.__name__)

    def cases(self, count: int) -> list[TensorCase]:
        return [self.case(index) for index in range(count)]

    # ---------------------------------------------------------------------------------------- values
    def sizes(self, rng: random.Random) -> dict[str, int]:
        """A size for each dynamic symbol beyond the rows, within its range."""
        sizes: dict[str, int] = {}
        for spec in self.signature.inputs:
            for dim in spec.dims[1:]:
                if dim.symbol is not None and dim.symbol not in sizes:
                    high = dim.low + OPEN_HIGH if dim.high is None else min(dim.high, dim.low + 64)
                    sizes[dim.symbol] = rng.choice([dim.low, high, rng.randint(dim.low, high)])
        return sizes

    def rows(self, rng: random.Random) -> int:
        return rng.choice([1, 1, 2, 3, rng.randint(1, min(16, self.max_rows))])

    def shape(self, spec: TensorSpec, rows: int, sizes: Mapping[str, int]) -> tuple[int, ...]:
        rest = [d.size if d.size is not None else sizes[str(d.symbol)] for d in spec.dims[1:]]
        return (rows, *rest)

    def values(self, rng: random.Random, spec: TensorSpec, shape: tuple[int, ...]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(rng.randrange(2**32))
        kind = spec.datatype.kind
        if kind == "b":
            return torch.randint(0, 2, shape, generator=generator).bool()
        if kind in "ui":
            low, high = (spec.value_range.low, spec.value_range.high) if spec.value_range else (-50, 50)
            low = max(low, integer_limits(spec.datatype)[0])
            high = min(high, low + 2**40)  # torch.randint's bounds are int64
            ids = torch.randint(low, high + 1, shape, generator=generator)
            if ids.numel() and rng.random() < 0.3:  # the range's ends
                ids.view(-1)[rng.randrange(ids.numel())] = rng.choice([low, high])
            return ids.to(spec.dtype)
        scale = rng.choice([1.0, 1.0, 0.01, 10.0])
        values = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
        coarse = rng.random()
        if coarse < 0.1:  # whole numbers: integer datatypes carry them exactly
            values = values.round()
        elif coarse < 0.25:  # bfloat16's values: FP16 and BF16 carry them exactly (within their range)
            values = values.to(torch.bfloat16).to(torch.float64)
        return values.to(spec.dtype)

    def request_tensors(self, rng: random.Random, rows: int | None = None) -> dict[str, torch.Tensor]:
        rows = self.rows(rng) if rows is None else rows
        sizes = self.sizes(rng)
        return {s.name: self.values(rng, s, self.shape(s, rows, sizes)) for s in self.signature.inputs}

    # ---------------------------------------------------------------------------------------- OIP requests
    def wire_datatype(self, rng: random.Random, spec: TensorSpec, values: torch.Tensor, binary: bool) -> DataType:
        """The input's own datatype mostly; sometimes another that converts exactly and holds these values."""
        target = spec.datatype
        if rng.random() < 0.7:
            return target
        others = [
            d
            for d in DATATYPES.values()
            if d.dtype is not None and d != target and converts_exactly(d, target) and holds(values, d)
        ]
        if not binary:  # JSON carries numbers, not a type: an integer datatype only names integers
            others = [d for d in others if d.kind in "ui" and target.kind in "ui"]
        return rng.choice(others) if others else target

    def entry(self, rng: random.Random, spec: TensorSpec, values: torch.Tensor, binary: bool) -> Entry:
        datatype = self.wire_datatype(rng, spec, values, binary)
        assert datatype.dtype is not None
        return Entry(spec.name, values.to(datatype.dtype), datatype.name, binary, nested=rng.random() < 0.4)

    def outputs_asked(self, rng: random.Random, draft: Draft) -> tuple[Wanted, ...]:
        """The head's outputs and parameters (written into ``draft``), and the outputs the answer must hold."""
        default = rng.choice([None, True, False])
        if default is not None:
            draft.head["parameters"] = {"binary_data_output": default}
        outputs = list(self.signature.outputs)
        if rng.random() < 0.4:
            return tuple(Wanted(o.name, bool(default)) for o in outputs)
        chosen = rng.sample(outputs, rng.randint(1, len(outputs)))
        asked, wanted = [], []
        for spec in chosen:
            parameters: dict[str, Any] = {}
            binary = rng.choice([None, True, False])
            if binary is not None:
                parameters["binary_data"] = binary
            classes = self.classes(rng, spec)
            if classes:
                parameters["classification"] = classes
            asked.append({"name": spec.name, **({"parameters": parameters} if parameters else {})})
            wanted.append(Wanted(spec.name, bool(default) if binary is None else binary, classes, spec.labels))
        draft.head["outputs"] = asked
        return tuple(wanted)

    def classes(self, rng: random.Random, spec: TensorSpec) -> int:
        width = spec.dims[-1].size if spec.rank >= 2 else None
        return rng.randint(1, width) if width and rng.random() < 0.25 else 0

    def oip_draft(self, rng: random.Random, tensors: Mapping[str, torch.Tensor], binary: float) -> Draft:
        """An OIP request of ``tensors`` (inputs in any order), each binary with probability ``binary``."""
        specs = list(self.signature.inputs)
        rng.shuffle(specs)
        draft = Draft([self.entry(rng, s, tensors[s.name], rng.random() < binary) for s in specs])
        if rng.random() < 0.3:
            draft.head["id"] = rng.choice(["42", "", "req-ü", str(rng.randrange(10**9))])
        return draft

    def valid_case(
        self, rng: random.Random, dialect: str, tensors: dict[str, torch.Tensor] | None = None
    ) -> TensorCase:
        tensors = self.request_tensors(rng) if tensors is None else tensors
        if dialect == "native":
            return self.native_case(rng, tensors)
        draft = self.oip_draft(rng, tensors, 0.0 if dialect == "oip-json" else rng.choice([0.5, 1.0]))
        wanted = self.outputs_asked(rng, draft)
        draft.header = dialect == "oip-binary"
        body, headers = draft.encode()
        return TensorCase(
            0, "", dialect, body, headers, OK, tensors=tensors, outputs=wanted, request_id=draft.head.get("id")
        )

    def native_case(self, rng: random.Random, tensors: dict[str, torch.Tensor]) -> TensorCase:
        one_row = next(iter(tensors.values())).shape[0] == 1 and rng.random() < 0.4
        data = {name: (t[0] if one_row else t).tolist() for name, t in tensors.items()}
        body: dict[str, Any] = {"inputs": data}
        if len(data) == 1 and rng.random() < 0.3:  # one input: the list alone
            body["inputs"] = next(iter(data.values()))
        outputs = [o.name for o in self.signature.outputs]
        if rng.random() < 0.3:
            outputs = rng.sample(outputs, rng.randint(1, len(outputs)))
            body["outputs"] = outputs
        return TensorCase(
            0,
            "",
            "native",
            json.dumps(body).encode("utf-8"),
            {"Content-Type": JSON_TYPE},
            OK,
            tensors=tensors,
            outputs=tuple(Wanted(name) for name in outputs),
            one_row=one_row,
        )

    def refused(
        self, dialect: str, body: bytes | Draft, status: int = 400, names: tuple[str, ...] = (), headers=None
    ) -> TensorCase:
        if isinstance(body, Draft):
            body, headers = body.encode()
        return TensorCase(0, "", dialect, body, headers or {"Content-Type": JSON_TYPE}, ERROR, status, names)

    def bad_draft(self, rng: random.Random, rows: int | None = None, binary: float | None = None) -> Draft:
        """A valid OIP request to be made invalid (all outputs asked, so that only the inputs decide)."""
        share = rng.choice([0.0, 0.5, 1.0]) if binary is None else binary
        return self.oip_draft(rng, self.request_tensors(rng, rows), share)

    @staticmethod
    def dialect_of(draft: Draft) -> str:
        return "oip-binary" if any(e.binary for e in draft.entries) or draft.header else "oip-json"

    # ---------------------------------------------------------------------------------------- valid productions
    def good_oip_json(self, rng):
        return self.valid_case(rng, "oip-json")

    def good_oip_binary(self, rng):
        return self.valid_case(rng, "oip-binary")

    def good_native(self, rng):
        return self.valid_case(rng, "native")

    def good_at_max_rows(self, rng):
        return self.valid_case(rng, rng.choice(["oip-binary", "oip-json"]), self.request_tensors(rng, self.max_rows))

    def good_extremes(self, rng):
        """Finite values at float's edges: -0.0, subnormals, the largest finite float, values that round to 0."""
        tensors = self.request_tensors(rng)
        for spec in self.floats():
            finfo = torch.finfo(spec.dtype)
            specials = [-0.0, float(finfo.smallest_normal) / 4, float(finfo.tiny) / 2**10, float(finfo.max), -finfo.max]
            flat = tensors[spec.name].view(-1)
            for _ in range(rng.randint(1, max(1, flat.numel()))):
                flat[rng.randrange(flat.numel())] = rng.choice(specials)
        return self.valid_case(rng, rng.choice(["oip-binary", "oip-json", "native"]), tensors)

    def good_nan_allowed(self, rng):
        """NaN and Infinity where the signature allows them: answered (in binary) or 422 naming a JSON output."""
        tensors = self.request_tensors(rng)
        for spec in self.floats(allowed=True):
            flat = tensors[spec.name].view(-1)
            flat[rng.randrange(flat.numel())] = rng.choice([math.nan, math.inf, -math.inf])
        return self.valid_case(rng, rng.choice(["oip-binary", "oip-json"]), tensors)

    def good_json_numbers(self, rng):
        """JSON numbers a float input holds only once rounded: huge integers, numbers that round to 0, 17+ digits."""
        spec = rng.choice(self.floats())
        tensors = self.request_tensors(rng)
        flat = tensors[spec.name].view(-1)
        at = rng.randrange(flat.numel())
        flat[at] = MARKER
        case = self.valid_case(rng, rng.choice(["oip-json", "native"]), tensors)
        largest = float(torch.finfo(spec.dtype).max)
        odd = rng.choice([v for v in ODD_NUMBERS if abs(float(v)) <= largest])
        case.body = case.body.replace(json.dumps(MARKER).encode(), json.dumps(odd).encode(), 1)
        flat[at] = torch.tensor(float(odd), dtype=torch.float64).to(spec.dtype)  # as the server reads it
        return case

    def floats(self, allowed: bool | None = None) -> list[TensorSpec]:
        return [
            s for s in self.signature.inputs if s.datatype.kind == "f" and (allowed is None or s.allow_nan == allowed)
        ]

    def ints(self) -> list[TensorSpec]:
        return [s for s in self.signature.inputs if s.datatype.kind in "ui"]

    def native_duplicate_key(self, rng):
        """A JSON object repeating an input's key: Python's parser keeps the last (valid) value; a server may also
        refuse the repetition."""
        case = self.valid_case(rng, "native")
        body = json.loads(case.body)
        if not isinstance(body["inputs"], dict):
            body["inputs"] = {self.signature.inputs[0].name: body["inputs"]}
        name = rng.choice(list(body["inputs"]))
        first = json.dumps({name: "not a tensor"})[1:-1]
        text = json.dumps(body).replace('{"inputs": {', '{"inputs": {' + first + ", ", 1)
        return replace(case, body=text.encode("utf-8"), expect=EITHER)

    # ---------------------------------------------------------------------------------------- datatypes
    def bytes_datatype(self, rng):
        draft = self.bad_draft(rng)
        entry = rng.choice(draft.entries)
        entry.datatype = "BYTES"
        strings = [str(v).encode() for v in entry.values.reshape(-1).tolist()]
        if entry.binary:
            entry.raw = b"".join(struct.pack("<I", len(s)) + s for s in strings)
        else:
            entry.data = [s.decode() for s in strings]
        return self.refused(self.dialect_of(draft), draft, 400, (repr(entry.name),))

    def float_for_int(self, rng):
        """Floats sent to an integer input: FP32/FP64 named in JSON or binary, or JSON fractions."""
        if not self.ints():
            return self.bytes_datatype(rng)
        spec = rng.choice(self.ints())
        draft = self.bad_draft(rng)
        entry = draft.entry(spec.name)
        entry.datatype = rng.choice(["FP32", "FP64"])
        entry.values = entry.values.to(torch.float32 if entry.datatype == "FP32" else torch.float64)
        if rng.random() < 0.5 and entry.values.numel():
            entry.values = entry.values + 0.5
        return self.refused(self.dialect_of(draft), draft, 400, (repr(spec.name),))

    def narrowing_binary(self, rng):
        """Binary data of a type the input's cannot hold without loss: a wider float, an unsigned or wider integer."""
        draft = self.bad_draft(rng, binary=1.0)
        narrowed = []
        for entry in draft.entries:
            spec = self.signature.input(entry.name)
            assert spec is not None
            lossy = [
                d
                for d in DATATYPES.values()
                if d.dtype is not None and d.kind != "s" and not converts_exactly(d, spec.datatype)
            ]
            if lossy:
                narrowed.append((entry, rng.choice(lossy)))
        entry, datatype = rng.choice(narrowed)
        entry.datatype = datatype.name
        assert datatype.dtype is not None
        entry.values = entry.values.to(torch.float64).clamp(0, 1).round().to(datatype.dtype)
        return self.refused("oip-binary", draft, 400, (repr(entry.name),))

    def bool_byte(self, rng):
        draft = self.bad_draft(rng, binary=1.0)
        entry = rng.choice(draft.entries)
        entry.datatype = "BOOL"
        raw = bytearray(entry.values.reshape(-1).to(torch.float64).ne(0).to(torch.uint8).numpy().tobytes())
        if not raw:
            return self.bytes_datatype(rng)
        raw[rng.randrange(len(raw))] = rng.choice([2, 0xFF, 0x80])
        entry.values, entry.raw = entry.values.bool(), bytes(raw)
        return self.refused("oip-binary", draft, 400, (repr(entry.name),))

    # ---------------------------------------------------------------------------------------- shapes
    def wrong_rank(self, rng):
        draft = self.bad_draft(rng)
        entry = rng.choice(draft.entries)
        shape = list(entry.values.shape)
        if rng.random() < 0.5 or len(shape) < 2:
            entry.values = entry.values.reshape(*shape, 1) if rng.random() < 0.5 else entry.values.unsqueeze(0)
        else:
            entry.values = entry.values.reshape(*shape[:-2], shape[-2] * shape[-1])
        return self.refused(self.dialect_of(draft), draft, 400, (repr(entry.name),))

    def native_wrong_rank(self, rng):
        """An extra dimension; or, beside other inputs, one input alone without its rows dimension."""
        tensors = self.request_tensors(rng, rows=1)
        data = {name: t.tolist() for name, t in tensors.items()}
        name = rng.choice(list(data))
        if len(data) > 1 and rng.random() < 0.5:
            data[name] = tensors[name][0].tolist()
        else:
            data[name] = tensors[name].unsqueeze(-1).tolist()
        return self.refused("native", json.dumps({"inputs": data}).encode(), 400, (repr(name),))

    def wrong_width(self, rng):
        """A static size beyond the rows changed (0, one off, many more)."""
        static = [(s, a) for s in self.signature.inputs for a, d in enumerate(s.dims) if a and d.size is not None]
        if not static:
            return self.dim_out_of_range(rng)
        spec, axis = rng.choice(static)
        return self.resized(rng, {spec.name: {axis: self.other_size(rng, spec.dims[axis].size or 0)}}, spec.name)

    @staticmethod
    def other_size(rng: random.Random, size: int) -> int:
        return rng.choice([s for s in (0, size - 1, size + 1, size * 3 + 1) if s >= 0 and s != size])

    def dim_out_of_range(self, rng):
        """A dynamic size just outside the range it was exported for, in every input that shares it."""
        outside = [
            (s, a)
            for s in self.signature.inputs
            for a, d in enumerate(s.dims)
            if a and d.size is None and (d.low > 0 or d.high is not None)
        ]
        if not outside:
            return self.unequal_rows(rng) if len(self.signature.inputs) > 1 else self.zero_rows(rng)
        spec, axis = rng.choice(outside)
        dim = spec.dims[axis]
        above = None if dim.high is None else dim.high + 1
        size = rng.choice([v for v in (dim.low - 1, above) if v is not None and v >= 0])
        resize = {
            s.name: {a: size for a, d in enumerate(s.dims) if a and d.symbol == dim.symbol}
            for s in self.signature.inputs
        }
        first = next(s.name for s in self.signature.inputs if resize[s.name])  # checked in the signature's order
        return self.resized(rng, {name: axes for name, axes in resize.items() if axes}, first)

    def unequal_shared(self, rng):
        """Dimensions that share a symbol sent with different sizes (one input's changed)."""
        shared = [
            (s, a)
            for s in self.signature.inputs
            for a, d in enumerate(s.dims)
            if a and d.symbol and sum(x.symbol == d.symbol for t in self.signature.inputs for x in t.dims[1:]) > 1
        ]
        if not shared:
            return self.wrong_width(rng)
        spec, axis = rng.choice(shared)
        dim = spec.dims[axis]
        sizes = self.sizes(rng)
        current = sizes[str(dim.symbol)]
        candidates = [v for v in range(dim.low, (dim.high or dim.low + OPEN_HIGH) + 1) if v != current]
        if not candidates:
            return self.wrong_width(rng)
        return self.resized(rng, {spec.name: {axis: rng.choice(candidates)}}, spec.name, sizes)

    def resized(self, rng, changes, named, sizes=None) -> TensorCase:
        """A request whose inputs get the sizes ``changes`` says ({name: {axis: size}}), data consistent with them."""
        rows = self.rows(rng)
        sizes = self.sizes(rng) if sizes is None else sizes
        tensors = {}
        for spec in self.signature.inputs:
            shape = list(self.shape(spec, rows, sizes))
            for axis, size in changes.get(spec.name, {}).items():
                shape[axis] = size
            tensors[spec.name] = self.values(rng, spec, tuple(shape))
        return self.shaped(rng, tensors, 400, (repr(named),))

    def shaped(self, rng, tensors, status, names) -> TensorCase:
        """Tensors that do not fit the signature, sent in any dialect."""
        if rng.random() < 0.25:
            body = json.dumps({"inputs": {n: t.tolist() for n, t in tensors.items()}}).encode()
            return self.refused("native", body, status, names)
        draft = self.oip_draft(rng, tensors, rng.choice([0.0, 1.0]))
        return self.refused(self.dialect_of(draft), draft, status, names)

    def unequal_rows(self, rng):
        if len(self.signature.inputs) < 2:
            return self.zero_rows(rng)
        spec = rng.choice(self.signature.inputs[1:])
        return self.rows_apart(rng, spec)

    def rows_apart(self, rng, spec: TensorSpec) -> TensorCase:
        rows = self.rows(rng)
        sizes = self.sizes(rng)
        tensors = {s.name: self.values(rng, s, self.shape(s, rows, sizes)) for s in self.signature.inputs}
        other = rng.choice([r for r in (1, rows + 1, rows + 2) if r != rows])
        tensors[spec.name] = self.values(rng, spec, self.shape(spec, other, sizes))
        return self.shaped(rng, tensors, 400, (repr(spec.name),))

    def zero_rows(self, rng):
        tensors = self.request_tensors(rng, rows=1)
        tensors = {name: t[:0] for name, t in tensors.items()}
        draft = self.oip_draft(rng, tensors, rng.choice([0.0, 1.0]))
        return self.refused(self.dialect_of(draft), draft, 400, (repr(self.signature.inputs[0].name),))

    def too_many_rows(self, rng):
        rows = self.max_rows + rng.choice([1, 1, 7, self.max_rows])
        draft = self.oip_draft(rng, self.request_tensors(rng, rows), rng.choice([1.0, 1.0, 0.0]))
        return self.refused(self.dialect_of(draft), draft, 413)

    def huge_shape(self, rng):
        """A shape claiming billions of elements with a few values or bytes: refused from the shape alone."""
        draft = self.bad_draft(rng, rows=rng.choice([1, 2]))
        entry = rng.choice(draft.entries)
        shape = list(entry.values.shape)
        shape[rng.randrange(len(shape))] = rng.choice([10**9, 2**31, 2**40, 2**62])
        if rng.random() < 0.3:  # no element at all, so the data fits the shape, but its sizes are impossible
            shape = [0, *(rng.choice([10**12, 2**62]) for _ in shape[1:])]
            entry.values = entry.values.reshape(-1)[:0]
        entry.shape = shape
        return self.refused(self.dialect_of(draft), draft, 400, (repr(entry.name),))

    # ---------------------------------------------------------------------------------------- values
    def non_finite(self, rng):
        """NaN or Infinity in a float input that does not allow them: JSON tokens, or binary bits."""
        refusing = self.floats(allowed=False)
        if not refusing:
            return self.id_out_of_range(rng) if self.ranged() else self.bytes_datatype(rng)
        spec = rng.choice(refusing)
        tensors = self.request_tensors(rng)
        flat = tensors[spec.name].view(-1)
        flat[rng.randrange(flat.numel())] = rng.choice([math.nan, math.inf, -math.inf])
        if rng.random() < 0.25:
            body = json.dumps({"inputs": {n: t.tolist() for n, t in tensors.items()}}).encode()
            return self.refused("native", body, 400, (repr(spec.name),))
        draft = self.oip_draft(rng, tensors, rng.choice([0.0, 0.5, 1.0]))
        return self.refused(self.dialect_of(draft), draft, 400, (repr(spec.name),))

    def overflowing_json(self, rng):
        """A JSON number beyond the input's float type (1e308 into FP32 is Infinity): refused as non-finite."""
        narrow = [s for s in self.floats(allowed=False) if s.dtype != torch.float64]
        if not narrow:
            return self.non_finite(rng)
        spec = rng.choice(narrow)
        big = float(torch.finfo(spec.dtype).max) * 1.01
        draft = self.bad_draft(rng, binary=0.0)
        entry = draft.entry(spec.name)
        flat = entry.values.to(torch.float64).reshape(-1).tolist()
        flat[rng.randrange(len(flat))] = rng.choice([1e308, -1e308, big, -big, 1e39])
        entry.data = flat
        return self.refused("oip-json", draft, 400, (repr(spec.name),))

    def ranged(self) -> list[TensorSpec]:
        return [s for s in self.ints() if s.value_range is not None]

    def id_out_of_range(self, rng):
        """An id below 0, one past the table, int64's extremes or beyond int64, in any dialect."""
        if not self.ranged():
            return self.float_for_int(rng) if self.ints() else self.non_finite(rng)
        spec = rng.choice(self.ranged())
        assert spec.value_range is not None
        low, high = integer_limits(spec.datatype)
        candidates = [spec.value_range.low - 1, spec.value_range.high + 1, INT64_MAX, INT64_MIN, 2**63, -(2**63) - 1]
        bad = rng.choice(candidates)
        tensors = self.request_tensors(rng)
        flat = tensors[spec.name].reshape(-1).tolist()
        flat[rng.randrange(len(flat))] = bad
        dialect = rng.choice(["native", "oip"])
        fits = low <= bad <= high
        if dialect == "native":
            data = {n: t.tolist() for n, t in tensors.items()}
            data[spec.name] = np.array(flat, dtype=object).reshape(tensors[spec.name].shape).tolist()
            return self.refused("native", json.dumps({"inputs": data}).encode(), 400, (repr(spec.name),))
        draft = self.oip_draft(rng, tensors, 0.0 if not fits else rng.choice([0.0, 1.0]))
        entry = draft.entry(spec.name)
        if entry.binary:
            entry.values = torch.tensor(flat, dtype=spec.dtype).reshape(tensors[spec.name].shape)
            entry.datatype = spec.datatype.name
        else:
            entry.data = flat
        return self.refused(self.dialect_of(draft), draft, 400, (repr(spec.name),))

    # ---------------------------------------------------------------------------------------- binary framing
    def binary_sum_lies(self, rng):
        """The bytes after the head more or fewer than the binary_data_size say: names every binary input."""
        draft = self.bad_draft(rng, binary=1.0)
        body, headers = draft.encode()
        after = len(body) - int(headers[HEADER])  # the raw bytes: cutting only those keeps the head whole
        if rng.random() < 0.5 or after < 1:
            body = body + bytes(rng.randint(1, 9))
        else:
            body = body[: -rng.randint(1, min(3, after))]
        names = tuple(repr(e.name) for e in draft.entries if e.binary)
        return self.refused("oip-binary", body, 400, names, headers)

    def binary_size_shifted(self, rng):
        """Sizes that add up, but one input claims bytes of the next (or its own size lies about its shape)."""
        draft = self.bad_draft(rng, binary=1.0)
        first = draft.entries[0]
        own = len(first.bytes())
        shift = rng.choice([1, 4, -1, -4])
        if len(draft.entries) > 1 and own + shift >= 0 and len(draft.entries[1].bytes()) - shift >= 0:
            first.size = own + shift
            draft.entries[1].size = len(draft.entries[1].bytes()) - shift
        else:
            first.size = own + abs(shift)
            first.raw = first.bytes() + bytes(abs(shift))
        return self.refused("oip-binary", draft, 400, (repr(first.name),))

    def binary_size_malformed(self, rng):
        draft = self.bad_draft(rng, binary=1.0)
        entry = rng.choice(draft.entries)
        own = len(entry.bytes())
        entry.size = rng.choice([-1, -max(1, own), own + 0.5, float(own), str(own), True, [own]])
        return self.refused("oip-binary", draft, 400, (repr(entry.name),))

    def header_lies(self, rng):
        """The head's length beyond the body, negative, not an integer, empty."""
        draft = self.bad_draft(rng, binary=rng.choice([0.5, 1.0]))
        draft.header = True
        body, headers = draft.encode()
        headers[HEADER] = rng.choice(
            [str(len(body) + 1), str(len(body) * 10), "-1", "-0.5", "12.5", "abc", "1e3", "0x10", str(2**64)]
        )
        return self.refused("oip-binary", body, 400, (HEADER,), headers)

    def header_inside_head(self, rng):
        """The head's length short of the JSON, or past it into the raw bytes: the head is not JSON."""
        draft = self.bad_draft(rng, binary=1.0)
        body, headers = draft.encode()
        length = int(headers[HEADER])
        moved = [n for n in (1, length // 2, length - 1, length + 1, length + 4) if 0 < n <= len(body) and n != length]
        headers[HEADER] = str(rng.choice(moved))
        return self.refused("oip-binary", body, 400, (), headers)

    def binary_without_header(self, rng):
        draft = self.bad_draft(rng, binary=1.0)
        body, headers = draft.encode()
        del headers[HEADER]  # the raw bytes then follow the JSON as if they were part of it
        return self.refused("oip-binary", body, 400, (), headers)

    def truncated(self, rng):
        """A body cut short: in the raw bytes (sizes then lie), inside the head, or a JSON body."""
        draft = self.bad_draft(rng)
        body, headers = draft.encode()
        if HEADER not in headers:
            return self.refused("oip-json", body[: rng.randrange(1, len(body))], 400, (), headers)
        length = int(headers[HEADER])
        if len(body) > length and rng.random() < 0.7:
            cut = rng.randrange(length, len(body))
            names = tuple(repr(e.name) for e in draft.entries if e.binary)
            return self.refused("oip-binary", body[:cut], 400, names, headers)
        return self.refused("oip-binary", body[: rng.randrange(0, length)], 400, (HEADER,), headers)

    # ---------------------------------------------------------------------------------------- names and fields
    def unknown_input(self, rng):
        draft = self.bad_draft(rng)
        known = {s.name for s in self.signature.inputs}
        name = rng.choice([n for n in ("extra", "X", "input0", "x ", "ü", "inputs", "0") if n not in known])
        copy = replace(rng.choice(draft.entries), name=name, fields={})
        draft.entries.insert(rng.randrange(len(draft.entries) + 1), copy)
        if rng.random() < 0.25:
            data = {e.name: e.values.tolist() for e in draft.entries}
            return self.refused("native", json.dumps({"inputs": data}).encode(), 400, (repr(name),))
        return self.refused(self.dialect_of(draft), draft, 400, (repr(name),))

    def missing_input(self, rng):
        draft = self.bad_draft(rng)
        if len(draft.entries) == 1:  # OIP takes no empty inputs list; the native form names the missing input
            return self.refused("native", b'{"inputs": {}}', 400, (repr(draft.entries[0].name),))
        gone = draft.entries.pop(rng.randrange(len(draft.entries)))
        return self.refused(self.dialect_of(draft), draft, 400, (repr(gone.name),))

    def duplicate_input(self, rng):
        draft = self.bad_draft(rng)
        twice = rng.choice(draft.entries)
        draft.entries.insert(rng.randrange(len(draft.entries) + 1), replace(twice))
        return self.refused(self.dialect_of(draft), draft, 400, (repr(twice.name),))

    def bad_entry_field(self, rng):
        """A malformed field of one input entry: every refusal names the input."""
        draft = self.bad_draft(rng, binary=rng.choice([0.0, 1.0]))
        entry = rng.choice(draft.entries)
        change = rng.choice(
            [
                {"shape": "2"},
                {"shape": [1, -6]},
                {"shape": [1.5]},
                {"shape": None},
                {"datatype": rng.choice(["FLOAT32", "fp32", "int64", "", 5, None])},
                {"parameters": 3},
                {"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}},
                {"content": []},
            ]
        )
        entry.fields.update(change)
        if rng.random() < 0.3 and not entry.binary:  # both data and a binary size
            entry.fields = {"parameters": {"binary_data_size": 4}}
        return self.refused(self.dialect_of(draft), draft, 400, (repr(entry.name),))

    def bad_output_request(self, rng):
        """An output request the model cannot give: an unknown name, a classification it cannot make, a flag that
        is not a boolean; the refusal names the output."""
        draft = self.bad_draft(rng)
        spec = rng.choice(self.signature.outputs)
        width = spec.dims[-1].size if spec.rank >= 2 else None
        choices: list[tuple[dict[str, Any], str]] = [
            ({"name": "nope"}, "nope"),
            ({"name": spec.name, "parameters": {"classification": rng.choice([0, -1, 1.5, "2", True])}}, spec.name),
            ({"name": spec.name, "parameters": {"binary_data": rng.choice(["yes", 1, None])}}, spec.name),
            ({"name": spec.name, "extra": 1}, spec.name),
        ]
        if width:
            choices.append(({"name": spec.name, "parameters": {"classification": width + 1}}, spec.name))
        if spec.rank < 2:
            choices.append(({"name": spec.name, "parameters": {"classification": 1}}, spec.name))
        asked, name = rng.choice(choices)
        draft.head["outputs"] = [asked]
        return self.refused(self.dialect_of(draft), draft, 400, (repr(name),))

    def bad_request_field(self, rng):
        """Top-level fields: unknown, an id that is not a string, a binary_data_output that is not a boolean,
        inputs that are not a list of tensors."""
        draft = self.bad_draft(rng)
        draft.head.update(
            rng.choice(
                [
                    {"instances": [1]},
                    {"id": 42},
                    {"parameters": {"binary_data_output": "true"}},
                    {"parameters": []},
                    {"outputs": []},
                    {"outputs": {"name": self.signature.outputs[0].name}},
                ]
            )
        )
        return self.refused(self.dialect_of(draft), draft, 400)

    def bad_native(self, rng):
        """Native bodies whose values are not a tensor: strings, ragged lists, booleans for numbers, objects."""
        tensors = self.request_tensors(rng, rows=rng.choice([1, 2]))
        data = {n: t.tolist() for n, t in tensors.items()}
        spec = rng.choice(self.signature.inputs)
        rows = data[spec.name]
        bad = rng.choice(
            [
                lambda v: [str(r) for r in v],
                lambda v: [*v[:1], [*(v[0] if isinstance(v[0], list) else [v[0]]), 1]],
                lambda v: {"data": v},
                lambda v: None,
                lambda v: "1,2,3",
                lambda v: [[[[[[[[v]]]]]]]] if spec.datatype.kind == "b" else [True, 1.5],
            ]
        )
        data[spec.name] = bad(rows)
        return self.refused("native", json.dumps({"inputs": data}).encode(), 400, (repr(spec.name),))

    def odd_encoding(self, rng):
        """A valid body in UTF-16 (with or without its BOM) or after a UTF-8 BOM: JSON is UTF-8."""
        case = self.valid_case(rng, rng.choice(["oip-json", "native"]))
        encoding = rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-8-sig"])
        body = case.body.decode("utf-8").encode(encoding)
        content_type = rng.choice([JSON_TYPE, f"{JSON_TYPE}; charset={encoding.replace('-sig', '')}"])
        return self.refused(case.dialect, body, 400, (), {"Content-Type": content_type})

    def not_json(self, rng):
        body = rng.choice([b"", b" ", b"null", b"[]", b'"x"', b"{", bytes(rng.randrange(256) for _ in range(32))])
        return self.refused("oip-json", body, 400)

    # ---------------------------------------------------------------------------------------- weights
    def weighted(self) -> list[tuple[Callable[[random.Random], TensorCase], float]]:
        """(production, weight) pairs; the first cases walk them in this order."""
        return [
            (self.good_oip_json, 10),
            (self.good_oip_binary, 12),
            (self.good_native, 8),
            (self.good_at_max_rows, 0.5 if self.max_rows <= 4096 else 0),
            (self.good_extremes, 3 if self.floats() else 0),
            (self.good_nan_allowed, 2 if self.floats(allowed=True) else 0),
            (self.good_json_numbers, 2 if self.floats() else 0),
            (self.native_duplicate_key, 1),
            (self.bytes_datatype, 2),
            (self.float_for_int, 2 if self.ints() else 0),
            (self.narrowing_binary, 2),
            (self.bool_byte, 1),
            (self.wrong_rank, 2),
            (self.native_wrong_rank, 1),
            (self.wrong_width, 2),
            (self.dim_out_of_range, 2),
            (self.unequal_shared, 1),
            (self.unequal_rows, 1 if len(self.signature.inputs) > 1 else 0),
            (self.zero_rows, 1),
            (self.too_many_rows, 1),
            (self.huge_shape, 2),
            (self.non_finite, 2 if self.floats(allowed=False) else 0),
            (self.overflowing_json, 1 if self.floats(allowed=False) else 0),
            (self.id_out_of_range, 3 if self.ranged() else 0),
            (self.binary_sum_lies, 2),
            (self.binary_size_shifted, 1),
            (self.binary_size_malformed, 1),
            (self.header_lies, 2),
            (self.header_inside_head, 1),
            (self.binary_without_header, 1),
            (self.truncated, 2),
            (self.unknown_input, 1),
            (self.missing_input, 1),
            (self.duplicate_input, 1),
            (self.bad_entry_field, 2),
            (self.bad_output_request, 1),
            (self.bad_request_field, 1),
            (self.bad_native, 1),
            (self.odd_encoding, 1),
            (self.not_json, 1),
        ]


# ------------------------------------------------------------------------------------------------ the judge
Expected = dict[str, torch.Tensor] | RequestError | None


def reference(engine: NetworkEngine, case: TensorCase) -> Expected:
    """What ``engine`` answers this request alone, its tensors handed over as they are (no codec, no batch-mates):
    the outputs the case asks for (without the rows dimension where a native request left it out), or the engine's
    refusal; None for a case with no valid request in it."""
    if case.tensors is None:
        return None
    wires = {
        name: WireTensor(name, tuple(t.shape), datatype=of_dtype(t.dtype), raw=to_bytes(t))
        for name, t in case.tensors.items()
    }
    [answer] = engine.infer([wires])
    if isinstance(answer, RequestError):
        return answer
    return {w.name: answer[w.name][0] if case.one_row else answer[w.name] for w in case.outputs}


def header(headers: Mapping[str, str], name: str) -> str | None:
    return next((value for key, value in headers.items() if key.lower() == name.lower()), None)


def strict(payload: bytes) -> Any:
    """Strict JSON (UTF-8, no NaN or Infinity tokens); ValueError otherwise."""

    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(payload.decode("utf-8"), parse_constant=refuse)


def judge(
    case: TensorCase,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    expected: Expected,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> str | None:
    """Why this answer is not what the case requires, or None. ``expected``: :func:`reference` of the case."""
    if case.expect == ERROR:
        assert case.status is not None
        return refusal_problem(status, body, case.status, case.names)
    if not isinstance(expected, dict):
        if case.expect == EITHER and 400 <= status < 500:
            return refusal_problem(status, body, status, ())
        why = expected.message if isinstance(expected, RequestError) else "no reference"
        return f"the grammar meant this request to be valid, but the engine refuses it alone: {why}"
    unwritable = [w.name for w in case.outputs if not (w.binary or w.classification) and not finite(expected[w.name])]
    if unwritable and case.expect == OK:  # JSON cannot carry NaN or Infinity: the first such output is named
        return refusal_problem(status, body, 422, (repr(unwritable[0]),))
    if case.expect == EITHER and 400 <= status < 500:
        return refusal_problem(status, body, status, ())
    if status != 200:
        return f"{status} {body[:300]!r}; a valid request must be answered 200"
    try:
        if case.protocol == "native":
            return native_problem(case, body, expected, rtol, atol)
        return oip_problem(case, headers, body, expected, rtol, atol)
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as error:
        return f"the answer cannot be read as the protocol writes one: {type(error).__name__}: {error}"[:400]


def finite(tensor: torch.Tensor) -> bool:
    return not tensor.is_floating_point() or bool(torch.isfinite(tensor).all())


def refusal_problem(status: int, body: bytes, want: int, names: tuple[str, ...]) -> str | None:
    if status != want:
        return f"{status} {body[:300]!r}; expected {want}"
    try:
        message = error_message(strict(body))
    except (ValueError, UnicodeDecodeError) as error:
        return f"the refusal is not strict JSON ({error}): {body[:200]!r}"
    if not isinstance(message, str) or not message.strip():
        return f"the refusal has no message: {body[:200]!r}"
    missing = [name for name in names if name not in message]
    return f"the message does not name {', '.join(missing)}: {message!r}" if missing else None


def values_problem(where: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> str | None:
    if tuple(got.shape) != tuple(want.shape):
        return f"{where}: shape {list(got.shape)}, the reference's {list(want.shape)}"
    if not want.is_floating_point():
        same = got.reshape(-1).tolist() == want.reshape(-1).tolist()
        return None if same else f"{where}: {got.reshape(-1).tolist()[:8]}..., the reference's {want.reshape(-1)[:8]}"
    a, b = got.to(torch.float64).numpy(), want.to(torch.float64).numpy()
    if np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True):
        return None
    worst = np.unravel_index(np.nanargmax(np.abs(a - b)), a.shape) if a.size else ()
    return f"{where}: {a[worst]!r} at {list(map(int, worst))}, the reference's {b[worst]!r}"


def native_problem(case: TensorCase, body: bytes, expected: dict[str, torch.Tensor], rtol, atol) -> str | None:
    answer = strict(body)
    if not isinstance(answer, dict) or set(answer) != {"outputs"} or not isinstance(answer["outputs"], dict):
        return f"expected {{'outputs': {{name: values}}}}, got {body[:200]!r}"
    outputs = answer["outputs"]
    if set(outputs) != {w.name for w in case.outputs}:
        return f"outputs {sorted(outputs)}, asked for {[w.name for w in case.outputs]}"
    for wanted in case.outputs:
        want = expected[wanted.name]
        got = torch.tensor(outputs[wanted.name], dtype=torch.float64 if want.is_floating_point() else None)
        problem = values_problem(f"output {wanted.name!r}", got.reshape(got.shape), want, rtol, atol)
        if problem:
            return problem
    return None


def oip_problem(
    case: TensorCase, headers: Mapping[str, str], body: bytes, expected: dict[str, torch.Tensor], rtol, atol
) -> str | None:
    length = header(headers, HEADER)
    if (length is not None) != any(w.binary for w in case.outputs):
        return f"{HEADER} {'sent' if length else 'missing'}; binary outputs asked: {[w.binary for w in case.outputs]}"
    head, rest = (body[: int(length)], memoryview(body)[int(length) :]) if length else (body, memoryview(b""))
    answer = strict(head)
    problem = head_problem(case, answer)
    if problem:
        return problem
    offset = 0
    for wanted, entry in zip(case.outputs, answer["outputs"], strict=True):
        raw = None
        if wanted.binary:
            size = entry["parameters"]["binary_data_size"]
            raw, offset = rest[offset : offset + size], offset + size
        problem = output_problem(wanted, entry, raw, expected[wanted.name], rtol, atol)
        if problem:
            return problem
    return None if offset == len(rest) else f"{len(rest) - offset} bytes after the binary outputs"


def head_problem(case: TensorCase, answer: Any) -> str | None:
    if not isinstance(answer, dict) or not isinstance(answer.get("outputs"), list):
        return f"expected the protocol's answer object, got {str(answer)[:200]}"
    if not isinstance(answer.get("model_name"), str) or not isinstance(answer.get("model_version"), str):
        return f"model_name and model_version must be strings: {str(answer)[:200]}"
    if answer.get("id") != case.request_id:
        return f"id {answer.get('id')!r}, the request's {case.request_id!r}"
    names = [o.get("name") if isinstance(o, dict) else o for o in answer["outputs"]]
    if names != [w.name for w in case.outputs]:
        return f"outputs {names}, asked for {[w.name for w in case.outputs]}"
    return None


def output_problem(
    wanted: Wanted, entry: dict[str, Any], raw: memoryview | None, want: torch.Tensor, rtol, atol
) -> str | None:
    where = f"output {wanted.name!r}"
    if wanted.classification:
        return classes_problem(wanted, entry, raw, want)
    if entry["datatype"] != of_dtype(want.dtype).name or entry["shape"] != list(want.shape):
        return f"{where}: {entry['datatype']} {entry['shape']}, the reference's {of_dtype(want.dtype).name} "
    if ("data" in entry) == wanted.binary:
        return f"{where}: asked {'in binary' if wanted.binary else 'in JSON'}, answered otherwise: {str(entry)[:200]}"
    if raw is not None:
        got = from_bytes(raw, DATATYPES[entry["datatype"]], tuple(entry["shape"]))
    else:
        got = torch.tensor(entry["data"], dtype=torch.float64 if want.is_floating_point() else None)
        got = got.reshape(entry["shape"])
    return values_problem(where, got, want, rtol, atol)


def class_strings(entry: dict[str, Any], raw: memoryview | None) -> list[str]:
    if raw is None:
        return list(entry["data"])
    texts, at = [], 0
    while at < len(raw):
        (size,) = struct.unpack("<I", raw[at : at + 4])
        texts.append(bytes(raw[at + 4 : at + 4 + size]).decode("utf-8"))
        at += 4 + size
    return texts


def classes_problem(wanted: Wanted, entry: dict[str, Any], raw: memoryview | None, want: torch.Tensor) -> str | None:
    """Each row's k classes: distinct indices, best first, their scores the reference's, none left out better than
    the last one kept, the label the signature gives."""
    k, where = wanted.classification, f"output {wanted.name!r} classification"
    if entry["datatype"] != "BYTES" or entry["shape"] != [*want.shape[:-1], k]:
        return f"{where}: {entry['datatype']} {entry['shape']}, expected BYTES {[*want.shape[:-1], k]}"
    texts = class_strings(entry, raw)
    rows = want.to(torch.float64).reshape(-1, want.shape[-1])
    if len(texts) != rows.shape[0] * k:
        return f"{where}: {len(texts)} strings for {rows.shape[0]} rows of {k}"
    for row, scores in enumerate(rows):
        problem = class_row_problem(texts[row * k : (row + 1) * k], scores, wanted.labels)
        if problem:
            return f"{where} row {row}: {problem}"
    return None


def class_row_problem(texts: list[str], scores: torch.Tensor, labels: tuple[str, ...] | None) -> str | None:
    parts = [text.split(":") for text in texts]
    if any(len(p) != (3 if labels else 2) for p in parts):
        return f"{texts} are not score:index{':label' if labels else ''}"
    indices = [int(p[1]) for p in parts]
    if len(set(indices)) != len(indices) or not all(0 <= i < len(scores) for i in indices):
        return f"indices {indices} are not distinct classes"
    if labels and [p[2] for p in parts] != [labels[i] for i in indices]:
        return f"labels {[p[2] for p in parts]} are not those of indices {indices}"
    if scores.isnan().any():
        return None  # NaN has no order: the strings' form is all there is to check
    said = [float(p[0]) for p in parts]
    true = [float(scores[i]) for i in indices]
    if not np.allclose(said, true, rtol=1e-5, atol=1e-6):
        return f"scores {said}, the reference's {true} for those classes"
    left = [float(s) for i, s in enumerate(scores) if i not in indices]
    if true != sorted(true, reverse=True) or (left and max(left) > min(true) + 1e-6 * max(1.0, abs(min(true)))):
        return f"{texts} are not the best classes, best first (scores {scores.tolist()})"
    return None
