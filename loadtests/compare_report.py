"""The comparison's report: compare.md (the table, ratios to ours, to the ceiling and to the ideal batcher, the
targets met or missed, where the tail's time goes) and compare.png (throughput at the SLO and latency at the moderate
load, per system)."""

from loadtests.baselines.ideal import summarize_tail
from loadtests.baselines.systems import ALL_SYSTEMS, DESCRIPTIONS


def system_notes(name, entry):
    """The table's notes cell: what is particular about this system's figure."""
    if name == "inprocess":
        return f"best batch {entry.get('best_batch_size')}, raw forward {entry.get('raw_forward_ms')} ms"
    notes = entry.get("stopped_because", "")
    if name == "ideal":
        notes = (
            f"{entry.get('workers')} workers x {entry.get('threads')} threads, batchSize {entry.get('batch_size')}, "
            f"maxBatchDelay {entry.get('max_batch_delay_ms'):g} ms; {notes}"
            if entry.get("max_batch_delay_ms") is not None
            else notes
        )
    if entry.get("backend"):
        notes = f"backend {entry['backend']}; {notes}"
    return notes


def capacity_cell(entry):
    """The capacity, and with several rounds its spread: a figure the noise could move is shown with that noise."""
    rate = entry.get("capacity_rate")
    if rate is None:
        return "none passed"
    spread = entry.get("capacity_spread")
    if not spread or spread["min"] == spread["max"]:
        return f"{rate}"
    return f"{rate} ({spread['min']:g}–{spread['max']:g} over {len(entry['capacity_rounds'])} rounds)"


def render_rounds(result):
    """Each round's order and figures, and the pairs whose ranking flipped between rounds."""
    if (result.get("rounds") or 1) < 2:
        return []
    lines = [
        "",
        f"## Rounds ({result['rounds']}, order reversed every other round; capacities are the median of the rounds)",
        "",
    ]
    for number, order in enumerate(result.get("orders") or [], 1):
        lines.append(f"- round {number}: {', '.join(order)}")
    lines.append("")
    for name in ALL_SYSTEMS:
        rounds = (result["systems"].get(name) or {}).get("capacity_rounds")
        if rounds:
            lines.append(f"- {name}: {' / '.join('–' if rate is None else f'{rate:g}' for rate in rounds)} requests/s")
    flips = result.get("ranking_flips") or []
    lines.append("")
    if not flips:
        lines.append("The ranking was the same in every round.")
    for flip in flips:
        first, second = flip["systems"]
        lines.append(
            f"- **RANKING FLIPPED between rounds: {first} vs {second}** "
            f"({first} {flip['rounds'][first]}, {second} {flip['rounds'][second]}): their difference is within the "
            "machine's noise; do not rank them on this run."
        )
    return lines


def render_markdown(result):
    lines = [
        f"# Side by side: {result['model']}, throughput at p99 <= {result['slo_ms']:g} ms",
        "",
        f"{result.get('machine') or str(result['cores']) + ' cores'}, started {result['started_at']}; each system "
        f"alone, one after the other, same "
        f"seeded payload mix; open-loop capacity search ({result['search']['step_seconds']:g} s steps, at least "
        f"{result['search'].get('min_requests', 0)} requests each); moderate "
        f"load = {result['moderate_rate']:g} requests/s open loop for every system.",
        "",
        "| system | what | precision | throughput at SLO /s | x ours | x ceiling | x ideal "
        "| p50 / p99 at moderate load | Locust CPU at capacity | notes |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for name in ALL_SYSTEMS:
        entry = result["systems"].get(name)
        if entry is None:
            continue
        if entry.get("error"):
            lines.append(f"| {name} | {DESCRIPTIONS[name]} | – | – | – | – | – | – | – | {entry['error'][:150]} |")
            continue
        if entry.get("same_as"):
            lines.append(
                f"| {name} | {DESCRIPTIONS[name]} | {entry.get('precision')} | = {entry['same_as']} | | | | | | "
                f"{entry.get('note', '')} |"
            )
            continue
        moderate = (
            f"{entry.get('moderate_p50_ms')} / {entry.get('moderate_p99_ms')} ms"
            if entry.get("moderate_p50_ms") is not None
            else "–"
        )
        cpu = entry.get("generator_cpu_share_at_capacity")
        notes = system_notes(name, entry)
        lines.append(
            f"| {name} | {DESCRIPTIONS[name]} | {entry.get('precision') or '–'} | "
            f"{capacity_cell(entry)} | "
            f"{entry.get('ratio_to_ours') or '–'} | {entry.get('ratio_to_ceiling') or '–'} | "
            f"{entry.get('ratio_to_ideal') or '–'} | {moderate} | "
            f"{'–' if cpu is None else format(cpu, '.0%')} | {notes} |"
        )
    lines += render_rounds(result)
    lines += ["", "## Targets (recorded, never asserted)", ""]
    for verdict in result["targets"]:
        state = "not measured" if verdict["met"] is None else ("met" if verdict["met"] else "MISSED")
        by = ""
        if verdict["met"] is False and verdict["value"] is not None and verdict["bound"]:
            by = f" (by {abs(verdict['value'] - verdict['bound']):.3g})"
        shown = verdict["note"] and (verdict["met"] is not None or verdict["note"] != "not measured")
        note = f" — {verdict['note']}" if shown else ""
        lines.append(f"- {verdict['target']}: {verdict['value']} vs {verdict['bound']}: **{state}**{by}{note}")
    tail = (result["systems"].get("ideal") or {}).get("tail") or {}
    sentence = summarize_tail(tail)
    if sentence:
        lines += [
            "",
            "## Where a long text's time goes (ideal batcher, at its capacity)",
            "",
            sentence[0].upper() + sentence[1:] + ". Per-request records (tokens, queue wait, batch compute) are in "
            f"{result['systems']['ideal'].get('report', 'ideal.json')}.",
        ]
    lines += [
        "",
        "The in-process ceiling has no HTTP, queue or batching delay and is not bound by the SLO; the ideal batcher "
        "replays the same open-loop schedules as the served systems' search against the handler in its configured "
        "workers with a perfect dispatcher (no HTTP, no frontend), so ours / ideal is what the serving stack costs at "
        "the SLO. Infinity is sent the same texts (or images) as OpenAI-style /embeddings requests. The load generator "
        "(Locust) runs on the same cores as the server, and its CPU share at capacity is listed per system.",
        "",
    ]
    return "\n".join(lines)


def plot(result, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ALL_SYSTEMS if (result["systems"].get(n) or {}).get("capacity_rate") is not None]
    if not names:
        return False
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(12, 4.5))
    throughput.bar(names, [result["systems"][n]["capacity_rate"] for n in names], color="tab:green")
    throughput.set_ylabel(f"requests/s at p99 <= {result['slo_ms']:g} ms")
    throughput.set_title(f"{result['model']}: throughput at the SLO")
    served = [n for n in names if result["systems"][n].get("moderate_p50_ms") is not None]
    positions = range(len(served))
    latency.bar(
        [p - 0.2 for p in positions], [result["systems"][n]["moderate_p50_ms"] for n in served], 0.4, label="p50"
    )
    latency.bar(
        [p + 0.2 for p in positions], [result["systems"][n]["moderate_p99_ms"] or 0 for n in served], 0.4, label="p99"
    )
    latency.set_xticks(list(positions), served)
    latency.set_ylabel("ms")
    latency.set_title(f"latency at {result['moderate_rate']:g} requests/s (open loop)")
    latency.legend()
    for axis in (throughput, latency):
        axis.tick_params(axis="x", rotation=20)
        axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return True
