"""The image-text kind's model path in process, on tiny random CLIP, SigLIP and sentence-transformers CLIP folders
(scripts/tiny_image_models.py): its text and image vectors equal the reference libraries' (transformers' model
forward, sentence-transformers' encode), and its zero-shot answers equal transformers' zero-shot-image-classification
pipeline's, sigmoid for SigLIP and softmax for CLIP. Its texts take the text models' path: the tokenizer exported and
proved at package time (served_tokenizer.json, no transformers tokenizer in the worker), the text path's padding
(SigLIP's fixed 64 tokens, CLIP's buckets) and row caches keyed by the model's identity, its shared tier too."""

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from handlers.core.errors import RequestError
from handlers.image.image_text_model import (
    TextEncoder,
    load_image_text_model,
    load_text_encoder,
    read_image_text_folder,
    stage_text_path,
)
from handlers.image.kinds.image_text_reference import load_reference, tokenizer_texts
from handlers.text.cache import RowCache
from handlers.text.folder import FolderError
from scripts import tiny_image_models

TEXTS = ["a photo of a cat", "a photo of a dog", "Bonjour le monde, très chaud!", "x"]
LABELS = ["cat", "dog", "car", "house"]
BOUND = 0.9999


def _images():
    """Four images of different sizes and content: noise, a gradient, flat colour, a wide one."""
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8))
    ramp = np.linspace(0, 255, 64 * 64 * 3).reshape(64, 64, 3).astype(np.uint8)
    return [noise, Image.fromarray(ramp), Image.new("RGB", (33, 33), (200, 30, 90)), noise.resize((120, 40))]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("image-text")
    clip = tiny_image_models.make_clip(root / "clip")
    return {
        "clip": clip,
        "siglip": tiny_image_models.make_siglip(root / "siglip"),
        "st-clip": tiny_image_models.make_sentence_transformers_clip(root / "st-clip", clip),
    }


STAGED_TEXT: dict = {}


def _text_staged(folder):
    """The folder's text path as the packaging step stages it (served_tokenizer.json written into the folder) and
    what image_model.json records of it; once per folder."""
    if folder not in STAGED_TEXT:
        STAGED_TEXT[folder] = stage_text_path(folder, folder, read_image_text_folder(folder), tokenizer_texts())
    return STAGED_TEXT[folder]


def _served(folder):
    info = read_image_text_folder(folder)
    model = load_image_text_model(folder, info)
    return info, model, load_text_encoder(folder, info, model.text, _text_staged(folder))


def _cosines(a, b):
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


@pytest.mark.parametrize("name", ["clip", "siglip", "st-clip"])
def test_text_and_image_vectors_equal_the_reference_library(folders, name):
    info, model, encoder = _served(folders[name])
    reference = load_reference(folders[name])
    expected_texts = reference.text_embeddings(TEXTS)
    got_texts = torch.stack([text.value for text in encoder.encode(TEXTS)])
    assert got_texts.shape == expected_texts.shape
    assert _cosines(got_texts, expected_texts).min() >= BOUND
    # Vectors of different texts differ: a blind tower would pass the parity above with any input.
    assert _cosines(got_texts[0:1], got_texts[2:3]).item() < 0.99
    images = _images()
    pixels = reference.image_processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        got_images = model.image(pixels)
    expected_images = reference.image_embeddings(images)
    assert _cosines(got_images, expected_images).min() >= BOUND
    assert torch.allclose(got_images.norm(dim=-1), expected_images.norm(dim=-1), rtol=1e-4)
    assert _cosines(got_images[0:1], got_images[1:2]).item() < 0.99


def test_sentence_transformers_clip_vectors_are_encodes_unnormalized_ones_and_the_transformers_ones_unit(folders):
    info = read_image_text_folder(folders["st-clip"])
    assert info.sentence_transformers and not info.normalize and info.architecture == "CLIPModel"
    _, _, encoder = _served(folders["st-clip"])
    assert abs(float(encoder.encode(TEXTS[:1])[0].value.norm()) - 1.0) > 1e-3
    _, _, encoder = _served(folders["clip"])
    assert abs(float(encoder.encode(TEXTS[:1])[0].value.norm()) - 1.0) < 1e-5


@pytest.mark.parametrize("name", ["clip", "siglip", "st-clip"])
@pytest.mark.parametrize("template", ["This is a photo of {}.", "{}"])
def test_zero_shot_scores_equal_the_pipeline(folders, name, template):
    info, model, encoder = _served(folders[name])
    reference = load_reference(folders[name])
    image = _images()[1]
    expected = reference.zero_shot(image, LABELS, template)
    pixels = reference.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        image_vectors = model.image(pixels)
    labels = torch.stack([text.value for text in encoder.encode([template.format(label) for label in LABELS])])
    scores = model.scores(image_vectors, labels)[0]
    got = sorted(zip(scores.tolist(), LABELS, strict=True), key=lambda pair: -pair[0])
    assert [label for _, label in got] == [answer["label"] for answer in expected]
    assert np.allclose([score for score, _ in got], [answer["score"] for answer in expected], atol=1e-5)
    if name == "siglip":  # a sigmoid per label: the scores need not sum to 1
        assert abs(sum(answer["score"] for answer in expected) - 1.0) > 1e-3
    else:
        assert abs(sum(score for score, _ in got) - 1.0) < 1e-5


class RecordingTower(torch.nn.Module):
    """The text tower, recording what each forward pass is fed."""

    def __init__(self, tower):
        super().__init__()
        self.tower = tower
        self.model = tower.model
        self.calls = []

    def forward(self, input_ids, attention_mask=None):
        self.calls.append((input_ids.clone(), None if attention_mask is None else attention_mask.clone()))
        return self.tower(input_ids, attention_mask)


LONG = ["word " * 200, "Bonjour le monde, " * 30]


@pytest.mark.parametrize("name", ["clip", "siglip", "st-clip"])
def test_the_served_tokenizer_gives_transformers_ids_long_texts_cut_alike(folders, name):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    info, _, encoder = _served(folders[name])
    assert isinstance(encoder.tokenizer.tokenizer, Tokenizer)  # the tokenizers library's, not transformers'
    theirs = AutoTokenizer.from_pretrained(str(folders[name] / info.model_dir))
    texts = TEXTS + LONG
    ours = encoder.tokenizer.encode_batch(texts)
    expected = theirs(texts, truncation=True, max_length=encoder.max_tokens)["input_ids"]
    assert [e.ids for e in ours] == [list(ids) for ids in expected]
    assert encoder.max_tokens == (64 if name == "siglip" else 77)
    assert [bool(e.overflowing) for e in ours] == [False] * len(TEXTS) + [True] * len(LONG)
    staged = _text_staged(folders[name])
    assert staged["tokenizer"]["pad_id"] == encoder.tokenizer.pad_id == theirs.pad_token_id
    assert staged["tokenizer"]["special_ids"] == sorted(theirs.all_special_ids)
    assert staged["tokenizer"]["truncation_side"] == "right"


def test_siglip_texts_are_padded_to_64_tokens_without_a_mask_as_the_pipeline_pads_them(folders):
    from transformers import AutoTokenizer

    info, model, encoder = _served(folders["siglip"])
    assert _text_staged(folders["siglip"])["padding"] == {"fixed": 64, "mask": False, "max_tokens": 64}
    recording = RecordingTower(encoder.tower)
    encoder.tower = recording
    texts = TEXTS + LONG
    got = torch.stack([row.value for row in encoder.encode(texts)])
    [(ids, mask)] = recording.calls
    assert ids.shape == (len(texts), 64) and mask is None
    # The ids the pipeline feeds (padding="max_length", max_length=64), and no mask: SigLIP's tokenizer makes none.
    pipeline = AutoTokenizer.from_pretrained(str(folders["siglip"]))(
        texts, padding="max_length", max_length=64, truncation=True, return_tensors="pt"
    )
    assert "attention_mask" not in pipeline and torch.equal(ids, pipeline["input_ids"])
    with torch.inference_mode():
        expected = model.text.model.get_text_features(input_ids=pipeline["input_ids"]).pooler_output
    expected = torch.nn.functional.normalize(expected.float(), dim=-1)
    assert _cosines(got, expected).min() >= BOUND


def test_clip_texts_are_padded_to_their_length_bucket_with_a_mask(folders):
    _, _, encoder = _served(folders["clip"])
    assert _text_staged(folders["clip"])["padding"] == {"buckets": [16, 32, 64, 77], "mask": True, "max_tokens": 77}
    recording = RecordingTower(encoder.tower)
    encoder.tower = recording
    encoder.encode(["a cat", "word " * 200])
    shapes = sorted(tuple(ids.shape) for ids, _ in recording.calls)
    assert shapes == [(1, 16), (1, 77)] and all(mask is not None for _, mask in recording.calls)


def test_a_clip_tokenizer_json_that_pads_to_77_answers_like_the_pipeline(folders, tmp_path):
    # The older openai/clip folders save tokenizer.json with padding (and truncation) to 77; transformers' call
    # replaces both, and so does the export: the rows are the text path's, the vectors the pipeline's.
    import shutil

    padded = tmp_path / "clip-padded"
    shutil.copytree(folders["clip"], padded)
    saved = json.loads((padded / "tokenizer.json").read_text())
    eos = max(int(token["id"]) for token in saved["added_tokens"])
    saved["padding"] = {
        "strategy": {"Fixed": 77},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": eos,
        "pad_type_id": 0,
        "pad_token": "<|endoftext|>",
    }
    saved["truncation"] = {"direction": "Right", "max_length": 77, "strategy": "LongestFirst", "stride": 0}
    (padded / "tokenizer.json").write_text(json.dumps(saved))
    _, model, encoder = _served(padded)
    recording = RecordingTower(encoder.tower)
    encoder.tower = recording
    got = torch.stack([row.value for row in encoder.encode(TEXTS)])
    assert max(ids.shape[1] for ids, _ in recording.calls) < 77  # their buckets, not the saved padding
    reference = load_reference(padded)
    assert _cosines(got, reference.text_embeddings(TEXTS)).min() >= BOUND
    image = _images()[0]
    expected = reference.zero_shot(image, LABELS)
    pixels = reference.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        image_vectors = model.image(pixels)
    labels = torch.stack([row.value for row in encoder.encode([f"This is a photo of {label}." for label in LABELS])])
    scores = sorted(zip(model.scores(image_vectors, labels)[0].tolist(), LABELS, strict=True), key=lambda p: -p[0])
    assert [label for _, label in scores] == [answer["label"] for answer in expected]
    assert np.allclose([score for score, _ in scores], [answer["score"] for answer in expected], atol=1e-5)


def test_the_worker_text_path_loads_no_transformers_tokenizer(folders, monkeypatch):
    import transformers

    info = read_image_text_folder(folders["clip"])
    staged = _text_staged(folders["clip"])
    model = load_image_text_model(folders["clip"], info)

    def refuse(*args, **kwargs):
        raise AssertionError("the worker's text path loaded a transformers tokenizer")

    for name in ("AutoTokenizer", "AutoProcessor", "CLIPTokenizer", "CLIPTokenizerFast", "PreTrainedTokenizerFast"):
        if getattr(transformers, name, None) is not None:
            monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)
    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "__call__", refuse)
    encoder = load_text_encoder(folders["clip"], info, model.text, staged)
    [row] = encoder.encode(["a photo of a cat"])
    assert row.value.shape == (info.dimension,) and not row.truncated


def test_a_folder_staged_without_its_text_path_is_refused_naming_the_fix(folders):
    info = read_image_text_folder(folders["clip"])
    model = load_image_text_model(folders["clip"], info)
    with pytest.raises(FolderError, match="image_model.json.*package the model again"):
        load_text_encoder(folders["clip"], info, model.text, None)


def test_the_text_cache_is_keyed_by_the_models_identity(folders):
    _, _, encoder = _served(folders["clip"])
    cache = RowCache(16)
    counting = RecordingTower(encoder.tower)

    def encoder_of(identity, version="1"):
        return TextEncoder(encoder.tokenizer, encoder.padding, counting, encoder.scores, cache, identity, version)

    first, second = encoder_of("sha256:" + "aa" * 32), encoder_of("sha256:" + "bb" * 32)
    [row] = first.encode(["a photo of a cat"])
    assert len(counting.calls) == 1
    assert first.encode(["a photo of a cat"])[0] is row and len(counting.calls) == 1  # a hit
    [other] = second.encode(["a photo of a cat"])  # another model under the same name: its own entry
    assert len(counting.calls) == 2 and len(cache) == 2 and other is not row
    encoder_of("sha256:" + "aa" * 32, "2").encode(["a photo of a cat"])  # another version too
    assert len(counting.calls) == 3


def test_the_padding_rule_is_recorded_and_read_back_and_a_fixed_length_holds_every_row():
    from handlers.text.buckets import PaddingRule

    for rule in (PaddingRule(64, 64, mask=False), PaddingRule(77)):
        assert PaddingRule.from_record(rule.record()) == rule
    assert PaddingRule(64, 64, mask=False).groups([3, 64, 10], 8192)[0].pad_length == 64
    with pytest.raises(ValueError, match="fixed"):
        PaddingRule(77, 64)
    with pytest.raises(ValueError, match="masked"):
        PaddingRule(77, mask=False)


class FakeValkey:
    """What the shared tier calls of its Redis client: MGET, and a pipeline of SETs."""

    def __init__(self):
        self.values = {}

    def mget(self, keys):
        return [self.values.get(key) for key in keys]

    def pipeline(self, transaction=False):
        client = self

        class Pipeline:
            def __init__(self):
                self.sets = []

            def set(self, key, value, ex=None):
                self.sets.append((key, value))

            def execute(self):
                client.values.update(self.sets)
                return [True] * len(self.sets)

        return Pipeline()


def test_texts_share_the_models_shared_tier_beside_its_images(folders):
    from handlers.image.kinds.base import CompanionContext
    from handlers.text.shared_cache import SHARED_CACHE_OPTION, Namespace, SharedCache, check_settings

    info = read_image_text_folder(folders["clip"])
    model = load_image_text_model(folders["clip"], info)
    settings = check_settings(SHARED_CACHE_OPTION, "shared_cache", {"url": "redis://127.0.0.1:1/0"})
    images = Namespace("clip", "1", "eager", "fp32", 1, info.dimension, identity="sha256:" + "aa" * 32)
    client = SharedCache(settings, images, "redis://127.0.0.1:1/0")
    client.client = FakeValkey()

    def worker(identity):
        context = CompanionContext("clip", "1", identity, {"text_cache_size": 16}, lambda: client)
        encoder = load_text_encoder(folders["clip"], info, model.text, _text_staged(folders["clip"]), context)
        encoder.tower = RecordingTower(encoder.tower)
        return encoder

    one, two, other = worker(images.identity), worker(images.identity), worker("sha256:" + "bb" * 32)
    [computed] = one.encode(["a photo of a dog"])
    assert len(one.tower.calls) == 1 and len(client.client.values) == 1
    [shared] = two.encode(["a photo of a dog"])  # a second worker: from the shared tier, not computed
    assert two.tower.calls == [] and torch.equal(shared.value, computed.value)
    assert (shared.tokens, shared.truncated) == (computed.tokens, computed.truncated)
    other.encode(["a photo of a dog"])  # another model's identity reads none of it
    assert len(other.tower.calls) == 1 and len(client.client.values) == 2
    events = client.drain()  # one client: the handler records the texts' round trips with the images'
    assert (events.hits, events.misses) == (1, 2)


def test_a_long_text_is_cut_at_the_tower_limit_and_says_so(folders):
    _, _, encoder = _served(folders["clip"])
    long_text = "word " * 200
    cut, short = encoder.encode([long_text, "short"])
    assert cut.truncated and cut.tokens == encoder.max_tokens == 77
    assert not short.truncated and short.tokens < 77


def test_a_broken_tokenizer_json_is_refused_at_package_time_naming_the_file(folders, tmp_path):
    import shutil

    from scripts.prepare_image_model import stage

    broken = tmp_path / "clip-broken"
    shutil.copytree(folders["clip"], broken)
    (broken / "served_tokenizer.json").unlink(missing_ok=True)
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "nonsense"')
    with pytest.raises(FolderError, match=r"(?s)^tokenizer\.json: does not load.*Fix: save the tokenizer again"):
        stage(str(broken), tmp_path / "model", None, None)


def test_siglip2_and_foreign_modules_are_refused_by_name(folders, tmp_path):
    siglip2 = tmp_path / "siglip2"
    siglip2.mkdir()
    (siglip2 / "config.json").write_text(json.dumps({"model_type": "siglip2", "architectures": ["Siglip2Model"]}))
    with pytest.raises(FolderError, match="Siglip2Model"):
        read_image_text_folder(siglip2)
    pooled = tmp_path / "pooled"
    pooled.mkdir()
    modules = json.loads((folders["st-clip"] / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "9_Pooling", "type": "sentence_transformers.models.Pooling"})
    (pooled / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(FolderError, match="Pooling"):
        read_image_text_folder(pooled)


# ---------------------------------------------------------------------------------------------------------------------
# The served path in process: each folder staged by the packaging step (its parity checks included), loaded by the
# image engine, and requests parsed and answered by the kind's routes.


class HeaderContext:
    """The one thing a route reads of TorchServe's context: the request's headers."""

    def __init__(self, content_type):
        self.headers = {"Content-Type": content_type}

    def get_request_header(self, idx, name):
        return self.headers.get(name)


def png(image):
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def data_uri(image):
    return "data:image/png;base64," + base64.b64encode(png(image)).decode()


@pytest.fixture(scope="module")
def engines(folders, tmp_path_factory):
    from handlers.image.engine import ImageEngine
    from scripts.prepare_image_model import stage

    loaded = {}
    for name, folder in folders.items():
        staged = tmp_path_factory.mktemp(f"staged-{name}") / "model"
        record = stage(str(folder), staged, None, None)
        parity = record["parity"]
        assert min(parity["fp32_agreement"], parity["text_vectors"], parity["zero_shot_scores"]) >= BOUND, parity
        assert record["kind"] == "image-text"
        loaded[name] = ImageEngine.load(staged, {"precision": "fp32"}, threads=1, name=name)
    return loaded


def served(engine, body, content_type="application/json", path=""):
    """One request through the kind's route at PATH: its answer, or its RequestError."""
    from handlers.core.http import RequestView
    from handlers.core.routes import route_table
    from handlers.image.requests import ImageRequestContext

    api = ImageRequestContext(engine.loaded.info, engine.sources, "m", "m", companion=engine.loaded.companion)
    route = route_table(engine.kind.routes())[path]
    try:
        payload = route.parse(api, body, RequestView(HeaderContext(content_type), 0))
    except RequestError as error:
        return error
    [result] = engine.run([payload], lambda request, rows: route.answer(api, request, rows))
    return result


def decoded_png(image):
    return Image.open(io.BytesIO(png(image))).convert("RGB")


@pytest.mark.parametrize("name", ["clip", "siglip", "st-clip"])
def test_served_text_and_image_embeddings_equal_the_reference(folders, engines, name):
    engine, reference = engines[name], load_reference(folders[name])
    images = _images()[:2]
    text = served(engine, {"text": TEXTS[0]})
    assert set(text) == {"embedding", "truncated"} and text["truncated"] is False
    expected = reference.text_embeddings(TEXTS[:1])[0]
    assert _cosines(torch.tensor(text["embedding"]), expected).item() >= BOUND
    raw = served(engine, png(images[0]), "image/png")
    expected_images = reference.image_embeddings([decoded_png(image) for image in images])
    assert _cosines(torch.tensor(raw["embedding"]), expected_images[0]).item() >= BOUND
    both = served(
        engine, {"texts": TEXTS[:2], "images": [data_uri(images[0]), base64.b64encode(png(images[1])).decode()]}
    )
    assert set(both) == {"text_embeddings", "truncated", "image_embeddings"}
    assert _cosines(torch.tensor(both["image_embeddings"]), expected_images).min() >= BOUND
    assert _cosines(torch.tensor(both["text_embeddings"]), reference.text_embeddings(TEXTS[:2])).min() >= BOUND
    assert both["image_embeddings"][0] == raw["embedding"]  # the same bytes: the same cached row


@pytest.mark.parametrize("name", ["clip", "siglip", "st-clip"])
def test_served_zero_shot_is_the_pipelines_answer(folders, engines, name):
    engine, reference = engines[name], load_reference(folders[name])
    images = _images()[1:3]
    body = {"images": [data_uri(image) for image in images], "candidate_labels": LABELS}
    answers = served(engine, body)
    assert len(answers) == 2
    for image, answer in zip(images, answers, strict=True):
        expected = reference.zero_shot(decoded_png(image), LABELS)
        assert [a["label"] for a in answer] == [e["label"] for e in expected]
        assert np.allclose([a["score"] for a in answer], [e["score"] for e in expected], atol=1e-5)
        assert list(answer[0]) == ["score", "label"]
    one = served(engine, {"image": data_uri(images[0]), "candidate_labels": LABELS, "hypothesis_template": "{}"})
    expected = reference.zero_shot(decoded_png(images[0]), LABELS, "{}")
    assert [a["label"] for a in one] == [e["label"] for e in expected]
    assert np.allclose([a["score"] for a in one], [e["score"] for e in expected], atol=1e-5)


def test_jina_and_openai_input_keeps_the_items_order(folders, engines):
    engine, reference = engines["clip"], load_reference(folders["clip"])
    image = _images()[0]
    body = {
        "model": "m",
        "input": [{"image": data_uri(image)}, {"text": TEXTS[1]}, TEXTS[2]],
        "encoding_format": "float",
    }
    for path in ("", "v1/embeddings"):
        answer = served(engine, body, path=path)
        assert [entry["index"] for entry in answer["data"]] == [0, 1, 2] and answer["model"] == "m"
        got = torch.tensor([entry["embedding"] for entry in answer["data"]])
        expected = torch.cat([reference.image_embeddings([decoded_png(image)]), reference.text_embeddings(TEXTS[1:3])])
        assert _cosines(got, expected).min() >= BOUND
        assert answer["usage"]["total_tokens"] > 0
    as_base64 = served(engine, {**body, "encoding_format": "base64"}, path="v1/embeddings")
    decoded = [np.frombuffer(base64.b64decode(entry["embedding"]), dtype="<f4") for entry in as_base64["data"]]
    assert np.allclose(decoded, [entry["embedding"] for entry in answer["data"]], atol=1e-7)


def test_cohere_embed_v2_texts_images_and_inputs(folders, engines):
    engine, reference = engines["clip"], load_reference(folders["clip"])
    image = _images()[0]
    expected_image = reference.image_embeddings([decoded_png(image)])[0]
    answer = served(engine, {"images": [data_uri(image)], "embedding_types": ["float", "base64"]}, path="v2/embed")
    assert answer["response_type"] == "embeddings_by_type" and answer["meta"]["billed_units"]["images"] == 1
    assert _cosines(torch.tensor(answer["embeddings"]["float"][0]), expected_image).item() >= BOUND
    decoded = np.frombuffer(base64.b64decode(answer["embeddings"]["base64"][0]), dtype="<f4")
    assert decoded.tolist() == pytest.approx(answer["embeddings"]["float"][0])
    inputs = [
        {"content": [{"type": "text", "text": TEXTS[0]}]},
        {"content": [{"type": "image_url", "image_url": {"url": data_uri(image)}}]},
    ]
    answer = served(engine, {"inputs": inputs, "input_type": "search_document"}, path="v2/embed")
    floats = torch.tensor(answer["embeddings"]["float"])
    assert _cosines(floats[0], reference.text_embeddings(TEXTS[:1])[0]).item() >= BOUND
    assert _cosines(floats[1], expected_image).item() >= BOUND
    texts = served(engine, {"texts": TEXTS[:2]}, path="v2/embed")
    assert texts["texts"] == TEXTS[:2] and len(texts["embeddings"]["float"]) == 2


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        ({"text": "a", "texts": ["b"]}, "", "either 'text' or 'texts'"),
        ({"texts": ["a"], "candidate_labels": ["x"]}, "", "not texts"),
        ({"candidate_labels": ["x", "y"]}, "", "needs 'image'"),
        ({"image": "data:image/png;base64,xx", "candidate_labels": ["x"], "hypothesis_template": "no slot"}, "", "{}"),
        ({"text": "a", "top_k": 3}, "", "unknown field"),
        ({"input": [{"text": "a", "image": "b"}]}, "", "'input'[0]"),
        ({"images": ["aGVsbG8="] * 65}, "", "handler.max_images"),
        (
            {"inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
            "v2/embed",
            "not both",
        ),
        ({"texts": ["a"], "images": ["b"]}, "v2/embed", "one of"),
        ({"texts": ["a"], "embedding_types": ["int8"]}, "v2/embed", "embedding_types"),
        ({"image": "not base64 at all!"}, "", "image"),
    ],
)
def test_bad_requests_are_refused_naming_the_problem(engines, body, path, words):
    error = served(engines["clip"], body, path=path)
    assert isinstance(error, RequestError) and 400 <= error.code < 500, error
    assert words in error.message


def test_cohere_truncate_none_refuses_a_text_over_the_limit(engines):
    error = served(engines["clip"], {"texts": ["word " * 100], "truncate": "NONE"}, path="v2/embed")
    assert isinstance(error, RequestError) and error.code == 400 and "token limit" in error.message
    cut = served(engines["clip"], {"text": "word " * 100})
    assert cut["truncated"] is True


def test_make_package_picks_the_image_template_and_describe_says_what_the_model_is(folders, engines):
    from scripts import package

    for name in ("clip", "siglip", "st-clip"):
        assert package.template_for(folders[name]) == "image-model"
    described = engines["siglip"].kind.describe(engines["siglip"].loaded.info)
    assert described["kind"] == "image-text" and described["zero_shot_scores"] == "sigmoid"
    assert engines["st-clip"].kind.describe(engines["st-clip"].loaded.info)["layout"] == "sentence-transformers"
    texts = engines["siglip"].describe()["companion"]["texts"]
    assert texts["padding"] == {"fixed": 64, "mask": False, "max_tokens": 64} and texts["cache_size"] == 1024
    served = json.loads((Path(engines["clip"].model_dir) / "image_model.json").read_text())["staged"]["text"]
    assert served["padding"]["buckets"] == [16, 32, 64, 77] and served["tokenizer"]["file"] == "served_tokenizer.json"


def test_an_older_sentence_transformers_layout_is_packaged_and_serves_encodes_vectors(folders, tmp_path):
    # Saves before sentence-transformers 6 (most hub copies) keep the CLIP model in 0_CLIPModel/, then 1_Normalize/.
    from sentence_transformers import SentenceTransformer

    from handlers.image.engine import ImageEngine
    from scripts.prepare_image_model import stage

    folder = tiny_image_models.make_old_sentence_transformers_clip(tmp_path / "st-clip-old", folders["clip"])
    record = stage(str(folder), tmp_path / "model", None, None)
    assert record["parity"]["fp32_agreement"] >= BOUND and record["parity"]["text_vectors"] >= BOUND
    assert "0_CLIPModel/model.safetensors" in record["files"]

    engine = ImageEngine.load(tmp_path / "model", {"precision": "fp32"}, threads=1)
    image = _images()[0]
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    [row] = engine.encode([buffer.getvalue()])
    expected = torch.as_tensor(SentenceTransformer(str(folder), device="cpu").encode([image]))[0]
    assert float(_cosines(row.value, expected)) >= BOUND
    assert abs(float(row.value.norm()) - 1.0) < 1e-5  # its Normalize module is served


# ---------------------------------------------------------------------------------------------------------------------
# A CLIP text tower shorter than OpenAI's 77 positions (32, as in some small models) with the character-level tokenizer:
# the default zero-shot template's longer parity hypotheses do not fit it, and a user's long texts must be cut there.

SHORT_POSITIONS = 32


@pytest.mark.parametrize(
    ("layout", "tokenizer_max_length"),
    [("clip", None), ("clip", 77), ("st-clip", 77)],
    ids=["tokenizer-says-32", "tokenizer-says-77", "sentence-transformers-tokenizer-says-77"],
)
def test_a_clip_text_tower_of_32_positions_is_packaged_and_cuts_long_texts_and_labels_there(
    tmp_path, layout, tokenizer_max_length
):
    from handlers.image.engine import ImageEngine
    from handlers.image.kinds.image_text_reference import parity_hypotheses
    from scripts.prepare_image_model import stage

    folder = tiny_image_models.make_clip(tmp_path / "clip-32", SHORT_POSITIONS, tokenizer_max_length)
    if layout == "st-clip":
        folder = tiny_image_models.make_sentence_transformers_clip(tmp_path / "st-clip-32", folder)
    reference = load_reference(folder)
    # What the pipeline could not run: hypotheses in the default template past the tower's positions.
    assert max(len(ids) for ids in reference.tokenizer(parity_hypotheses())["input_ids"]) > SHORT_POSITIONS
    record = stage(str(folder), tmp_path / "model", None, None)
    parity = record["parity"]
    assert min(parity["fp32_agreement"], parity["text_vectors"], parity["zero_shot_scores"]) >= BOUND, parity

    engine = ImageEngine.load(tmp_path / "model", {"precision": "fp32"}, threads=1, name="clip-32")
    assert engine.loaded.companion.max_tokens == SHORT_POSITIONS
    texts = ["word " * 50, "a photo of a cat"]
    answer = served(engine, {"texts": texts})
    assert answer["truncated"] == [True, False]
    assert _cosines(torch.tensor(answer["text_embeddings"]), reference.text_embeddings(texts)).min() >= BOUND
    # A label past the positions is answered on its first 32 tokens (transformers' pipeline does not run it at all):
    # the scores are the model's softmax over its scaled cosines to the cut hypotheses.
    image = _images()[1]
    labels = ["cat", "a very long description of a mountain landscape at sunset"]
    zero_shot = served(engine, {"image": data_uri(image), "candidate_labels": labels})
    hypotheses = torch.nn.functional.normalize(reference.text_embeddings(parity_hypotheses(None, labels)), dim=-1)
    image_vector = torch.nn.functional.normalize(reference.image_embeddings([decoded_png(image)]), dim=-1)
    with torch.inference_mode():
        logits = reference.model.logit_scale.exp() * image_vector @ hypotheses.T
    expected = dict(zip(labels, torch.softmax(logits, dim=-1)[0].tolist(), strict=True))
    assert sorted(answer["label"] for answer in zero_shot) == sorted(labels)
    assert all(abs(answer["score"] - expected[answer["label"]]) < 1e-5 for answer in zero_shot)


def test_a_clip_text_tower_too_short_for_any_label_is_refused_at_package_time_naming_the_file(tmp_path, capfd):
    import shutil

    from scripts import package

    # 4 positions: even 'cat' is 5 tokens with the start and end ones.
    folder = tiny_image_models.make_clip(tmp_path / "clip-4", text_positions=4)
    store, name = tmp_path / "store", "unit-clip-4-positions"
    argv = ["image-model", "--name", name, "--var", f"model_dir={folder}", "--var", "backends=none"]
    try:
        assert package.main([*argv, "--store", str(store)]) == 1
    finally:
        shutil.rmtree(Path(package.REPO) / "build" / name, ignore_errors=True)
    error = capfd.readouterr().err
    assert "config.json: the text tower reads at most 4 tokens (text_config.max_position_embeddings 4" in error
    assert "'cat' 5" in error and "Fix: package the model's own config.json and tokenizer files" in error
    assert "Traceback" not in error
    assert not list(store.glob("**/*.mar"))
