"""The polynomial-sketch page's training-mode section and its plots (benchmarks/
polynomial_sketches.py writes the rest of the page).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _sketch_methods import PROJECTIONS

LABEL = {"gaussian": "Gaussian", "rademacher": "Rademacher", "tensorsketch": "TensorSketch",
         "tensorsrht": "TensorSRHT"}
OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def ratio_cell(timing, key, reference):
    """``time | reference / time`` table cells, ``- | -`` where not measured."""
    if key not in timing:
        return "- | -"
    return f"{timing[key]:.3f} | {timing[reference] / timing[key]:.1f}x"


def training_lines(timings, n):
    threads = list(timings)
    rows = [("tensorsrht", "TensorSRHT (compiled kernels)"),
            ("tensorsrht-ctr", "CtR-TensorSRHT (compiled kernels)"),
            ("tensorsrht-gemm", "TensorSRHT (GEMM path)"),
            ("tensorsrht-ctr-gemm", "CtR-TensorSRHT (GEMM path)"),
            ("rademacher", "dense Rademacher")]
    lines = [
        "### Training mode (autograd on)",
        "",
        "What GPyTorch training and `RandomFeatureGP.optimize_hyperparameters` run: kernel "
        "features with the lengthscale and the bias learnable. *forward*: "
        "`kernel.real_features(x)` with autograd recording; *forward + backward*: the same, "
        f"then `backward(G)` of a fixed random G ({n} x 5120, the gradient a loss "
        "`sum(Phi * G)` sends back), which computes the gradients to the lengthscale and the "
        "bias. The compiled path saves only its inputs for the backward pass and recomputes "
        "the transforms there (the 35 transforms per row would be 7x the size of the "
        "features); the dense sketch's autograd keeps its N x 35840 projections.",
        "",
        "| method | "
        + " | ".join(f"{t} thread(s): forward (s) | dense / this | forward + backward (s) | "
                     "dense / this" for t in threads) + " |",
        "|---|" + "---|---|---|---|" * len(threads),
    ]
    for key, name in rows:
        cells = []
        for t in threads:
            tm = timings[t]
            cells.append(ratio_cell(tm, ("train-forward", key), ("train-forward", "rademacher"))
                         + " | "
                         + ratio_cell(tm, ("train-both", key), ("train-both", "rademacher")))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    forward = [timings[t][("train-forward", "rademacher")]
               / timings[t][("train-forward", "tensorsrht")] for t in threads]
    both = [timings[t][("train-both", "rademacher")] / timings[t][("train-both", "tensorsrht")]
            for t in threads]
    nograd = [timings[t][("rademacher", "real")] / timings[t][("tensorsrht", "real")]
              for t in threads]
    per = ", ".join(f"{t} thread(s)" for t in threads)
    lines += [
        "",
        f"Targets ({per}): forward with autograd on at least 15x the dense sketch: "
        + ", ".join(f"{v:.1f}x" for v in forward)
        + (" (met)" if min(forward) >= 15 else " (NOT met)")
        + "; forward + backward at least 10x the dense sketch's: "
        + ", ".join(f"{v:.1f}x" for v in both)
        + (" (met)" if min(both) >= 10 else " (NOT met)")
        + "; without gradient (inference table above): "
        + ", ".join(f"{v:.1f}x" for v in nograd) + ".",
        "",
    ]
    return lines


def plot(errors, timing, degrees, multiples):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if errors is not None:
        plot_errors(plt, errors, degrees, multiples)
    plot_timing(plt, timing)


def plot_errors(plt, errors, degrees, multiples):
    fig, axes = plt.subplots(2, len(degrees), figsize=(4.2 * len(degrees), 7), sharex=True)
    colors = {"gaussian": "C0", "rademacher": "C1", "tensorsketch": "C2", "tensorsrht": "C3"}
    styles = {"real": "-", "complex": ":", "ctr": "--"}
    sizes = [m * 64 for m in multiples]
    for row, centred in enumerate((False, True)):
        for col, degree in enumerate(degrees):
            ax = axes[row, col]
            for projection in PROJECTIONS:
                for mode in ("real", "ctr"):
                    vals = [errors[(centred, degree, s, projection, mode)][0] for s in sizes]
                    med = np.array([np.median(v) for v in vals])
                    quart = np.array([np.percentile(v, [25, 75]) for v in vals])
                    # medians and quartiles: the errors are heavy-tailed for large p
                    ax.errorbar(sizes, med, yerr=[med - quart[:, 0], quart[:, 1] - med],
                                color=colors[projection],
                                linestyle=styles[mode], marker="o", ms=3, capsize=2,
                                label=f"{'CtR-' if mode == 'ctr' else ''}{LABEL[projection]}")
            ax.set_yscale("log")
            ax.set_title(f"p = {degree}, {'zero-centred' if centred else 'non-centred'} "
                         "(median, quartiles)", fontsize=9)
            ax.set_xlabel("real output size D")
            if col == 0:
                ax.set_ylabel("relative Frobenius error")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "polynomial_sketches.png", dpi=110)
    plt.close(fig)


def plot_timing(plt, timing):
    fig, ax = plt.subplots(figsize=(7, 3.5))
    keys = [("tensorsrht", "real"), ("tensorsrht", "ctr"), ("tensorsrht-gemm", "real"),
            ("tensorsrht-gemm", "ctr"), ("tensorsketch", "real"),
            ("tensorsketch", "ctr"), ("rademacher", "real"), ("rademacher", "ctr"),
            ("sklearn", "real")]
    names = ["TensorSRHT", "CtR-TSRHT", "TensorSRHT (GEMM)", "CtR-TSRHT (GEMM)",
             "TensorSketch", "CtR-TS", "Rademacher", "CtR-Rad.", "sklearn PCS"]
    shown = [(n, timing[k]) for k, n in zip(keys, names) if k in timing]
    ax.barh([n for n, _ in shown], [t for _, t in shown], color="C0")
    ax.set_xlabel("seconds (d = 1024, p = 7, D = 5120)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(OUT / "polynomial_sketches_time.png", dpi=110)
    plt.close(fig)
