"""Compressed embeddings: the types a request may ask for (OpenAI's ``encoding_format``, Cohere's
``embedding_types``), each computed from the served float32 vector at answer time, and the calibration int8/uint8
are scaled with.

- ``float``: the float32 values; ``base64``: their little-endian float32 bytes, base64 (what OpenAI's client asks for).
- ``int8`` / ``uint8``: per dimension, the value's place between that dimension's smallest and largest value over the
  calibration sentences, in 256 steps (0..255, and for int8 minus 128), values outside a range clipped to its ends:
  sentence-transformers' ``quantize_embeddings`` with those ranges.
- ``binary`` / ``ubinary``: one bit per dimension, 1 where the value is positive, packed 8 to a byte, first dimension
  in the highest bit (numpy's ``packbits``), as Cohere packs them: ``ubinary`` the bytes 0..255, ``binary`` each byte
  minus 128 (-128..127). A vector whose size is not a multiple of 8 is padded with 0 bits.

The calibration is computed at package time (scripts/prepare_text_model.py): the project's fp32 vectors of the
archive's reference sentences, stored in the archive as ``calibration.safetensors``. Ranges for a vector cut to fewer
dimensions (``dimensions``) come from the calibration vectors cut (and re-normalised) the same way.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

CALIBRATION_FILE = "calibration.safetensors"
FLOAT_TYPES = ("float", "base64")
INTEGER_TYPES = ("int8", "uint8")
BIT_TYPES = ("binary", "ubinary")
EMBEDDING_TYPES = (*FLOAT_TYPES, *INTEGER_TYPES, *BIT_TYPES)


@dataclass
class Calibration:
    """The reference sentences' fp32 vectors (as served, before any cut), from which int8/uint8 ranges are taken."""

    vectors: torch.Tensor  # [sentences, dimension] float32
    _ranges: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def sentences(self) -> int:
        return int(self.vectors.shape[0])

    def ranges(self, dimensions: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
        """(smallest, largest) value per dimension of the calibration vectors cut to ``dimensions`` (and re-normalised
        where the served cut is)."""
        key = (dimensions, normalize)
        if key not in self._ranges:
            vectors = cut(self.vectors, dimensions, normalize).numpy()
            self._ranges[key] = (vectors.min(axis=0), vectors.max(axis=0))
        return self._ranges[key]

    def describe(self) -> dict[str, Any]:
        low, high = self.ranges(int(self.vectors.shape[1]), False)
        return {
            "file": CALIBRATION_FILE,
            "sentences": self.sentences,
            "min": [float(value) for value in low],
            "max": [float(value) for value in high],
        }


def load_calibration(model_dir: str | Path, dimension: int) -> Calibration | None:
    """The archive's calibration, or None (an archive packaged before calibration existed; a model whose calibration
    does not match its vectors is treated alike: int8/uint8 are then refused, naming the fix)."""
    path = Path(model_dir) / CALIBRATION_FILE
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    vectors = load_file(str(path)).get("vectors")
    if vectors is None or vectors.dim() != 2 or vectors.shape[1] != dimension or vectors.shape[0] < 2:
        return None
    return Calibration(vectors.to(torch.float32))


def write_calibration(folder: Path, vectors: list[torch.Tensor]) -> dict[str, Any]:
    """Store the calibration vectors in the staged folder; what model_source.json records about them."""
    from safetensors.torch import save_file

    stacked = torch.stack([vector.to(torch.float32) for vector in vectors]).contiguous()
    save_file({"vectors": stacked}, str(folder / CALIBRATION_FILE))
    return {"file": CALIBRATION_FILE, "sentences": int(stacked.shape[0]), "dimension": int(stacked.shape[1])}


def cut(vectors: torch.Tensor, dimensions: int, normalize: bool) -> torch.Tensor:
    """The first ``dimensions`` values of each row, re-normalised to unit length where ``normalize``."""
    vectors = vectors[..., :dimensions].to(torch.float32)
    if normalize:
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    return vectors


def quantize(vectors: np.ndarray, kind: str, ranges: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """float32 rows [n, d] as ``kind`` (int8, uint8, binary or ubinary); int8/uint8 need the calibration's ranges."""
    if kind in BIT_TYPES:
        packed = np.packbits(vectors > 0, axis=-1)
        return packed if kind == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    if ranges is None:
        raise ValueError(f"{kind} needs calibration ranges")
    low, high = ranges
    steps = (high - low) / 255
    steps = np.where(steps == 0, 1, steps)
    steps_taken = np.clip(np.floor((vectors - low) / steps), 0, 255)
    return (steps_taken - 128).astype(np.int8) if kind == "int8" else steps_taken.astype(np.uint8)


def float32_base64(vector: np.ndarray) -> str:
    """A row's little-endian float32 bytes, base64 (OpenAI's ``encoding_format: "base64"``, Cohere's ``base64``)."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
