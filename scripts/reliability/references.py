"""Distinct inputs per model and their reference answers computed in-process, to verify every served answer.

The classifier's reference is the archived program's weights in the training script's module, run in fp32; MiniLM's
is sentence-transformers' encode() of the same model in fp32 (served answers may be bf16: they must reach cosine >=
0.999 to their own reference).
"""

import io
import json
import random
import zipfile
from pathlib import Path

import torch

from scripts.ops import payloads, registry

# Served answers may be bf16: each must reach this cosine similarity to its fp32 reference.
MIN_COSINE = 0.999
CLASSIFIER_PROGRAM = "model.pt2"


def load_classifier(archive_path):
    """The archived classifier (its exported program's weights) as an fp32 model in eval mode."""
    with zipfile.ZipFile(archive_path) as mar:
        program = torch.export.load(io.BytesIO(mar.read(CLASSIFIER_PROGRAM)))
    return classifier_of(program)


def classifier_of(program):
    """The classifier's module (scripts/train_classifier.py) holding an exported classifier program's weights: a plain
    module, so a reference can also run it in float64 (``.double()``)."""
    from scripts.train_classifier import MLPClassifier

    return MLPClassifier.from_state_dict(dict(program.state_dict)).eval()


def load_classifier_dir(model_dir):
    """The classifier of an unpacked archive or a staged model folder (its model.pt2)."""
    return classifier_of(torch.export.load(str(Path(model_dir) / CLASSIFIER_PROGRAM)))


class ClassifierReference:
    name = "classifier"

    def __init__(self, archive_path, count, seed=0):
        model = load_classifier(archive_path)
        self.rows = torch.randn(count, model.layers[0].in_features, generator=torch.Generator().manual_seed(seed))
        with torch.inference_mode():
            self.expected = torch.softmax(model(self.rows), dim=-1)
        self.bodies = [json.dumps({"inputs": row}).encode() for row in self.rows.tolist()]

    def body(self, index):
        return self.bodies[index % len(self.bodies)]

    def matches(self, index, answer):
        expected = self.expected[index % len(self.bodies)]
        got = torch.tensor(answer["probabilities"])
        return answer["label"] == int(expected.argmax()) and torch.allclose(got, expected, atol=1e-4)


def distinct_texts(count, seed=0):
    """Deterministic, pairwise distinct sentences of mixed lengths (mostly short, a tail of long ones)."""
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        length = rng.choice([4, 6, 8, 10, 12, 16, 24, 40]) if rng.random() < 0.9 else rng.randint(80, 320)
        words = payloads.words(rng, length).split()
        words.insert(rng.randrange(len(words)), f"item{index}")
        texts.append(" ".join(words))
    return texts


class MiniLMReference:
    name = "minilm"

    def __init__(self, count, seed=0):
        from sentence_transformers import SentenceTransformer

        from scripts.reliability.model_files import minilm_reference_dir

        self.texts = distinct_texts(count, seed)
        model = SentenceTransformer(str(minilm_reference_dir()), device="cpu")
        self.expected = torch.from_numpy(
            model.encode(self.texts, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
        )
        self.bodies = [json.dumps({"text": text}).encode() for text in self.texts]

    def body(self, index):
        return self.bodies[index % len(self.bodies)]

    def matches(self, index, answer):
        got = torch.tensor(answer["embedding"])
        expected = self.expected[index % len(self.bodies)]
        return got.shape == expected.shape and torch.nn.functional.cosine_similarity(got, expected, dim=0) >= MIN_COSINE


class Window:
    """A view of a reference pool starting at `offset`, so each phase of the suite sends inputs the previous phases
    did not (the worker's embedding cache would otherwise answer them and flatter the figures); wraps around."""

    def __init__(self, reference, offset):
        self.reference, self.offset, self.name = reference, offset, reference.name

    def body(self, index):
        return self.reference.body(self.offset + index)

    def matches(self, index, answer):
        return self.reference.matches(self.offset + index, answer)


class WindowCursor:
    """Hands out consecutive Windows of one reference pool: each phase gets the inputs after the previous phase's."""

    def __init__(self, reference):
        self.reference, self.offset = reference, 0

    def take(self, count):
        """A Window starting where the last one taken ended; the next one starts `count` inputs later."""
        window = Window(self.reference, self.offset)
        self.offset += count
        return window


# Per kind (scripts/ops/registry.py): (model, store, count, seed) -> its reference pool. An embedding model's reference
# is sentence-transformers on the folder its spec names (reference: pypi:...), which only minilm's does.
REFERENCES = {
    "mlp": lambda model, store, count, seed: ClassifierReference(Path(store) / f"{model}.mar", count, seed),
    "embedding": lambda model, store, count, seed: MiniLMReference(count, seed),
}


def reference_for(model, store, count, seed=0):
    described = registry.model(model, store)
    if described.kind not in REFERENCES or (described.kind == "embedding" and described.reference is None):
        raise ValueError(f"no reference answers for model {model!r}")
    return REFERENCES[described.kind](model, store, count, seed)
