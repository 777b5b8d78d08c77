"""Triton's binary tensor extension to the Open Inference Protocol: the framing of a body that carries raw tensors.

Such a body is a JSON head followed by raw bytes. The ``Inference-Header-Content-Length`` header says how many bytes
the head takes; each binary input then says in ``parameters.binary_data_size`` how many of the following bytes are
its own, in the order the inputs are listed. An answer is framed the same way, the header saying the head's length.
Here: splitting a request body, cutting its buffers (every size checked against what is there), joining an answer,
and the BYTES element layout (a 4-byte little-endian length before each string).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from handlers.core.errors import RequestError

HEADER = "Inference-Header-Content-Length"


def head_length(value: object, body_length: int) -> int:
    """The header's value as the JSON head's length in bytes; refused (400) unless it is an integer in
    [0, body length]."""
    text = value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)
    try:
        length = int(text.strip())
    except ValueError:
        raise RequestError(
            f"header {HEADER} must be an integer (the JSON head's length in bytes), got {text!r}"
        ) from None
    if length < 0:
        raise RequestError(f"header {HEADER} is {length}: a length cannot be negative")
    if length > body_length:
        raise RequestError(f"header {HEADER} is {length}, beyond the body's {body_length} bytes")
    return length


def split(body: bytes, header_value: object) -> tuple[bytes, memoryview]:
    """(the JSON head, the bytes after it)."""
    length = head_length(header_value, len(body))
    view = memoryview(body)
    return bytes(view[:length]), view[length:]


def cut(rest: memoryview, sizes: Sequence[tuple[str, int]]) -> dict[str, memoryview]:
    """Each binary input's bytes, in order; refused (400) unless the sizes add up to exactly the bytes there are."""
    total = sum(size for _, size in sizes)
    if total != len(rest):
        said = ", ".join(f"{name!r}: {size}" for name, size in sizes) or "no binary input"
        raise RequestError(
            f"the inputs' binary_data_size add up to {total} bytes ({said}), but {len(rest)} bytes follow the "
            f"JSON head ({HEADER})"
        )
    buffers: dict[str, memoryview] = {}
    start = 0
    for name, size in sizes:
        buffers[name] = rest[start : start + size]
        start += size
    return buffers


def join(head: bytes, buffers: Sequence[bytes]) -> tuple[bytes, dict[str, str]]:
    """An answer's body and headers: the head alone when nothing is binary, else head + buffers with the header."""
    if not buffers:
        return head, {}
    return b"".join([head, *buffers]), {HEADER: str(len(head))}


def encode_strings(strings: Sequence[bytes]) -> bytes:
    """BYTES elements as the extension lays them out: each string after its 4-byte little-endian length."""
    return b"".join(struct.pack("<I", len(s)) + s for s in strings)
