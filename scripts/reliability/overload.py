"""The overload check's own model: the classifier with a short job queue, sent heavy requests.

Overload means offering about twice what the server sustains, from the in-process open-loop generator, which shares
the CPU with the server and stops being a fair client above a few hundred requests/s
(resilience.MAX_OVERLOAD_RPS). With ordinary requests a fast CPU serves more than that, so "2x capacity" was
never offered and nothing was rejected (seen: minilm at ~406 req/s, 400 offered, 0 rejected). Here the capacity in
requests/s is brought down instead of the generator pushed up:

- each request carries ROWS classifier rows (~0.42 MB of JSON; the worker's parsing and validation are the cost):
  a 2-core AVX512-BF16 EPYC serves ~25 of them per second, so 2x capacity stays far below the generator's cap even
  on a CPU several times faster;
- the archive variant ``classifier-overload`` (a copy of classifier.mar) says ``jobQueueSize: QUEUE_SIZE`` in its
  model-config.yaml, TorchServe's per-model job queue: offered twice its capacity, the queue is full within
  QUEUE_SIZE / capacity seconds (about a second), then every request that does not fit gets TorchServe's
  immediate 503. The other models keep config.properties' queue (256).

The classifier has no answer cache, so a small pool of distinct bodies is cycled; each answer is checked against the
archived weights run in-process (fp32), row by row.
"""

import json
import zipfile
from pathlib import Path

import numpy as np
import torch
import yaml

from scripts.reliability.references import load_classifier

MODEL = "classifier-overload"
QUEUE_SIZE = 16  # TorchServe's per-model job queue (jobQueueSize); capacity clients <= this, so none is refused
ROWS = 512  # rows per request: ~0.42 MB of JSON, under half of max_request_size (1 MiB)
BODIES = 16  # distinct bodies, cycled
DECIMALS = 3  # values sent as k/1000: short JSON, and the server parses exactly the floats the reference uses
# A row whose two highest probabilities are closer than this may be labelled either way by a differently batched
# matmul; its probabilities are still checked to PROBABILITY_TOLERANCE.
PROBABILITY_TOLERANCE = 1e-4
MANIFEST = "MAR-INF/MANIFEST.json"


def build_archive(source, store):
    """``store/classifier-overload.mar``: a copy of classifier.mar served under that name, with jobQueueSize
    QUEUE_SIZE and handler.max_rows_per_request ROWS in its model-config.yaml."""
    destination = Path(store) / f"{MODEL}.mar"
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(destination, "w", zipfile.ZIP_DEFLATED) as variant:
        manifest = json.loads(archive.read(MANIFEST))
        config_name = manifest["model"]["configFile"]
        manifest["model"]["modelName"] = MODEL
        config = yaml.safe_load(archive.read(config_name)) or {}
        config["jobQueueSize"] = QUEUE_SIZE
        config["handler"] = {**(config.get("handler") or {}), "max_rows_per_request": ROWS}
        for item in archive.infolist():
            data = archive.read(item.filename)
            if item.filename == MANIFEST:
                data = json.dumps(manifest, indent=2).encode()
            elif item.filename == config_name:
                data = yaml.safe_dump(config, sort_keys=False).encode()
            variant.writestr(item, data)
    return destination


class HeavyClassifierReference:
    """Requests of `rows` rows each (`bodies` distinct ones, cycled) and their answers from the archived weights."""

    name = MODEL

    def __init__(self, archive_path, rows=ROWS, bodies=BODIES, seed=11):
        model = load_classifier(archive_path)
        features = model.layers[0].in_features
        values = np.round(np.random.default_rng(seed).standard_normal((bodies, rows, features)), DECIMALS)
        # What the server computes: the JSON floats (k/1000 as float64) converted to float32.
        inputs = torch.tensor(values, dtype=torch.float32)
        with torch.inference_mode():
            self.expected = torch.softmax(model(inputs.reshape(-1, features)), dim=-1).reshape(bodies, rows, -1)
        self.rows = rows
        self.bodies = [json.dumps({"inputs": body.tolist()}, separators=(",", ":")).encode() for body in values]

    def body(self, index):
        return self.bodies[index % len(self.bodies)]

    def matches(self, index, answer):
        expected = self.expected[index % len(self.bodies)]
        if not isinstance(answer, list) or len(answer) != self.rows:
            return False
        got = torch.tensor([row["probabilities"] for row in answer])
        labels = torch.tensor([row["label"] for row in answer])
        if got.shape != expected.shape or not torch.allclose(got, expected, atol=PROBABILITY_TOLERANCE):
            return False
        # The answered label must be the row's most probable class (up to a near-tie).
        chosen = expected.gather(1, labels.clamp(0, expected.shape[1] - 1).unsqueeze(1)).squeeze(1)
        in_range = bool(((labels >= 0) & (labels < expected.shape[1])).all())
        return in_range and bool((chosen >= expected.max(dim=1).values - PROBABILITY_TOLERANCE).all())
