"""handler.compile_decode (handlers/generation/compiled.py) on the tiny demo model: the gate, the fallback, and one
compile for every batch size. torch.compile runs with its ``eager`` backend here (dynamo's tracing and guards, no C++
compilation): what is tested is the wiring, the gate and the graph count, which do not depend on the backend; the
inductor figures are in docs/generation.md."""

import pytest
import torch

from handlers.core.config import ConfigError
from handlers.generation import compiled
from handlers.generation.decoding import SamplingSettings, Sequence
from handlers.generation.running import RunningBatch
from scripts.ops.handler_loader import load_handler

# These options shape the eager torch step, so these handlers decode eagerly (handler.decode_step).
EAGER = {"decode_step": "eager"}


@pytest.fixture(scope="module")
def model_dir(prepared_model_dir):
    return prepared_model_dir("generator")


@pytest.fixture(scope="module")
def compiled_handler(model_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "BACKEND", "eager")
        handler, _ = load_handler(model_dir, "generator", {"compile_decode": True, **EAGER}, continuous_batching=True)
    return handler


def flat_mlps(model):
    return [parent.mlp for parent in compiled.mlp_parents(model) if isinstance(parent.mlp, compiled.FlatMLP)]


def test_true_compiles_every_layers_mlp_once_the_gate_saw_eagers_tokens(compiled_handler):
    described = compiled_handler.describe()["compile_decode"]
    assert described["setting"] == "true" and described["compiled"] is True
    assert described["reason"] == "greedy fp32 tokens equal to eager on the gate prompts"
    model = compiled_handler.loaded.model
    assert len(flat_mlps(model)) == model.config.n_layer
    assert 1 <= described["graphs"] <= 2  # a lone row's step, and every other shape


def test_no_batch_size_chunk_or_mixed_pass_compiles_again(compiled_handler):
    model = compiled_handler.loaded.model
    before = compiled.compile_counts()
    with torch.inference_mode():
        for rows in (2, 5, 7):
            batch = RunningBatch(model, 0, [], chunk_tokens=4)
            batch.prefill([Sequence([5, 6, 7, row], SamplingSettings(1000)) for row in range(rows)])
            batch.step()
            batch.begin_filling([Sequence(list(range(3, 3 + 4 * rows)), SamplingSettings(1000))])
            while batch.filling is not None:  # mixed passes: the running rows' step and a chunk in one sequence
                batch.advance()
            batch.step()
    assert batch.mixable
    assert compiled.compile_counts() == before


def test_compiled_tokens_are_eagers_on_prompts_the_gate_did_not_see(compiled_handler):
    model = compiled_handler.loaded.model
    prompts = [[11, 12, 13, 14, 15], [200, 3], [42] * 9]

    def greedy():
        sequences = [Sequence(list(prompt), SamplingSettings(10)) for prompt in prompts]
        batch = RunningBatch(model, 0, [])
        with torch.inference_mode():
            batch.prefill(sequences)
            for _ in range(9):
                batch.step()
        return [sequence.token_ids for sequence in sequences]

    got = greedy()
    compiled.uninstall(model)
    try:
        assert got == greedy()
    finally:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(compiled, "BACKEND", "eager")
            compiled.install(model)


def test_a_compiled_mlp_that_changes_tokens_is_put_back_to_eager_with_the_reason(model_dir, monkeypatch, caplog):
    monkeypatch.setattr(compiled, "BACKEND", "eager")
    monkeypatch.setattr(compiled, "run_module", lambda module, hidden: module(hidden) * 1.5)  # a wrong compiler
    overrides = {"compile_decode": "true", "decode_step": "eager"}  # the MLPs are the eager step's
    handler, _ = load_handler(model_dir, "generator", overrides, continuous_batching=True)
    described = handler.describe()["compile_decode"]
    assert described["compiled"] is False
    assert described["reason"].startswith("greedy fp32 tokens differ from eager on ")
    assert flat_mlps(handler.loaded.model) == []
    assert "decoding stays eager" in caplog.text


def test_false_is_the_default_and_leaves_the_model_eager(model_dir):
    handler, _ = load_handler(model_dir, "generator", EAGER, continuous_batching=True)
    assert handler.describe()["compile_decode"] == {
        "setting": "false",
        "compiled": False,
        "reason": "handler.compile_decode is false",
        "graphs": 0,
        "seconds": 0.0,
    }
    assert flat_mlps(handler.loaded.model) == []


def test_a_value_other_than_auto_true_false_is_refused_naming_the_key(model_dir):
    with pytest.raises(ConfigError, match=r"handler.compile_decode: 'yes' is not one of \['auto', 'true', 'false'\]"):
        load_handler(model_dir, "generator", {"compile_decode": "yes"})
