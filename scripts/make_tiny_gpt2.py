"""Build the demo causal LM: a tiny GPT-2-architecture model with RANDOM (untrained) weights, fully offline.

No pretrained language-model weights can be downloaded here, so the `generator` demo and its tests run on this model.
It exercises exactly the serving path a real GPT-2 checkpoint takes (Hugging Face config + safetensors weights +
tokenizer.json, loaded with `AutoModelForCausalLM`/`AutoTokenizer`), but its text is meaningless by construction.

The tokenizer is a byte-level BPE (the GPT-2 scheme: any UTF-8 text encodes, decoding is byte concatenation) trained
on a small corpus kept in this file, so the build needs no download. Weights come from a fixed seed: the same
arguments give byte-identical files.

    python -m scripts.make_tiny_gpt2 --out build/generator/lm [--seed 0] [--layers 2] [--hidden 128]
    python -m scripts.make_tiny_gpt2 --out build/generator-124m/lm --preset gpt2-small   # 124 M parameters

``--preset gpt2-small`` is GPT-2 small's shape (12 layers, hidden 768, 12 heads, 1024 positions, a 50,257-token
vocabulary, tied input and output embeddings: 124 M parameters), for measuring serving at a real model's cost. The
small corpus below cannot train 50,257 BPE tokens, so the vocabulary is filled up with word tokens (" w0", " w1",
...): every token still decodes to text, as a real model's do.

Exit codes: 0 built, 2 bad arguments.
"""

import argparse
import json
import sys
from pathlib import Path

END_OF_TEXT = "<|endoftext|>"

# Training text for the tokenizer only (the model never learns from it): plain English about this project's subject,
# so that common words become single tokens and prompts stay short.
CORPUS = """
TorchServe serves PyTorch models over HTTP. A request arrives at the frontend, waits in a queue, and is sent to a
worker together with other requests as a batch. The handler turns the requests of the batch into tensors, runs the
model once, and turns the outputs back into one answer per request. A model archive holds the handler, the weights
and the configuration. The management API registers models, scales workers and sets the default version.
A language model predicts the next token from the tokens before it. Generation repeats that step: the new token is
appended to the text and the model is asked again. Without a cache every step recomputes the whole prefix, so the
cost of a step grows with the length of the text. With a key and value cache the model keeps what it computed for
the earlier tokens and only processes the new one, so every step costs about the same.
Greedy decoding takes the most likely token. Sampling draws a token from the distribution, sharpened or flattened by
the temperature and limited to the top k candidates. A seed makes a sampled answer reproducible.
Streaming sends each piece of text as soon as it is produced, so the first words reach the reader long before the
last ones are written. The time to the first token is what a person waiting at a screen feels.
The quick brown fox jumps over the lazy dog. Hello world, this is a test of the serving stack. One, two, three,
four, five, six, seven, eight, nine, ten. What is the answer? It is forty two. Once upon a time there was a small
model that could not speak, because its weights were random; it still served every request on time.
"""


def build_tokenizer(vocab_size):
    """Byte-level BPE trained on CORPUS (deterministic: same corpus and size give the same merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    lines = [line.strip() for line in CORPUS.strip().splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines, trainer)
    return tokenizer


def fill_vocabulary(tokenizer, vocab_size):
    """Add word tokens (" w0", " w1", ...) until the tokenizer has ``vocab_size`` tokens (none when it has them)."""
    from tokenizers import AddedToken

    missing = vocab_size - tokenizer.get_vocab_size()
    if missing > 0:
        tokenizer.add_tokens([AddedToken(f" w{index}", normalized=False) for index in range(missing)])


def build(out_dir, seed, layers, hidden, heads, positions, vocab_size, tie_embeddings=False):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a build log, not a terminal: no progress bars

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    fill_vocabulary(tokenizer, vocab_size)
    end_id = tokenizer.token_to_id(END_OF_TEXT)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        model_max_length=positions,
    )
    wrapped.save_pretrained(out_dir)

    # The demo's output layer is untied and its initialisation wider than GPT-2's 0.02: with tied, near-zero weights
    # the residual stream echoes the input embedding and greedy decoding repeats one token forever, which would make
    # the cache-versus-recompute and batch-versus-alone tests trivially true. These weights give varied,
    # context-dependent tokens with clear margins between the top logits. The gpt2-small preset ties them, as GPT-2
    # does (its parameter count is GPT-2 small's).
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=positions,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        bos_token_id=end_id,
        eos_token_id=end_id,
        tie_word_embeddings=tie_embeddings,
        initializer_range=0.1,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    return {
        "vocab_size": config.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "positions": positions,
        "seed": seed,
    }


# Named sizes: build() arguments (besides the folder and the seed).
PRESETS = {
    "demo": {"layers": 2, "hidden": 128, "heads": 4, "positions": 1024, "vocab_size": 512},
    "gpt2-small": {
        "layers": 12,
        "hidden": 768,
        "heads": 12,
        "positions": 1024,
        "vocab_size": 50257,
        "tie_embeddings": True,
    },
}

# The model's size and seed: (flag, default, what it sets).
SIZE_OPTIONS = (
    ("--seed", 0, "torch seed of the random weights"),
    ("--layers", 2, "transformer blocks"),
    ("--hidden", 128, "hidden size"),
    ("--heads", 4, "attention heads"),
    ("--positions", 1024, "longest sequence, prompt + output"),
    ("--vocab-size", 512, "BPE vocabulary size to aim for"),
)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.make_tiny_gpt2",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for the Hugging Face model files")
    for flag, default, text in SIZE_OPTIONS:
        parser.add_argument(flag, type=int, default=default, help=f"{text} (default {default})")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named size (overrides the size flags)")
    args = parser.parse_args(argv)
    if args.preset:
        preset = PRESETS[args.preset]
        summary = build(args.out, args.seed, **preset)
        print(f"random-weight GPT-2 written to {args.out}: {json.dumps(summary)}")
        return 0
    if min(args.layers, args.hidden, args.heads, args.positions) < 1 or args.hidden % args.heads:
        parser.error("--layers, --hidden, --heads, --positions must be positive and --hidden divisible by --heads")
    if args.vocab_size < 258:
        parser.error("--vocab-size must be at least 258 (256 bytes + end-of-text + one merge)")
    summary = build(args.out, args.seed, args.layers, args.hidden, args.heads, args.positions, args.vocab_size)
    print(f"random-weight GPT-2 written to {args.out}: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
