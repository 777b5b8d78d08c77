"""The head of a sentence-transformers chain as data: one frozen spec per module after the ``Transformer`` (what its
folder's config.json says), read by handlers/text/modules.py ``read_chain`` and computed by its torch steps.

The specs sit below both modules.py and folder.py, so the folder description (:class:`TextModelFolder` holds the head)
can ask what a module does without importing the readers, which themselves report problems as folder errors.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolingModule:
    path: str
    modes: tuple[str, ...]
    include_prompt: bool
    dimension: int  # the token embedding width it expects


@dataclass(frozen=True)
class DenseModule:
    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a class path, e.g. torch.nn.modules.activation.Tanh
    target: str  # modules.SENTENCE or modules.TOKENS
    residual: bool


@dataclass(frozen=True)
class LayerNormModule:
    path: str
    dimension: int


@dataclass(frozen=True)
class NormalizeModule:
    path: str
    target: str


@dataclass(frozen=True)
class SpladeModule:
    path: str
    strategy: str  # max | sum
    activation: str  # relu | log1p_relu


@dataclass(frozen=True)
class MultiVectorMaskModule:
    path: str
    skiplist_words: tuple[str, ...]
    skiplist_tasks: tuple[str, ...]


HeadModule = PoolingModule | DenseModule | LayerNormModule | NormalizeModule | SpladeModule | MultiVectorMaskModule
