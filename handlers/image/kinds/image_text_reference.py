"""What the reference libraries answer for an image-text folder, in fp32: the text and image embeddings and the
zero-shot image classification of transformers' ``zero-shot-image-classification`` pipeline. The package-time parity
check compares the served path with these (bound 0.9999 cosine); the tests compare served answers with them.

Package time and tests only: it imports transformers (and sentence-transformers for its folders), which a worker
never does for this kind.

- transformers ``CLIPModel`` / ``SiglipModel`` folders: the vectors are the ``text_embeds`` / ``image_embeds`` the
  model's own forward computes (projected, then made unit length: what ``logits_per_image`` is a scaled cosine of);
  texts are tokenized as the pipeline tokenizes them (SigLIP: padded to 64 tokens, its text tower reads the padding).
- sentence-transformers CLIP folders: what ``SentenceTransformer.encode`` returns for texts and for PIL images (the
  projected vectors, unit length only where the folder has a Normalize module); zero-shot through the pipeline on the
  transformers model inside it.

A CLIP text tower reads as many tokens as its position embeddings (77 in OpenAI's CLIP, fewer in some small models):
the reference cuts a text there (the pipeline does not cut CLIP texts, and a longer one does not run at all), and the
zero-shot parity check uses the labels and template that fit (:func:`fit_zero_shot_parity`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SIGLIP_TEXT_TOKENS = 64  # what the zero-shot pipeline pads a SigLIP text to (SigLIP was trained on that)
# The zero-shot parity check's labels: a few everyday classes, one long enough to need several tokens.
PARITY_LABELS = ("cat", "dog", "a red sports car", "mountain landscape at sunset", "bowl of soup")
BARE_TEMPLATE = "{}"  # the label alone: the shortest hypothesis, for a text tower too short for the default template
MIN_PARITY_LABELS = 2  # a zero-shot answer with one label is that label whatever the model computes
REFERENCE_SENTENCES = Path(__file__).resolve().parents[3] / "models" / "reference_sentences.json"


def parity_texts() -> list[str]:
    """The texts the text tower's parity check computes: the text models' reference sentences (every script and
    length, some past the 77-token limit) where the repository has them, and the parity labels."""
    import json

    sentences = json.loads(REFERENCE_SENTENCES.read_text(encoding="utf-8")) if REFERENCE_SENTENCES.exists() else []
    return [str(sentence) for sentence in sentences] + list(PARITY_LABELS)


def parity_hypotheses(template: str | None = None, labels: Sequence[str] = PARITY_LABELS) -> list[str]:
    """LABELS in TEMPLATE (default: the served default zero-shot template, as a request without one sends them)."""
    from handlers.image.image_text_requests import DEFAULT_TEMPLATE

    return [(template or DEFAULT_TEMPLATE).replace("{}", label, 1) for label in labels]


@dataclass(frozen=True)
class ZeroShotParity:
    """The labels and template the package-time zero-shot check sends: the pipeline's answer and the served one are
    compared on them."""

    template: str
    labels: tuple[str, ...]

    def hypotheses(self) -> list[str]:
        return parity_hypotheses(self.template, self.labels)


def fit_zero_shot_parity(token_count: Callable[[str], int], max_tokens: int) -> ZeroShotParity | None:
    """The parity labels whose hypotheses the text tower reads whole (TOKEN_COUNT tokens, special ones included, at
    most MAX_TOKENS): in the served default template where at least two fit, else as bare labels; None where fewer
    than two fit even bare. A cut hypothesis is no check: the pipeline does not cut a CLIP text (a longer one does
    not run), and two cut hypotheses could be the same tokens."""
    from handlers.image.image_text_requests import DEFAULT_TEMPLATE

    for template in (DEFAULT_TEMPLATE, BARE_TEMPLATE):
        fitting = tuple(
            label
            for label, hypothesis in zip(PARITY_LABELS, parity_hypotheses(template), strict=True)
            if token_count(hypothesis) <= max_tokens
        )
        if len(fitting) >= MIN_PARITY_LABELS:
            return ZeroShotParity(template, fitting)
    return None


def tokenizer_texts() -> list[str]:
    """The texts the served tokenizer's ids are proved on at package time: the parity texts, the parity labels in
    the default zero-shot template, and texts past every tower's limit (so that truncation is proved too, whether or
    not the repository's reference sentences are there)."""
    long_texts = ["word " * 200, "A much longer caption, " * 40 + "with its end cut off."]
    return [*parity_texts(), *parity_hypotheses(), *long_texts]


def is_siglip(model_type: str) -> bool:
    """SigLIP and SigLIP 2: scored with a sigmoid and padded to 64 tokens, as the pipeline decides by this test."""
    return "siglip" in model_type


def pipeline_text_kwargs(model_type: str) -> dict[str, Any]:
    """The tokenizer arguments transformers' zero-shot-image-classification pipeline uses for this model type
    (written out from its preprocess, not imported from the served path: a reference must not share the code it
    checks; the zero-shot tests run the pipeline itself)."""
    if is_siglip(model_type):
        return {"padding": "max_length", "max_length": SIGLIP_TEXT_TOKENS, "truncation": True}
    return {"padding": True}


@dataclass
class ImageTextReference:
    """A folder as the reference library loads it: ``model`` the transformers model (CLIPModel, SiglipModel),
    ``tokenizer`` and ``image_processor`` what its processor holds, ``sentence_transformer`` where the folder is one."""

    model: Any
    tokenizer: Any
    image_processor: Any
    sentence_transformer: Any = None

    @property
    def model_type(self) -> str:
        return str(self.model.config.model_type)

    @property
    def text_positions(self) -> int:
        """The tokens the text tower's position embeddings hold: a longer text does not run."""
        return int(self.model.config.text_config.max_position_embeddings)

    def text_limit(self) -> int:
        """Where a text is cut: the tokenizer's model_max_length, or the text tower's positions where fewer."""
        limit = self.tokenizer.model_max_length
        return min(int(limit), self.text_positions) if isinstance(limit, int) and limit > 0 else self.text_positions

    def token_count(self, text: str) -> int:
        """TEXT's tokens as the pipeline tokenizes it for this model (uncut, special tokens included)."""
        return len(self.tokenizer(text)["input_ids"])

    @torch.inference_mode()
    def text_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        if self.sentence_transformer is not None:
            return self.sentence_transformer.encode(list(texts), convert_to_tensor=True).float()
        kwargs = pipeline_text_kwargs(self.model_type)
        if not is_siglip(self.model_type):
            # CLIP's 77 positions (fewer in some small models): a longer text would not run at all. Cut where the
            # text tower ends even where the tokenizer's model_max_length says more.
            kwargs.update(truncation=True, max_length=self.text_limit())
        inputs = self.tokenizer(list(texts), return_tensors="pt", **kwargs)
        features = self.model.get_text_features(**inputs).pooler_output
        return torch.nn.functional.normalize(features.float(), dim=-1)

    @torch.inference_mode()
    def image_embeddings(self, images: Sequence[Any]) -> torch.Tensor:
        if self.sentence_transformer is not None:
            return self.sentence_transformer.encode(list(images), convert_to_tensor=True).float()
        pixels = self.image_processor(images=list(images), return_tensors="pt")
        features = self.model.get_image_features(**pixels).pooler_output
        return torch.nn.functional.normalize(features.float(), dim=-1)

    def zero_shot(
        self, image: Any, candidate_labels: Sequence[str], hypothesis_template: str = "This is a photo of {}."
    ) -> list[dict[str, Any]]:
        """transformers' zero-shot-image-classification pipeline's answer: [{"score", "label"}], best first."""
        from transformers import pipeline

        classifier = pipeline(
            "zero-shot-image-classification",
            model=self.model,
            tokenizer=self.tokenizer,
            image_processor=self.image_processor,
            device="cpu",
        )
        return classifier(image, candidate_labels=list(candidate_labels), hypothesis_template=hypothesis_template)


def load_reference(folder: str | os.PathLike[str]) -> ImageTextReference:
    """The reference library's model of FOLDER (offline, fp32, eval mode)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(folder)
    if (folder / "modules.json").exists():
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(folder), device="cpu", local_files_only=True).eval()
        first: Any = st[0]  # its Transformer module (the CLIP model and its processor)
        processor = first.processor
        reference = ImageTextReference(first.model.eval(), processor.tokenizer, processor.image_processor, st)
        # encode cuts a text at the tokenizer's model_max_length, which may say more than the text tower holds (a
        # longer text does not run): cut where the tower ends, as sentence-transformers' own max_seq_length does.
        first.max_seq_length = reference.text_limit()
        return reference
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
    return ImageTextReference(model, processor.tokenizer, processor.image_processor)
