"""The tuner's report: tune.md (the table, the recommendation and its model-config.yaml snippet) and heatmap.png
(capacity per batchSize x maxBatchDelay, one panel per worker and thread count)."""

from loadtests.report import markdown_table


def plot_heatmap(points, png_path, title):
    """Capacity (requests/s at the SLO) per batchSize x maxBatchDelay, one panel per (workers, threads)."""
    if not points:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(p["workers"], p["threads"]) for p in points})
    batch_sizes = sorted({p["batch_size"] for p in points})
    delays = sorted({p["max_batch_delay"] for p in points})
    figure, axes = plt.subplots(1, len(groups), figsize=(4.8 * len(groups) + 1, 4.2), squeeze=False)
    top = max([p["capacity_rate"] or 0 for p in points] + [1])
    for axis, (workers, threads) in zip(axes[0], groups, strict=True):
        grid = [[float("nan")] * len(batch_sizes) for _ in delays]
        for p in points:
            if (p["workers"], p["threads"]) == (workers, threads):
                grid[delays.index(p["max_batch_delay"])][batch_sizes.index(p["batch_size"])] = p["capacity_rate"] or 0
        image = axis.imshow(grid, cmap="viridis", vmin=0, vmax=top, origin="lower", aspect="auto")
        for row in range(len(delays)):
            for column in range(len(batch_sizes)):
                value = grid[row][column]
                if value == value:  # not NaN
                    axis.text(
                        column,
                        row,
                        f"{value:.0f}",
                        ha="center",
                        va="center",
                        color="white" if value < top * 0.6 else "black",
                    )
        axis.set_xticks(range(len(batch_sizes)), [str(b) for b in batch_sizes])
        axis.set_yticks(range(len(delays)), [str(d) for d in delays])
        axis.set_xlabel("batchSize")
        axis.set_ylabel("maxBatchDelay (ms)")
        axis.set_title(f"{workers} worker(s) x {threads} thread(s)")
    figure.colorbar(image, ax=axes[0].tolist(), label="requests/s at the SLO")
    figure.suptitle(title)
    figure.savefig(png_path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return True


def config_delay(delay):
    """maxBatchDelay as a model-config.yaml line's value. TorchServe 0.12 reads 0 there as unset and waits its default
    100 ms instead (only the register API's max_batch_delay=0 means no wait), so a measured 0 becomes 1 ms, the
    smallest wait an archive can hold, with a comment saying so."""
    if delay == 0:
        return "1  # measured: 0 (no wait); an archive's 0 means TorchServe's default 100 ms"
    return str(delay)


def render_markdown(result):
    lines = [
        f"# Batch-config sweep: {result['model']}, p99 <= {result['slo_ms']:g} ms",
        "",
        f"{result.get('machine') or str(result['cores']) + ' cores'}; threads per worker = cores // workers unless "
        f"--threads was given; "
        f"{result['step_seconds']:g} s per capacity step (at least {result.get('min_requests', 0)} requests); "
        f"started {result['started_at']}.",
        "",
    ]
    columns = [
        ("workers", "r"),
        ("threads", "r"),
        ("batchSize", "r"),
        ("maxBatchDelay ms", "r"),
        ("capacity /s", "r"),
        ("p99 at capacity", "r"),
        (f"p50 / p99 at {result['start_rate']:g}/s", "l"),
        ("mean batch at capacity", "r"),
        ("stopped because", "l"),
    ]
    rows = [
        [
            p["workers"],
            p["threads"],
            p["batch_size"],
            p["max_batch_delay"],
            p["capacity_rate"] if p.get("capacity_rate") is not None else p.get("error", "none"),
            p.get("p99_at_capacity_ms"),
            f"{p.get('low_load_p50_ms')} / {p.get('low_load_p99_ms')}",
            p.get("mean_batch_at_capacity"),
            p.get("stopped_because", ""),
        ]
        for p in sorted(
            result["points"], key=lambda p: (p["workers"], p["threads"], p["batch_size"], p["max_batch_delay"])
        )
    ]
    lines += markdown_table(columns, rows)
    best = result["recommendation"]
    lines += ["", "## Recommendation", ""]
    throughput = best.get("throughput")
    if throughput:
        lines += [
            f"- **Highest throughput at the SLO**: batchSize {throughput['batch_size']}, maxBatchDelay "
            f"{throughput['max_batch_delay']} ms, {throughput['workers']} worker(s) x {throughput['threads']} "
            f"thread(s): {throughput['capacity_rate']} requests/s.",
            "",
            "  model-config.yaml:",
            "",
            "  ```yaml",
            f"  minWorkers: {throughput['workers']}",
            f"  maxWorkers: {throughput['workers']}",
            f"  batchSize: {throughput['batch_size']}",
            f"  maxBatchDelay: {config_delay(throughput['max_batch_delay'])}",
            "  handler:",
            f"    threads: {throughput['threads']}",
            "  ```",
        ]
    latency = best.get("latency")
    if latency:
        lines.append(
            f"- **Lowest latency at low load** ({result['start_rate']:g}/s): batchSize "
            f"{latency['batch_size']}, maxBatchDelay {latency['max_batch_delay']} ms, {latency['workers']} "
            f"worker(s) x {latency['threads']} thread(s): p50 {latency['low_load_p50_ms']} ms, "
            f"p99 {latency['low_load_p99_ms']} ms."
        )
    if not throughput and not latency:
        lines.append("- nothing passed; see the table")
    lines.append("")
    return "\n".join(lines)
