"""Sparse (SPLADE) encoders: a sentence-transformers ``SparseEncoder`` folder, Transformer (masked-LM head) ->
SpladePooling; one weight per vocabulary entry, almost all zero, the same as ``SparseEncoder.encode()``.

A computed row is kept (and cached, and answered) as its non-zero entries, largest first: ``(token ids, weights)``.
The folder's ``max_active_dims`` keeps only that many, as ``encode()`` does; a request may keep fewer (its top_k).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from handlers.core.http import RequestView
from handlers.text.cache import CachedRow
from handlers.text.dialects import tei
from handlers.text.folder import FolderError, TextModelFolder
from handlers.text.kinds.base import Case, Reference
from handlers.text.kinds.sentence_transformers import MODEL_CONFIG, SentenceTransformersKind
from handlers.text.modules import SpladeModule
from handlers.text.requests.common import RequestContext
from handlers.text.requests.embedding import TextPreparation
from handlers.text.requests.sparse import format_sparse_answer, parse_sparse_request
from handlers.text.routes import Route
from handlers.text.rows import Row, RowOptions
from handlers.text.tokenization import ServedTokenizer

SparseRow = tuple[torch.Tensor, torch.Tensor]  # (token ids int64, weights fp32), weights largest first


def sparse_row(weights: torch.Tensor, keep: int | None = None) -> SparseRow:
    """The non-zero entries of a [vocabulary] row, largest first (ties by id), at most ``keep`` of them."""
    weights = weights.to(torch.float32)
    ids = torch.nonzero(weights > 0).flatten()  # ascending ids, so a stable sort keeps ties in id order
    values, order = torch.sort(weights[ids], descending=True, stable=True)
    return ids[order][:keep].to(torch.long), values[:keep].contiguous()


def dense_row(row: SparseRow, size: int) -> torch.Tensor:
    out = torch.zeros(size, dtype=torch.float32)
    out[row[0]] = row[1]
    return out


class SparseEncoderReference(Reference):
    def __init__(self, folder: Path, info: TextModelFolder) -> None:
        from sentence_transformers import SparseEncoder

        self.model: Any = SparseEncoder(str(folder), device="cpu", trust_remote_code=info.remote_code)
        self.body = self.model[0].auto_model

    def answer(self, case: Case) -> Any:
        prompt = {"prompt_name": case.prompt_name} if case.prompt_name else {"prompt": ""}
        encoded = self.model.encode([case.text], convert_to_tensor=True, batch_size=1, **prompt)
        return encoded.to_dense()[0].float().cpu()


class SparseKind(SentenceTransformersKind):
    name = "sparse"
    reference_library = "sentence-transformers SparseEncoder.encode()"
    model_types = ("SparseEncoder",)
    task = "fill-mask"
    value_layout = "sparse"

    def read_folder(self, folder: Path, trust_remote_code: bool) -> TextModelFolder:
        saved = self.read_saved(folder, trust_remote_code)
        if len(saved.head) != 1 or not isinstance(saved.head[0], SpladeModule):
            raise self.refuse_chain(saved, "Transformer (fill-mask) -> SpladePooling")
        vocabulary = saved.files.config.get("vocab_size")
        if type(vocabulary) is not int or vocabulary < 1:
            raise FolderError("config.json", f"vocab_size {vocabulary!r} is not a positive integer", "save it again")
        keep = saved.model_config.get("max_active_dims")
        if keep is not None and (type(keep) is not int or keep < 1):
            raise FolderError(MODEL_CONFIG, f"max_active_dims {keep!r} is not a positive integer", "fix or remove it")
        return self.folder_info(saved, vocabulary, max_active_dims=keep)

    def load_reference(self, folder: Path, info: TextModelFolder) -> Reference:
        return SparseEncoderReference(folder, info)

    def served_row(self, info: TextModelFolder, tokenizer: ServedTokenizer, case: Case) -> tuple[Row, RowOptions]:
        preparation = TextPreparation(dict(info.prompts), info.default_prompt_name, info.lowercase)
        prompt = info.prompts.get(case.prompt_name, "") if case.prompt_name else ""
        return preparation.apply([case.text], prompt)[0], RowOptions()

    def routes(self) -> tuple[Route, ...]:
        return (*super().routes(), tei.EMBED_SPARSE)

    def parse_request(self, api: RequestContext, body: Any, request: RequestView) -> Any:
        return parse_sparse_request(api, body, request.content_type)

    def answer(self, api: RequestContext, payload: Any, rows: list[CachedRow]) -> Any:
        return format_sparse_answer(api, payload, rows)

    def row_value(
        self, info: TextModelFolder, output: torch.Tensor, row: int, tokens: Sequence[int], options: RowOptions
    ) -> Any:
        return sparse_row(output[row], info.max_active_dims)

    def parity(self, info: TextModelFolder, expected: list[Any], ours: list[Any]) -> float:
        """Cosine of the weight vectors (ours as served: after the folder's max_active_dims, as encode() keeps
        them)."""
        kept = [dense_row(value, info.output_size) for value in ours]
        return self.similarity(info, torch.stack([torch.as_tensor(e).float() for e in expected]), torch.stack(kept))

    def check_value(self, info: TextModelFolder, value: Any) -> bool:
        ids, weights = value
        return bool(
            ids.numel() == weights.numel()
            and (ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < info.output_size))
            and torch.isfinite(weights).all()
            and (weights > 0).all()
            and len(set(ids.tolist())) == ids.numel()
        )

    def options_defaults(self) -> dict[str, Any]:
        return {**super().options_defaults(), "max_request_tokens": 8192}

    def describe(self, info: TextModelFolder) -> dict[str, Any]:
        return {**super().describe(info), "vocabulary": info.output_size, "max_active_dims": info.max_active_dims}
