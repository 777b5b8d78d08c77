"""Per-token decoding latency versus position, with and without the key/value cache, and time to first token.

Runs handlers.generation.running.generate in this process (no server, so the numbers are the model's, not HTTP's)
on the generator's model folder: greedy decoding of one prompt, timing every step. With the cache a step feeds one token
and its cost stays flat as the text grows; without it every step recomputes the whole prefix, so its cost grows
with the position. Time to first token (prefill of the prompt + choosing the first token) is reported per mode.

    python -m scripts.bench_generator --quick          # a few seconds: short run, 1 repeat
    python -m scripts.bench_generator                  # positions up to 512, 3 repeats (make bench-generator)
    python -m scripts.bench_generator --model-dir /path/to/hf-dir --threads 4

Writes OUT_DIR/generator_bench.json (every step's median latency) and OUT_DIR/generator_bench.md (the table).
Exit codes: 0 done, 1 the model folder cannot be loaded, 2 bad arguments.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = REPO / "build" / "generator" / "lm"


def load(model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, local_files_only=True, use_safetensors=True, dtype=torch.float32
    ).eval()
    return model, tokenizer


def prompt_ids(tokenizer, count):
    """Exactly `count` prompt tokens: an English sentence's tokens, repeated as needed."""
    sentence = tokenizer.encode("The quick brown fox jumps over the lazy dog, then serves a model over HTTP. ")
    return (sentence * (count // len(sentence) + 1))[:count]


def time_steps(model, prompt, new_tokens, use_cache):
    """Seconds of each decoding step of one greedy run (step 0 = prefill + first token = time to first token)."""
    import torch

    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import generate

    stamps = []
    sequence = Sequence(list(prompt), SamplingSettings(max_new_tokens=new_tokens))
    started = time.perf_counter()
    with torch.inference_mode():
        # no stop token: every run decodes exactly new_tokens steps
        generate(
            model,
            [sequence],
            (),
            pad_token_id=0,
            use_cache=use_cache,
            on_step=lambda _: stamps.append(time.perf_counter()),
        )
    return [b - a for a, b in zip([started] + stamps[:-1], stamps, strict=True)]


def measure(model, prompt, new_tokens, repeats):
    """{mode: [median seconds of step i over repeats]} for the cached and the recomputing decoder."""
    results = {}
    for mode, use_cache in (("cache", True), ("no_cache", False)):
        time_steps(model, prompt, min(new_tokens, 8), use_cache)  # warm-up: first-call allocations
        runs = [time_steps(model, prompt, new_tokens, use_cache) for _ in range(repeats)]
        results[mode] = [statistics.median(step) for step in zip(*runs, strict=True)]
    return results


def report_positions(prompt_tokens, new_tokens):
    """Positions for the table: the first generated token's, then powers of two, then the last."""
    first, last = prompt_tokens, prompt_tokens + new_tokens - 1
    positions = [first] + [p for p in (32, 64, 128, 256, 512, 1024, 2048) if first < p < last] + [last]
    return sorted(set(positions))


def window_mean(latencies, step, half_width=2):
    """Mean over a few steps around `step` (single steps are noisy on a shared machine)."""
    low, high = max(1, step - half_width), min(len(latencies), step + half_width + 1)  # step 0 is the prefill
    return statistics.fmean(latencies[low:high]) if high > low else latencies[step]


def table(results, prompt_tokens, new_tokens):
    rows = [
        "| position (tokens so far) | with cache, ms/token | without cache, ms/token | without / with |",
        "|---:|---:|---:|---:|",
    ]
    for position in report_positions(prompt_tokens, new_tokens):
        step = position - prompt_tokens
        cached = window_mean(results["cache"], step) * 1000
        recomputed = window_mean(results["no_cache"], step) * 1000
        rows.append(f"| {position} | {cached:.2f} | {recomputed:.2f} | {recomputed / cached:.1f}x |")
    ttft = {mode: results[mode][0] * 1000 for mode in results}
    total = {mode: sum(results[mode]) for mode in results}
    rows += [
        "",
        f"time to first token ({prompt_tokens}-token prompt): with cache {ttft['cache']:.2f} ms, "
        f"without {ttft['no_cache']:.2f} ms",
        f"{new_tokens} tokens: with cache {total['cache']:.2f} s ({new_tokens / total['cache']:.0f} tokens/s), "
        f"without {total['no_cache']:.2f} s ({new_tokens / total['no_cache']:.0f} tokens/s)",
    ]
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench_generator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help=f"Hugging Face causal-LM folder (default {DEFAULT_MODEL_DIR.relative_to(REPO)}, "
        "built as the random demo model if missing)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (default 16)")
    parser.add_argument("--new-tokens", type=int, default=497, help="tokens to generate (default 497: up to 512)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode; medians are reported (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the served worker)")
    parser.add_argument("--quick", action="store_true", help="short smoke run: 8-token prompt, 120 tokens, 1 repeat")
    parser.add_argument("--out-dir", type=Path, default=REPO / "build" / "bench", help="where JSON and markdown go")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompt_tokens, args.new_tokens, args.repeats = 8, 120, 1
    if min(args.prompt_tokens, args.new_tokens, args.repeats, args.threads) < 1:
        parser.error("--prompt-tokens, --new-tokens, --repeats and --threads must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or DEFAULT_MODEL_DIR
    with tempfile.TemporaryDirectory(prefix="bench-generator-") as scratch:
        if args.model_dir is None and not (model_dir / "config.json").exists():
            from scripts import make_tiny_gpt2

            model_dir = Path(scratch) / "lm"
            print(f"{DEFAULT_MODEL_DIR.relative_to(REPO)} missing: building the random demo model in {model_dir}")
            make_tiny_gpt2.build(model_dir, seed=0, layers=2, hidden=128, heads=4, positions=1024, vocab_size=512)
        try:
            model, tokenizer = load(model_dir)
        except (OSError, ValueError) as error:
            print(f"error: cannot load {model_dir}: {error}", file=sys.stderr)
            return 1
    positions = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if positions and args.prompt_tokens + args.new_tokens > positions:
        parser.error(f"--prompt-tokens + --new-tokens must not exceed the model's {positions} positions")

    prompt = prompt_ids(tokenizer, args.prompt_tokens)
    results = measure(model, prompt, args.new_tokens, args.repeats)
    text = table(results, args.prompt_tokens, args.new_tokens)
    model_dir = Path(model_dir).resolve()
    shown = model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir
    setup = (
        f"model {shown} ({model.config.model_type}, {sum(p.numel() for p in model.parameters()):,} "
        f"parameters), fp32, batch 1, greedy, torch {torch.__version__}, {args.threads} thread(s), "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), median of {args.repeats} run(s)"
    )
    print(setup)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "setup": setup,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "quick": args.quick,
        "step_seconds": results,  # index i: the step that produced the token at position prompt_tokens + i
        "time_to_first_token_seconds": {mode: steps[0] for mode, steps in results.items()},
    }
    (args.out_dir / "generator_bench.json").write_text(json.dumps(record, indent=2) + "\n")
    command = "python -m scripts.bench_generator" + (" --quick" if args.quick else "")
    (args.out_dir / "generator_bench.md").write_text(f"`{command}`: {setup}\n\n{text}\n")
    print(f"saved {args.out_dir / 'generator_bench.json'} and {args.out_dir / 'generator_bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
