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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SIGLIP_TEXT_TOKENS = 64  # what the zero-shot pipeline pads a SigLIP text to (SigLIP was trained on that)
# The zero-shot parity check's labels: a few everyday classes, one long enough to need several tokens.
PARITY_LABELS = ("cat", "dog", "a red sports car", "mountain landscape at sunset", "bowl of soup")
REFERENCE_SENTENCES = Path(__file__).resolve().parents[3] / "models" / "reference_sentences.json"


def parity_texts() -> list[str]:
    """The texts the text tower's parity check computes: the text models' reference sentences (every script and
    length, some past the 77-token limit) where the repository has them, and the parity labels."""
    import json

    sentences = json.loads(REFERENCE_SENTENCES.read_text(encoding="utf-8")) if REFERENCE_SENTENCES.exists() else []
    return [str(sentence) for sentence in sentences] + list(PARITY_LABELS)


def parity_hypotheses() -> list[str]:
    """The parity labels in the served default zero-shot template, as a request without a template sends them."""
    from handlers.image.image_text_requests import DEFAULT_TEMPLATE

    return [DEFAULT_TEMPLATE.replace("{}", label, 1) for label in PARITY_LABELS]


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

    @torch.inference_mode()
    def text_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        if self.sentence_transformer is not None:
            return self.sentence_transformer.encode(list(texts), convert_to_tensor=True).float()
        kwargs = pipeline_text_kwargs(self.model_type)
        if not is_siglip(self.model_type):
            kwargs["truncation"] = True  # CLIP's 77 positions: a longer text would not run at all
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
        return ImageTextReference(first.model.eval(), processor.tokenizer, processor.image_processor, st)
    from transformers import AutoModel, AutoProcessor

    model = AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
    return ImageTextReference(model, processor.tokenizer, processor.image_processor)
