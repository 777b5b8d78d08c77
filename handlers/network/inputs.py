"""One request's tensors as they came (:class:`WireTensor`, whatever the dialect) checked against the signature into
the tensors the program takes. Each refusal is a :class:`RequestError` that names the input and the problem.

Checks, in order: the input names; the shape (rank, static sizes, dynamic sizes within the range the program was
exported for, dimensions that share a symbol equal, the same number of rows in every input, rows within the limit:
413 beyond it); the datatype (a conversion that loses nothing, :func:`datatypes.converts_exactly`; JSON numbers are
decimal text, so any JSON number fits a float input and a JSON integer fits an integer input whose range holds it,
but a JSON fraction never fits an integer input); the values (NaN and Infinity refused unless the signature allows
them; ids within their range).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from handlers.core.errors import RequestError, too_large
from handlers.network.datatypes import DataType, converts_exactly, extremes, from_bytes, integer_limits
from handlers.network.signature import Signature, TensorSpec

KIND_WORDS = {"b": "booleans", "i": "integers", "f": "numbers with a fraction or exponent"}
JSON_TYPES = {type(None): "null", dict: "an object", str: "a string", list: "a list"}


@dataclass(frozen=True)
class WireTensor:
    """One input as a request carried it, before any check against the signature."""

    name: str
    shape: tuple[int, ...]
    datatype: DataType | None = None  # as the client named it (None: the native form, which names none)
    values: list[Any] | None = None  # JSON data, flat, row-major: bools, ints or floats only (the codec checked)
    kind: str = ""  # JSON data: "b" booleans, "i" integers, "f" any number with a fraction ("" when empty)
    raw: bytes | memoryview | None = None  # binary data (its length checked against the shape by the codec)
    one_row: bool = False  # native form: the rows dimension may be left out (one row, answered without it)


@dataclass(frozen=True)
class Checked:
    """A request's tensors as the program takes them, in the signature's order, with the rows first."""

    tensors: tuple[torch.Tensor, ...]
    rows: int
    one_row: bool  # sent without the rows dimension: its answer leaves it out too

    def group_key(self) -> tuple[tuple[int, ...], ...]:
        """Requests whose tensors agree beyond the rows share one forward pass."""
        return tuple(tuple(t.shape[1:]) for t in self.tensors)


def json_values(data: Any, where: str) -> tuple[list[Any], tuple[int, ...], str]:
    """(the values, flat and row-major; the nesting's shape; "b", "i", "f" or "" for none): nested lists of one
    kind of JSON value, every list at one depth of one length."""
    try:
        array = np.asarray(data, dtype=object)
    except ValueError:  # deeper than numpy's 64 dimensions
        raise RequestError(f"{where}: data is nested too deeply") from None
    flat = array.reshape(-1).tolist()
    types = set(map(type, flat))
    if types <= {bool}:
        return flat, array.shape, "b" if flat else ""
    if types <= {int}:
        return flat, array.shape, "i"
    if types <= {int, float}:
        return flat, array.shape, "f"
    if list in types:
        raise RequestError(f"{where}: data holds nested lists of unequal lengths (a tensor's rows are all one length)")
    if bool in types:
        raise RequestError(f"{where}: data mixes booleans and numbers")
    if str in types:
        raise RequestError(f"{where}: data holds strings (BYTES) where numbers are expected")
    odd = next(t for t in types if t not in (bool, int, float))
    raise RequestError(f"{where}: data holds {JSON_TYPES.get(odd, odd.__name__)} where numbers are expected")


def kind_words(kind: str) -> str:
    return KIND_WORDS[kind]


def native_tensor(name: str, data: Any) -> WireTensor:
    """An input in the native JSON form: nested lists whose nesting is the shape (one row may leave out the rows)."""
    flat, shape, kind = json_values(data, f"input {name!r}")
    return WireTensor(name=name, shape=shape, values=flat, kind=kind, one_row=True)


def check_request(wires: Mapping[str, WireTensor], signature: Signature, max_rows: int) -> Checked:
    check_names(wires, signature)
    one_row = omits_rows(wires, signature)
    shapes = {spec.name: ((1,) if one_row else ()) + wires[spec.name].shape for spec in signature.inputs}
    rows = check_shapes(shapes, signature)
    if rows > max_rows:
        raise too_large(f"the request has {rows} rows; at most {max_rows} are accepted in one request")
    tensors = []
    for spec in signature.inputs:
        tensor = to_tensor(wires[spec.name], spec, shapes[spec.name])
        check_values(tensor, spec)
        tensors.append(tensor)
    return Checked(tensors=tuple(tensors), rows=rows, one_row=one_row)


def check_names(wires: Mapping[str, WireTensor], signature: Signature) -> None:
    expected = [spec.name for spec in signature.inputs]
    missing = [name for name in expected if name not in wires]
    if missing:
        raise RequestError(f"input {missing[0]!r} is missing; the model takes {expected}")
    unknown = sorted(set(wires) - set(expected))
    if unknown:
        raise RequestError(f"unknown input {unknown[0]!r}; the model takes {expected}")


def omits_rows(wires: Mapping[str, WireTensor], signature: Signature) -> bool:
    """Whether a native request sent one row without its rows dimension (every input, or none, may)."""
    short = [
        spec.name
        for spec in signature.inputs
        if wires[spec.name].one_row and len(wires[spec.name].shape) == spec.rank - 1
    ]
    if short and len(short) != len(signature.inputs):
        full = next(spec.name for spec in signature.inputs if spec.name not in short)
        raise RequestError(
            f"input {short[0]!r} is one row without the rows dimension, but input {full!r} is not: send every input "
            "with its rows dimension, or every input as one row"
        )
    return bool(short)


def check_shapes(shapes: Mapping[str, tuple[int, ...]], signature: Signature) -> int:
    """The request's rows, once every input's shape fits its spec and shared dimensions agree."""
    seen: dict[str, tuple[int, str]] = {}  # symbol -> (size, where it was first seen)
    for spec in signature.inputs:
        shape = shapes[spec.name]
        if len(shape) != spec.rank:
            raise RequestError(
                f"input {spec.name!r} has {len(shape)} dimensions (shape {list(shape)}); the model takes "
                f"{spec.rank}: [{', '.join(['rows', *(d.describe() for d in spec.dims[1:])])}]"
            )
        for axis, (size, dim) in enumerate(zip(shape, spec.dims, strict=True)):
            where = f"input {spec.name!r} dimension {axis}"
            if axis and not dim.admits(size):
                kind = "" if dim.size is not None else f" (the range it was exported for: {dim.describe()})"
                raise RequestError(f"{where} is {size}; the model takes {dim.describe()}{kind}")
            if dim.symbol is not None:
                first = seen.setdefault(dim.symbol, (size, where))
                if first[0] != size:
                    what = "rows" if axis == 0 else "size"
                    raise RequestError(f"{where} is {size} but {first[1]} is {first[0]}: the {what} must be equal")
    rows = shapes[signature.inputs[0].name][0]
    if rows < 1:
        raise RequestError(f"input {signature.inputs[0].name!r} has no rows")
    return rows


def to_tensor(wire: WireTensor, spec: TensorSpec, shape: tuple[int, ...]) -> torch.Tensor:
    """The input's values as a tensor of the spec's dtype, if they convert without loss."""
    target = spec.datatype
    if wire.raw is not None and wire.datatype is not None:
        if not converts_exactly(wire.datatype, target):
            raise RequestError(
                f"input {spec.name!r} is {target.name}; {wire.datatype.name} data would not convert without loss: "
                f"send {target.name}"
            )
        return from_bytes(wire.raw, wire.datatype, shape).to(spec.dtype)
    return json_tensor(wire, spec, target, shape)


def json_tensor(wire: WireTensor, spec: TensorSpec, target: DataType, shape: tuple[int, ...]) -> torch.Tensor:
    values = wire.values or []
    kind = wire.kind
    if wire.datatype is not None and wire.datatype.kind == "f":
        kind = "f"  # integers sent as FP32 are floats all the same: never for an integer input
    accepted = {"b": "b", "u": "i", "i": "i", "f": "if"}[target.kind]
    if values and kind.replace("u", "i") not in accepted:
        raise RequestError(f"input {spec.name!r} is {target.name}; the request sent {kind_words(kind)}")
    if target.kind in "ui" and values:
        low, high = integer_limits(target)
        smallest, largest = min(values), max(values)
        if smallest < low or largest > high:
            bad = smallest if smallest < low else largest
            raise RequestError(f"input {spec.name!r} is {target.name}, which holds {low}..{high}; got {bad}")
        return torch.from_numpy(np.array(values, dtype=np_dtype(spec.dtype))).reshape(shape)
    try:
        tensor = torch.tensor(values, dtype=torch.float64 if target.kind == "f" else torch.bool)
    except (OverflowError, RuntimeError):
        raise RequestError(f"input {spec.name!r} holds an integer too large for {target.name}") from None
    return tensor.to(spec.dtype).reshape(shape)


def np_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def check_values(tensor: torch.Tensor, spec: TensorSpec) -> None:
    if tensor.numel() == 0:
        return
    if tensor.is_floating_point() and not spec.allow_nan:
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            at = first_index(~finite)
            raise RequestError(
                f"input {spec.name!r} holds {float(tensor[at])} at {list(at)}: NaN, Infinity and values beyond "
                f"{spec.datatype.name}'s range are refused (a signature file may allow NaN and Infinity: "
                f"inputs.{spec.name}.allow_nan)"
            )
    value_range = spec.value_range
    if value_range is not None:
        smallest, largest = extremes(tensor)
        if smallest < value_range.low or largest > value_range.high:
            bad = smallest if smallest < value_range.low else largest
            at = tuple(int(i) for i in np.argwhere(tensor.numpy() == bad)[0])
            raise RequestError(
                f"input {spec.name!r} holds {bad} at {list(at)}; it takes ids in [{value_range.low}, "
                f"{value_range.high}] ({value_range.source})"
            )


def first_index(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])
