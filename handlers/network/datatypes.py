"""The Open Inference Protocol's tensor datatypes and their torch dtypes, and which conversions lose nothing.

The OIP (KServe v2) names a tensor's element type with one of the strings below; BYTES (length-prefixed strings) has
no torch dtype, so a network's tensors are never BYTES (the codec still frames them in a request body to refuse them
by name). Binary tensor data is little-endian and row-major, as Triton's binary extension sends it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DataType:
    name: str  # as the protocol spells it
    dtype: torch.dtype | None  # None: BYTES
    kind: str  # "b" bool, "u" unsigned, "i" signed, "f" floating, "s" strings
    bits: int  # bits per element (0 for BYTES, whose elements vary)

    @property
    def itemsize(self) -> int:
        return self.bits // 8


_TABLE = (
    DataType("BOOL", torch.bool, "b", 8),
    DataType("UINT8", torch.uint8, "u", 8),
    DataType("UINT16", torch.uint16, "u", 16),
    DataType("UINT32", torch.uint32, "u", 32),
    DataType("UINT64", torch.uint64, "u", 64),
    DataType("INT8", torch.int8, "i", 8),
    DataType("INT16", torch.int16, "i", 16),
    DataType("INT32", torch.int32, "i", 32),
    DataType("INT64", torch.int64, "i", 64),
    DataType("FP16", torch.float16, "f", 16),
    DataType("FP32", torch.float32, "f", 32),
    DataType("FP64", torch.float64, "f", 64),
    DataType("BF16", torch.bfloat16, "f", 16),
    DataType("BYTES", None, "s", 0),
)
DATATYPES: dict[str, DataType] = {datatype.name: datatype for datatype in _TABLE}
_BY_DTYPE: dict[torch.dtype, DataType] = {d.dtype: d for d in _TABLE if d.dtype is not None}


def named(name: str) -> DataType | None:
    """The datatype a request names (exactly as the protocol spells it), or None."""
    return DATATYPES.get(name) if isinstance(name, str) else None


def of_dtype(dtype: torch.dtype) -> DataType:
    """The protocol's datatype of a torch dtype; ValueError for one it has no name for (complex, float8, ...)."""
    try:
        return _BY_DTYPE[dtype]
    except KeyError:
        raise ValueError(f"{dtype} has no Open Inference Protocol datatype") from None


def converts_exactly(source: DataType, target: DataType) -> bool:
    """Whether every value of ``source`` becomes a ``target`` value without changing kind or losing range: the same
    type, bool to anything numeric, an integer to a wider integer that holds all its values, an integer to a float
    (the values a client sends as integers to a float input), a float to a wider float. Never float to integer,
    signed to unsigned, or a narrowing (FP64 to FP32: send FP32; bf16 and fp16 hold different values)."""
    if source == target:
        return True
    if source.kind == "s" or target.kind == "s":
        return False
    if source.kind == "b":
        return True
    if target.kind == "f":
        if source.kind == "f":
            return target.bits > source.bits
        return True
    if source.kind == "f" or target.kind == "b":
        return False
    if source.kind == target.kind:
        return target.bits >= source.bits
    return source.kind == "u" and target.kind == "i" and target.bits > source.bits


def from_bytes(raw: bytes | memoryview, datatype: DataType, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``shape`` from its little-endian row-major bytes (whose length the caller has checked)."""
    assert datatype.dtype is not None, "BYTES has no tensor"
    if len(raw) == 0:
        return torch.empty(shape, dtype=datatype.dtype)
    # A writable copy: torch warns on (and must not write into) the request's read-only buffer.
    return torch.frombuffer(bytearray(raw), dtype=datatype.dtype).reshape(shape)


def to_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's elements as little-endian row-major bytes (the binary extension's layout)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def extremes(tensor: torch.Tensor) -> tuple[int, int]:
    """The smallest and largest value of a non-empty integer tensor, as Python ints (numpy: torch has no min/max for
    uint16..uint64)."""
    values = tensor.detach().to("cpu").numpy()
    return int(np.min(values)), int(np.max(values))


def integer_limits(datatype: DataType) -> tuple[int, int]:
    """The range an integer datatype holds."""
    if datatype.kind not in "ui" or datatype.dtype is None:
        raise ValueError(f"{datatype.name} is not an integer datatype")
    info = torch.iinfo(datatype.dtype)
    return int(info.min), int(info.max)
