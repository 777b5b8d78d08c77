"""A tiny, randomly initialised stand-in for all-MiniLM-L6-v2: same architecture code, tokenizer and file layout.

Compiling the real 6-layer encoder takes minutes on 2 cores; the compiler's behaviour (graphs, guards,
recompilations, AOT export) depends on the model's code, not its width, so the compile tests use this one.
"""

import json
import shutil
from pathlib import Path

import torch

COPIED = [
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "sentence_bert_config.json",
    "modules.json",
    "reference_sentences.json",
    "model-config.yaml",
    "text_model.json",  # what the packaging step recorded (kind, model class, served tokenizer)
    "served_tokenizer.json",
]


def make_tiny_model_dir(real_model_dir, target, hidden=32, layers=1, seed=0):
    """Write a model_dir like the archive's, with a 1-layer 32-wide BERT of seeded random weights."""
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    real_model_dir, target = Path(real_model_dir), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copy2(real_model_dir / name, target / name)
    real = json.loads((real_model_dir / "config.json").read_text())
    config = BertConfig(
        vocab_size=real["vocab_size"],
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=real["max_position_embeddings"],
    )
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=False)
    config.to_json_file(target / "config.json")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, target / "model.safetensors")
    (target / "1_Pooling").mkdir(exist_ok=True)
    (target / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_cls_token": False,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            }
        )
    )
    return target
