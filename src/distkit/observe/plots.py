"""matplotlib figures. Each function returns the figure; the caller shows or saves it."""
from __future__ import annotations

import matplotlib.pyplot as plt


def learning_curves(results_list, labels=None):
    """Train loss, validation loss and the validation score per epoch, one line per run.

    ``results_list``: results dicts as returned by ``distkit.launch.entry.run``. The third panel
    shows the task's score metric (accuracy for the built-in tasks; for a score on the
    loss, the task's first other metric)."""
    metric, loss_name = _curve_metric(results_list[0]) if results_list else ("accuracy", None)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for i, res in enumerate(results_list):
        label = labels[i] if labels else f"{res['backend']} x{res['world_size']}"
        epochs = [h["epoch"] for h in res["history"]]
        axes[0].plot(epochs, [h["train_loss"] for h in res["history"]], marker="o", label=label)
        axes[1].plot(epochs, [h["val_loss"] for h in res["history"]], marker="o", label=label)
        axes[2].plot(epochs, [h[f"val_{metric}"] for h in res["history"]], marker="o", label=label)
    loss_label = "cross-entropy (nats)" if loss_name in (None, "CrossEntropyLoss") else loss_name
    for ax, title, ylabel in zip(axes, ["train loss (epoch mean)", "validation loss", f"validation {metric}"],
                                 [loss_label, loss_label,
                                  "fraction correct" if metric == "accuracy" else metric]):
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[2].legend()
    fig.tight_layout()
    return fig


def _curve_metric(results) -> tuple:
    """(metric for the third panel, loss class name) from a run's ``task`` record."""
    task = results.get("task") or {}
    names = [m[4:] for m in task.get("metrics", ["val_accuracy"])]
    score = (task.get("score") or ["accuracy"])[0]
    if score == "loss":
        score = next((n for n in names if n != "loss"), "loss")
    return score, task.get("loss")


def sharding_map(record, max_epochs: int = 3):
    """Which rank saw which sample, per epoch, from ``distkit.sharding.collect_indices``.

    Left: one row per epoch, one column per sample index; the colour is the rank that saw
    it, black = seen by more than one rank (padding, or a bug), white = seen by none.
    Right: for each sample rank 0 saw in both of two consecutive epochs, its position in
    the first epoch against its position in the next. Points on the diagonal: the same
    order again (``set_epoch`` was not called); a scattered cloud: a new order."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    n, w = record["dataset_size"], record["world_size"]
    seen = record["seen"][:max_epochs]
    grid = np.full((len(seen), n), -1)
    for e, ranks in enumerate(seen):
        for r, idx in enumerate(ranks):
            for i in idx:
                if 0 <= i < n:
                    grid[e, i] = r if grid[e, i] in (-1, r) else w
    colours = ["white"] + [plt.cm.tab10(r % 10) for r in range(w)] + ["black"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 1.2 + 0.9 * len(seen)),
                                   gridspec_kw={"width_ratios": [2.2, 1]})
    ax1.imshow(grid, cmap=ListedColormap(colours), vmin=-1, vmax=w, aspect="auto",
               interpolation="nearest")
    ax1.set_yticks(range(len(seen)), [f"epoch {e + 1}" for e in range(len(seen))])
    ax1.set_xlabel("sample index")
    ax1.set_ylabel("epoch")
    ax1.set_title(f"{n} samples on {w} ranks: who saw what")
    handles = [Patch(color=colours[r + 1], label=f"rank {r}") for r in range(w)]
    handles += [Patch(color="black", label="several ranks"), Patch(facecolor="white", edgecolor="gray", label="none")]
    ax1.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    for e in range(len(seen) - 1):
        before = {i: pos for pos, i in enumerate(seen[e][0])}
        after = {i: pos for pos, i in enumerate(seen[e + 1][0])}
        both = [i for i in before if i in after]
        same = sum(before[i] == after[i] for i in both)
        ax2.scatter([before[i] for i in both], [after[i] for i in both], s=6, alpha=0.7,
                    label=f"epoch {e + 1} -> {e + 2}: {same}/{len(both)} at the same position")
    last = len(seen[0][0]) - 1
    ax2.plot([0, last], [0, last], ls=":", color="gray", label="the same order")
    ax2.set_xlabel(f"position in epoch e (of rank 0's {len(seen[0][0])} samples)")
    ax2.set_ylabel("position of the same sample in epoch e + 1")
    ax2.set_title("rank 0: did the order change? (diagonal = no)")
    if len(seen) > 1:
        ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def profiler_bars(summary, top: int = 8):
    """From ``distkit.observe.profiling.summarize``. Left: the costliest handlers (total seconds
    per rank: bar = mean over ranks, whisker = min..max). Right: data wait vs compute on
    each rank (stacked)."""
    from distkit.observe.profiling import handler_rows, row

    rows = handler_rows(summary)[:top]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 0.6 + 0.4 * max(len(rows), 4)),
                                   gridspec_kw={"width_ratios": [1.6, 1]})
    means = [r["mean_s"] for r in rows]
    err = [[m - r["min_s"] for m, r in zip(means, rows)], [r["max_s"] - m for m, r in zip(means, rows)]]
    ax1.barh(range(len(rows)), means, xerr=err, color="tab:purple", capsize=3)
    ax1.set_yticks(range(len(rows)), [f"{r['name'][:40]} ({r['event']}, {r['ranks']} rank(s))" for r in rows],
                   fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xlabel("seconds in total, per rank (min..max over ranks)")
    ax1.set_ylabel("handler (event, ranks that ran it)")
    ax1.set_title("handler cost (HandlersTimeProfiler)")
    data, compute = row(summary, "data (fetch a batch)"), row(summary, "compute (training step)")
    ranks = range(summary["world_size"])
    d = [v or 0.0 for v in data["per_rank_s"]]
    c = [v or 0.0 for v in compute["per_rank_s"]]
    ax2.bar(ranks, d, color="tab:orange", label="data wait")
    ax2.bar(ranks, c, bottom=d, color="tab:blue", label="compute")
    ax2.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax2.set_ylabel("seconds")
    ax2.set_title(f"data vs compute: {summary['bottleneck']}-bound ({summary['data_share']:.0%} data)")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="x" if ax is ax1 else "y")
    fig.tight_layout()
    return fig


def data_vs_compute(summaries, labels):
    """Several profiled runs side by side (e.g. before and after fixing the data
    pipeline): seconds per rank waiting for data and computing (mean over ranks)."""
    from distkit.observe.profiling import row

    fig, ax = plt.subplots(figsize=(1.5 + 2.2 * len(summaries), 3.4))
    d = [row(s, "data (fetch a batch)")["mean_s"] for s in summaries]
    c = [row(s, "compute (training step)")["mean_s"] for s in summaries]
    x = range(len(summaries))
    ax.bar(x, d, color="tab:orange", label="data wait")
    ax.bar(x, c, bottom=d, color="tab:blue", label="compute")
    for i, (di, ci) in enumerate(zip(d, c)):
        ax.text(i, di + ci, f"{di + ci:.2f} s\n{di / (di + ci):.0%} data", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("seconds per rank (mean over ranks)")
    ax.set_ylim(0, 1.25 * max(di + ci for di, ci in zip(d, c)))
    ax.set_title("where the training loop's time went")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def oversubscription_plot(rows):
    """Time for N busy processes to finish the same work each, and their total throughput,
    against N, with the machine's core count marked. ``rows``: from ``distkit.lessons.collectives.oversubscription``."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    n = [r["processes"] for r in rows]
    cores = rows[0]["cores"]
    ax1.plot(n, [r["seconds"] for r in rows], marker="o", label="measured")
    ax1.plot(n, [rows[0]["seconds"] * max(1.0, k / cores) for k in n], ls="--", color="gray",
             label="max(1, N / cores) x time alone")
    ax1.set_title("time for the same work per process")
    ax1.set_ylabel("seconds, first start to last finish")
    ax2.plot(n, [r["matmuls_per_second"] for r in rows], marker="o")
    ax2.set_title("total work per second, all processes")
    ax2.set_ylabel(f"{rows[0]['size']}x{rows[0]['size']} matrix products / s")
    ax2.set_ylim(bottom=0)
    for ax in (ax1, ax2):
        ax.axvline(cores, color="red", alpha=0.5, label=f"{cores} cores")
        ax.set_xlabel("busy processes N")
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(k) for k in n])
        ax.grid(alpha=0.3)
    ax1.legend()
    fig.tight_layout()
    return fig


def benchmark_chart(results):
    """``distkit bench`` results in three panels: kit / hand-written ratios against their
    targets; scaling (samples/s per variant, efficiency in the labels); and loader
    samples/s vs ``num_workers`` against each model's compute samples/s."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    ax = axes[0]
    bars = []
    if "overhead" in results:
        o = results["overhead"]
        bars += [(f"1 proc: {name}", v["ratio"], o["target_cost"]) for name, v in o["variants"].items()]
    if "ddp" in results:
        d = results["ddp"]
        bars.append((f"DDP {d['world_size']} procs: kit", d["ratio"], d["target_cost"]))
    gpu = results.get("gpu", {})
    if "ratio" in gpu:
        bars.append(("GPU ResNet-18: kit", gpu["ratio"], gpu["target_cost"]))
    for i, (label, ratio, target) in enumerate(bars):
        ax.barh(i, ratio, color="tab:green" if ratio >= 1 - target else "tab:red")
        ax.plot([1 - target] * 2, [i - 0.4, i + 0.4], color="black", ls="--")
        ax.text(ratio, i, f" {ratio:.3f}", va="center")
    ax.set_yticks(range(len(bars)), [b[0] for b in bars])
    ax.axvline(1.0, color="gray", lw=0.8)
    lo = min([b[1] for b in bars] + [0.9])
    ax.set_xlim(lo - 0.02, max([b[1] for b in bars] + [1.0]) + 0.06)
    ax.invert_yaxis()
    ax.set_xlabel("kit samples/s / hand-written samples/s (1 = as fast)")
    title = "kit / hand-written samples/s (dashed: target)"
    if "skipped" in gpu:
        title += f"\nGPU: skipped: {gpu['skipped']}"
    ax.set_title(title, fontsize=10)

    ax = axes[1]
    if "scaling" in results:
        models = results["scaling"]["models"]
        variants = [p["variant"] for p in next(iter(models.values()))["points"]]
        width = 0.8 / len(variants)
        top = 0.0
        for j, variant in enumerate(variants):
            values = [next(p for p in m["points"] if p["variant"] == variant)["median"]
                      for m in models.values()]
            top = max([top] + values)
            ax.bar([i + j * width for i in range(len(models))], values, width, label=variant)
        ax.set_ylim(0, top * 1.4)  # room for the legend above the bars
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))],
                      [f"{name}\nstrong eff {m['strong_efficiency']:.2f}, weak {m['weak_efficiency']:.2f}"
                       f"\n{m['allreduce_bytes_per_step'] / 2**20:.1f} MiB all-reduced/step"
                       for name, m in models.items()], fontsize=8)
        ax.set_ylabel("samples/s")
        ax.legend(fontsize=7, ncol=3, loc="upper center")
        ax.set_title(f"scaling to {results['scaling']['world_sizes'][-1]} processes", fontsize=10)
    else:
        ax.set_axis_off()

    ax = axes[2]
    if "data" in results:
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for k, (pname, p) in enumerate(results["data"]["pipelines"].items()):
            color = colors[k % len(colors)]
            points = [(int(name.split()[0].split("=")[1]), v["median"])
                      for name, v in p["loader"].items() if name.endswith("pin=False")]
            ax.plot(*zip(*points), marker="o", color=color, label=f"loader: {pname}")
            for ls, (model, c) in zip(["--", ":"], p["compute"].items()):
                ax.axhline(c["median"], color=color, ls=ls, lw=1,
                           label=f"compute: {model} on {pname.split()[0]}")
        ax.set_yscale("log")
        ax.set_xticks(results["data"].get("num_workers", ax.get_xticks()))
        ax.set_xlabel("num_workers")
        ax.set_ylabel("samples/s")
        ax.legend(fontsize=7)
        ax.set_title("data-bound where the loader line is below compute", fontsize=10)
    else:
        ax.set_axis_off()
    m, v = results["machine"], results["versions"]
    fig.suptitle(f"distkit bench ({results['mode']}) - {m['cores']} cores, {m['cpu']}, torch "
                 f"{v['torch']}, ignite {v['ignite']}", fontsize=10)
    fig.tight_layout()
    return fig


def scaling_curves(summary):
    """Seconds per epoch, samples/s, scaling efficiency and final validation loss against
    the number of processes: one line per scaling mode and lr rule.

    ``summary``: rows of :func:`distkit.lessons.scaling.summarize`."""
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [("epoch_time_s", "seconds per epoch (median)"), ("samples_per_s", "samples / s"),
              ("efficiency", "efficiency = speed-up / N"), ("final_val_loss", "final validation loss")]
    curves = sorted({(r["mode"], r["lr_rule"]) for r in summary})
    sizes = sorted({r["world_size"] for r in summary})
    for mode, rule in curves:
        rows = sorted((r for r in summary if (r["mode"], r["lr_rule"]) == (mode, rule)),
                      key=lambda r: r["world_size"])
        n = [r["world_size"] for r in rows]
        for ax, (key, _) in zip(axes, panels):
            ax.plot(n, [r[key] for r in rows], "-" if mode == "strong" else "--", marker="o",
                    label=f"{mode} scaling, {rule}")
    axes[2].plot(sizes, [1.0] * len(sizes), ":", color="gray", label="linear (ideal)")
    units = ["seconds", "samples / s", "speed-up / N (1 = ideal)", "cross-entropy (nats)"]
    for ax, (_, title), unit in zip(axes, panels, units):
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.set_xlabel("processes (N)")
        ax.set_xticks(sizes)
        ax.grid(alpha=0.3)
    axes[2].set_ylim(bottom=0)
    axes[3].legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_costs(costs):
    """Time of one training step split into compute and the communication it could not
    hide, per world size and batch per process, labelled with the bytes all-reduced.

    ``costs``: dicts of :func:`distkit.lessons.scaling.measure_step_costs`."""
    costs = sorted(costs, key=lambda c: (c["world_size"], -c["per_process_batch"]))
    fig, ax = plt.subplots(figsize=(1.5 + 1.6 * len(costs), 3.6))
    x = range(len(costs))
    compute = [1e3 * c["compute_s"] for c in costs]
    comm = [1e3 * max(0.0, c["step_s"] - c["compute_s"]) for c in costs]
    ax.bar(x, compute, color="tab:blue", label="compute (no all-reduce)")
    ax.bar(x, comm, bottom=compute, color="tab:red", label="gradient all-reduce (not hidden)")
    for i, c in enumerate(costs):
        ax.text(i, compute[i] + comm[i], f"{c['bytes_allreduced_per_step'] / 1e3:.0f} kB\n"
                f"{c['communication_share']:.0%} comm", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [f"N={c['world_size']}\n{c['per_process_batch']}/proc" for c in costs])
    ax.set_ylabel("ms per step (slowest rank)")
    ax.set_ylim(0, 1.3 * max(a + b for a, b in zip(compute, comm)))
    ax.set_title("one step: compute vs communication")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def confusion_matrix(matrix, class_names=None, title="validation confusion matrix"):
    """A heatmap of ``matrix[true, predicted]`` counts (ignite's ``ConfusionMatrix``
    output), each cell annotated with its count."""
    import numpy as np

    m = np.asarray(matrix)
    names = class_names or [str(i) for i in range(len(m))]
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * len(m), 0.8 + 0.42 * len(m)))
    image = ax.imshow(m, cmap="Blues")
    for t in range(len(m)):
        for p in range(len(m)):
            if m[t, p]:
                ax.text(p, t, int(m[t, p]), ha="center", va="center", fontsize=7,
                        color="white" if m[t, p] > m.max() / 2 else "black")
    ax.set_xticks(range(len(m)), names)
    ax.set_yticks(range(len(m)), names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="validation images (count)")
    fig.tight_layout()
    return fig


def sample_predictions(images, labels, predictions, columns: int = 8):
    """A grid of images, each titled ``predicted (true)``; wrong ones in red."""
    n = len(images)
    rows = (n + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(1.3 * columns, 1.5 * rows), squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.set_axis_off()
        if k < n:
            import numpy as np

            image = np.asarray(images[k])  # channels first, as torch keeps images
            ax.imshow(image[0] if len(image) == 1 else image.transpose(1, 2, 0), cmap="gray_r")
            ok = predictions[k] == labels[k]
            ax.set_title(f"{predictions[k]} ({labels[k]})", fontsize=9, color="black" if ok else "red")
    fig.suptitle("validation images: predicted (true)", fontsize=10)
    fig.tight_layout()
    return fig
