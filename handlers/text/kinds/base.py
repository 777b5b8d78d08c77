"""What a kind of text model is, as one class: everything in which an embedding model, a classifier, a sparse and a
multi-vector encoder differ, and nothing in which they do not.

The engine (handlers/text/engine.py: caches, one tokenizer call, length buckets, compiled backends, the accuracy
gate; handlers/text/batch.py) calls these methods and never branches on a kind's name. A kind:

- reads its folder (:meth:`TextKind.read_folder`: which files it needs, what its modules compute, which transformers
  class family its body loads as, its output size),
- loads the library the model was trained with and its answer per reference case, for the package-time parity check
  (:meth:`load_reference`, :meth:`reference_cases`, :meth:`parity`; scripts/prepare_text_model.py),
- measures how close a candidate backend computes to eager fp32 (:meth:`similarity`, the accuracy gate),
- turns one row of the model's output into what is cached and answered (:meth:`row_value`), and checks a value read
  back from the shared cache tier (:meth:`check_value`),
- describes itself (:meth:`describe`), parses its own body and shapes its answer (its request module under
  handlers/text/requests/), and lists the API dialects it speaks (:meth:`routes`: rows of handlers/text/dialects/).

Adding a kind is one subclass here plus its request module, registered in handlers/text/kinds/__init__.py KINDS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from handlers.core import runtime
from handlers.text.dialects import tei
from handlers.text.folder import TextModelFolder
from handlers.text.routes import Route
from handlers.text.rows import Row, RowOptions

if TYPE_CHECKING:
    from handlers.core.http import RequestView
    from handlers.text.cache import CachedRow
    from handlers.text.requests.common import RequestContext
    from handlers.text.tokenization import ServedTokenizer


class Reference:
    """A reference library's model of a folder: the transformers module inside it, and its answer per case."""

    body: Any  # the transformers model the library loaded (its class is what the worker loads)

    def answer(self, case: Case) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Case:
    """One reference input of the parity check: a text (or a pair), and the prompt and task it is encoded with."""

    text: str
    pair: str | None = None
    prompt_name: str | None = None
    task: str | None = None


class TextKind:
    name: ClassVar[str]
    reference_library: ClassVar[str]  # what the parity check compares with, for messages and model_source.json
    default_min_cosine: ClassVar[float] = 0.999  # the accuracy gate's bound unless handler.min_cosine says
    gate_measure: ClassVar[str] = "row cosine"
    value_layout: ClassVar[str] = "vector"  # how a computed row is kept: one fp32 row, "sparse" or "matrix"
    pools_windows: ClassVar[bool] = False  # a long text's windows may be pooled into one row (handlers/text/windows.py)

    # ------------------------------------------------------------------------------------------- the folder
    def read_folder(self, folder: Path, trust_remote_code: bool) -> TextModelFolder:
        raise NotImplementedError

    def reference_cases(self, info: TextModelFolder, sentences: list[str]) -> list[Case]:
        """The inputs the accuracy gate and the parity check compute: the reference sentences as they are."""
        return [Case(text) for text in sentences]

    def served_row(self, info: TextModelFolder, tokenizer: ServedTokenizer, case: Case) -> tuple[Row, RowOptions]:
        """A case as the served path computes it: the row the tokenizer reads and its options (the request module
        turns a request's texts into rows the same way)."""
        return (case.text if case.pair is None else (case.text, case.pair)), RowOptions()

    def load_reference(self, folder: Path, info: TextModelFolder) -> Reference:
        """The reference library's model of the folder (package time only; imports that library)."""
        raise NotImplementedError

    def parity(self, info: TextModelFolder, expected: list[Any], ours: list[Any]) -> float:
        """How close the served values (:meth:`row_value` of the project's fp32 module, one unpadded case at a time)
        are to the reference library's answers for the same cases (1.0 = the same); the bound is
        scripts/prepare_text_model.py's."""
        return self.similarity(
            info, torch.stack([torch.as_tensor(e).float() for e in expected]), torch.stack(ours).float()
        )

    def resolve(self, info: TextModelFolder, tokenizer: ServedTokenizer) -> TextModelFolder:
        """What the folder says that only the tokenizer can turn into ids (a multi-vector model's skip list)."""
        return info

    # ------------------------------------------------------------------------------------------- the gate
    def similarity(
        self, info: TextModelFolder, expected: torch.Tensor, got: torch.Tensor, mask: torch.Tensor | None = None
    ) -> float:
        """The accuracy gate's measure between a candidate's output and eager fp32's (1.0 = identical)."""
        return runtime.min_cosine_similarity(expected, got)

    # ------------------------------------------------------------------------------------------- answers
    def row_value(
        self, info: TextModelFolder, output: torch.Tensor, row: int, tokens: Sequence[int], options: RowOptions
    ) -> Any:
        """What one computed row caches and answers, from the forward pass's output and the row's token ids."""
        return output[row].clone()

    def check_value(self, info: TextModelFolder, value: Any) -> bool:
        """Whether a value read back from the shared cache tier is one this model could have computed."""
        vector = value
        if not bool(torch.isfinite(vector).all()):
            return False
        return not info.normalized or abs(float(vector.norm()) - 1.0) <= 1e-3

    # ------------------------------------------------------------------------------------------- requests
    def routes(self) -> tuple[Route, ...]:
        """The API surfaces this kind serves (handlers/text/routes.py): its own body at the model's URL and the
        tokenizer's routes (TEI's); a kind adds the rows of the dialects whose clients it answers
        (handlers/text/dialects/)."""
        return (Route("", self.parse_request, self.answer, api="this project's own"), *tei.TOKENIZER)

    def parse_request(self, api: RequestContext, body: Any, request: RequestView) -> Any:
        """One request's body at the model's own URL validated into its payload (a handlers.text.batch.RowsRequest),
        or RequestError."""
        raise NotImplementedError

    def answer(self, api: RequestContext, payload: Any, rows: list[CachedRow]) -> Any:
        """The answer to one request from its computed rows, in its own order."""
        raise NotImplementedError

    def package_records(
        self, folder: Path, info: TextModelFolder, cases: list[Case], values: list[Any]
    ) -> dict[str, Any]:
        """Files this kind adds to the staged folder from the fp32 values of the reference cases (package time), and
        what model_source.json records about them."""
        return {}

    def allowed_dimensions(self, info: TextModelFolder, configured: list[int]) -> tuple[int, ...] | None:
        """The sizes a request may cut its vectors to (an embedding model's Matryoshka sizes); none by default."""
        return ()

    def describe_requests(self, api: RequestContext) -> dict[str, Any]:
        """What describe adds about the options requests have (an embedding model's sizes and calibration)."""
        return {}

    def describe(self, info: TextModelFolder) -> dict[str, Any]:
        return {
            "kind": info.kind,
            "architecture": info.model_type,
            "engine": info.engine,
            "body": info.body_class,
            "max_tokens": info.max_tokens,
            "remote_code": info.remote_code,
        }

    def options_defaults(self) -> dict[str, Any]:
        """handler: option defaults of this kind that differ from the text engine's."""
        return {"min_cosine": self.default_min_cosine}
