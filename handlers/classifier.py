"""Handler for ``classifier``: 128 numbers in, a label and 10 class probabilities out.

Request shapes and answers: :mod:`handlers.mlp.requests`; the network: :mod:`handlers.mlp.nets`.
All rows of all requests in a batch go through one forward pass; each request gets back exactly its own rows.
"""

from __future__ import annotations

from typing import Any

import torch

from handlers.core import runtime
from handlers.core.base import BatchScope, ServingHandler
from handlers.core.config import COMMON_OPTIONS, Option
from handlers.core.http import RequestView, json_body
from handlers.mlp.nets import LoadedClassifier, load_classifier
from handlers.mlp.requests import (
    ClassifierBatch,
    ClassifierRequest,
    answer_requests,
    parse_classifier_request,
)


class ClassifierHandler(ServingHandler):
    options = {
        **COMMON_OPTIONS,
        "max_rows": Option(int, 64, minimum=1, maximum=4096, help="rows one request may carry"),
        "weights": Option(str, "classifier.pt", help="state_dict file inside the archive"),
    }
    loaded: LoadedClassifier

    # ----------------------------------------------------------------------------------------------- load time
    def load_model(self, model_dir: str) -> LoadedClassifier:
        return load_classifier(model_dir, self.config["weights"])

    def reference_batch(self, loaded: LoadedClassifier) -> torch.Tensor:
        # Fixed, seeded rows at the scale of real inputs: the accuracy gate compares precisions on them.
        return torch.randn(64, loaded.in_features, generator=torch.Generator().manual_seed(1234))

    def warmup_batches(self, loaded: LoadedClassifier) -> list[torch.Tensor]:
        largest = self.max_batch_requests * self.config["max_rows"]
        sizes, size = [], 1
        while size < largest:
            sizes.append(size)
            size *= 2
        sizes.append(largest)
        return [torch.zeros(rows, loaded.in_features) for rows in sizes]

    def forward(self, model: Any, batch: torch.Tensor) -> torch.Tensor:
        return model(batch.to(self.device, runtime.input_dtype(model)))

    # ----------------------------------------------------------------------------------------------- per request
    def parse_request(self, body: Any, request: RequestView) -> ClassifierRequest:
        return parse_classifier_request(json_body(body, request), self.loaded.in_features, self.config["max_rows"])

    # ----------------------------------------------------------------------------------------------- per batch
    def preprocess(self, payloads: list[ClassifierRequest]) -> ClassifierBatch:
        return ClassifierBatch(torch.cat([payload.rows for payload in payloads]))

    def inference(self, batch: ClassifierBatch, scope: BatchScope) -> torch.Tensor:
        return self.forward(self.loaded.model, batch.inputs).float().cpu()

    def postprocess(self, logits: torch.Tensor, payloads: list[ClassifierRequest]) -> list[Any]:
        return answer_requests(logits, payloads)
