"""BASELINE, not for serving: the naive TorchServe handler for minilm the comparison measures ours against.

What a first handler typically looks like: fp32, eager, no warm-up, one request at a time (the archive says
batchSize 1), one tokenizer call and one forward pass per request, mean pooling and normalisation as in
sentence-transformers, and the answer returned as a dict for TorchServe to encode. It answers the same shape as the
project's handler ({"text": ...} -> {"embedding": [384 floats]}), so the same load test measures both.
"""

import json

import torch
from transformers import AutoModel, AutoTokenizer


class NaiveEmbeddingHandler:
    def __init__(self):
        self.initialized = False

    def initialize(self, context):
        model_dir = context.system_properties["model_dir"]
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()
        self.initialized = True

    def embed(self, text):
        # max_length 256: the model's sentence-transformers limit, so the answers match the project's handler.
        encoded = self.tokenizer(text, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            hidden = self.model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
        return torch.nn.functional.normalize(pooled, dim=-1)[0].tolist()

    def handle(self, data, context):
        answers = []
        for request in data:
            body = request.get("body") or request.get("data")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            answers.append({"embedding": self.embed(body["text"])})
        return answers
