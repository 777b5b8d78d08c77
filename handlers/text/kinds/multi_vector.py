"""Multi-vector (ColBERT-style, late-interaction) encoders: a sentence-transformers ``MultiVectorEncoder`` folder; one
vector per scored token, the same as ``MultiVectorEncoder.encode_query()`` / ``encode_document()``.

Served module chains: Transformer, then Dense and Normalize on the token vectors and a MultiVectorMask, as saved. A
text is encoded as a query or a document (the request says; a document by default): the folder's "query" or
"document" prompt goes in front, the folder's ``query_length`` / ``document_length`` truncate it, and for the tasks
the mask names its skip-listed tokens (punctuation, for PyLate's models) are dropped from the answer. Query expansion
(padding queries with expansion tokens) is refused when the folder is read (handlers/text/modules.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from handlers.core.http import RequestView
from handlers.text.cache import CachedRow
from handlers.text.folder import TextModelFolder
from handlers.text.kinds.base import Case, Reference
from handlers.text.kinds.sentence_transformers import SentenceTransformersKind, hidden_width
from handlers.text.modules import TOKENS, DenseModule, MultiVectorMaskModule, NormalizeModule
from handlers.text.requests.common import RequestContext
from handlers.text.requests.multi_vector import format_multi_vector_answer, parse_multi_vector_request, prepared
from handlers.text.rows import Row, RowOptions

if TYPE_CHECKING:
    from handlers.text.tokenization import ServedTokenizer

TASKS = ("query", "document")
SERVED_CHAIN = "Transformer, then Dense and Normalize on the token vectors and at most one MultiVectorMask"


class MultiVectorReference(Reference):
    def __init__(self, folder: Path, info: TextModelFolder) -> None:
        from sentence_transformers import MultiVectorEncoder

        self.model: Any = MultiVectorEncoder(str(folder), device="cpu", trust_remote_code=info.remote_code)
        self.body = self.model[0].auto_model

    def answer(self, case: Case) -> Any:
        encode = self.model.encode_query if case.task == "query" else self.model.encode_document
        return encode([case.text], batch_size=1)[0].float().cpu()


class MultiVectorKind(SentenceTransformersKind):
    name = "multi-vector"
    reference_library = "sentence-transformers MultiVectorEncoder.encode_query() / encode_document()"
    model_types = ("MultiVectorEncoder",)
    gate_measure = "token cosine"
    value_layout = "matrix"

    def read_folder(self, folder: Path, trust_remote_code: bool) -> TextModelFolder:
        saved = self.read_saved(folder, trust_remote_code)
        width = hidden_width(saved.files.config) or 0
        normalized = False
        masks = [module for module in saved.head if isinstance(module, MultiVectorMaskModule)]
        for module in saved.head:
            if isinstance(module, DenseModule) and module.target == TOKENS and module.in_features == width:
                width, normalized = module.out_features, False
            elif isinstance(module, NormalizeModule) and module.target == TOKENS:
                normalized = True
            elif not isinstance(module, MultiVectorMaskModule):
                raise self.refuse_chain(saved, SERVED_CHAIN)
        if len(masks) > 1 or not width:
            raise self.refuse_chain(saved, SERVED_CHAIN)
        mask = masks[0] if masks else MultiVectorMaskModule("", (), ("document",))
        return self.folder_info(
            saved,
            width,
            normalized=normalized,
            skiplist_words=mask.skiplist_words,
            skiplist_tasks=mask.skiplist_tasks,
        )

    def reference_cases(self, info: TextModelFolder, sentences: list[str]) -> list[Case]:
        return [Case(text, task=task) for task in TASKS for text in sentences]

    def served_row(self, info: TextModelFolder, tokenizer: ServedTokenizer, case: Case) -> tuple[Row, RowOptions]:
        rows, options = prepared(info, [case.text], case.task or "document")
        return rows[0], options[0]

    def parse_request(self, api: RequestContext, body: Any, request: RequestView) -> Any:
        return parse_multi_vector_request(api, body, request.content_type)

    def answer(self, api: RequestContext, payload: Any, rows: list[CachedRow]) -> Any:
        return format_multi_vector_answer(api, payload, rows)

    def load_reference(self, folder: Path, info: TextModelFolder) -> Reference:
        return MultiVectorReference(folder, info)

    def resolve(self, info: TextModelFolder, tokenizer: ServedTokenizer) -> TextModelFolder:
        """Skip-listed words as token ids (a word that is not one token of the vocabulary is dropped, as
        sentence-transformers drops it)."""
        ids = [tokenizer.tokenizer.token_to_id(word) for word in info.skiplist_words]
        return replace(info, skiplist_ids=frozenset(i for i in ids if i is not None))

    def scored(self, info: TextModelFolder, tokens: Sequence[int], options: RowOptions) -> torch.Tensor:
        """Which of a row's tokens are scored: all, but skip-listed ones for the tasks the mask names."""
        keep = torch.ones(len(tokens), dtype=torch.bool)
        if info.skiplist_ids and (options.task or "document") in info.skiplist_tasks:
            keep = torch.tensor([token not in info.skiplist_ids for token in tokens], dtype=torch.bool)
        return keep

    def row_value(
        self, info: TextModelFolder, output: torch.Tensor, row: int, tokens: Sequence[int], options: RowOptions
    ) -> Any:
        return output[row, : len(tokens)][self.scored(info, tokens, options)].clone()

    def parity(self, info: TextModelFolder, expected: list[Any], ours: list[Any]) -> float:
        """The smallest cosine of any token's vector; 0 where a case's scored token count differs."""
        worst = 1.0
        for reference, got in zip(expected, ours, strict=True):
            if tuple(reference.shape) != tuple(got.shape):
                return 0.0
            worst = min(worst, float(torch.nn.functional.cosine_similarity(reference, got, dim=-1).min()))
        return worst

    def similarity(
        self, info: TextModelFolder, expected: torch.Tensor, got: torch.Tensor, mask: torch.Tensor | None = None
    ) -> float:
        cosines = torch.nn.functional.cosine_similarity(expected.float(), got.float(), dim=-1)
        if mask is not None:
            cosines = cosines[mask.bool()]
        return float(cosines.min()) if cosines.numel() else 1.0

    def check_value(self, info: TextModelFolder, value: Any) -> bool:
        if value.dim() != 2 or value.shape[1] != info.output_size or not bool(torch.isfinite(value).all()):
            return False
        return not info.normalized or bool(((value.norm(dim=-1) - 1).abs() <= 1e-3).all())

    def options_defaults(self) -> dict[str, Any]:
        # A cached row is every scored token's vector (a 256-token document at 128 floats is 128 KiB).
        return {**super().options_defaults(), "cache_size": 512, "max_request_tokens": 8192}

    def describe(self, info: TextModelFolder) -> dict[str, Any]:
        return {
            **super().describe(info),
            "dimension": info.output_size,
            "task_lengths": dict(info.task_lengths),
            "skiplist_words": list(info.skiplist_words),
        }
