"""Handler for text classifiers and cross-encoder rerankers packaged from a Hugging Face folder. Labels from the
folder's ``id2label``; softmax for a single-label model, a sigmoid per label for a multi-label one, a relevance score
per document for a one-output reranker (handlers/text/requests/classification.py). The batch path (caches of logits
rows, one tokenizer call for texts and text pairs, length buckets, compiled backends and their accuracy gate on
probabilities) is the shared text-model path, :class:`handlers.text.handler.TextModelHandler`.
"""

from __future__ import annotations

from typing import Any

from handlers.core.config import Option
from handlers.core.http import RequestView
from handlers.text.batch import ComputedBatch, answer_requests
from handlers.text.handler import TEXT_MODEL_OPTIONS, TextModelHandler
from handlers.text.requests.classification import ClassificationRequest, format_answer, parse_classification_request


class TextClassifierHandler(TextModelHandler):
    kind = "classification"
    options = {
        **TEXT_MODEL_OPTIONS,
        "min_cosine": Option(
            float,
            0.99,
            minimum=0.0,
            maximum=1.0,
            help="accuracy gate: reduced precision must reach this agreement with fp32, 1 - the largest difference "
            "of any reference row's probabilities (0.99: no probability moves by more than 0.01)",
        ),
    }

    def parse_request(self, body: Any, request: RequestView) -> ClassificationRequest:
        return parse_classification_request(body, request.content_type, self.loaded.limits, self.loaded.info)

    def postprocess(self, computed: ComputedBatch, payloads: list[ClassificationRequest]) -> list[Any]:
        info = self.loaded.info
        return answer_requests(
            computed,
            payloads,
            self.cache,
            lambda payload, rows: format_answer(payload, rows, info, self.model_name),
            self.shared_cache,
        )
