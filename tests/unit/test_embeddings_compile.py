"""compile: jit (no recompilation after warm-up) and aot (a .pt2 built like the packaging step builds it).

Both run on a 1-layer, 32-wide BERT with the real tokenizer (tests/unit/tiny_minilm.py): the same model code, so the
same graphs and guards, at a fraction of the compile time of the real encoder.
"""

import json
import random

import pytest
import torch

from handlers.core import runtime
from handlers.core.config import ConfigError
from scripts.ops.handler_loader import load_handler, set_requests, statuses
from scripts.prepare_minilm import build_aot

WORDS = "the of serving tensor café 東京 🙂 batch token model request queue latency x".split()


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_minilm_dir):
    return tiny_minilm_dir


def load(model_dir, **handler_overrides):
    return load_handler(model_dir, "minilm", {"precision": "fp32", "cache_size": 0, **handler_overrides})


def mixed_load(seed=0):
    """Batches of 1..40 requests, texts from 1 to ~400 words (every bucket, truncation included)."""
    rng = random.Random(seed)
    batches = []
    for requests in (1, 3, 16, 2, 7, 1, 40):
        batch = []
        for _ in range(requests):
            texts = [
                " ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 3, 9, 20, 45, 100, 400])))
                for _ in range(rng.choice([1, 1, 2, 5]))
            ]
            batch.append({"input": texts})
        batches.append(batch)
    return batches


def answer_all(handler, context, batches):
    results = []
    for bodies in batches:
        set_requests(context, [{"Content-Type": "application/json"}] * len(bodies))
        answers = handler.handle([{"body": body} for body in bodies], context)
        assert statuses(context, len(bodies)) == [200] * len(bodies)
        results.append([torch.tensor([d["embedding"] for d in json.loads(a)["data"]]) for a in answers])
    return results


@pytest.fixture(scope="module")
def eager_answers(tiny_model_dir):
    handler, context = load(tiny_model_dir)
    return answer_all(handler, context, mixed_load())


def assert_same_answers(got, expected):
    for got_batch, expected_batch in zip(got, expected, strict=True):
        for got_rows, expected_rows in zip(got_batch, expected_batch, strict=True):
            assert torch.nn.functional.cosine_similarity(got_rows, expected_rows).min() > 0.9999


def test_jit_warmup_covers_every_served_shape_so_a_mixed_load_compiles_nothing(tiny_model_dir, eager_answers):
    handler, context = load(tiny_model_dir, compile="jit")
    before = runtime.compile_count()
    answers = answer_all(handler, context, mixed_load())
    assert runtime.compile_count() == before, "a served shape was not covered by warm-up"
    assert_same_answers(answers, eager_answers)


def test_aot_package_built_like_the_packaging_step_loads_and_matches_eager(tiny_model_dir, eager_answers):
    build_aot(tiny_model_dir, "fp32", 1024, 0.9999)
    built = json.loads((tiny_model_dir / "minilm.pt2.json").read_text())
    assert built["precision"] == "fp32" and built["min_cosine_to_eager"] >= 0.9999
    compiles = runtime.compile_count()
    handler, context = load(tiny_model_dir, compile="aot")
    assert runtime.compile_count() == compiles  # nothing is compiled in the worker
    assert handler.describe()["compile"] == "aot"
    assert_same_answers(answer_all(handler, context, mixed_load()), eager_answers)

    # A worker whose forward passes could exceed the package's dynamic batch bound refuses to start.
    with pytest.raises(ConfigError, match="takes at most 1024 rows, a forward pass may hold 2048"):
        load(tiny_model_dir, compile="aot", max_forward_tokens=32768)
