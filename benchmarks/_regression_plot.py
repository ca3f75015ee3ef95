"""The figure of ``regression_uci.py``: test MNLL against wall time, one panel per set."""

from __future__ import annotations

import math

import numpy as np
from _harness import grouped


def plot(rows, path, methods):
    """MNLL against wall time per set (mean and spread over splits), one marker per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = grouped(rows, "set", "method")
    sets = list(dict.fromkeys(r["set"] for r in rows))
    cols = min(4, len(sets))
    nrows = math.ceil(len(sets) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    markers = dict(zip(methods, "oXs*D"))
    handles = {}
    for ax, name in zip(axes.flat, sets):
        points = {m: table[(name, m)] for m in methods if (name, m) in table}
        low = min(float(np.mean([x["mnll"] for x in r])) for r in points.values())
        top = low + 2.0
        for method, rs in points.items():
            t, m = np.array([r["time"] for r in rs]), np.array([r["mnll"] for r in rs])
            shown = min(m.mean(), top)
            handles[method] = ax.errorbar(
                t.mean(), shown, xerr=t.std(), yerr=m.std() if m.mean() < top else None,
                fmt=markers[method], color=f"C{methods.index(method)}", capsize=2, ms=7)
            if m.mean() > top:
                ax.annotate(f"{m.mean():.2g}", (t.mean(), shown), textcoords="offset points",
                            xytext=(4, -10), fontsize=7)
        ax.set_xscale("log")
        ax.set_title(f"{name} (N = {next(iter(points.values()))[0]['n_train']})")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test MNLL (lower is better)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(sets):]:
        ax.axis("off")
    fig.legend([handles[m] for m in methods if m in handles],
               [m for m in methods if m in handles], loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
