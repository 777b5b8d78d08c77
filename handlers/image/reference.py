"""The generated images of the parity check (package time, against transformers) and the accuracy gate (every
worker start, against eager fp32): the same pixels everywhere, from a seed, with no image files in the archive.

Their sizes exercise the processor's resize rule: odd sizes, portrait and landscape, a 1x1 image and one larger than
the model's input; their content is smooth gradients with noise, so a resize filter or a channel order that differs
shows in the model's outputs."""

from __future__ import annotations

import numpy as np
from PIL import Image

SEED = 34
# (width, height): landscape, portrait, square at a typical input size, tiny, odd and large.
SIZES = ((64, 48), (45, 97), (224, 224), (1, 1), (33, 17), (640, 427))


def reference_images(sizes: tuple[tuple[int, int], ...] = SIZES) -> list[Image.Image]:
    rng = np.random.default_rng(SEED)
    images = []
    for width, height in sizes:
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        base = np.stack(
            [
                255 * x / max(1, width - 1),
                255 * y / max(1, height - 1),
                255 * (0.5 + 0.5 * np.sin((x + 2 * y) / 7.0)),
            ],
            axis=-1,
        )
        noisy = base + rng.normal(0, 24, size=base.shape)
        images.append(Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB"))
    return images
