"""Embedding models: a sentence-transformers ``SentenceTransformer`` folder; one vector per text, the same vector as
``SentenceTransformer.encode()``.

Served module chains: Transformer -> Pooling (any of sentence-transformers' modes, ``include_prompt`` either way),
then any sequence of Dense (with its activation), LayerNorm and Normalize on the pooled row, as saved (LaBSE,
sentence-T5/GTR and EmbeddingGemma put a Dense after pooling; a decoder embedder such as Qwen3-Embedding pools the
last token). A ``truncate_dim`` in config_sentence_transformers.json cuts every vector as ``encode()`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from handlers.core.http import RequestView
from handlers.text.cache import CachedRow
from handlers.text.dialects import cohere, native, openai, tei
from handlers.text.folder import FolderError, TextModelFolder
from handlers.text.kinds.base import Case, Reference
from handlers.text.kinds.sentence_transformers import MODEL_CONFIG, SavedModel, SentenceTransformersKind, hidden_width
from handlers.text.modules import SENTENCE, DenseModule, LayerNormModule, NormalizeModule, PoolingModule
from handlers.text.quantization import EMBEDDING_TYPES, INTEGER_TYPES, write_calibration
from handlers.text.requests.common import RequestContext
from handlers.text.requests.embedding import text_preparation
from handlers.text.routes import Route
from handlers.text.rows import Row, RowOptions
from handlers.text.tokenization import ServedTokenizer

# config_sentence_transformers.json: the sizes a Matryoshka-trained model's vectors may be cut to (this project's key;
# sentence-transformers ignores keys it does not know).
MATRYOSHKA_KEY = "matryoshka_dimensions"
SERVED_CHAIN = "Transformer -> Pooling, then Dense, LayerNorm and Normalize on the pooled row, in any order"


class SentenceTransformerReference(Reference):
    def __init__(self, folder: Path, info: TextModelFolder) -> None:
        from sentence_transformers import SentenceTransformer

        self.model: Any = SentenceTransformer(str(folder), device="cpu", trust_remote_code=info.remote_code)
        self.body = self.model[0].auto_model

    def answer(self, case: Case) -> Any:
        # One text at a time: no padding, so the comparison is about the model; prompt "" asks for none.
        prompt = {"prompt_name": case.prompt_name} if case.prompt_name else {"prompt": ""}
        return self.model.encode(
            [case.text], convert_to_tensor=True, normalize_embeddings=False, batch_size=1, **prompt
        )[0].cpu()


class EmbeddingKind(SentenceTransformersKind):
    name = "embedding"
    reference_library = "sentence-transformers SentenceTransformer.encode()"
    model_types = ("SentenceTransformer",)
    pools_windows = True  # one vector per text: windows' vectors average into one

    def read_folder(self, folder: Path, trust_remote_code: bool) -> TextModelFolder:
        saved = self.read_saved(folder, trust_remote_code)
        width, normalized = self.check_chain(saved)
        truncate_dim = saved.model_config.get("truncate_dim")
        if truncate_dim is not None:
            if type(truncate_dim) is not int or not 1 <= truncate_dim <= width:
                raise FolderError(
                    MODEL_CONFIG, f"truncate_dim {truncate_dim!r} is not an integer in 1..{width}", "fix or remove it"
                )
            normalized = normalized and truncate_dim == width
        served = truncate_dim or width
        sizes = saved.model_config.get(MATRYOSHKA_KEY, [])
        if not isinstance(sizes, list) or not all(type(size) is int and 1 <= size <= served for size in sizes):
            raise FolderError(
                MODEL_CONFIG,
                f"{MATRYOSHKA_KEY} {sizes!r} is not a list of sizes in 1..{served}",
                "list the sizes the model was trained to be cut to (MatryoshkaLoss matryoshka_dims), or remove it",
            )
        return self.folder_info(
            saved,
            served,
            truncate_dim=truncate_dim if truncate_dim != width else None,
            normalized=normalized,
            matryoshka_dims=tuple(sorted(set(sizes))),
        )

    def check_chain(self, saved: SavedModel) -> tuple[int, bool]:
        """(the row's width after the chain, whether the answer has unit length), or a refusal naming the module."""
        head = saved.head
        if not head or not isinstance(head[0], PoolingModule):
            raise self.refuse_chain(saved, SERVED_CHAIN)
        pooling = head[0]
        hidden = hidden_width(saved.files.config)
        if hidden is not None and pooling.dimension != hidden:
            raise FolderError(
                f"{pooling.path}/config.json",
                f"embedding dimension {pooling.dimension} differs from the model's hidden size {hidden} (config.json)",
                "save the model and its pooling config from the same sentence-transformers model",
            )
        width = pooling.dimension * len(pooling.modes)
        normalized = False
        for module in head[1:]:
            if isinstance(module, DenseModule) and module.target == SENTENCE:
                if module.in_features != width:
                    raise FolderError(
                        f"{module.path}/config.json",
                        f"in_features {module.in_features} does not take the {width} floats before it",
                        "save the model again with sentence-transformers",
                    )
                width, normalized = module.out_features, False
            elif isinstance(module, LayerNormModule) and module.dimension == width:
                normalized = False
            elif isinstance(module, NormalizeModule) and module.target == SENTENCE:
                normalized = True
            else:
                raise self.refuse_chain(saved, SERVED_CHAIN)
        return width, normalized

    def reference_cases(self, info: TextModelFolder, sentences: list[str]) -> list[Case]:
        """The sentences without a prompt; where the pooling leaves a prompt out, also with each non-empty prompt."""
        cases = [Case(text) for text in sentences]
        if info.excludes_prompt:
            for name, prompt in info.prompts.items():
                if prompt:
                    cases += [Case(text, prompt_name=name) for text in sentences[:8]]
        return cases

    def served_row(self, info: TextModelFolder, tokenizer: ServedTokenizer, case: Case) -> tuple[Row, RowOptions]:
        preparation = text_preparation(info, tokenizer)
        prompt = info.prompts.get(case.prompt_name, "") if case.prompt_name else ""
        return preparation.apply([case.text], prompt)[0], (preparation.options(1, prompt) or [RowOptions()])[0]

    def routes(self) -> tuple[Route, ...]:
        return (*super().routes(), openai.EMBEDDINGS, cohere.EMBED, tei.EMBED)

    def parse_request(self, api: RequestContext, body: Any, request: RequestView) -> Any:
        return native.parse_route(api, body, request)

    def answer(self, api: RequestContext, payload: Any, rows: list[CachedRow]) -> Any:
        return native.answer_route(api, payload, rows)

    def allowed_dimensions(self, info: TextModelFolder, configured: list[int]) -> tuple[int, ...] | None:
        """Sizes below the model's own that 'dimensions' may ask for: the folder's matryoshka_dimensions and
        handler.dimensions; any size where the folder cuts its vectors itself (truncate_dim) and lists none."""
        declared = {*info.matryoshka_dims, *configured}
        if not declared and info.truncate_dim is not None:
            return None
        return tuple(sorted(size for size in declared if size < info.output_size))

    def describe_requests(self, api: RequestContext) -> dict[str, Any]:
        sizes = api.dimensions
        calibrated = api.calibration is not None
        return {
            "dimensions": "any" if sizes is None else sorted({*sizes, api.info.output_size}),
            "embedding_types": [kind for kind in EMBEDDING_TYPES if calibrated or kind not in INTEGER_TYPES],
            "calibration": api.calibration.describe() if calibrated else None,
        }

    def package_records(
        self, folder: Path, info: TextModelFolder, cases: list[Case], values: list[Any]
    ) -> dict[str, Any]:
        """int8/uint8 calibration: the served fp32 vectors of the reference sentences (no prompt), in the archive."""
        vectors = [value for case, value in zip(cases, values, strict=True) if case.prompt_name is None]
        return {"calibration": write_calibration(folder, vectors)}

    def load_reference(self, folder: Path, info: TextModelFolder) -> Reference:
        return SentenceTransformerReference(folder, info)

    def options_defaults(self) -> dict[str, Any]:
        return {**super().options_defaults(), "max_request_tokens": 4096}

    def describe(self, info: TextModelFolder) -> dict[str, Any]:
        pooling = next(module for module in info.head if isinstance(module, PoolingModule))
        return {
            **super().describe(info),
            "dimension": info.output_size,
            "pooling": list(pooling.modes),
            "include_prompt": pooling.include_prompt,
            "normalize": info.normalized,
            "truncate_dim": info.truncate_dim,
        }
