"""Handler for ``classifier``: 128 numbers in, a label and 10 class probabilities out.

Requests: ``{"inputs": [128 numbers]}`` -> ``{"label": int, "probabilities": [...]}``, or
``{"inputs": [[128 numbers], ...]}`` (up to ``handler.max_rows`` rows) -> a list of those objects in row order.
All rows of all requests in a batch go through one forward pass; each request gets back exactly its own rows.
"""

import os

import torch

from handlers.base import ServingHandler, json_body
from handlers.config import COMMON_OPTIONS, Option
from handlers.errors import RequestError, shown, too_large
from handlers.nets import MLPClassifier

ALLOWED_FIELDS = {"inputs"}
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # 3.4028234663852886e38; anything larger becomes inf


class ClassifierHandler(ServingHandler):
    options = {
        **COMMON_OPTIONS,
        "compile": Option(str, "none", ("none", "jit")),
        "max_rows": Option(int, 64, minimum=1, maximum=4096, help="rows one request may carry"),
        "weights": Option(str, "classifier.pt", help="state_dict file inside the archive"),
    }

    # ----------------------------------------------------------------------------------------------- load time
    def load_model(self, model_dir):
        state_dict = torch.load(os.path.join(model_dir, self.config["weights"]), map_location="cpu", weights_only=True)
        model = MLPClassifier.from_state_dict(state_dict)
        self.in_features = model.layers[0].in_features
        return model

    def reference_batch(self):
        # Fixed, seeded rows at the scale of real inputs: the accuracy gate compares precisions on them.
        return torch.randn(64, self.in_features, generator=torch.Generator().manual_seed(1234))

    def warmup_batches(self):
        largest = self.max_batch_requests * self.config["max_rows"]
        sizes, size = [], 1
        while size < largest:
            sizes.append(size)
            size *= 2
        sizes.append(largest)
        return [torch.zeros(rows, self.in_features) for rows in sizes]

    def forward(self, model, batch):
        return model(batch.to(self.device, self.compute_dtype))

    # ----------------------------------------------------------------------------------------------- per request
    def parse_request(self, body, request):
        """Validate one request; returns its rows as a float32 tensor and whether it was a single row."""
        body = json_body(body, request)
        if not isinstance(body, dict):
            kind = "null" if body is None else type(body).__name__
            raise RequestError(f"body must be a JSON object with an 'inputs' field, got {kind}")
        unknown = sorted(set(body) - ALLOWED_FIELDS)
        if unknown:
            raise RequestError(f"unknown field(s) {unknown}; only 'inputs' is accepted")
        if "inputs" not in body:
            raise RequestError("missing field 'inputs'")
        inputs = body["inputs"]
        if not isinstance(inputs, list) or not inputs:
            raise RequestError("'inputs' must be a non-empty list of numbers or of rows")
        single = not isinstance(inputs[0], list)
        rows = [inputs] if single else inputs
        if len(rows) > self.config["max_rows"]:
            raise too_large(f"'inputs' has {len(rows)} rows; handler.max_rows is {self.config['max_rows']}")
        for number, row in enumerate(rows):
            where = "'inputs'" if single else f"'inputs'[{number}]"
            if not isinstance(row, list):
                raise RequestError(f"{where} must be a list of {self.in_features} numbers")
            if len(row) != self.in_features:
                raise RequestError(f"{where} has {len(row)} values; expected {self.in_features}")
            for position, value in enumerate(row):
                if type(value) not in (int, float):
                    raise RequestError(f"{where}[{position}] is {type(value).__name__}, not a number")
                # abs() first: a huge int compares exactly, where isfinite would overflow converting it to float.
                if not abs(value) <= FLOAT32_MAX:
                    raise RequestError(f"{where}[{position}] is {shown(value)}: values must be finite float32 "
                                       f"numbers (at most {FLOAT32_MAX:.8g} in magnitude)")
        return {"rows": torch.tensor(rows, dtype=torch.float32), "single": single}

    # ----------------------------------------------------------------------------------------------- per batch
    def preprocess(self, payloads):
        return torch.cat([payload["rows"] for payload in payloads])

    def inference(self, batch):
        return self.forward(self.model, batch).float().cpu()

    def postprocess(self, logits, payloads):
        """Each request's rows as label + probabilities; a request whose rows overflow inside the model gets a 422.

        Inputs within float32's range can still overflow in the layers (e.g. 1e38 times a weight above 3.4): such a
        row's logits are inf or NaN, and softmax would turn them into NaN probabilities that are not JSON."""
        finite = torch.isfinite(logits).all(dim=-1).tolist()
        probabilities = torch.softmax(logits, dim=-1)
        labels = probabilities.argmax(dim=-1).tolist()
        probabilities = probabilities.tolist()
        results, start = [], 0
        for payload in payloads:
            rows = range(start, start + len(payload["rows"]))
            start = rows.stop
            overflowed = [row - rows.start for row in rows if not finite[row]]
            if overflowed:
                where = "'inputs'" if payload["single"] else f"'inputs' rows {overflowed[:10]}"
                results.append(RequestError(f"{where} overflow inside the model (activations beyond float32's "
                                            f"range); scale the values down", code=422, error_type="InputOverflow"))
                continue
            answers = [{"label": labels[row], "probabilities": probabilities[row]} for row in rows]
            results.append(answers[0] if payload["single"] else answers)
        return results
