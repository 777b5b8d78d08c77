"""Stage an image model's folder for its archive: check it, copy what serving needs, record the image processor's
steps, prove parity.

The prepare step of the image-model template (models/image-model):

1. **Check** the folder as the worker will read it (handlers/image/kinds/): the kind the folder says it is (a
   transformers *ForImageClassification architecture; --kind to name it), its image processor
   (``preprocessor_config.json``), safetensors weights (pickled ``.bin`` weights are refused). A refusal names the
   file and the fix, and nothing is staged (so nothing reaches model_store/).
2. **Copy** what serving reads (configs, weights) into --out; training leftovers stay behind.
3. **Record what transformers decides** (``image_model.json``): the class the weights load as and the image
   processor's resolved steps (resize rule and filter, crop, rescale, normalize: handlers/image/preprocess.py), which
   the worker reproduces without loading the processor. A processor whose steps the server does not reproduce is
   refused by name. An image-text model's text tokenizer is exported by the text models' own step
   (handlers/text/tokenization.py: ``served_tokenizer.json``, its ids proved equal to transformers' on the reference
   texts, long ones included) and recorded with its padding rule (SigLIP: every text to 64 tokens; CLIP: the text
   path's length buckets); a tokenizer that cannot be exported is refused naming the file and the fix.
4. **Parity**: generated reference images (handlers/image/reference.py: odd sizes, portrait and landscape, 1x1,
   larger than the model's input) through the served preprocessing and the served fp32 module, one image at a time,
   against transformers' AutoImageProcessor and model on the same images. Below --min-parity (0.9999 in the kind's
   measure: 1 - the largest score difference for a classifier) the folder is refused. A kind that computes more
   than image rows proves that too, against the same bound (an image-text model: its text vectors, and its
   zero-shot scores against transformers' zero-shot-image-classification pipeline).
5. **Backends**: compiled candidates of the served module (a classifier's logits; an image-text model's vision
   tower with its projection) built, gated against eager fp32 on the same generated images and ranked by ms/image,
   by the text models' one build (scripts/build_backends.py); a candidate below the gate is not packed and the
   output says why. Workers with ``backend: auto`` serve the best one that passes the gate again on their machine.

    python -m scripts.prepare_image_model --source /path/to/folder --out build/my-model/model
Exit codes: 0 staged, 1 the folder was refused or the backends could not be built, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from scripts import build_backends
from scripts.prepare_text_model import PARITY_BOUND, PrepareError, parse_backends, resolve_source

COPIED_SUFFIXES = (".json", ".safetensors", ".txt")
LEFT_BEHIND = ("training_args", "trainer_state", "optimizer", "scheduler", "rng_state")


def check_files(folder: Path) -> None:
    """What a worker reads must be there, and no pickle is ever loaded."""
    from handlers.image.folder import PROCESSOR_FILE
    from handlers.text.folder import FolderError, optional_json, pickled_files, refuse_pickle

    if not (folder / "config.json").is_file():
        raise FolderError("config.json", "is missing", "save the model with save_pretrained(folder)")
    # transformers 5's Processor.save_pretrained (and sentence-transformers 6, which calls it) nests the image
    # processor's settings in processor_config.json instead of writing preprocessor_config.json.
    nested = "image_processor" in optional_json(folder, "processor_config.json")
    if not (folder / PROCESSOR_FILE).is_file() and not nested:
        raise FolderError(
            PROCESSOR_FILE,
            "is missing, so how the model's images are resized and normalized is unknown",
            "save the model's image processor beside it: AutoImageProcessor.from_pretrained(...)"
            ".save_pretrained(folder)",
        )
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        pickled = pickled_files(folder)
        if pickled:
            raise refuse_pickle(pickled[0])
        raise FolderError("model.safetensors", "is missing", "save the model with save_pretrained(folder)")


def copy_folder(source: Path, out: Path, module_dir: str = "", other_modules: tuple[str, ...] = ()) -> list[str]:
    """Copy what serving reads: the folder's files, and those of ``module_dir``, the subfolder where an older
    sentence-transformers save keeps its CLIP model (``0_CLIPModel/``; the worker reads it there, as
    sentence-transformers does). ``other_modules``: the later modules' folders (an older save's empty
    ``1_Normalize/``), made so that sentence-transformers loads the staged copy for the parity check."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    copied = []
    for relative in dict.fromkeys(("", module_dir)):
        (out / relative).mkdir(parents=True, exist_ok=True)
        for path in sorted((source / relative).iterdir()):
            if path.is_file() and path.suffix in COPIED_SUFFIXES and not path.name.startswith(LEFT_BEHIND):
                shutil.copy2(path, out / relative / path.name)
                copied.append(f"{relative}/{path.name}" if relative else path.name)
    for relative in other_modules:
        (out / relative).mkdir(parents=True, exist_ok=True)
    return copied


def sentence_transformers_module_dirs(folder: Path, module_dir: str) -> tuple[str, ...]:
    """The folders modules.json names after the model's own (``module_dir``): an older save's ``1_Normalize``."""
    if not module_dir:
        return ()
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    paths = [str(module.get("path", "")).strip("/") for module in modules if isinstance(module, dict)]
    return tuple(path for path in paths if path and path != module_dir and "/" not in path and ".." not in path)


def check_weights_load(out: Path, body_class: str) -> None:
    """Every parameter is in the folder's weights: transformers would initialise a missing one at random."""
    from handlers.image.kinds.base import load_options
    from handlers.text.folder import FolderError
    from handlers.text.model import transformers_class

    _, loading = transformers_class(body_class).from_pretrained(str(out), output_loading_info=True, **load_options())
    missing = sorted(loading.get("missing_keys") or []) + sorted(str(k) for k in loading.get("mismatched_keys") or [])
    if missing:
        raise FolderError(
            "model.safetensors",
            f"has no weights (or weights of another shape) for {len(missing)} of the model's parameters "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): they would be random",
            "save config.json and the weights of the same model together (save_pretrained)",
        )


def parity(out: Path, kind: Any, info: Any, reference: Any) -> tuple[float, float]:
    """The served preprocessing and fp32 module against the reference library on the reference images, one image at
    a time: (agreement in the kind's measure, the largest pixel_values difference to the processor's)."""
    import torch

    from handlers.image.reference import reference_images

    module = kind.build_module(out, info)
    preprocessing = info.preprocessing
    expected, ours, pixel_difference = [], [], 0.0
    with torch.inference_mode():
        for image in reference_images():
            pixels = preprocessing.tensor([preprocessing.pixels(image)])
            theirs = torch.as_tensor(reference.processor(images=image, return_tensors="pt")["pixel_values"])
            if theirs.shape != pixels.shape:
                raise PrepareError(
                    f"the served preprocessing makes a {image.width}x{image.height} image {tuple(pixels.shape)}, "
                    f"the folder's image processor {tuple(theirs.shape)}; refused"
                )
            pixel_difference = max(pixel_difference, float((theirs.float() - pixels).abs().max()))
            ours.append(kind.row_value(info, module(pixels), 0))
            expected.append(reference.answer(image))
    return kind.parity(info, expected, ours), pixel_difference


def stage(source: str, out: Path, kind_name: str | None, min_parity: float | None) -> dict[str, Any]:
    from dataclasses import replace

    from handlers.image.folder import write_served
    from handlers.image.kinds import inspect_folder, kind_named
    from handlers.image.preprocess import Preprocessing, PreprocessingError
    from handlers.text.folder import FolderError

    folder, origin = resolve_source(source)
    info = inspect_folder(folder, kind_name)
    kind = kind_named(info.kind)
    # An image-text folder saved by sentence-transformers before version 6 keeps the model in a module subfolder.
    module_dir = str(info.extra.get("image_text", {}).get("model_dir", ""))
    check_files(folder / module_dir)
    copied = copy_folder(folder, out, module_dir, sentence_transformers_module_dirs(folder, module_dir))
    # An image-text model's text tokenizer, through the text models' own steps (before the reference library loads
    # the folder: a tokenizer it cannot load is refused naming the file).
    staged = kind.stage(folder, out, info)
    reference = kind.load_reference(out, info)
    try:
        preprocessing = Preprocessing.from_processor(reference.processor)
    except PreprocessingError as error:
        raise FolderError(
            "preprocessor_config.json", str(error), "save one of the image processors listed with the model"
        ) from None
    body_class = type(reference.body).__name__ if hasattr(reference, "body") else info.body_class
    info = replace(info, preprocessing=preprocessing, body_class=body_class)
    check_weights_load(out / module_dir, body_class)
    write_served(out, info, staged)
    info = inspect_folder(out, kind.name)  # the staged copy is what the worker reads: check it too
    agreement, pixel_difference = parity(out, kind, info, reference)
    bound = PARITY_BOUND if min_parity is None else min_parity
    if agreement < bound:
        raise PrepareError(
            f"{folder}: the served {kind.name} model computes something else than {kind.reference_library} on the "
            f"reference images (fp32 agreement {agreement:.6f} < {bound}, {kind.gate_measure}); refused"
        )
    companion = kind.companion_parity(out, info, reference)  # e.g. an image-text model's text tower
    for what, value in companion.items():
        if value < bound:
            raise PrepareError(
                f"{folder}: the served {kind.name} model's {what.replace('_', ' ')} differ from "
                f"{kind.reference_library}'s (fp32 agreement {value:.6f} < {bound}); refused"
            )
    record = {
        **origin,
        **kind.describe(info),
        "files": copied,
        "parity": {
            "reference": kind.reference_library,
            "fp32_agreement": round(agreement, 7),
            "bound": bound,
            "pixel_values_max_difference": pixel_difference,
            **{what: round(value, 7) for what, value in companion.items()},
        },
    }
    weights = out / "model.safetensors"
    if weights.is_file():
        record["model.safetensors sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (out / "model_source.json").write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"staged {kind.name} model {folder} -> {out}: {info.model_type} ({info.body_class}, "
        f"{preprocessing.processor_class}), parity with {kind.reference_library} {agreement:.6f}, pixel_values "
        f"max difference {pixel_difference:g}"
    )
    return record


def main(argv: list[str] | None = None) -> int:
    from handlers.image.kinds import KINDS

    parser = argparse.ArgumentParser(
        prog="python -m scripts.prepare_image_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kind", choices=("auto", *KINDS), default="auto", help="the model's kind (auto: the folder's)"
    )
    parser.add_argument("--source", required=True, help="the model folder")
    parser.add_argument("--out", type=Path, required=True, help="folder to stage the archive's model files in")
    parser.add_argument("--min-parity", type=float, help=f"fp32 agreement with the reference library ({PARITY_BOUND})")
    parser.add_argument(
        "--backends",
        default="default",
        help=f"compiled backends to build: default (what pays off on this machine), all, none, or a list of "
        f"{', '.join(build_backends.ALL_BACKENDS)} (scripts/build_backends.py)",
    )
    parser.add_argument("--rank-seconds", type=float, default=30.0, help="backend ranking budget (default 30 s)")
    parser.add_argument(
        "--min-cosine", type=float, help="the backends' gate bound to eager fp32 (default: the kind's, 0.999 or 0.99)"
    )
    args = parser.parse_args(argv)
    backends = parse_backends(parser, args.backends)
    if args.rank_seconds <= 0 or (args.min_cosine is not None and not 0 < args.min_cosine <= 1):
        parser.error("--rank-seconds must be positive and --min-cosine in (0, 1]")
    from handlers.text.folder import FolderError

    try:
        stage(args.source, args.out, None if args.kind == "auto" else args.kind, args.min_parity)
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
