"""Token limits that follow the model: `auto` resolves from the model folder's positions, explicit limits that do not
fit are refused when packaging (scripts.prepare_generator) and at load, and requests get the resolved limits.

The model is a 256-position tiny GPT-2 (scripts/make_tiny_gpt2.py with small sizes, random weights), the case of the
report where the shipped 256 + 256 limits made registration fail with only a line in the model log.
"""

import json
import shutil

import pytest

from handlers.core.config import ConfigError, validate
from handlers.generation.limits import (
    LimitsError,
    ModelPositions,
    positions_in,
    resolve_token_limits,
    with_resolved_limits,
)
from handlers.generator import GeneratorHandler
from scripts import make_tiny_gpt2, prepare_generator
from scripts.ops.handler_loader import load_handler, set_requests, statuses

SHIPPED_CONFIG = prepare_generator.REPO / "models" / "generator" / "model-config.yaml"
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def own_model(tmp_path_factory):
    """A user's Hugging Face causal-LM folder with n_positions=256 (safetensors weights, tokenizer.json)."""
    folder = tmp_path_factory.mktemp("gpt2-256") / "my-gpt2"
    make_tiny_gpt2.build(folder, seed=0, layers=1, hidden=32, heads=2, positions=256, vocab_size=300)
    assert json.loads((folder / "config.json").read_text())["n_positions"] == 256
    return folder


def write_config(path, **handler):
    """The shipped model-config.yaml with some handler: keys replaced."""
    import yaml

    config = yaml.safe_load(SHIPPED_CONFIG.read_text())
    config["handler"].update(handler)
    path.write_text(yaml.safe_dump(config))
    return path


def prepare(own_model, out, config, capsys):
    code = prepare_generator.main(["--out", str(out), "--model-dir", str(own_model), "--config", str(config)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def served(own_model, tmp_path_factory):
    """The prepared folder (lm/, model_info.json, the shipped model-config.yaml) loaded in-process."""
    out = tmp_path_factory.mktemp("build-256")
    assert (
        prepare_generator.main(["--out", str(out), "--model-dir", str(own_model), "--config", str(SHIPPED_CONFIG)]) == 0
    )
    shutil.copy2(SHIPPED_CONFIG, out / "model-config.yaml")
    return out, load_handler(out, "generator")


def run(handler, context, bodies):
    set_requests(context, [JSON] * len(bodies))
    return [json.loads(answer) for answer in handler.handle([{"body": body} for body in bodies], context)]


def test_shipped_config_is_auto_and_auto_keeps_the_demo_model_at_256_and_256():
    import yaml

    handler_section = yaml.safe_load(SHIPPED_CONFIG.read_text())["handler"]
    assert handler_section["max_prompt_tokens"] == "auto" and handler_section["max_new_tokens"] == "auto"
    config = validate(handler_section, GeneratorHandler.options)
    limits = resolve_token_limits(config, ModelPositions(1024, "n_positions", "lm/config.json"), "model-config.yaml")
    assert (limits.max_prompt_tokens, limits.max_new_tokens, limits.default_max_new_tokens) == (256, 256, 32)
    assert limits.auto == ("max_prompt_tokens", "max_new_tokens")
    # No position limit in the model's config: auto is the cap, nothing to check against.
    unknown = resolve_token_limits(config, ModelPositions(None, "", "lm/config.json"), "model-config.yaml")
    assert (unknown.max_prompt_tokens, unknown.max_new_tokens, unknown.positions) == (256, 256, None)


def test_tools_reading_an_archive_config_get_the_served_integers():
    config = validate({"max_new_tokens": 64}, GeneratorHandler.options)
    positions = positions_in({"max_position_embeddings": 512}, "lm/config.json")
    assert positions == ModelPositions(512, "max_position_embeddings", "lm/config.json")
    resolved = with_resolved_limits(config, positions, "model-config.yaml")
    assert (resolved["max_prompt_tokens"], resolved["max_new_tokens"]) == (256, 64)


def test_token_limit_options_take_auto_or_a_positive_integer():
    options = GeneratorHandler.options
    assert validate({"max_prompt_tokens": 100}, options)["max_prompt_tokens"] == 100
    assert validate({}, options)["max_new_tokens"] == "auto"
    for bad, problem in [("big", "expected auto or an integer, got 'big'"), (0, "below the minimum"), (True, "int")]:
        with pytest.raises(ConfigError, match=problem):
            validate({"max_new_tokens": bad}, options)


def test_auto_limits_of_a_256_position_model_are_128_and_128_and_it_serves(served):
    out, (handler, context) = served
    limits = handler.loaded.limits
    assert (limits.max_prompt_tokens, limits.max_new_tokens, limits.default_max_new_tokens) == (128, 128, 32)
    assert limits.positions == 256
    [answer] = run(handler, context, [{"prompt": "Hello world", "max_new_tokens": 8}])
    assert statuses(context, 1) == [200]
    assert 1 <= answer["completion_tokens"] <= 8
    assert answer["model"] == {"name": "my-gpt2", "weights": "user-supplied"}
    # The longest request the limits allow fits the model: 128 prompt tokens + 128 new tokens = 256 positions.
    piece = next(p for p in (" a", "a", " the", "x") if len(handler.loaded.tokenizer.encode(p * 128)) == 128)
    [longest] = run(handler, context, [{"prompt": piece * 128, "max_new_tokens": 128}])
    assert statuses(context, 1) == [200] and longest["prompt_tokens"] == 128


def test_describe_shows_the_resolved_limits_and_the_positions(served):
    _, (handler, context) = served
    set_requests(context, [{"describe": "True"}])
    [described] = handler.handle([{"body": b""}], context)
    limits = json.loads(described)["limits"]
    assert limits["max_prompt_tokens"] == 128 and limits["max_new_tokens"] == 128 and limits["positions"] == 256
    assert limits["auto"] == ["max_prompt_tokens", "max_new_tokens"]


def test_requests_past_the_resolved_limits_get_a_400_naming_the_limit(served):
    _, (handler, context) = served
    tokenizer = handler.loaded.tokenizer
    prompt = " ".join(["fox"] * 150)
    assert 128 < len(tokenizer.encode(prompt)) and len(prompt) < handler.loaded.limits.max_prompt_chars
    answers = run(handler, context, [{"prompt": prompt}, {"prompt": "Hi", "max_new_tokens": 129}])
    assert statuses(context, 2) == [400, 400]
    assert "at most 128 are allowed (handler.max_prompt_tokens)" in answers[0]["message"]
    assert "'max_new_tokens' is 129; it must be between 1 and 128" in answers[1]["message"]


def test_explicit_limits_past_the_positions_are_refused_when_packaging(own_model, tmp_path, capsys):
    config = write_config(tmp_path / "model-config.yaml", max_prompt_tokens=200, max_new_tokens=100)
    code, _, err = prepare(own_model, tmp_path / "build", config, capsys)
    assert code == 1
    assert (
        f"error: lm/config.json: n_positions 256 is too small for handler.max_prompt_tokens 200 + "
        f"handler.max_new_tokens 100 in {config} (300 exceeds the model's 256 positions); set them to auto "
        f"(min(256, positions // 2) each: 128 here) or lower them to add up to at most 256"
    ) in err
    assert not (tmp_path / "build" / "model_info.json").exists()


def test_one_explicit_limit_beside_auto_is_checked_with_the_auto_value(own_model, tmp_path, capsys):
    config = write_config(tmp_path / "model-config.yaml", max_prompt_tokens=200)
    code, _, err = prepare(own_model, tmp_path / "build", config, capsys)
    assert code == 1 and "handler.max_prompt_tokens 200 + handler.max_new_tokens 128 (auto)" in err
    fitting = write_config(tmp_path / "fits.yaml", max_prompt_tokens=200, max_new_tokens=56)
    code, out, _ = prepare(own_model, tmp_path / "build", fitting, capsys)
    assert code == 0 and "max_prompt_tokens 200 + max_new_tokens 56, model positions 256" in out


def test_default_max_new_tokens_above_the_resolved_limit_is_refused_when_packaging(own_model, tmp_path, capsys):
    config = write_config(tmp_path / "model-config.yaml", default_max_new_tokens=200)
    code, _, err = prepare(own_model, tmp_path / "build", config, capsys)
    assert code == 1
    assert (
        "handler.default_max_new_tokens (200) is above handler.max_new_tokens (128, auto for lm/config.json "
        "n_positions 256)"
    ) in err


def test_the_worker_refuses_limits_that_do_not_fit_at_load(served):
    out, _ = served
    with pytest.raises(LimitsError, match=r"lm/config.json: n_positions 256 is too small .* set them to auto"):
        load_handler(out, "generator", {"max_prompt_tokens": 200, "max_new_tokens": 100})


def test_a_folder_with_only_pickled_weights_is_refused_with_why_and_how_to_convert(tmp_path, capsys):
    own = tmp_path / "pickled"
    own.mkdir()
    (own / "config.json").write_text('{"n_positions": 256}')
    (own / "pytorch_model.bin").write_bytes(b"pickle")
    code, _, err = prepare(own, tmp_path / "build", SHIPPED_CONFIG, capsys)
    assert code == 1
    assert "loading a pickle can run code" in err and "save_pretrained(folder, safe_serialization=True)" in err
