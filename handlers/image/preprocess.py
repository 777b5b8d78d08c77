"""An image as the model's image processor makes it, without the image processor: resize, center crop, rescale,
normalize, channels first; then images of any size in one batch become one tensor per final shape.

What the folder's ``preprocessor_config.json`` means is decided by transformers itself, once, at package time: the
packaging step loads the folder's image processor and records its resolved settings (:meth:`Preprocessing.
from_processor`) in the archive's ``image_model.json``; the worker reads that record (:meth:`Preprocessing.
from_record`) and never imports the image processor. The steps are transformers' PIL backend's, in its order and
arithmetic, so the tensors are the same (tests/unit/test_image_preprocess.py compares them bit for bit):

- resize with PIL on the 8-bit RGB image (what transformers' ``resize`` does after ``to_pil_image``), to
  ``height`` x ``width``, or the shortest edge to ``shortest_edge`` (the long edge ``int(shortest * long / short)``,
  torchvision's rule), capped by ``longest_edge`` where set; ConvNeXt's ``crop_pct`` rule where the processor is
  ConvNeXt's (resize the short edge to ``shortest_edge / crop_pct``, then crop a square);
- center crop, padding with zeros where the image is smaller than the crop (transformers' ``center_crop``);
- rescale in float64 then to float32 (``image.astype(float64) * scale``), normalize in float32
  (``(x - mean) / std``).

Only the resize runs per image (PIL's C code); the crop is a view, and rescale and normalize run once per batch on
the stacked uint8 tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from math import ceil
from typing import Any

import numpy as np
import torch
from PIL import Image

# transformers' processor classes whose steps this module reproduces: the PIL backend's generic ones, and ConvNeXt's
# crop_pct resize. Any other class (a Siglip2 patch processor, EfficientNet's offset rescale) is refused at package
# time by name rather than served with different pixels.
GENERIC_PROCESSORS = frozenset(
    {
        "ViTImageProcessor",
        "DeiTImageProcessor",
        "BitImageProcessor",
        "CLIPImageProcessor",
        "SiglipImageProcessor",
        "ConvNextImageProcessor",
    }
)
SIZE_KEYS = ("height", "width", "shortest_edge", "longest_edge")


class PreprocessingError(ValueError):
    """An image processor whose steps this module does not reproduce; the message names what and why."""


@dataclass(frozen=True)
class Preprocessing:
    """The resolved steps of one image processor (what ``image_model.json`` records under ``preprocessing``)."""

    processor_class: str
    do_resize: bool = True
    size: dict[str, int] = field(default_factory=dict)  # height+width, or shortest_edge (+ longest_edge)
    resample: int = int(Image.Resampling.BILINEAR)
    crop_pct: float | None = None  # ConvNeXt only
    do_center_crop: bool = False
    crop_size: dict[str, int] = field(default_factory=dict)
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    # ------------------------------------------------------------------------------------------- the record
    @classmethod
    def from_processor(cls, processor: Any) -> Preprocessing:
        """What a loaded transformers image processor does (package time), or a refusal naming what differs."""
        name = type(processor).__name__.removesuffix("Pil").removesuffix("Fast")
        if name not in GENERIC_PROCESSORS:
            raise PreprocessingError(
                f"image processor {type(processor).__name__} is not one this server reproduces "
                f"({', '.join(sorted(GENERIC_PROCESSORS))})"
            )
        if getattr(processor, "do_pad", False):
            raise PreprocessingError(f"{name} pads images (do_pad), which this server does not reproduce")
        size = sized(getattr(processor, "size", None))
        crop_size = sized(getattr(processor, "crop_size", None))
        do_resize = bool(processor.do_resize)
        if do_resize and not (
            ("height" in size and "width" in size and "shortest_edge" not in size) or "shortest_edge" in size
        ):
            raise PreprocessingError(f"{name} size {size} is neither height+width nor shortest_edge")
        if name == "ConvNextImageProcessor" and "shortest_edge" not in size:
            raise PreprocessingError(f"{name} size {size} has no shortest_edge")
        mean, std = processor.image_mean, processor.image_std
        return cls(
            processor_class=name,
            do_resize=do_resize,
            size=size,
            resample=int(processor.resample if processor.resample is not None else Image.Resampling.BILINEAR),
            crop_pct=float(processor.crop_pct) if name == "ConvNextImageProcessor" else None,
            do_center_crop=bool(processor.do_center_crop),
            crop_size=crop_size,
            do_rescale=bool(processor.do_rescale),
            rescale_factor=float(processor.rescale_factor),
            do_normalize=bool(processor.do_normalize),
            image_mean=three(mean),
            image_std=three(std),
        )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Preprocessing:
        values = dict(record)
        values["image_mean"] = tuple(values.get("image_mean", (0.5, 0.5, 0.5)))
        values["image_std"] = tuple(values.get("image_std", (0.5, 0.5, 0.5)))
        return cls(**values)

    def record(self) -> dict[str, Any]:
        values = asdict(self)
        values["image_mean"], values["image_std"] = list(self.image_mean), list(self.image_std)
        return values

    # ------------------------------------------------------------------------------------------- per image
    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize step."""
        size = self.size
        if "shortest_edge" not in size:
            return size["height"], size["width"]
        shortest = size["shortest_edge"]
        if self.crop_pct is not None:  # ConvNeXt: below 384 the short edge goes to shortest/crop_pct, else a warp
            return (
                shortest_edge_size(height, width, int(shortest / self.crop_pct))
                if shortest < 384
                else (
                    shortest,
                    shortest,
                )
            )
        if "longest_edge" in size:
            return size_with_aspect_ratio(height, width, shortest, size["longest_edge"])
        return shortest_edge_size(height, width, shortest)

    def pixels(self, image: Image.Image) -> np.ndarray:
        """One RGB image -> its uint8 pixels (height, width, 3) after resize and center crop."""
        if image.mode != "RGB":
            image = image.convert("RGB")
        if self.do_resize:
            height, width = self.resized_size(image.height, image.width)
            image = image.resize((width, height), resample=Image.Resampling(self.resample))
            array = np.asarray(image)
            if self.crop_pct is not None and self.size["shortest_edge"] < 384:
                edge = self.size["shortest_edge"]
                array = center_crop(array, edge, edge)
        else:
            array = np.asarray(image)
        if self.do_center_crop:
            array = center_crop(array, self.crop_size["height"], self.crop_size["width"])
        return array

    # ------------------------------------------------------------------------------------------- per batch
    def tensor(self, pixels: Sequence[np.ndarray]) -> torch.Tensor:
        """Same-shaped uint8 (height, width, 3) images -> the model's float32 pixel_values (n, 3, height, width)."""
        stacked = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2)
        if self.do_rescale:
            # transformers upcasts to float64 before scaling, then rounds to float32: the same numbers.
            values = (stacked.to(torch.float64) * self.rescale_factor).to(torch.float32)
        else:
            values = stacked.to(torch.float32)
        if self.do_normalize:
            mean = torch.tensor(self.image_mean, dtype=torch.float32).view(1, 3, 1, 1)
            std = torch.tensor(self.image_std, dtype=torch.float32).view(1, 3, 1, 1)
            values = (values - mean) / std
        return values.contiguous()

    def describe(self) -> dict[str, Any]:
        return {key: value for key, value in self.record().items() if value not in (None, {}, [])}


def sized(value: Any) -> dict[str, int]:
    """A transformers SizeDict (or dict) as the keys it sets."""
    if value is None:
        return {}
    items = value.items() if hasattr(value, "items") else ((key, getattr(value, key, None)) for key in SIZE_KEYS)
    return {str(key): int(number) for key, number in items if key in SIZE_KEYS and number is not None}


def three(value: Any) -> tuple[float, ...]:
    values = [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)] * 3
    if len(values) != 3:
        raise PreprocessingError(f"image_mean/image_std {value!r} do not have 3 values (RGB)")
    return tuple(values)


def shortest_edge_size(height: int, width: int, shortest: int) -> tuple[int, int]:
    """torchvision's (and transformers') rule: the short edge becomes ``shortest``, the long one keeps the ratio,
    rounded down."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = shortest, int(shortest * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def size_with_aspect_ratio(height: int, width: int, shortest: int, longest: int) -> tuple[int, int]:
    """transformers' get_size_with_aspect_ratio: the short edge to ``shortest`` unless the long one would pass
    ``longest``."""
    raw = None
    low, high = float(min(height, width)), float(max(height, width))
    if high / low * shortest > longest:
        raw = longest * low / high
        shortest = int(round(raw))
    if (height <= width and height == shortest) or (width <= height and width == shortest):
        return height, width
    if width < height:
        return int((raw if raw is not None else shortest) * height / width), shortest
    return shortest, int((raw if raw is not None else shortest) * width / height)


def center_crop(array: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """transformers' center_crop on (height, width, channels): a view where the crop fits, else zero-padded first."""
    height, width = array.shape[:2]
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    if top >= 0 and left >= 0 and top + crop_height <= height and left + crop_width <= width:
        return array[top : top + crop_height, left : left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    padded = np.zeros((new_height, new_width, *array.shape[2:]), dtype=array.dtype)
    top_pad, left_pad = ceil((new_height - height) / 2), ceil((new_width - width) / 2)
    padded[top_pad : top_pad + height, left_pad : left_pad + width] = array
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top) : min(new_height, top + crop_height), max(0, left) : min(new_width, left + crop_width)]


def group_by_shape(pixels: Sequence[np.ndarray]) -> list[list[int]]:
    """Positions of same-shaped images, in first-seen order: each group is one tensor, one forward pass (a processor
    with a fixed output size makes one group of any batch)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for position, array in enumerate(pixels):
        groups.setdefault(tuple(array.shape), []).append(position)
    return list(groups.values())
