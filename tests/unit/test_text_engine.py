"""The text engine called with no TorchServe at all: rows in, per-row values or per-row errors out, the same numbers as
the served handler path (which is the engine behind a TorchServe adapter)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.core.errors import RequestError
from handlers.text.engine import EncodeOptions, TextEngine
from scripts.ops.handler_loader import load_handler, set_requests

CONFIG = {"precision": "fp32", "backend": "eager", "cache_size": 0, "shared_cache": {"url": ""}}
TEXTS = ["A man is eating food.", "Ein Mann isst.", "東京タワー 🗼"]
REPO = Path(__file__).resolve().parents[2]
LONG = "The quick brown fox jumps over the lazy dog near the riverbank. " * 40  # ~520 tokens, over the limit


@pytest.fixture(scope="module")
def engine(tiny_minilm_dir):
    return TextEngine.load(tiny_minilm_dir, CONFIG, kind="embedding")


def test_encode_gives_the_served_handlers_vectors_row_by_row(engine, tiny_minilm_dir):
    rows = engine.encode(TEXTS)
    handler, context = load_handler(tiny_minilm_dir, "minilm", CONFIG)
    set_requests(context, [{"Content-Type": "application/json"}])
    [served] = handler.handle([{"body": {"input": TEXTS}}], context)
    want = torch.tensor([item["embedding"] for item in json.loads(served)["data"]], dtype=torch.float32)
    assert torch.equal(torch.stack([row.value for row in rows]), want)
    tokens = [len(e.ids) for e in engine.loaded.tokenizer.encode_batch(TEXTS)]
    assert [row.tokens for row in rows] == tokens and not any(row.truncated for row in rows)


def test_a_row_over_the_token_limit_is_that_rows_error_and_the_others_are_computed(engine):
    strict = EncodeOptions(truncate=False, name="passage")
    first, long, last = engine.encode([TEXTS[0], LONG, TEXTS[1]], strict)
    assert isinstance(long, RequestError) and long.code == 400
    assert "passage is longer than the model's limit of 256 tokens" in long.message
    assert torch.equal(first.value, engine.encode([TEXTS[0]])[0].value)
    assert torch.equal(last.value, engine.encode([TEXTS[1]])[0].value)
    [cut] = engine.encode([LONG])  # truncating (the default), the same row is computed from its first 256 tokens
    assert cut.truncated and cut.tokens == 256


def test_tokenize_says_what_the_model_sees(engine):
    short, long = engine.tokenize([TEXTS[0], LONG])
    assert short.ids == list(engine.loaded.tokenizer.encode(TEXTS[0]).ids) and not short.truncated
    assert len(long.ids) == 256 and long.truncated
    assert len(engine.tokenize([LONG], max_tokens=32)[0].ids) == 32


def test_the_engine_keeps_computed_rows_in_its_cache(tiny_minilm_dir):
    cached = TextEngine.load(tiny_minilm_dir, {**CONFIG, "cache_size": 8}, kind="embedding")
    [first] = cached.encode([TEXTS[0]])
    assert len(cached.cache) == 1
    [again] = cached.encode([TEXTS[0]])
    assert again.value is first.value  # answered from the LRU, not computed again


def test_a_folder_of_another_kind_is_refused_naming_both(tiny_minilm_dir):
    with pytest.raises(ConfigError, match="holds a embedding model, which the classification engine does not serve"):
        TextEngine.load(tiny_minilm_dir, CONFIG, kind="classification")


def test_loading_and_encoding_import_nothing_of_torchserve(tiny_minilm_dir):
    program = (
        "import sys\n"
        "from handlers.text.engine import TextEngine\n"
        f"engine = TextEngine.load({str(tiny_minilm_dir)!r}, {CONFIG!r})\n"
        "[row] = engine.encode(['hello'])\n"
        "print(row.value.shape[0], sorted(m for m in sys.modules if m == 'ts' or m.startswith('ts.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "[]" and int(done.stdout.split()[0]) > 0
