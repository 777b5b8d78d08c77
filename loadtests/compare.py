"""Side-by-side: this project's handler against the usual alternatives, one after the other, same machine and traffic.

    python -m loadtests.compare --model minilm --slo-ms 100 [--systems ours,ours-eager,infinity,ideal,...]

Systems (each started alone on free loopback ports, measured, stopped before the next starts):
  ours       this project's archive as packaged (model_store/<model>.mar) on a private TorchServe
  ours-eager the same archive with `handler.backend: eager`, the rest of its config unchanged: the served gain of
             compiling is ours / ours-eager, measured in the same run
  naive      a naive TorchServe handler (loadtests/baselines/naive_handler.py): fp32, eager, batchSize 1, one
             tokenizer call per request, TorchServe's default of one worker per core (--naive-workers)
  flask      the plain Flask pattern (loadtests/baselines/flask_server.py): one request, one forward pass
  ray-fp32   Ray Serve + @serve.batch around sentence-transformers with its defaults (fp32)
  ray-same   the same at the precision ours serves (bf16 on a CPU with native bf16; when ours serves fp32 this is
             the same system as ray-fp32 and is not run twice)
  infinity   Infinity (infinity-emb 0.0.78, the Python embedding server), its torch engine at ours' precision,
             batch 32, the machine's cores, OpenAI-style /embeddings (sent the same texts in that shape)
  infinity-onnx  the same with its optimum engine (ONNX Runtime, fp32; the model exported to ONNX once)
  stock-image-classifier  TorchServe's stock image_classifier handler on the same image classifier: a TorchScript
             trace, its PIL/torchvision transforms, fp32, batch 8, 50 ms, 2 workers (loadtests/baselines/
             stock_image_classifier.py), sent the same images as raw bodies
  inprocess  the ceiling: the packaged handler called directly in a loop at the best batch size (no HTTP, no queue)
  ideal      the ideal batcher at the SLO (loadtests/baselines/ideal.py): the archive's handler in its configured
             workers behind a perfect dispatcher (same batchSize, maxBatchDelay), no HTTP or frontend, replaying
             the same open-loop schedules; the same capacity search. Also where a long text's time goes.
  torchserve-network, litserve, pytriton   for a network of loadtests/networks.py (--model resnet50-size or ranking):
             TorchServe's BaseHandler on its TorchScript trace, LitServe and Triton (PyTriton) on its exported program,
             each with the network's batching and checked against the module in process before it is measured
             (loadtests/baselines/network_peers.py); with ours (model.pt2 packaged as a user would, sent OIP
             binary), ours-fp32 (the same pinned to fp32), ours-json (ours' archive sent its native JSON form),
             inprocess (model.pt2 in a loop) and ideal (ours' archive in the ideal batcher)
naive, flask, ray-* and infinity-onnx exist for minilm only; infinity also for an embedding model packaged from
its folder (--model <its name>: Infinity serves the same folder, unpacked from the archive); stock-image-classifier
for an image classifier. Ray and Infinity are installed on demand into their own venvs (build/ray-venv,
build/infinity-venv), the stock handler's torchvision into build/stock-image-classifier-site
(loadtests/baselines/baseline_env.py); if one cannot be, the table says so and the others are still measured.

For every server: the capacity search (loadtests/capacity.py: highest open-loop rate with p99 <= SLO and no failures)
and one open-loop run at --moderate-rate (the same offered load for all). Writes
loadtests/reports/compare-<model>-<time>/compare.json, compare.md (table, ratios to ours and to the ceiling, the
targets met or missed) and compare.png, plus each system's capacity and load-test reports in its own folder.
With --rounds N (default 2) every system is measured N times, the order reversed every other round (A B C, then
C B A): a noisy window on the shared machine then falls on different systems in different rounds instead of
deciding one system's only figure. Each system's capacity is the median of its rounds, reported with the spread
(min / median / max) and each round's figure; a pair of systems whose order differs between rounds is flagged as a
ranking that flipped (a difference smaller than the noise). The moderate- and low-load runs are made in the first
round only. The systems are loadtests/baselines/systems.py, the report loadtests/compare_report.py; this module
measures and decides. Exit codes: 0 compared (a system that failed is reported in the table), 1 nothing could be
measured, 2 bad arguments.
"""

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from loadtests import capacity as capacity_search
from loadtests import compare_report, networks
from loadtests import run as loadtest
from loadtests.baselines import network_peers
from loadtests.baselines import systems as baselines
from scripts.ops import machine, registry
from scripts.ops.server import exit_on_sigterm

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "loadtests" / "reports"
# The targets (recorded and reported, never asserted), the baselines that exist and the moderate rate are the
# model's, from the registry (scripts/ops/registry.py: its spec's tooling: section, else its kind's): minilm's are
# the issue's; a user's embedding model is compared with Infinity on the same folder and with the compiled backend's
# served gain.


def measure_server(
    name, url, metrics_url, model, slo_ms, out_dir, search, moderate_rate, moderate_seconds, low_rate, log
):
    found = capacity_search.capacity(url, model, slo_ms, out_dir / name / "capacity", metrics_url, log=log, **search)
    entry = {
        "capacity_rate": found["capacity_rate"],
        "stopped_because": found["stopped_because"],
        "capacity_report": found["report_dir"],
        "slo_ms": slo_ms,
    }
    if found["capacity_rate"] is None and found.get("steps"):
        # No rate passed: keep the lowest one tried, whose p50 says whether any lower rate could (evaluate_targets).
        lowest = min(found["steps"], key=lambda step: step["rate"])
        entry["lowest_rate"], entry["lowest_p50_ms"] = lowest["rate"], lowest["p50_ms"]
    at_capacity = found.get("at_capacity")
    if at_capacity and at_capacity.get("report_dir"):
        summary = json.loads((Path(at_capacity["report_dir"]) / "summary.json").read_text())
        entry["p99_at_capacity_ms"] = summary.get("p99_ms")
        entry["generator_cpu_share_at_capacity"] = (summary.get("generator") or {}).get("cpu_share")
        entry["throughput_at_capacity"] = summary.get("rps")
    for label, rate in (("moderate", moderate_rate), ("low", low_rate)):
        if not rate:
            continue
        settings = loadtest.settings_for(
            model,
            "open",
            rate=rate,
            duration=moderate_seconds,
            payload_seed=search["payload_seed"],
            arrivals=search["arrivals"],
        )
        summary = loadtest.run(settings, url, metrics_url, out_dir / name / label, log=lambda *_: None)
        entry[f"{label}_rate"] = rate
        entry[f"{label}_p50_ms"] = summary["p50_ms"]
        entry[f"{label}_p99_ms"] = summary["p99_ms"]
        entry[f"{label}_failures"] = summary["failures"]
        log(
            f"  {label} load {rate:g}/s: p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms, "
            f"{summary['failures']} failures"
        )
    return entry


def ratio(numerator, denominator):
    return round(numerator / denominator, 3) if numerator and denominator else None


def add_ratios(results):
    ours_rate = (results.get("ours") or {}).get("capacity_rate")
    ceiling = (results.get("inprocess") or {}).get("capacity_rate")
    ideal_rate = (results.get("ideal") or {}).get("capacity_rate")
    for entry in results.values():
        rate = entry.get("capacity_rate")
        entry["ratio_to_ours"] = ratio(rate, ours_rate)
        entry["ratio_to_ceiling"] = ratio(rate, ceiling)
        entry["ratio_to_ideal"] = ratio(rate, ideal_rate)


def no_rate_passed(name, entry, ours_rate):
    """The verdict on a ratio whose baseline passed no rate while ours passed one: (met, note).

    Its capacity is then below its lowest rate tried, and the ratio has no finite value. When even that lowest step's
    p50 was over the SLO, no lower rate can pass either (with fewer arrivals there is less queueing, but a request's
    own service time does not shrink, so more than half of the requests stay over the SLO): the target is met. When
    the p50 was under it, a lower rate might still pass: not measured, search lower."""
    if entry.get("error") or entry.get("lowest_rate") is None:
        return None, "not measured"
    lowest, p50, slo = entry["lowest_rate"], entry.get("lowest_p50_ms"), entry.get("slo_ms")
    if p50 is not None and slo is not None and p50 > slo:
        return True, (
            f"ours passed {ours_rate:g}/s; {name} passed no rate: at its lowest, {lowest:g}/s, its p50 was already "
            f"{p50:g} ms > the {slo:g} ms SLO, so no lower rate passes and the ratio is unbounded"
        )
    return None, f"{name} passed no rate down to {lowest:g}/s (p50 {p50} ms there): search lower to bound the ratio"


# The networks' targets (throughput at the SLO): ours as packaged (its faster request form) against the best peer as
# each ships by default, ours pinned to fp32 against the best peer (the same precision), and ours against the ideal
# batcher on its archive.
NETWORK_PEERS = ("torchserve-network", "litserve", "pytriton")
OURS_FORMS = ("ours", "ours-json")  # ours as packaged, sent OIP binary and its native JSON form
NETWORK_TARGETS = {
    "resnet50-size": {"slo_ms": 500.0, "peers": 2.0, "same_precision": 1.2, "ideal": 0.85},
    "ranking": {"slo_ms": 50.0, "peers": 3.0},
}


def network_verdicts(model, results):
    """The network targets of NETWORK_TARGETS, each measured or missed, with the best peer named."""
    targets = NETWORK_TARGETS.get(model, {})
    peers = {name: (results.get(name) or {}).get("capacity_rate") for name in NETWORK_PEERS if name in results}
    measured = {name: rate for name, rate in peers.items() if rate}
    best = max(measured, key=measured.get) if measured else None
    verdicts = []

    def verdict(label, ours_name, other_name, other_rate, bound):
        ours_rate = (results.get(ours_name) or {}).get("capacity_rate")
        value = ratio(ours_rate, other_rate)
        note = f"{ours_name} {ours_rate}/s, {other_name} {other_rate}/s" if value is not None else "not measured"
        slo = (results.get(ours_name) or {}).get("slo_ms")
        if value is not None and slo is not None and slo != targets["slo_ms"]:
            value, note = None, f"measured at p99 <= {slo:g} ms, not the target's {targets['slo_ms']:g} ms"
        verdicts.append(
            {
                "target": f"{label} >= {bound:g}x (throughput at p99 <= {targets['slo_ms']:g} ms)",
                "value": value,
                "bound": bound,
                "met": None if value is None else value >= bound,
                "note": note,
            }
        )

    if "peers" in targets:
        # Ours in whichever of its request forms served more (OIP binary or its native JSON), as each peer is sent
        # its own form; the note names the form.
        forms = {name: (results.get(name) or {}).get("capacity_rate") or 0 for name in OURS_FORMS}
        fastest = max(forms, key=forms.get) if any(forms.values()) else "ours"
        verdict("ours / best peer", fastest, best or "best peer", measured.get(best), targets["peers"])
    if "same_precision" in targets:
        verdict(
            "ours fp32 / best peer (fp32)",
            "ours-fp32",
            best or "best peer",
            measured.get(best),
            targets["same_precision"],
        )
    if "ideal" in targets:
        verdict("ours / ideal", "ours", "ideal", (results.get("ideal") or {}).get("capacity_rate"), targets["ideal"])
    return verdicts


def evaluate_targets(model, results, model_store=None):
    """Each target: measured ratio or figure, the bound, met or missed and by how much. Never raises."""
    verdicts = []
    if model in networks.NETWORKS:
        return network_verdicts(model, results)
    ours_rate = (results.get("ours") or {}).get("capacity_rate")
    described = registry.model(model, model_store)
    for target in described.targets:
        label, other, bound = target.label, target.other, target.bound
        other_rate = (results.get(other) or {}).get("capacity_rate")
        if other == "ray-same" and results.get("ray-same", {}).get("same_as"):
            other_rate = (results.get(results["ray-same"]["same_as"]) or {}).get("capacity_rate")
        value = ratio(ours_rate, other_rate)
        note = "" if value is not None else "not measured"
        met = None if value is None else value >= bound
        if value is None and ours_rate and other_rate is None:
            met, note = no_rate_passed(other, results.get(other) or {}, ours_rate)
        other_entry = results.get(other) or {}
        if (
            value is not None
            and other == "infinity"
            and other_entry.get("precision") != (results["ours"].get("precision"))
        ):
            note = f"infinity ran {other_entry.get('precision')}, ours {results['ours'].get('precision')}"
        verdicts.append(
            {
                "target": f"{label} >= {bound:g}x (throughput at the SLO)",
                "value": value,
                "bound": bound,
                "met": met,
                "note": note,
            }
        )
    margin = described.low_load_margin_ms
    if margin is not None:
        low_load_target = f"{model} p50 at low load <= raw forward + maxBatchDelay + {margin:g} ms"
        ours_entry, ceiling = results.get("ours") or {}, results.get("inprocess") or {}
        p50, forward = ours_entry.get("low_p50_ms"), ceiling.get("raw_forward_ms")
        delay = ours_entry.get("max_batch_delay_ms")
        if p50 is not None and forward is not None and delay is not None:
            bound = forward + delay + margin
            verdicts.append(
                {
                    "target": low_load_target,
                    "value": p50,
                    "bound": round(bound, 3),
                    "met": p50 <= bound,
                    "note": f"raw forward {forward} ms, maxBatchDelay {delay} ms; Locust's p50 is whole ms",
                }
            )
        else:
            verdicts.append(
                {
                    "target": low_load_target,
                    "value": None,
                    "bound": None,
                    "met": None,
                    "note": "not measured",
                }
            )
    return verdicts


def round_orders(systems, rounds):
    """The order of each round: as given, then reversed, alternately, so that a slow drift of the machine over the
    run (a neighbour's job, heat) weighs on every system alike and each system meets different noisy windows."""
    return [list(systems) if number % 2 == 0 else list(reversed(systems)) for number in range(rounds)]


def aggregate_rounds(per_round):
    """One entry per system from its rounds: the first measured round's entry (it holds the moderate-load figures)
    with capacity_rate the median of the rounds' capacities, capacity_rounds each round's figure (None where that
    round had none) and capacity_spread their min / median / max. With one round, that round's entries unchanged."""
    if len(per_round) == 1:
        return per_round[0]
    names = list(dict.fromkeys(name for results in per_round for name in results))
    aggregated = {}
    for name in names:
        entries = [results[name] for results in per_round if name in results]
        rates = [entry.get("capacity_rate") for entry in entries]
        measured = [rate for rate in rates if rate is not None]
        base = next((entry for entry in entries if entry.get("capacity_rate") is not None), entries[0])
        if not measured:
            aggregated[name] = base
            continue
        aggregated[name] = {
            **base,
            "capacity_rate": round(statistics.median(measured), 3),
            "capacity_rounds": rates,
            "capacity_spread": capacity_search.spread(measured),
        }
        errors = [entry["error"] for entry in entries if entry.get("error")]
        if errors:
            aggregated[name]["round_errors"] = errors
    return aggregated


def ranking_flips(per_round):
    """Pairs of systems that ranked one way in one round and the other way in another: their difference is within
    the machine's noise, and the report says so rather than rank them."""
    names = list(dict.fromkeys(name for results in per_round for name in results))
    flips = []
    for index, first in enumerate(names):
        for second in names[index + 1 :]:
            signs = set()
            for results in per_round:
                a = (results.get(first) or {}).get("capacity_rate")
                b = (results.get(second) or {}).get("capacity_rate")
                if a is not None and b is not None and a != b:
                    signs.add(a > b)
            if len(signs) == 2:
                flips.append(
                    {
                        "systems": [first, second],
                        "rounds": {
                            name: [(results.get(name) or {}).get("capacity_rate") for results in per_round]
                            for name in (first, second)
                        },
                    }
                )
    return flips


def ideal_search(search):
    """The served systems' search options for the ideal batcher (Locust's worker processes mean nothing there)."""
    return {key: value for key, value in search.items() if key != "workers"}


def ideal_entry(found):
    """What compare.json keeps of the ideal batcher's result (the per-request records stay in its ideal.json)."""
    at_capacity = found.get("at_capacity") or {}
    return {
        "capacity_rate": found["capacity_rate"],
        "stopped_because": found["stopped_because"],
        "p99_at_capacity_ms": at_capacity.get("p99_ms"),
        "throughput_at_capacity": at_capacity.get("throughput"),
        **{key: found.get(key) for key in ("precision", "backend", "threads", "workers", "batch_size")},
        "max_batch_delay_ms": found.get("max_batch_delay_ms"),
        "tail": found.get("tail") or {},
        "report": str(Path(found["report_dir"]) / "ideal.json"),
    }


def start_system(name, model, model_store, naive_workers, out_dir, ours_info, precision, log):
    """The context manager that runs system `name` (a Ray baseline at ours' batching and the given precision)."""
    batching = (ours_info.get("batch_size") or 16, ours_info.get("max_batch_delay_ms") or 5)
    if model in networks.NETWORKS:
        return network_peers.start(name, model, out_dir, log)
    if name == "ours":
        return baselines.ours(model, model_store, log)
    if name == "ours-eager":
        return baselines.ours_eager(model, model_store, log)
    if name in ("infinity", "infinity-onnx"):
        engine = "torch" if name == "infinity" else "optimum"
        return baselines.infinity(engine, precision, out_dir / name, log, model, model_store)
    if name == "naive":
        return baselines.naive(model, naive_workers, log)
    if name == "flask":
        return baselines.flask(model, out_dir / "flask", log)
    if name == "stock-image-classifier":
        return baselines.stock_image_classifier(model, model_store, out_dir / name, log)
    ray_precision = "fp32" if name == "ray-fp32" else precision
    return baselines.ray(model, ray_precision, *batching, out_dir / name, log)


def compare(
    model,
    slo_ms,
    systems,
    search,
    out_dir,
    model_store,
    moderate_rate,
    moderate_seconds,
    low_rate,
    naive_workers,
    ceiling_seconds,
    ceiling_batch_sizes,
    log=print,
    rounds=1,
):
    started_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    ours_info = {}
    precision = "fp32"
    per_round = []
    orders = round_orders(systems, rounds)
    for number, order in enumerate(orders):
        if rounds > 1:
            log(f"=== round {number + 1} of {rounds}: {', '.join(order)}")
        round_dir = out_dir / f"round-{number + 1}" if rounds > 1 else out_dir
        results = {}
        per_round.append(results)
        measure = dict(
            model=model,
            slo_ms=slo_ms,
            out_dir=round_dir,
            search=search,
            # The fixed-rate runs are the same in every round: once is enough.
            moderate_rate=moderate_rate if number == 0 else None,
            moderate_seconds=moderate_seconds,
            log=log,
        )
        for name in order:
            precision, ours_info = measure_system(
                name,
                systems,
                results,
                measure,
                model,
                slo_ms,
                search,
                round_dir,
                model_store,
                low_rate if number == 0 else None,
                naive_workers,
                ceiling_seconds,
                ceiling_batch_sizes,
                precision,
                ours_info,
                log,
            )
    results = aggregate_rounds(per_round)
    add_ratios(results)
    result = {
        "model": model,
        "slo_ms": slo_ms,
        "cores": machine.cores(),
        "machine": machine.describe(),
        "started_at": started_at,
        "systems": results,
        "moderate_rate": moderate_rate,
        "low_rate": low_rate,
        "search": search,
        "rounds": rounds,
        "orders": orders,
        "ranking_flips": ranking_flips(per_round),
        "targets": evaluate_targets(model, results, model_store),
    }
    return result


def measure_system(
    name,
    systems,
    results,
    measure,
    model,
    slo_ms,
    search,
    out_dir,
    model_store,
    low_rate,
    naive_workers,
    ceiling_seconds,
    ceiling_batch_sizes,
    precision,
    ours_info,
    log,
):
    """Measure one system into results[name]; returns (precision, ours_info), which later systems depend on."""
    log(f"== {name}: {baselines.DESCRIPTIONS[name]}")
    if not system_exists(name, model, model_store):
        results[name] = {"error": f"baseline does not exist for {model}"}
        return precision, ours_info
    try:
        if name == "inprocess":
            ceiling = in_process_ceiling(model, model_store, ceiling_seconds, ceiling_batch_sizes, log)
            results[name] = {
                "capacity_rate": ceiling["best"]["requests_per_s"],
                "precision": ceiling["precision"],
                "backend": ceiling["backend"],
                "threads": ceiling["threads"],
                "best_batch_size": ceiling["best"]["batch_size"],
                "raw_forward_ms": ceiling["raw_forward_ms"],
                "batches": ceiling["results"],
            }
            log(f"  ceiling {results[name]['capacity_rate']} requests/s at batch {ceiling['best']['batch_size']}")
            return precision, ours_info
        if name == "ideal":
            if model in networks.NETWORKS:
                found = network_peers.ideal(model, slo_ms, ideal_search(search), out_dir / name, log)
            else:
                found = baselines.ideal(model, model_store, slo_ms, ideal_search(search), out_dir / name, log)
            results[name] = ideal_entry(found)
            log(f"  ideal batcher: {results[name]['capacity_rate']} requests/s at p99 <= {slo_ms:g} ms")
            return precision, ours_info
        if name in ("ray-same", "infinity"):
            precision = ours_info.get("precision") or baselines.same_precision_fallback(model, model_store)
            if name == "ray-same" and precision == "fp32" and "ray-fp32" in systems:
                results[name] = {
                    "same_as": "ray-fp32",
                    "precision": "fp32",
                    "note": "ours serves fp32 on this CPU (no native bf16), so this is ray-fp32",
                }
                log("  ours serves fp32 here: same system as ray-fp32, not run twice")
                return precision, ours_info
        context = start_system(name, model, model_store, naive_workers, out_dir, ours_info, precision, log)
        with context as (url, metrics_url, info):
            if name == "ours":
                ours_info = info
            log(f"  up at {url}: {info}")
            traffic = system_traffic(name, model)  # the same inputs in the system's own request shape
            entry = measure_server(
                name,
                url,
                metrics_url,
                low_rate=low_rate if name == "ours" else None,
                **{**measure, "model": traffic},
            )
            results[name] = {**info, **entry}
    except Exception as error:  # one system failing must not cost the others' measurements
        log(f"  {name} failed: {type(error).__name__}: {error}")
        results[name] = {"error": f"{type(error).__name__}: {error}"[:500]}
    return precision, ours_info


def system_exists(name, model, model_store):
    """Whether system ``name`` is compared for ``model``: a network's systems (network_peers.NETWORK_SYSTEMS), else
    ours' own and the baselines the model's registry entry lists."""
    if model in networks.NETWORKS:
        return name in network_peers.NETWORK_SYSTEMS
    return name not in baselines.FOR_SOME_MODELS or name in registry.model(model, model_store).baselines


def system_traffic(name, model):
    if model in networks.NETWORKS:
        return network_peers.traffic_for(name, model)  # OIP binary for Triton (and ours), JSON otherwise
    return baselines.system_traffic(name, model)


def in_process_ceiling(model, model_store, seconds, batch_sizes, log):
    if model in networks.NETWORKS:
        return network_peers.ceiling(model, seconds, batch_sizes, log)
    return baselines.in_process(model, model_store, seconds, batch_sizes, log)


def default_systems(model, model_store):
    """(systems compared by default, the open-loop rate every one is measured at) for ``model``; ValueError for a
    model that is neither a network nor known to the registry."""
    if model in networks.NETWORKS:
        return list(network_peers.NETWORK_SYSTEMS), networks.NETWORKS[model].moderate_rate
    described = registry.model(model, model_store)
    systems = [s for s in baselines.ALL_SYSTEMS if s not in baselines.FOR_SOME_MODELS or s in described.baselines]
    return systems, described.moderate_rate


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        required=True,
        help="minilm, classifier, the name of an embedding model packaged from its folder (its archive in "
        "--model-store): ours, ours-eager, infinity, inprocess and ideal exist for it; or a network of "
        f"loadtests/networks.py ({', '.join(networks.NETWORKS)}): {', '.join(network_peers.NETWORK_SYSTEMS)}",
    )
    parser.add_argument(
        "--systems",
        help=f"comma-separated subset of {','.join(baselines.ALL_SYSTEMS)} (default: all that exist for the model)",
    )
    capacity_search.add_search_arguments(parser)
    parser.add_argument(
        "--moderate-rate",
        type=float,
        help="open-loop rate every system is measured at (default 10/s minilm, 100/s classifier)",
    )
    parser.add_argument("--moderate-seconds", type=float, default=20.0, help="duration of that run")
    parser.add_argument(
        "--low-rate", type=float, default=2.0, help="ours only: p50 at this low rate (classifier target); 0 = skip"
    )
    parser.add_argument(
        "--naive-workers",
        type=int,
        default=machine.cores(),
        help="naive TorchServe workers (default: one per core, TorchServe's own default)",
    )
    parser.add_argument("--ceiling-seconds", type=float, default=10.0, help="in-process seconds per batch size")
    parser.add_argument("--ceiling-batch-sizes", default="1,8,16,32", help="in-process batch sizes to try")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="measure every system this many times, the order reversed every other round; each system's capacity "
        "is the median of its rounds, a ranking that flips between rounds is flagged (default 2; 1 = one pass)",
    )
    parser.add_argument("--model-store", default=str(REPO / "model_store"))
    parser.add_argument("--out", help="report folder (default loadtests/reports/compare-<model>-<time>)")
    args = parser.parse_args(argv)
    try:
        default, default_rate = default_systems(args.model, args.model_store)
    except ValueError as error:
        parser.error(str(error))
    if args.systems:
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
        unknown = sorted(set(systems) - set(baselines.ALL_SYSTEMS))
        if unknown:
            parser.error(f"unknown system(s) {unknown}; choose from {list(baselines.ALL_SYSTEMS)}")
    else:
        systems = default
    try:
        batch_sizes = [int(s) for s in args.ceiling_batch_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--ceiling-batch-sizes: comma-separated integers")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    moderate_rate = args.moderate_rate or default_rate

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out or REPORTS / f"compare-{args.model}-{stamp}")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = compare(
        args.model,
        args.slo_ms,
        systems,
        capacity_search.search_kwargs(args),
        out_dir,
        args.model_store,
        moderate_rate,
        args.moderate_seconds,
        args.low_rate,
        args.naive_workers,
        args.ceiling_seconds,
        batch_sizes,
        rounds=args.rounds,
    )
    (out_dir / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = compare_report.render_markdown(result)
    (out_dir / "compare.md").write_text(markdown)
    compare_report.plot(result, out_dir / "compare.png")
    print(markdown)
    print(f"report: {out_dir}/compare.md")
    measured = [e for e in result["systems"].values() if e.get("capacity_rate") is not None]
    return 0 if measured else 1


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
