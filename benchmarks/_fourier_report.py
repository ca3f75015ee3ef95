"""The Fourier-features benchmark's methods and its page: the plot, the summary and the tables
of ``docs/benchmarks/fourier_features.md`` (written by ``benchmarks/fourier_features.py``).
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

import gpytorch
import matplotlib
import numpy as np
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"iid": "RFF (iid)", "orthogonal": "ORF", "structured": "SORF",
          "structured-pad64": "SORF, pad_to=64"}
#: methods of the error comparison: name -> FourierFeatureKernel keywords.
ERROR_METHODS = {
    "iid": {"sampling": "iid"},
    "orthogonal": {"sampling": "orthogonal"},
    "structured": {"sampling": "structured"},
    "structured-pad64": {"sampling": "structured", "pad_to": 64},
}


def machine_info() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}; {os.cpu_count()} cores; torch {torch.__version__}, gpytorch "
            f"{gpytorch.__version__}, Python {platform.python_version()}; "
            f"torch threads: {torch.get_num_threads()}")


def write_plot(path, ratios, mse, feat):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (name, (d, lengthscale, _, results)) in zip(axes[:2], mse.items()):
        for sampling in ERROR_METHODS:
            mean = results[sampling].mean(1)
            se = results[sampling].std(1, ddof=1) / math.sqrt(results[sampling].shape[1])
            ax.errorbar(ratios, mean, yerr=2 * se, marker="o", capsize=2, label=LABELS[sampling])
        ax.set_yscale("log")
        ax.set_xlabel("D / d (frequencies per input dimension)")
        ax.set_ylabel("kernel MSE (off-diagonal)")
        ax.set_title(f"{name}, d = {d}, l = {lengthscale:.2f}")
        ax.legend()
    ax = axes[2]
    dims = [r["d"] for r in feat]
    for key, label in [("orthogonal", "ORF"), ("structured", "SORF (auto route)"),
                       ("structured-fwht", "SORF (FWHT route)"),
                       ("gpytorch", "gpytorch RFFKernel")]:
        ax.plot(dims, [r[f"proj {key}"] * 1e3 for r in feat], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("input dimension d")
    ax.set_ylabel("projection x W^T time [ms]")
    ax.set_title("projection time, fixed N and D")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_lines(ratios, mse, feat, steps, gp_n):
    lines = []
    for name, (d, _, _, results) in mse.items():
        base = results["iid"].mean(1)
        orf = results["orthogonal"].mean(1) / base
        sorf = results["structured"].mean(1) / base
        lines.append(
            f"* {name} (d = {d}): MSE ratio to RFF over D/d = {ratios[0]}..{ratios[-1]}: "
            f"ORF {orf.min():.2f}-{orf.max():.2f}, SORF {sorf.min():.2f}-{sorf.max():.2f} "
            + ("(ORF and SORF below RFF at every D/d, as the ORF paper reports)."
               if max(orf.max(), sorf.max()) < 1 else "(not below RFF at every D/d).")
        )
    lines.append(
        "* SORF has fixed row norms, so it carries a bias of order z^4 / d' that more features "
        "do not remove: at d = 11 (padded to 16) its ratio to RFF creeps up with D/d, while at "
        "d = 64 it tracks ORF. `pad_to=64` lowers the bias at d = 11 once D >= 64; with fewer "
        "frequencies than d' only the first rows of one padded block are used, whose "
        "projections onto the d input coordinates are no longer orthogonal."
    )
    faster = [r["d"] for r in feat if r["proj structured-fwht"] < r["proj orthogonal"]]
    last = feat[-1]
    lines.append(
        f"* Projection time: the SORF FWHT route first beats the dense ORF product at "
        f"d = {faster[0] if faster else '(never)'}; at d = {last['d']} it is "
        f"{last['proj orthogonal'] / last['proj structured-fwht']:.1f}x faster than ORF and "
        f"{last['proj gpytorch'] / last['proj structured-fwht']:.1f}x faster than GPyTorch's "
        f"RFFKernel projection ({last['gpytorch'] / last['structured']:.1f}x for the whole "
        "feature map, where the shared cos/sin cost remains). For d <= 128 the default route is "
        "a dense product and costs the same as ORF."
    )
    base = steps["gpytorch RFFKernel"][0]
    ratios_gp = ", ".join(f"{name.split(' (')[-1].rstrip(')')} {seconds / base:.2f}x"
                          for name, (seconds, _) in steps.items() if name.startswith("rfgp"))
    lines.append(
        f"* ExactGP training step at N = {gp_n}, equal D: rfgp FourierFeatureKernel takes "
        f"{ratios_gp} the time of gpytorch RFFKernel; the step is GPyTorch's low-rank linear "
        "algebra, the same for both."
    )
    return lines


def write_markdown(path, args, ratios, num_points, num_seeds, mse, feat, feat_n, feat_m, steps,
                   gp_n, gp_m, gp_d, elapsed):
    command = "python benchmarks/fourier_features.py" + (" --quick" if args.quick else "")
    lines = [
        "# Random Fourier features: iid vs orthogonal vs structured",
        "",
        f"Command: `{command}` (total {elapsed:.0f} s).  ",
        f"Machine: {machine_info()}.  ",
        "Timings were taken on a shared 2-core machine with one torch thread; other jobs were "
        "running, so single timings can be off by tens of percent. Ratios within one table are "
        "the meaningful numbers.",
        "",
        "![plots](fourier_features.png)",
        "",
        "## Summary",
        "",
        *summary_lines(ratios, mse, feat, steps, gp_n),
        "",
        "## 1. Kernel-approximation MSE against D/d",
        "",
        "RBF kernel, lengthscale = mean distance to the 50th nearest neighbour (1000 sampled "
        f"points), MSE of `K_hat - K` over all off-diagonal pairs of {num_points} random points, "
        f"mean over {num_seeds} seeds (+- standard error). D counts frequencies "
        "(`num_features = 2 D`), as in the ORF paper. SORF pads d to the next power of two; "
        "'SORF pad_to=64' pads further to 64 (`FourierFeatureKernel(..., pad_to=64)`).",
        "",
    ]
    for name, (d, lengthscale, z, results) in mse.items():
        quantiles = np.quantile(z.numpy(), [0.1, 0.5, 0.9])
        lines += [
            f"### {name}: d = {d}, "
            f"l = {lengthscale:.3f}; pair distances z = |x - y| / l: 10/50/90% quantiles "
            f"{quantiles[0]:.2f} / {quantiles[1]:.2f} / {quantiles[2]:.2f}",
            "",
            "| D/d | RFF MSE | ORF MSE | SORF MSE | SORF pad_to=64 MSE | ORF / RFF | SORF / RFF "
            "| SORF pad_to=64 / RFF |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, ratio in enumerate(ratios):
            cells = []
            for sampling in ERROR_METHODS:
                values = results[sampling][i]
                se = values.std(ddof=1) / math.sqrt(len(values))
                cells.append(f"{values.mean():.3e} +- {se:.1e}")
            base = results["iid"][i].mean()
            lines.append(
                f"| {ratio} | " + " | ".join(cells)
                + f" | {results['orthogonal'][i].mean() / base:.3f}"
                + f" | {results['structured'][i].mean() / base:.3f}"
                + f" | {results['structured-pad64'][i].mean() / base:.3f} |"
            )
        lines.append("")
    lines += [
        "## 2. Feature-construction time against d",
        "",
        f"N = {feat_n} float32 inputs, D = {feat_m} frequencies ({2 * feat_m} feature columns), "
        "median of repeats. SORF 'auto' is the default route (one dense product with the "
        "materialised W for d <= 128, the FWHT otherwise); 'FWHT' forces the "
        "O(N D log d) route. `gpytorch` is `RFFKernel(num_samples=D)`: its projection "
        "`x @ (randn_weights / lengthscale)` and its full feature root.",
        "",
        "### Projection `x W^T` (where the methods differ)",
        "",
        "| d | ORF [ms] | SORF auto [ms] | SORF FWHT [ms] | gpytorch [ms] | gpytorch / SORF FWHT "
        "| SORF FWHT / (N D log2 d) [ns] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in feat:
        per = r["proj structured-fwht"] / (feat_n * feat_m * math.log2(r["d"])) * 1e9
        lines.append(
            f"| {r['d']} | {r['proj orthogonal'] * 1e3:.1f} | {r['proj structured'] * 1e3:.1f} | "
            f"{r['proj structured-fwht'] * 1e3:.1f} | {r['proj gpytorch'] * 1e3:.1f} | "
            f"{r['proj gpytorch'] / r['proj structured-fwht']:.2f} | {per:.3f} |"
        )
    first, last = feat[0], feat[-1]
    growth = {k: last[f"proj {k}"] / first[f"proj {k}"]
              for k in ("orthogonal", "structured-fwht", "gpytorch")}
    lines += [
        "",
        f"From d = {first['d']} to d = {last['d']} ({last['d'] // first['d']}x): ORF projection "
        f"time x {growth['orthogonal']:.1f}, gpytorch x {growth['gpytorch']:.1f} (both "
        f"O(N D d)); SORF FWHT route x {growth['structured-fwht']:.1f}, against "
        f"log2({last['d']}) / log2({first['d']}) = "
        f"{math.log2(last['d']) / math.log2(first['d']):.2f} for O(N D log d).",
        "",
        "### Full `features(x)` (projection + cos/sin) and the one-off weight draw",
        "",
        "The cos/sin of the N x 2D output costs the same for every method and dominates at "
        "small d. 'draw' samples the random weights once (ORF: a d x d QR per block).",
        "",
        "| d | ORF [ms] | SORF auto [ms] | gpytorch RFF [ms] | gpytorch / SORF | draw ORF [ms] "
        "| draw SORF [ms] | draw gpytorch [ms] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in feat:
        lines.append(
            f"| {r['d']} | {r['orthogonal'] * 1e3:.1f} | {r['structured'] * 1e3:.1f} | "
            f"{r['gpytorch'] * 1e3:.1f} | {r['gpytorch'] / r['structured']:.2f} | "
            f"{r['draw orthogonal'] * 1e3:.1f} | {r['draw structured'] * 1e3:.2f} | "
            f"{r['draw gpytorch'] * 1e3:.1f} |"
        )
    lines += [
        "",
        f"## 3. ExactGP training step at N = {gp_n}",
        "",
        f"One Adam step on the exact marginal likelihood (forward, backward, update), N = {gp_n}, "
        f"d = {gp_d}, D = {gp_m} frequencies ({2 * gp_m} feature columns) for every kernel, "
        "float32, `ScaleKernel` + `GaussianLikelihood`, median of the timed rounds (the models "
        "take turns, one step each per round, after a warm-up round). GPyTorch takes the "
        "low-rank (Woodbury) route for every kernel. The loss (negative marginal log "
        "likelihood per datum after the last step) differs between the kernels only through "
        "their random draws and, for SORF at d = 8 (padded to 8), its bias.",
        "",
        "| kernel | s / step | time / gpytorch RFFKernel | loss |",
        "|---|---|---|---|",
    ]
    base = steps["gpytorch RFFKernel"][0]
    for name, (seconds, loss) in steps.items():
        lines.append(f"| {name} | {seconds:.3f} | {seconds / base:.2f} | {loss:.4f} |")
    lines.append("")
    Path(path).write_text("\n".join(lines))
