"""Targeted measurements of the generator's scheduling on the measurement model (GPT-2 small's shape).

    python -m loadtests.generator_scheduling short    # a short request among long ones: when does its answer leave?
    python -m loadtests.generator_scheduling prefix   # time to first token with a 200-token shared system prompt
    python -m loadtests.generator_scheduling cancel   # decoding steps spent after a client disconnects
    python -m loadtests.generator_scheduling probe    # TorchServe's two per-step mechanisms: cost of one step
    python -m loadtests.generator_scheduling steps    # in-process: a prefill and a decoding step by batch size
    python -m loadtests.generator_scheduling calls    # served demo model: several steps per TorchServe call or one
    python -m loadtests.generator_scheduling load     # in-process: a worker's load, decoder exported or traced
    python -m loadtests.generator_scheduling all      # each of the above (make generator-scheduling)

short   per-step and static (loadtests/generator_systems.py): three long streams (256 tokens) and one short one
        (8 tokens), sent together and, again, the short one while the long ones decode. A decoding step is the
        median gap between two pieces of the long streams meanwhile; the short request's answer leaves
        ``(end - first piece) / step - (tokens - 1)`` steps after its last token (0: with it).
prefix  per-step with prefix reuse (as packaged) and without (handler.prefix_cache.max_bytes 0): one request at a
        time, each a 200-token system prompt (exactly, in the model's tokens) and a question of its own, 8 tokens
        streamed; the first request of each server fills the cache and is reported apart.
cancel  per-step and static: a stream (native API, 256 tokens) whose client reads 5 pieces and closes the
        connection, and a plain request whose client leaves after 2 s; tokens generated after the disconnect are
        read from the server's GeneratedTokens counter once it is idle (a decoding step gives one token per row).
probe   no model: a decoder that makes one token per step in no time (loadtests/generator_probe/), served once with
        continuousBatching and once with asyncCommunication, shows what a step costs in TorchServe's frontend
        (one stream of 400 tokens; 8 streams of 200) and whether a client's disconnect reaches the worker.
steps   in-process, no server: the median time of a decoding step of the measurement model with 1, 4, 8 and 16
        running rows (about 150 columns wide); for a 9-token prompt joining such a batch (and a 200-token one
        joining 16 rows), its first token and the running rows' longest wait between two tokens, prefilled whole
        in a pass of its own and with chunked prefill (the archive's handler.prefill_chunk_tokens); one prefill
        alone. --threads N: torch threads (default 1, as the archive's worker). --rows 1,16: those batch sizes
        only. --compile-decode true: the handler loads with handler.compile_decode true (its MLPs compiled if the
        gate passes) and each decoding step is timed compiled and, alternately on the same batch, eager (so a busy
        machine's drift hits both); the graphs torch.compile made over the whole run are reported. Each batch size
        is also timed with rows of very different lengths (one prompt of the archive's max_prompt_tokens among
        9-token ones). --decode-attention per_row: the handler loads with handler.decode_attention per_row (a
        step's attention over each row's own columns) and each step is timed that way and, alternately, padded.
        --precision bf16: instead of the joins, each decoding step at fp32, with the model as a bf16 generator
        serves it (fp32 output layer) and wholly in bf16 (``bf16_head_bf16``: what the fp32 output layer costs),
        alternately on batches alike (medians of 10), and the decoding gate (handlers/generation/precision.py) of
        both bf16 forms: passed or not, with its figures. --decode-step openvino: instead of the joins, each decoding
        step on the paged OpenVINO step (handler.decode_step openvino) and, alternately on batches alike, on the
        eager step (greedy; medians of 10, wall and CPU), with rows of 1 length and of very different lengths, and
        whether both chose the same tokens; then 10 more steps of the paged step alone (``_openvino_alone_s``: no
        eager step between them to take the caches, as in a server that runs only it).
calls   the demo archive (model_store/generator.mar, built if needed) served with handler.decode_call_ms 20 (steps
        sharing a TorchServe call) and with decode_call_ms 0 (one step a call, as shipped), two servers side by side
        measured alternately: at 1 user a greedy stream of 128 tokens (ms per token after the first, pieces per
        token) and the same request plain (ms per token), 10 each, medians; at 16 users 32 streams of 128 tokens
        (output tokens/s, twice; pieces per token).
load    in-process, no server: the measurement archive's handler loaded with handler.decode_step openvino, twice
        each, alternately with the decoder exported at package time (decode/openvino/) and with it set aside (the
        worker traces the model at load): describe's load phases (decode_step: conversion or reading, compile,
        gate), medians.

Each writes loadtests/reports/generator-<name>-<time>.json and prints its figures. Exit codes: 0 measured, 1 a
server failed, 2 bad arguments.
"""

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from loadtests import generator_systems as systems
from loadtests.prometheus import parse
from scripts.ops import machine
from scripts.ops.server import exit_on_sigterm, private_server
from scripts.ops.stats import percentile

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "loadtests" / "reports"
PROBE = REPO / "loadtests" / "generator_probe"
QUESTIONS = [f"Question {n}: how do I serve model number {n} with {n + 1} workers?" for n in range(12)]
SYSTEM_PROMPT_TOKENS = 200
LONG_PROMPT_TOKENS = 200  # steps: a long prompt joining 16 running rows
SYSTEM_TEXT = (
    "You are the support assistant of a model-serving platform. Answer questions about deploying PyTorch models "
    "with TorchServe: model archives, handlers, batching, workers, metrics, the management API and streaming. Be "
    "precise, name the configuration keys a user must change, and say when a question is outside your scope. "
)


# ------------------------------------------------------------------------------------------------ short among long
def stream_times(endpoint, prompt, max_tokens, into, key, started_event=None):
    """Stream a completion; put (piece times, end time, start time) under ``into[key]``."""
    body = {"model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    started = time.perf_counter()
    times = []
    with requests.post(endpoint.completions_url, json=body, stream=True, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data: {") and any(c.get("text") for c in json.loads(line[6:]).get("choices") or []):
                times.append(time.perf_counter())
                if started_event is not None and len(times) >= 10:
                    started_event.set()
    into[key] = {"pieces": times, "end": time.perf_counter(), "start": started}


def short_among_long(endpoint, together):
    """Three long streams and one short one; ``together``: all sent at once, else the short once the long ones
    have given 10 pieces each."""
    runs, threads, events = {}, [], []
    for n in range(3):
        event = threading.Event()
        events.append(event)
        args = (endpoint, f"A long story number {n}", 256, runs, f"long{n}", event)
        threads.append(threading.Thread(target=stream_times, args=args))
    for thread in threads:
        thread.start()
    if not together:
        for event in events:
            event.wait(timeout=300)
    stream_times(endpoint, "A short answer please", 8, runs, "short")
    for thread in threads:
        thread.join()
    short = runs["short"]
    window = (short["start"], short["end"])
    gaps = [
        later - earlier
        for n in range(3)
        for earlier, later in zip(runs[f"long{n}"]["pieces"], runs[f"long{n}"]["pieces"][1:], strict=False)
        if window[0] <= earlier and later <= window[1]
    ]
    step = statistics.median(gaps) if gaps else None
    tokens = len(short["pieces"])
    first = short["pieces"][0] if short["pieces"] else short["end"]
    extra = None if step is None or not tokens else (short["end"] - first) / step - (tokens - 1)
    long_end = max(runs[f"long{n}"]["end"] for n in range(3))
    return {
        "arrival": "with the long ones" if together else "while the long ones decode",
        "short_first_token_s": round(first - short["start"], 4),
        "short_total_s": round(short["end"] - short["start"], 4),
        "short_pieces": tokens,
        "decode_step_s": None if step is None else round(step, 4),
        "steps_after_its_last_token": None if extra is None else round(extra, 1),
        "short_done_before_long_ones_s": round(long_end - short["end"], 2),
    }


def measure_short(log):
    results = {}
    for system in ("per-step", "static"):
        with systems.start(system, log) as endpoint:
            results[system] = [short_among_long(endpoint, together) for together in (True, False)]
        log(f"short/{system}: {json.dumps(results[system])}")
    return results


# ------------------------------------------------------------------------------------------------ prefix reuse
def system_prompt(log):
    """A text of exactly SYSTEM_PROMPT_TOKENS tokens of the measurement model (and a space to end it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(systems.lm_folder(log), local_files_only=True)
    text = SYSTEM_TEXT * 8
    for cut in range(SYSTEM_PROMPT_TOKENS, SYSTEM_PROMPT_TOKENS - 20, -1):
        candidate = tokenizer.decode(tokenizer.encode(text)[:cut])
        if len(tokenizer.encode(candidate)) == SYSTEM_PROMPT_TOKENS:
            return candidate
        text = candidate + " ."
    raise RuntimeError(f"no prompt of exactly {SYSTEM_PROMPT_TOKENS} tokens found")


def first_token_times(endpoint, system, describe=True):
    """Time to first token of each question after the shared system prompt, one request at a time."""
    times = []
    for question in QUESTIONS:
        pieces, piece_times, started = systems.complete(endpoint, system + question, 8, stream=True, temperature=0)
        times.append(piece_times[0] - started)
    described = requests.post(endpoint.describe_url, timeout=60).json() if describe else {}
    return times, described.get("prefix_cache")


def measure_prefix(log):
    system = system_prompt(log)
    results = {"system_prompt_tokens": SYSTEM_PROMPT_TOKENS, "requests": len(QUESTIONS)}
    no_prefix = systems.variant_store("no-prefix", {}, {"prefix_cache": {"max_bytes": 0, "block_tokens": 16}}, log)
    for name, store in (("prefix reuse", None), ("no prefix reuse", no_prefix)):
        start = systems.start("per-step", log) if store is None else systems.torchserve("per-step", store, log)
        with start as endpoint:
            times, cache = first_token_times(endpoint, system)
        warm = times[1:]
        results[name] = {
            "first_request_s": round(times[0], 4),
            "first_token_p50_s": round(percentile(warm, 0.5), 4),
            "first_token_max_s": round(max(warm), 4),
            "prefix_cache": cache,
        }
        log(f"prefix/{name}: {json.dumps(results[name])}")
    on, off = results["prefix reuse"]["first_token_p50_s"], results["no prefix reuse"]["first_token_p50_s"]
    results["speedup"] = round(off / on, 2)
    return results


# ------------------------------------------------------------------------------------------------ cancellation
def generated_tokens(endpoint):
    text = requests.get(f"{endpoint.metrics_url}/metrics", timeout=30).text
    return sum(
        value
        for (metric, labels), value in parse(text).items()
        if metric == "GeneratedTokens" and ("ModelName", systems.MODEL) in labels
    )


def idle_count(endpoint, settle=3.0, timeout=300):
    """GeneratedTokens once it has not moved for ``settle`` seconds."""
    deadline = time.monotonic() + timeout
    last, since = generated_tokens(endpoint), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = generated_tokens(endpoint)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle:
            return now
    raise RuntimeError("the server did not become idle")


def disconnect_after_pieces(endpoint, pieces):
    connection = systems.post_on_socket(
        endpoint.native_url, {"prompt": "A long story", "max_new_tokens": 256, "stream": True}
    )
    received = b""
    while received.count(b'"done":false') < pieces:
        received += connection.recv(65536)
    connection.close()
    return received.count(b'"done":false')


def disconnect_after_seconds(endpoint, seconds):
    connection = systems.post_on_socket(endpoint.native_url, {"prompt": "A long story", "max_new_tokens": 256})
    time.sleep(seconds)
    connection.close()


def measure_cancel(log):
    results = {}
    for system in ("per-step", "static"):
        with systems.start(system, log) as endpoint:
            before = idle_count(endpoint)
            read = disconnect_after_pieces(endpoint, 5)
            after = idle_count(endpoint)
            stream = {"pieces_read": read, "tokens_generated": int(after - before)}
            stream["tokens_after_disconnect"] = int(after - before) - read
            disconnect_after_seconds(endpoint, 2.0)
            plain = {"left_after_s": 2.0, "tokens_generated": int(idle_count(endpoint) - after)}
        results[system] = {"stream": stream, "plain": plain}
        log(f"cancel/{system}: {json.dumps(results[system])}")
    return results


# ------------------------------------------------------------------------------------------------ frontend probe
def probe_archive(kind, log):
    """build/generator-probe/<kind>/probe-<kind>.mar from loadtests/generator_probe (torch-model-archiver)."""
    store = REPO / "build" / "generator-probe" / kind
    store.mkdir(parents=True, exist_ok=True)
    command = [str(Path(sys.executable).parent / "torch-model-archiver"), "--model-name", f"probe-{kind}"]
    command += ["--version", "1.0", "--handler", str(PROBE / f"{kind}_handler.py")]
    command += ["--config-file", str(PROBE / f"{kind}.yaml"), "--export-path", str(store), "--force"]
    subprocess.run(command, check=True, capture_output=True)
    return store


def probe_streams(url, streams, tokens):
    """Milliseconds per step: ``streams`` concurrent streams of ``tokens`` tokens each."""

    def one(_):
        with requests.post(url, json={"tokens": tokens, "stream": True}, stream=True, timeout=300) as response:
            response.raise_for_status()
            return sum(1 for _ in response.iter_content(None))

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        chunks = list(pool.map(one, range(streams)))
    return round((time.perf_counter() - started) / tokens * 1000, 3), chunks


def probe_disconnect(url):
    """Tokens the probe decoder made for a stream whose client left after 5 pieces (it counts them)."""
    connection = systems.post_on_socket(url, {"tokens": 100000, "stream": True, "sleep_ms": 2}, timeout=60)
    received = b""
    while received.count(b"t") < 5:
        received += connection.recv(4096)
    connection.close()
    time.sleep(3.0)
    return requests.post(url, json={"stats": True}, timeout=60).json()


def measure_probe(log):
    results = {}
    for kind in ("continuous", "async"):
        store = probe_archive(kind, log)
        with private_server(f"probe-{kind}", store, [f"probe-{kind}"]) as server:
            url = f"{server.inference_url}/predictions/probe-{kind}"
            probe_streams(url, 1, 20)  # warm
            one_ms, _ = probe_streams(url, 1, 400)
            eight_ms, _ = probe_streams(url, 8, 200)
            stats = probe_disconnect(url)
        results[kind] = {
            "ms_per_step_1_stream": one_ms,
            "ms_per_step_8_streams": eight_ms,
            "worker_saw_the_disconnect": bool(stats["cancelled"]),
            # tokens made for the stream whose client left after 5 pieces: when the worker dropped it, or 3 s later
            "disconnected_stream_tokens": (stats["cancelled"] or list(stats["running"].values()) or [None])[-1],
        }
        log(f"probe/{kind}: {json.dumps(results[kind])}")
    return results


# ------------------------------------------------------------------------------------------------ steps per call
CALLS_TOKENS = 128


def calls_stream(url, seed):
    """(ms per token after the first, pieces, tokens) of one greedy NDJSON stream."""
    body = {"prompt": f"Once upon a time {seed}", "max_new_tokens": CALLS_TOKENS, "temperature": 0, "stream": True}
    with requests.post(url, json=body, stream=True, timeout=300) as response:
        response.raise_for_status()
        lines, first = [], None
        for line in response.iter_lines():
            if line:
                lines.append(json.loads(line))
                first = first or time.perf_counter()
        ended = time.perf_counter()
    tokens = lines[-1]["completion_tokens"]
    return (ended - first) / max(tokens - 1, 1) * 1000, len(lines), tokens


def calls_plain(url, seed):
    body = {"prompt": f"Once upon a time {seed}", "max_new_tokens": CALLS_TOKENS, "temperature": 0}
    started = time.perf_counter()
    answer = requests.post(url, json=body, timeout=300).json()
    return (time.perf_counter() - started) / answer["completion_tokens"] * 1000


def calls_figures(urls, rounds=5):
    """Both servers measured alternately, request by request (and burst by burst), so that a busy machine's drift
    falls on both alike."""
    for url in urls.values():
        for seed in range(3):
            calls_stream(url, seed)  # warm
    alone = {name: [] for name in urls}
    plain = {name: [] for name in urls}
    crowd = {name: [] for name in urls}
    for seed in range(rounds):
        for name, url in urls.items():
            alone[name].append(calls_stream(url, seed))
            plain[name].append(calls_plain(url, seed))
    for _ in range(2):
        for name, url in urls.items():
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                streams = list(pool.map(lambda seed, url=url: calls_stream(url, seed), range(32)))
            crowd[name].append((sum(t for _, _, t in streams) / (time.perf_counter() - started), streams))
    return {
        name: {
            "1_user_stream_ms_per_token": round(statistics.median(ms for ms, _, _ in alone[name]), 3),
            "1_user_stream_pieces_per_token": round(
                sum(p for _, p, _ in alone[name]) / sum(t for _, _, t in alone[name]), 3
            ),
            "1_user_plain_ms_per_token": round(statistics.median(plain[name]), 3),
            "16_users_tokens_per_s": [round(rate, 1) for rate, _ in crowd[name]],
            "16_users_pieces_per_token": round(
                sum(p for _, s in crowd[name] for _, p, _ in s) / sum(t for _, s in crowd[name] for _, _, t in s), 3
            ),
        }
        for name in urls
    }


def measure_calls(log):
    from loadtests.variants import variant_archive
    from scripts import package

    source_store = REPO / "model_store"
    package.build("generator", source_store, log=log)
    source = source_store / "generator.mar"
    # Both set explicitly: the archive ships with one step a call (decode_call_ms 0), the budget is opt-in.
    several = REPO / "build" / "generator-calls" / "several-steps"
    one_step = REPO / "build" / "generator-calls" / "one-step"
    variant_archive(source, several / source.name, {}, {"decode_call_ms": 20})
    variant_archive(source, one_step / source.name, {}, {"decode_call_ms": 0})
    with contextlib.ExitStack() as servers:
        urls = {}
        for name, store in (("decode_call_ms 20", several), ("one step a call", one_step)):
            server = servers.enter_context(private_server(f"calls-{name.replace(' ', '-')}", store, ["generator"]))
            urls[name] = f"{server.inference_url}/predictions/generator"
        before = [round(load, 2) for load in os.getloadavg()]
        figures = calls_figures(urls, rounds=10)
    figures["load_average"] = {"before": before, "after": [round(load, 2) for load in os.getloadavg()]}
    log(f"calls: {json.dumps(figures)}")
    return figures


# ------------------------------------------------------------------------------------------------ step costs
def timed(action, repeats):
    """Median seconds of ``action()`` over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 4)


def running_batch(model, pad_token_id, chunk, prompt, rows, rng):
    """A running batch of ``rows`` sampling rows that joined at different times, about 150 columns wide."""
    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import RunningBatch

    batch = RunningBatch(model, pad_token_id, [], chunk_tokens=chunk)
    for _ in range(rows):
        batch.prefill([Sequence(prompt, SamplingSettings(1000, 0.8, seed=rng.randrange(2**31)))])
        for _ in range(rng.randrange(20)):
            batch.step()
    while batch.width < 150:
        batch.step()
    return batch


def join_whole(batch, ids):
    """A prompt prefilled whole in a pass of its own: seconds to its first token, and the running rows' longest wait
    between two tokens (that pass, then their step)."""
    from handlers.generation.decoding import SamplingSettings, Sequence

    joining = Sequence(ids, SamplingSettings(1000))
    started = time.perf_counter()
    batch.prefill([joining])
    first = time.perf_counter() - started
    batch.remove([joining])
    return first, first + timed(batch.step, 1)


def join_chunked(batch, ids):
    """The same with chunked prefill (the chunks ride in the running rows' passes)."""
    from handlers.generation.decoding import SamplingSettings, Sequence

    joining = Sequence(ids, SamplingSettings(1000))
    batch.begin_filling([joining])
    started, longest = time.perf_counter(), 0.0
    while batch.filling is not None:
        longest = max(longest, timed(batch.advance, 1))
    first = time.perf_counter() - started
    batch.remove([joining])
    return first, longest


def compare_precisions(handler, wanted, row_counts, rounds=10):
    """Decoding steps of the served fp32 model against the model as the generator serves ``wanted`` (bf16 with an
    fp32 output layer, handlers/generation/precision.py: whether or not its gate passes) and wholly converted, timed
    alternately on batches alike, ``rounds`` steps each; and the decoding gate's figures for both."""
    import random

    import torch

    from handlers.core import runtime
    from handlers.generation import precision

    fp32_model, pad = handler.loaded.model, handler.loaded.pad_token_id
    # As served (an fp32 output layer), and, for what that layer costs, the whole model converted (a bf16 one).
    models = {
        "fp32": fp32_model,
        wanted: precision.at_precision(fp32_model, wanted),
        f"{wanted}_head_{wanted}": runtime.convert_model(fp32_model, wanted),
    }
    results = {f"{wanted}_native": runtime.machine_can_run(wanted, torch.device("cpu")) or "yes"}
    for name, model in list(models.items())[1:]:
        gate = precision.decoding_gate(fp32_model, model, pad, wanted)
        results[f"precision_gate_{name}"] = {**gate.describe(), "summary": gate.summary()}
    prompt = handler.loaded.tokenizer.encode("Once upon a time there was a small model")
    chunk = handler.loop.scheduler.batch.chunk_tokens
    with torch.inference_mode():
        for rows in row_counts:
            batches = {name: running_batch(model, pad, chunk, prompt, rows, random.Random(rows)) for name, model in
                       models.items()}  # fmt: skip
            times = {name: [] for name in models}
            for _ in range(rounds):
                for name, batch in batches.items():
                    times[name].append(timed(batch.step, 1))
            for name, values in times.items():
                results[f"decode_step_{rows}_rows_{name}_s"] = round(statistics.median(values), 4)
    return results


def alternated(step, switches, repeats=10):
    """Median seconds of ``step`` under each of ``switches`` (suffix -> action that puts the model in that form),
    one step each in turn on the same batch, so that a busy machine's drift hits every form alike."""
    times = {suffix: [] for suffix in switches}
    for _ in range(repeats):
        for suffix, switch in switches.items():
            switch()
            times[suffix].append(timed(step, 1))
    next(iter(switches.values()))()  # back to the first form (as loaded)
    return {suffix: round(statistics.median(values), 4) for suffix, values in times.items()}


def step_forms(model, is_compiled, per_row):
    """The forms a step is timed in: as loaded (suffix ''), and the other form of what was switched on."""
    from handlers.generation import compiled, mixed_pass

    if is_compiled:
        return {"": lambda: compiled.install(model), "_eager": lambda: compiled.uninstall(model)}
    if per_row:
        return {
            "": lambda: mixed_pass.use_per_row(model, True),
            "_padded": lambda: mixed_pass.use_per_row(model, False),
        }
    return {"": lambda: None}


def compare_decode_steps(handler, row_counts, prompt, rounds=10):
    """Decoding steps of the paged OpenVINO step (handler.decode_step openvino, as the handler chose it) and the eager
    torch step, alternately on batches alike (the same greedy rows), medians of ``rounds`` (wall and process CPU
    seconds); at each batch size also rows of very different lengths (one prompt of max_prompt_tokens among 9-token
    ones), and whether both steps chose the same tokens."""
    import torch

    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.paged_openvino import PagedBatch
    from handlers.generation.running import RunningBatch

    paged, model = handler.decode_step.paged, handler.loaded.model
    if paged is None:
        raise RuntimeError(f"the paged step does not serve: {handler.decode_step.reason}")
    long_prompt = (prompt * (handler.loaded.limits.max_prompt_tokens // len(prompt) + 1))[
        : handler.loaded.limits.max_prompt_tokens
    ]
    results = {}
    with torch.inference_mode():
        for rows in row_counts:
            alike = [(prompt * 16)[:150]] * rows  # about 150 columns, as the eager figures above
            for label, prompts in (("", alike), ("_mixed_lengths", [long_prompt] + [prompt] * (rows - 1))):
                eager, on_paged = RunningBatch(model, handler.loaded.pad_token_id, []), PagedBatch(paged, [])
                for batch in (eager, on_paged):
                    batch.prefill([Sequence(list(ids), SamplingSettings(1000)) for ids in prompts])
                times = {"eager": ([], []), "openvino": ([], [])}
                for _ in range(rounds + 2):  # the first two of each are not timed
                    for name, batch in (("eager", eager), ("openvino", on_paged)):
                        wall, cpu = time.perf_counter(), time.process_time()
                        batch.step()
                        times[name][0].append(time.perf_counter() - wall)
                        times[name][1].append(time.process_time() - cpu)
                same = [a.token_ids == b.token_ids for a, b in zip(eager.sequences, on_paged.sequences, strict=True)]
                results[f"decode_step_{rows}_rows{label}_same_tokens"] = f"{sum(same)}/{len(same)}"
                alone = []  # then the paged step with nothing between its steps, as a lone server's worker runs it
                for _ in range(rounds + 2):
                    wall = time.perf_counter()
                    on_paged.step()
                    alone.append(time.perf_counter() - wall)
                results[f"decode_step_{rows}_rows{label}_openvino_alone_s"] = round(statistics.median(alone[2:]), 4)
                for name, (walls, cpus) in times.items():
                    results[f"decode_step_{rows}_rows{label}_{name}_s"] = round(statistics.median(walls[2:]), 4)
                    results[f"decode_step_{rows}_rows{label}_{name}_cpu_s"] = round(statistics.median(cpus[2:]), 4)
                on_paged.remove(list(on_paged.sequences))
    results["decode_step"] = handler.decode_step.describe()
    return results


def time_joins(results, batch, rows, prompt, long_prompt):
    """A short prompt (and at 16 rows a long one) joining ``batch``, prefilled whole and chunked."""
    cases = [("", prompt, 5)] + ([("long_", long_prompt, 3)] if rows == 16 else [])
    for label, ids, repeats in cases:
        for name, join in (("whole", join_whole), ("chunked", join_chunked)):
            runs = [join(batch, ids) for _ in range(repeats)]
            first, wait = (round(statistics.median(values), 4) for values in zip(*runs, strict=True))
            results[f"join_{label}{name}_{rows}_rows_first_token_s"] = first
            results[f"join_{label}{name}_{rows}_rows_longest_wait_s"] = wait


def unpacked_archive(log):
    """The measurement archive unpacked (build/generator-compare/unpacked), as a worker gets it."""
    import shutil
    import zipfile

    folder = systems.VARIANTS / "unpacked"
    archive = systems.built_archive(log)
    if (
        not (folder / "model-config.yaml").exists()
        or (folder / "model-config.yaml").stat().st_mtime < archive.stat().st_mtime
    ):
        shutil.rmtree(folder, ignore_errors=True)
        with zipfile.ZipFile(archive) as unpacked:
            unpacked.extractall(folder)
    return folder


def measure_load(log, repeats=2):
    """In-process loads of the measurement archive's handler (handler.decode_step openvino), alternately with the
    decoder exported at package time and with its export set aside (the worker traces the model): describe's load
    phases, medians of ``repeats``."""
    from scripts.ops.handler_loader import load_handler

    folder = unpacked_archive(log)
    export, aside = folder / "decode" / "openvino", folder / "decode" / "openvino.aside"
    seconds: dict[str, dict[str, list[float]]] = {"exported": {}, "traced": {}}
    decoders = {}
    try:
        for _ in range(repeats):
            for how in seconds:
                if how == "traced":
                    export.rename(aside)
                try:
                    handler, _ = load_handler(folder, systems.MODEL, {"decode_step": "openvino"}, True)
                finally:
                    if aside.exists():
                        aside.rename(export)
                described = handler.describe()
                decoders[how] = described["decode_step"]["decoder"]
                for phase, value in {**handler.load_phases.seconds, "load": handler.load_seconds}.items():
                    seconds[how].setdefault(phase, []).append(value)
                del handler
    finally:
        if aside.exists():
            aside.rename(export)
    results = {"repeats": repeats, "decoder": decoders}
    for how, phases in seconds.items():
        results[how] = {phase: round(statistics.median(values), 2) for phase, values in phases.items()}
    return results


def measure_steps(
    log,
    threads=1,
    row_counts=(1, 4, 8, 16),
    compile_decode="false",
    decode_attention="padded",
    compare_with=None,
    decode_step="eager",
):
    """In-process (no server): what a decoding step of the measurement model costs by batch size, and what a prompt
    joining such a batch costs the running rows and itself, prefilled whole in a pass of its own (the generator
    before chunked prefill) or riding in the running rows' decoding passes (chunked prefill, as shipped).
    ``compare_with`` (a precision): decoding steps at fp32 against that precision instead, and its decoding gate."""
    import random

    import torch

    from handlers.generation import compiled
    from handlers.generation import decode_attention as attention
    from handlers.generation.decoding import SamplingSettings, Sequence
    from handlers.generation.running import RunningBatch
    from scripts.ops.handler_loader import load_handler

    folder = unpacked_archive(log)
    torch.set_num_threads(threads)  # before load: the load-time gates and timings run at this count too
    # the eager torch step is what the first two shape; decode_step openvino times the paged step against it
    overrides = {"compile_decode": compile_decode, "decode_attention": decode_attention, "decode_step": decode_step}
    overrides["threads"] = threads  # the paged step's OpenVINO threads too, whatever the archive ships
    handler, _ = load_handler(folder, systems.MODEL, overrides, continuous_batching=True)
    model, tokenizer, pad = handler.loaded.model, handler.loaded.tokenizer, handler.loaded.pad_token_id
    chunk = handler.loop.scheduler.batch.chunk_tokens
    rng = random.Random(0)
    prompt = tokenizer.encode("Once upon a time there was a small model")
    sentence = tokenizer.encode(" The quick brown fox jumps over the lazy dog, then serves a model over HTTP.")
    long_prompt = (sentence * (LONG_PROMPT_TOKENS // len(sentence) + 1))[:LONG_PROMPT_TOKENS]
    results = {"prompt_tokens": len(prompt), "long_prompt_tokens": len(long_prompt), "threads": threads}
    results["prefill_chunk_tokens"] = chunk
    described = handler.describe()
    results["compile_decode"], results["decode_attention"] = described["compile_decode"], described["decode_attention"]
    if decode_step != "eager":
        results.update(compare_decode_steps(handler, row_counts, prompt))
        log(f"steps: {json.dumps(results)}")
        return results
    if compare_with is not None:
        results.update(compare_precisions(handler, compare_with, row_counts))
        log(f"steps: {json.dumps(results)}")
        return results
    forms = step_forms(model, described["compile_decode"]["compiled"], described["decode_attention"]["per_row"])
    mixed_tokens = handler.loaded.limits.max_prompt_tokens
    results["mixed_lengths_long_prompt_tokens"] = mixed_tokens
    with torch.inference_mode():
        for rows in row_counts:
            batch = running_batch(model, pad, chunk, prompt, rows, rng)
            for suffix, seconds in alternated(batch.step, forms).items():
                results[f"decode_step_{rows}_rows{suffix}_s"] = seconds
            # One prompt as long as the archive accepts among short ones: the padding a per-row attention skips.
            mixed = attention.mixed_lengths_batch(model, pad, rows, mixed_tokens)
            for suffix, seconds in alternated(mixed.step, forms).items():
                results[f"decode_step_{rows}_rows_mixed_lengths{suffix}_s"] = seconds
            time_joins(results, batch, rows, prompt, long_prompt)
        alone = RunningBatch(model, pad, [])
        results["prefill_1_alone_s"] = timed(lambda: alone.prefill([Sequence(prompt, SamplingSettings(1))]), 5)
    results["compile_graphs_total"] = compiled.compile_counts()  # the gate's and this run's: no per-shape growth
    results["attention_implementation"] = model.config._attn_implementation
    log(f"steps: {json.dumps(results)}")
    return results


MEASUREMENTS = {
    "short": measure_short,
    "prefix": measure_prefix,
    "cancel": measure_cancel,
    "probe": measure_probe,
    "steps": measure_steps,
    "calls": measure_calls,
    "load": measure_load,
}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.generator_scheduling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("measurement", choices=[*MEASUREMENTS, "all"])
    parser.add_argument("--threads", type=int, default=1, help="steps: torch threads (default 1, as the worker)")
    parser.add_argument("--rows", default="1,4,8,16", help="steps: running rows, comma-separated (default 1,4,8,16)")
    parser.add_argument(
        "--compile-decode",
        choices=("false", "true"),
        default="false",
        help="steps: load with handler.compile_decode (true: compiled and eager steps timed alternately)",
    )
    parser.add_argument(
        "--decode-attention",
        choices=("padded", "per_row"),
        default="padded",
        help="steps: load with handler.decode_attention (per_row: per-row and padded steps timed alternately)",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="steps: bf16 = time each decoding step at fp32 and as a bf16 generator serves it (alternately, on "
        "batches alike; no joins), and run bf16's decoding gate (default fp32: the archive as packaged)",
    )
    parser.add_argument(
        "--decode-step",
        choices=("eager", "openvino"),
        default="eager",
        help="steps: openvino = load with handler.decode_step openvino and time its paged step against the eager step "
        "(alternately, batches alike, greedy; no joins); default eager: the eager step's figures",
    )
    args = parser.parse_args(argv)
    if args.decode_step != "eager" and (args.precision != "fp32" or args.compile_decode != "false"):
        parser.error("--decode-step openvino compares fp32 steps: leave --precision and --compile-decode as they are")
    if args.precision != "fp32" and args.compile_decode != "false":
        parser.error("--precision bf16 compares eager steps: leave --compile-decode false")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    try:
        row_counts = tuple(int(rows) for rows in args.rows.split(","))
    except ValueError:
        parser.error(f"--rows: expected integers, got {args.rows!r}")
    if not row_counts or min(row_counts) < 1:
        parser.error("--rows: each at least 1")
    exit_on_sigterm()
    REPORTS.mkdir(parents=True, exist_ok=True)
    names = list(MEASUREMENTS) if args.measurement == "all" else [args.measurement]
    status = 0
    for name in names:
        try:
            if name == "steps":
                compare_with = None if args.precision == "fp32" else args.precision
                figures = measure_steps(
                    print,
                    args.threads,
                    row_counts,
                    args.compile_decode,
                    args.decode_attention,
                    compare_with,
                    args.decode_step,
                )
            else:
                figures = MEASUREMENTS[name](print)
        except Exception as error:
            print(f"{name}: failed: {error}", file=sys.stderr)
            status = 1
            continue
        report = {
            "measurement": name,
            "date": f"{datetime.datetime.now():%Y-%m-%d %H:%M}",
            "machine": machine.describe(),
            "cpu_tag": machine.cpu_kind(),
            "figures": figures,
        }
        path = REPORTS / f"generator-{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"{name}: {json.dumps(figures)}\nreport: {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
