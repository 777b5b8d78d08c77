"""What every embedding dialect shares (handlers/text/dialects/: the project's own body, OpenAI, Cohere, TEI): how a
text becomes the model's input (:class:`TextPreparation`: the folder's prompts and lower-casing), what the served
vectors allow a request to ask for (:class:`VectorSpace`: sizes, re-normalisation of a cut, int8/uint8 calibration),
and the answered vectors in each encoding (handlers/text/quantization.py's types).

``prompt_name`` picks one of the model's named prompts (config_sentence_transformers.json), as sentence-transformers'
``encode(prompt_name=...)`` does; without it the model's default prompt applies, if it has one; ``null`` asks for
none. A size (OpenAI's ``dimensions``, Cohere's ``output_dimension``) cuts each vector to its first N values
(re-normalised where the model normalises) where the model declares that size; its own size is always accepted.
Fields that would change the answer and that cannot be honoured are refused instead of silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from handlers.core.errors import RequestError, ServerError, shown
from handlers.core.http import float32_list
from handlers.text.folder import TextModelFolder
from handlers.text.modules import NormalizeModule
from handlers.text.quantization import INTEGER_TYPES, Calibration, cut, float32_base64, quantize
from handlers.text.requests.common import RequestContext
from handlers.text.rows import RowOptions
from handlers.text.tokenization import ServedTokenizer
from handlers.text.windows import WindowedRequest, pool_windows, split_texts
from handlers.text.windows import WindowRow as EmbeddingRow  # one text's computed row as an answer needs it


@dataclass(frozen=True)
class TextPreparation:
    """How the model's own folder says a text becomes its input: a named prompt in front (sentence-transformers'
    ``encode(prompt_name=...)``), lower-casing (sentence_bert_config.json ``do_lower_case``), and, where the pooling
    leaves the prompt out (``include_prompt: false``), the prompt's token count (``prompt_tokens``)."""

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    lowercase: bool = False
    prompt_tokens: Callable[[str], int] | None = None

    def prompt(self, body: dict[str, Any]) -> str:
        """The prompt a request picked: 'prompt_name' (null: none), else the model's default prompt, else none."""
        if "prompt_name" not in body:
            return self.prompts.get(self.default_prompt_name, "") if self.default_prompt_name else ""
        name = body["prompt_name"]
        if name is None:
            return ""
        if not isinstance(name, str):
            raise RequestError(f"'prompt_name' must be a string or null, got {type(name).__name__}")
        if name not in self.prompts:
            shown = name if len(name) <= 64 else name[:64] + "..."
            known = f"this model's prompts are {sorted(self.prompts)}" if self.prompts else "this model has none"
            raise RequestError(f"'prompt_name' {shown!r} is not a prompt of this model; {known}")
        return self.prompts[name]

    def prepared(self, prompt: str) -> str:
        """The prompt as it stands in front of each text that :meth:`apply` prepares."""
        return prompt.lower() if self.lowercase and prompt else prompt

    def apply(self, texts: list[str], prompt: str) -> list[str]:
        texts = [prompt + text for text in texts] if prompt else texts
        return [text.lower() for text in texts] if self.lowercase else texts

    def options(self, count: int, prompt: str) -> list[RowOptions] | None:
        """Each row's options: the prompt's token count where the pooling leaves it out, else the defaults."""
        if self.prompt_tokens is None or not prompt:
            return None
        length = self.prompt_tokens(prompt.lower() if self.lowercase else prompt)
        return [RowOptions(prompt_length=length)] * count


NO_PROMPTS = TextPreparation()


@dataclass(frozen=True)
class VectorSpace:
    """What the served vectors allow a request to ask for: their size, the shorter sizes the model declares
    (``sizes``; None: any size, for a folder with ``truncate_dim``), whether its modules normalise (a cut vector is
    then re-normalised) and the calibration int8/uint8 are scaled with."""

    dimension: int
    sizes: tuple[int, ...] | None = ()
    normalizes: bool = False
    calibration: Calibration | None = None

    def check_size(self, value: Any, name: str) -> int | None:
        """The size a request cuts to (None: the model's own)."""
        if value is None:
            return None
        if type(value) is int and value == self.dimension:
            return None
        if type(value) is int and 1 <= value < self.dimension and (self.sizes is None or value in self.sizes):
            return value
        if self.sizes is None:
            served = f"any size from 1 to {self.dimension}"
        elif self.sizes:
            served = f"{sorted({*self.sizes, self.dimension})}"
        else:
            raise RequestError(
                f"'{name}' {shown(value)} is not supported: this model's embeddings have a fixed {self.dimension} "
                f"dimensions (send {self.dimension} or leave '{name}' out)"
            )
        raise RequestError(f"'{name}' {shown(value)} is not supported: this model serves {served} dimensions")

    def check_types(self, types: Sequence[str], name: str) -> None:
        for kind in types:
            if kind in INTEGER_TYPES and self.calibration is None:
                raise RequestError(
                    f"'{name}' {kind!r} needs the model's int8 calibration, which this archive lacks: package the "
                    f"model again (python -m scripts.package) to serve {kind}; float, base64, binary and ubinary work"
                )


FIXED = VectorSpace(0)


NON_FINITE = "the model produced a non-finite number (NaN or Infinity); no answer was sent"


class CutVectors(Protocol):
    """What a request says about its answered vectors: the size to cut to (None: the model's own) and whether each
    answered vector is made unit length (a cut of a normalising model; TEI's normalize)."""

    @property
    def dimensions(self) -> int | None: ...

    @property
    def normalize(self) -> bool: ...


def answered_vectors(request: CutVectors, rows: Sequence[EmbeddingRow]) -> torch.Tensor:
    """The request's rows as answered: cut to its size and re-normalised where it asks."""
    vectors = torch.stack([row.value.detach().to("cpu", torch.float32) for row in rows])
    if request.dimensions is not None or request.normalize:
        vectors = cut(vectors, request.dimensions or vectors.shape[-1], request.normalize)
    return vectors


def answered_array(request: CutVectors, rows: Sequence[EmbeddingRow]) -> np.ndarray | ServerError:
    """The answered vectors as one float32 array, or the server error that refuses a non-finite one (never NaN as
    bytes or integers: what to_json refuses for floats)."""
    vectors = answered_vectors(request, rows)
    if not bool(torch.isfinite(vectors).all()):
        return ServerError(NON_FINITE)
    return vectors.numpy()


def encoded_as(array: np.ndarray, kind: str, request: CutVectors, space: VectorSpace) -> list[Any]:
    """Each answered row as ``kind``, scaled (int8/uint8) for the vectors the request asked for."""
    return encoded(array, kind, space, request.dimensions is not None and request.normalize)


def encoded(vectors: np.ndarray, kind: str, space: VectorSpace, normalized_cut: bool) -> list[Any]:
    """Each row as ``kind`` (one of EMBEDDING_TYPES)."""
    if kind == "float":
        return [float32_list(vector) for vector in vectors]
    if kind == "base64":
        return [float32_base64(vector) for vector in vectors]
    ranges = None
    if kind in INTEGER_TYPES:
        if space.calibration is None:
            raise ValueError("int8/uint8 without a calibration (refused when parsed)")
        ranges = space.calibration.ranges(vectors.shape[-1], normalized_cut)
    return quantize(vectors, kind, ranges).tolist()


def vector_space(api: RequestContext) -> VectorSpace:
    """What the served vectors allow requests to ask for (sizes, re-normalisation of a cut, the calibration)."""
    normalizes = any(isinstance(module, NormalizeModule) for module in api.info.head)
    return VectorSpace(api.info.output_size, api.dimensions, normalizes, api.calibration)


def text_preparation(info: TextModelFolder, tokenizer: ServedTokenizer) -> TextPreparation:
    """How the folder says a text becomes the model's input (:class:`TextPreparation`)."""
    prompt_tokens = tokenizer.prompt_length if info.excludes_prompt else None
    return TextPreparation(dict(info.prompts), info.default_prompt_name, info.lowercase, prompt_tokens)


class LongInputRequest(WindowedRequest, Protocol):
    """An embedding request that may ask for windows: the mode it asked for (or the model's default) and the prompt
    its parser put in front of each text, as prepared (repeated in front of each window)."""

    long_input: str
    prompt: str


def split_long_texts(api: RequestContext, request: LongInputRequest) -> None:
    """Where the request asked for windows (handlers/text/windows.py), its texts become their windows' rows."""
    if request.long_input != "windows" or api.windows is None:
        return
    prompt_tokens = api.tokenizer.prompt_length(request.prompt) if request.prompt else 0
    split_texts(request, api.tokenizer, api.windows, request.prompt, prompt_tokens)


def text_rows(api: RequestContext, request: LongInputRequest, rows: Sequence[EmbeddingRow]) -> list[EmbeddingRow]:
    """One row per text of the request: a windowed text's windows pooled (unit length where the model's own module
    chain makes its vectors unit length); every other request's rows as they are."""
    if request.windows is None:
        return list(rows)
    return pool_windows(rows, request.windows, api.info.normalized)
