"""The image load-test mix (loadtests/images.py) and its traffic (loadtests/payloads.py): seeded, unique per request,
decodable, in each system's request shape; and the image targets of the comparison. No server."""

import base64
import hashlib
import io

from PIL import Image

from loadtests import compare, compare_report, images, payloads
from scripts.ops import registry


def digest(data):
    return hashlib.sha256(data).hexdigest()


def test_pool_spans_thumbnails_to_4000_pixel_photos_in_three_formats_and_is_seeded():
    pool = images.image_pool(0)
    again = images.image_pool.__wrapped__(0)  # drawn afresh, not the cached pool
    assert [digest(i.data) for i in pool] == [digest(i.data) for i in again]
    assert len(pool) == images.POOL_SIZE
    assert {i.format for i in pool} == {"JPEG", "PNG", "WEBP"}
    sides = [max(i.width, i.height) for i in pool]
    assert min(sides) == 64 and max(sides) == 4000
    assert all(i.format == "JPEG" for i in pool if max(i.width, i.height) > images.LARGEST_PNG_OR_WEBP)
    assert any(i.height > i.width for i in pool)  # portraits too


def test_stamped_images_differ_in_bytes_only_and_still_decode_to_the_same_pixels():
    for image in images.image_pool(0):
        first, second = images.stamp(image, 1), images.stamp(image, 2)
        assert first != second != image.data and len(first) == len(image.data)
        decoded = Image.open(io.BytesIO(second))
        decoded.load()  # a PNG whose chunk checksum were left stale fails here
        assert decoded.size == (image.width, image.height)
        assert decoded.tobytes() == Image.open(io.BytesIO(image.data)).tobytes()


def test_image_payloads_are_reproducible_unique_and_mix_raw_bodies_with_json_base64():
    stream = images.ImagePayloads(0, 3)
    bodies = [stream.next() for _ in range(60)]
    again = images.ImagePayloads(0, 3)
    assert [repr(b) for b in bodies] == [repr(again.next()) for _ in range(60)]
    raw = [b for b in bodies if isinstance(b, images.RawBody)]
    sent_json = [b for b in bodies if isinstance(b, dict)]
    assert raw and sent_json
    assert {b.content_type for b in raw} <= set(images.MEDIA_TYPES.values())
    decoded = [b.data for b in raw] + [base64.b64decode(b["image"]) for b in sent_json]
    assert len({digest(data) for data in decoded}) == len(decoded)  # no request a cache could answer
    other_user = images.ImagePayloads(0, 4).next()
    assert repr(other_user) != repr(bodies[0])


def test_each_system_gets_the_same_images_in_its_own_request_shape():
    stock = payloads.image_traffic("vit-base-stock", "image-classification")
    assert stock.path == "/predictions/vit-base-stock"
    assert all(isinstance(stock.payloads(0, 1).next(), images.RawBody) for _ in range(10))
    infinity = payloads.image_traffic("clip-b32-openai", "image-text")
    body = infinity.payloads(0, 1).next()
    assert infinity.path == "/embeddings" and body["model"] == "clip-b32" and body["modality"] == "image"
    assert body["input"][0].startswith("data:image/")
    ours = payloads.image_traffic("vit-base", "image-classification")
    assert ours.path == "/predictions/vit-base"


def test_image_answers_are_checked_and_a_wrong_one_is_named():
    classify = payloads.image_traffic("vit-base", "image-classification").check
    assert classify([{"label": "cat", "score": 0.7}, {"label": "dog", "score": 0.2}]) is None
    assert "score" in classify([{"label": "cat", "score": 1.5}])
    assert classify({"embedding": [0.1]}) is not None
    stock = payloads.image_traffic("vit-base-stock", "image-classification").check
    assert stock({"tabby": 0.4, "tiger": 0.1}) is None and stock([]) is not None
    infinity = payloads.image_traffic("clip-b32-openai", "image-text").check
    assert infinity({"data": [{"embedding": [0.1, 0.2]}]}) is None
    assert infinity({"data": []}) is not None


def test_bodies_are_sent_as_json_or_raw_bytes_with_their_media_type():
    raw = images.RawBody(b"\xff\xd8jpeg", "image/jpeg")
    assert payloads.request_parts(raw) == ({"data": b"\xff\xd8jpeg"}, "image/jpeg")
    assert payloads.request_parts({"text": "hi"}) == ({"json": {"text": "hi"}}, "application/json")
    requests, headers = payloads.worker_requests([raw, {"text": "hi"}])
    assert requests == [{"body": bytearray(b"\xff\xd8jpeg")}, {"body": {"text": "hi"}}]
    assert headers == [
        {"Content-Type": "image/jpeg", "url_path": ""},
        {"Content-Type": "application/json", "url_path": ""},
    ]


def test_image_kinds_carry_the_issues_targets_and_the_ratio_is_reported(monkeypatch):
    assert registry.KINDS["image-text"].targets == (registry.Target("infinity", 1.5),)
    assert "infinity" in registry.KINDS["image-text"].baselines
    assert registry.KINDS["image-classification"].targets[0].bound == 3.0
    clip = registry.build("clip-b32", "image-text", "handlers/image_model.py", {})
    monkeypatch.setattr(registry, "model", lambda name, store=None: clip)
    verdicts = compare.evaluate_targets(
        "clip-b32",
        {
            "ours": {"capacity_rate": 30.0, "precision": "fp32"},
            "infinity": {"capacity_rate": 12.0, "precision": "fp32"},
        },
    )
    assert verdicts == [
        {
            "target": "ours / infinity >= 1.5x (throughput at the SLO)",
            "value": 2.5,
            "bound": 1.5,
            "met": True,
            "note": "",
        }
    ]


def test_a_baseline_that_passes_no_rate_meets_the_target_only_when_its_p50_was_already_over_the_slo(monkeypatch):
    vit = registry.build("vit-base", "image-classification", "handlers/image_model.py", {})
    monkeypatch.setattr(registry, "model", lambda name, store=None: vit)
    stock = {"capacity_rate": None, "slo_ms": 250, "lowest_rate": 0.5}
    over = compare.evaluate_targets(
        "vit-base", {"ours": {"capacity_rate": 0.5}, "stock-image-classifier": {**stock, "lowest_p50_ms": 380}}
    )
    assert over[0]["met"] is True and over[0]["value"] is None
    assert "380 ms > the 250 ms SLO" in over[0]["note"] and "unbounded" in over[0]["note"]
    under = compare.evaluate_targets(
        "vit-base", {"ours": {"capacity_rate": 0.5}, "stock-image-classifier": {**stock, "lowest_p50_ms": 200}}
    )
    assert under[0]["met"] is None and "search lower" in under[0]["note"]
    neither = compare.evaluate_targets(
        "vit-base", {"ours": {"capacity_rate": None}, "stock-image-classifier": {**stock, "lowest_p50_ms": 380}}
    )
    assert neither[0]["met"] is None
    text = compare_report.render_markdown(
        {
            "model": "vit-base",
            "slo_ms": 250,
            "cores": 2,
            "started_at": "now",
            "search": {"step_seconds": 10},
            "moderate_rate": 2,
            "systems": {"ours": {"capacity_rate": 0.5}, "stock-image-classifier": {**stock, "lowest_p50_ms": 200}},
            "targets": under,
        }
    )
    assert "**not measured** — stock-image-classifier passed no rate down to 0.5/s" in text
