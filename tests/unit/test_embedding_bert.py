"""The plain-torch BERT encoder (handlers/text/bert.py) computes what transformers' BertModel computes.

The worker serves handlers/text/bert.py instead of transformers (its import alone cost ~7 s of every worker
start); these tests pin the two together on the same random weights, padding included, and check that a config the
module does not implement is refused instead of silently computed differently."""

import pytest
import torch

from handlers.text.bert import BertEncoder, check_bert_config

pytestmark = pytest.mark.unit


def hf_bert(layers=2, hidden=64, heads=4, seed=0):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=1000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=128,
    )
    config._attn_implementation = "eager"  # the textbook path, so the comparison does not share our sdpa call
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=False).eval()
    return config, model


def ours_from(config, model):
    ours = BertEncoder(check_bert_config(config.to_dict()))
    weights = {k: v for k, v in model.state_dict().items() if k != "embeddings.position_ids"}
    ours.load_state_dict(weights, strict=True)  # same names as the checkpoint: nothing missing, nothing extra
    return ours.eval()


def test_matches_transformers_on_real_tokens_with_padding():
    config, model = hf_bert()
    ours = ours_from(config, model)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, 1000, (3, 20), generator=generator)
    attention_mask = torch.ones(3, 20, dtype=torch.long)
    attention_mask[1, 7:] = 0  # a padded row
    attention_mask[2, 1:] = 0  # a row of one real token
    input_ids[attention_mask == 0] = 0
    with torch.inference_mode():
        expected = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        got = ours(input_ids, attention_mask)
    real = attention_mask.bool()
    # Padding positions are never pooled; compare the tokens that are.
    assert torch.allclose(got[real], expected[real], atol=1e-5), (got[real] - expected[real]).abs().max()


def test_padding_does_not_change_real_tokens():
    config, model = hf_bert(layers=1)
    ours = ours_from(config, model)
    ids = torch.randint(1, 1000, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        alone = ours(ids, torch.ones_like(ids))
        padded_ids = torch.cat([ids, torch.zeros(1, 23, dtype=torch.long)], dim=1)
        mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 23, dtype=torch.long)], dim=1)
        padded = ours(padded_ids, mask)[:, :9]
    assert torch.allclose(alone, padded, atol=1e-5)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"model_type": "roberta"}, "model_type"),
    ],
)
def test_unsupported_variants_are_refused(change, named):
    config, _ = hf_bert(layers=1)
    with pytest.raises(ValueError, match=named):
        check_bert_config({**config.to_dict(), **change})


def test_missing_weight_fails_the_load():
    config, model = hf_bert(layers=1)
    ours = BertEncoder(check_bert_config(config.to_dict()))
    weights = {k: v for k, v in model.state_dict().items() if k != "embeddings.position_ids"}
    del weights["encoder.layer.0.output.dense.bias"]
    with pytest.raises(RuntimeError, match="output.dense.bias"):
        ours.load_state_dict(weights, strict=True)
