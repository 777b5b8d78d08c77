"""handlers.generation.decoding and handlers.generation.streaming on the packaged demo model (random weights),
without a server.

The model is the archive's own lm/ folder. Its weights are random, so no expected text is hard-coded: every
assertion compares two ways of computing the same thing (cache vs recompute, batch vs alone, seed vs seed).
"""

import pytest
import torch

from handlers.generation.decoding import SamplingSettings, Sequence, choose_token, left_pad
from handlers.generation.running import generate
from handlers.generation.streaming import INCOMPLETE_CHARACTER, IncrementalText

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog, and then over the lazy dog again.",
    "A",
    "Once upon a time there was a small model",
]


class RecordingModel(torch.nn.Module):
    """The real model, recording the input shape of every forward pass it is asked for."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config
        self.input_shapes = []

    def forward(self, input_ids, **kwargs):
        self.input_shapes.append(tuple(input_ids.shape))
        return self.model(input_ids=input_ids, **kwargs)


@pytest.fixture(scope="module")
def lm(prepared_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = prepared_model_dir("generator") / "lm"
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, use_safetensors=True).eval()
    # One thread, as the served worker uses (handler.threads: 1): tiny matrices gain nothing from more, and on a
    # shared CI machine spinning threads make these tests many times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield RecordingModel(model), tokenizer
    torch.set_num_threads(threads)


def decode(model, prompt_ids, settings, stop_token_ids=(), use_cache=True):
    sequences = [Sequence(list(ids), s) for ids, s in zip(prompt_ids, settings, strict=True)]
    with torch.inference_mode():
        generate(model, sequences, stop_token_ids, pad_token_id=0, use_cache=use_cache)
    return sequences


def decode_alone(model, prompt_ids, settings, stop_token_ids=()):
    return [decode(model, [ids], [s], stop_token_ids)[0] for ids, s in zip(prompt_ids, settings, strict=True)]


def test_left_pad_puts_tokens_right_and_counts_positions_over_real_tokens():
    input_ids, mask, positions = left_pad([[5, 6, 7], [9]], pad_token_id=0, device="cpu")
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions[0].tolist() == [0, 1, 2] and positions[1, -1].item() == 0


def test_greedy_with_cache_equals_recomputing_the_prefix_every_step(lm):
    model, tokenizer = lm
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    settings = [SamplingSettings(max_new_tokens=40)] * len(PROMPTS)
    for ids, setting in zip(prompt_ids, settings, strict=True):
        model.input_shapes.clear()
        [cached] = decode(model, [ids], [setting], use_cache=True)
        cached_shapes = list(model.input_shapes)
        model.input_shapes.clear()
        [recomputed] = decode(model, [ids], [setting], use_cache=False)
        assert cached.token_ids == recomputed.token_ids
        assert len(cached.token_ids) == 40 and len(set(cached.token_ids)) > 5  # not a degenerate repetition
        # The cached run fed the prompt once and then one token per step; the other fed the whole prefix each time.
        assert cached_shapes == [(1, len(ids))] + [(1, 1)] * 39
        assert [shape[1] for shape in model.input_shapes] == list(range(len(ids), len(ids) + 40))


def test_batch_of_different_lengths_gives_each_prompt_its_tokens_alone(lm):
    model, tokenizer = lm
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    assert len({len(ids) for ids in prompt_ids}) == len(PROMPTS)
    settings = [
        SamplingSettings(max_new_tokens=25),
        SamplingSettings(max_new_tokens=7, temperature=0.8, seed=1),
        SamplingSettings(max_new_tokens=18, temperature=1.5, top_k=20, seed=2),
        SamplingSettings(max_new_tokens=3),
    ]
    model.input_shapes.clear()
    batched = decode(model, prompt_ids, settings)
    batch_rows = [shape[0] for shape in model.input_shapes]
    alone = decode_alone(model, prompt_ids, settings)
    for together, by_itself, setting in zip(batched, alone, settings, strict=True):
        assert together.token_ids == by_itself.token_ids
        assert len(together.token_ids) == setting.max_new_tokens and together.finish_reason == "length"
    # Finished rows left the batch: 4 rows until the 3-token one ends, 3 until the 7-token one, 2, then 1.
    assert batch_rows == [4] * 3 + [3] * 4 + [2] * 11 + [1] * 7


def test_stop_token_ends_its_row_early_without_changing_the_others(lm):
    model, tokenizer = lm
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    settings = [SamplingSettings(max_new_tokens=20)] * len(PROMPTS)
    free_run = decode_alone(model, prompt_ids[:1], settings[:1])[0].token_ids
    stop_token = free_run[4]  # what the first prompt produces at step 5 becomes the end-of-text token
    batched = decode(model, prompt_ids, settings, stop_token_ids=[stop_token])
    alone = decode_alone(model, prompt_ids, settings, stop_token_ids=[stop_token])
    first = batched[0]
    assert first.finish_reason == "stop" and first.token_ids[-1] == stop_token
    assert first.token_ids == free_run[: free_run.index(stop_token) + 1]
    for together, by_itself in zip(batched, alone, strict=True):
        assert together.token_ids == by_itself.token_ids
        assert together.finish_reason == by_itself.finish_reason


def test_seeded_sampling_is_reproducible_and_depends_on_the_seed(lm):
    model, tokenizer = lm
    ids = tokenizer.encode(PROMPTS[0])
    draw = lambda seed: decode(model, [ids], [SamplingSettings(30, temperature=1.0, seed=seed)])[0].token_ids  # noqa
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    greedy = decode(model, [ids], [SamplingSettings(30)])[0].token_ids
    assert draw(7) != greedy


def test_top_k_restricts_draws_to_the_k_most_likely_tokens():
    logits = torch.randn(512, generator=torch.Generator().manual_seed(0))
    allowed = set(torch.topk(logits, 3).indices.tolist())
    generator = torch.Generator().manual_seed(1)
    draws = {choose_token(logits, SamplingSettings(1, temperature=2.0, top_k=3), generator) for _ in range(300)}
    assert draws == allowed
    assert choose_token(logits, SamplingSettings(1, temperature=1.0, top_k=1), generator) == int(logits.argmax())


def test_incremental_text_concatenates_to_the_decoded_text(lm):
    _, tokenizer = lm
    generator = torch.Generator().manual_seed(5)
    for _ in range(50):
        token_ids = torch.randint(
            0, len(tokenizer), (int(torch.randint(1, 40, (1,), generator=generator)),), generator=generator
        ).tolist()
        text = IncrementalText(tokenizer, tokenizer.encode("Hello"))
        pieces = [text.push(token) for token in token_ids]
        assert all(not piece.endswith(INCOMPLETE_CHARACTER) for piece in pieces)
        text.finish()
        # byte-level BPE decodes by concatenating bytes, so the pieces add up to exactly the decoded text
        assert text.text == tokenizer.decode(token_ids, skip_special_tokens=True)
