"""The served image preprocessing (handlers/image/preprocess.py) against transformers' own image processors: the same
pixel_values, bit for bit, for odd sizes, portrait and landscape, a 1x1 image and a large one, and the same values
when images of different sizes are batched together."""

import numpy as np
import pytest
import torch
from PIL import Image

from handlers.image.preprocess import Preprocessing, PreprocessingError, group_by_shape
from handlers.image.reference import reference_images

# (width, height): odd, portrait, landscape, tiny, larger than every model input, and exactly an input size.
SIZES = ((37, 53), (45, 97), (97, 45), (1, 1), (2, 3), (1200, 801), (224, 224), (32, 32))


def processors():
    from transformers import (
        BitImageProcessor,
        CLIPImageProcessor,
        ConvNextImageProcessor,
        SiglipImageProcessor,
        ViTImageProcessor,
    )

    return {
        "vit 32x32 bilinear": ViTImageProcessor(size={"height": 32, "width": 32}),
        "clip shortest edge 224 + crop, bicubic": CLIPImageProcessor(),
        "siglip 224x224 bicubic": SiglipImageProcessor(),
        "convnext crop_pct 224": ConvNextImageProcessor(size={"shortest_edge": 224}),
        "convnext 384 warp": ConvNextImageProcessor(size={"shortest_edge": 384}),
        "bit shortest edge 48 + crop 40": BitImageProcessor(
            size={"shortest_edge": 48}, crop_size={"height": 40, "width": 40}
        ),
        "crop larger than the resize (zero padding)": CLIPImageProcessor(
            size={"shortest_edge": 16}, crop_size={"height": 24, "width": 20}
        ),
        "no rescale, no normalize": ViTImageProcessor(
            size={"height": 20, "width": 28}, do_rescale=False, do_normalize=False
        ),
    }


def images():
    rng = np.random.default_rng(7)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for w, h in SIZES]


@pytest.fixture(scope="module")
def cases():
    return processors()


@pytest.mark.parametrize("name", list(processors()))
def test_each_image_gets_the_processors_pixel_values_bit_for_bit(cases, name):
    processor = cases[name]
    ours = Preprocessing.from_processor(processor)
    for image in images():
        expected = torch.as_tensor(processor(images=image, return_tensors="pt")["pixel_values"])
        got = ours.tensor([ours.pixels(image)])
        assert got.shape == expected.shape, (name, image.size)
        assert torch.equal(got, expected.float()), (name, image.size, float((got - expected).abs().max()))


def test_images_of_any_size_in_one_batch_become_one_tensor_with_each_images_own_values(cases):
    processor = cases["clip shortest edge 224 + crop, bicubic"]
    ours = Preprocessing.from_processor(processor)
    batch = images()
    pixels = [ours.pixels(image) for image in batch]
    groups = group_by_shape(pixels)
    assert groups == [list(range(len(batch)))]  # a fixed crop: one tensor for the whole batch
    stacked = ours.tensor(pixels)
    expected = torch.as_tensor(processor(images=batch, return_tensors="pt")["pixel_values"])
    assert torch.equal(stacked, expected)


def test_without_a_crop_images_of_other_shapes_form_their_own_groups(cases):
    processor = cases["bit shortest edge 48 + crop 40"]
    ours = Preprocessing.from_processor(processor)
    uncropped = Preprocessing.from_record({**ours.record(), "do_center_crop": False})
    pixels = [uncropped.pixels(image) for image in images()]
    groups = group_by_shape(pixels)
    assert sorted(i for group in groups for i in group) == list(range(len(SIZES)))
    for group in groups:
        assert len({pixels[i].shape for i in group}) == 1
    assert len(groups) > 1


def test_the_record_round_trips(cases):
    for processor in cases.values():
        ours = Preprocessing.from_processor(processor)
        assert Preprocessing.from_record(ours.record()) == ours


def test_a_processor_whose_steps_differ_is_refused_by_name():
    from transformers import EfficientNetImageProcessor

    with pytest.raises(PreprocessingError, match="EfficientNetImageProcessor"):
        Preprocessing.from_processor(EfficientNetImageProcessor())


def test_the_reference_images_cover_odd_tiny_and_large_sizes():
    sizes = [image.size for image in reference_images()]
    assert (1, 1) in sizes
    assert any(w > h for w, h in sizes) and any(h > w for w, h in sizes)
    assert max(max(size) for size in sizes) > 224
    assert [image.tobytes() for image in reference_images()] == [image.tobytes() for image in reference_images()]
