"""Vector-field GPs: operator-valued random features against the exact operator-valued GP.

Two questions, as in Brault et al. (ORFF, ACML 2016), Figs. 1 and 5:

1. Training time against N (10^2 .. 10^5) for the random-feature curl-free GP
   (``RandomFeatureGP`` + ``CurlFreeFeatureKernel``, D = 1000) and the exact curl-free GP
   (dense ``(2N) x (2N)`` Gram of ``CurlFreeKernel`` + Cholesky, as long as it is feasible), on
   the noisy gradient field of five Gaussian bumps; with the test RMSE of both.
2. Kernel approximation error against D (10 .. 10^4) for the decomposable, curl-free, div-free
   and Helmholtz features in d = p = 4, points in [-1, 1]^4: the largest spectral-norm error
   ``max_{x,z} ||K_hat(x, z) - K(x, z)||_2`` over all pairs (the kernels have K(x, x) of norm 1)
   and the relative Frobenius error of the Gram matrix, averaged over seeds.

Run: ``python benchmarks/vector_fields.py`` (``--quick`` for a short run). Writes
``docs/benchmarks/vector_fields.md`` and ``docs/benchmarks/vector_fields.png``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rfgp import RandomFeatureGP  # noqa: E402
from rfgp.kernels import (  # noqa: E402
    CurlFreeFeatureKernel,
    CurlFreeKernel,
    DecomposableFeatureKernel,
    DivFreeFeatureKernel,
    HelmholtzFeatureKernel,
)
from rfgp.metrics import relative_frobenius_error, rmse  # noqa: E402

DT = torch.float64

# The five-Gaussian gradient field of the ORFF paper (as in the vector_field example of
# rfgp.demo): positive bumps at (0, 0), (0, +-1), negative ones at (+-1, 0).
FIVE_CENTRES = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, -1.0], [-1.0, 0.0], [1.0, 0.0]],
                            dtype=DT)
FIVE_SIGNS = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0], dtype=DT)


def five_gaussian_field(x: torch.Tensor, width: float = 0.4) -> torch.Tensor:
    """Gradient of sum_i s_i exp(-|x - c_i|^2 / (2 w^2)), closed form, ``(N, 2)``."""
    diff = x.unsqueeze(1) - FIVE_CENTRES  # (N, 5, 2)
    bumps = FIVE_SIGNS * torch.exp(-diff.pow(2).sum(-1) / (2 * width**2))
    return -(bumps.unsqueeze(-1) * diff).sum(1) / width**2


def timed(fn, repeats: int = 1):
    best = math.inf
    out = None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


# ---------------------------------------------------------------- 1. time vs N
def fit_random_features(x, y, scale, num_features, lengthscale, noise):
    from gpytorch.kernels import ScaleKernel

    kernel = CurlFreeFeatureKernel(num_features, input_dim=2, seed=1).to(DT)
    kernel.lengthscale = lengthscale
    scaled = ScaleKernel(kernel).to(DT)
    scaled.outputscale = scale
    return RandomFeatureGP(scaled, noise=noise, solve="weight").fit(x, y)


def fit_exact(exact, x, y, scale, noise):
    with torch.no_grad():
        gram = exact(x).to_dense() * scale
        gram.diagonal().add_(noise)
        chol = torch.linalg.cholesky(gram)
        return torch.cholesky_solve(y.reshape(-1, 1), chol)


def time_vs_n(sizes, exact_max: int, num_features: int, lengthscale: float = 0.35,
              noise: float = 0.01):
    g = torch.Generator().manual_seed(0)
    x_test = torch.rand(500, 2, generator=g, dtype=DT) * 4 - 2
    y_test = five_gaussian_field(x_test)
    rows = []
    for n in sizes:
        x = torch.rand(n, 2, generator=g, dtype=DT) * 4 - 2
        y = five_gaussian_field(x) + math.sqrt(noise) * torch.randn(n, 2, generator=g, dtype=DT)
        scale = float(y.pow(2).mean())
        repeats = 3 if n <= 3000 else 1
        rf_time, gp = timed(lambda x=x, y=y, s=scale: fit_random_features(
            x, y, s, num_features, lengthscale, noise), repeats)
        rf_rmse = float(rmse(y_test, gp.predict(x_test)))
        row = {"N": n, "rf_time": rf_time, "rf_rmse": rf_rmse,
               "exact_time": None, "exact_rmse": None}
        if n <= exact_max:
            exact = CurlFreeKernel(input_dim=2).to(DT)
            exact.lengthscale = lengthscale
            exact_time, alpha = timed(lambda x=x, y=y, s=scale, k=exact: fit_exact(
                k, x, y, s, noise), repeats)
            with torch.no_grad():
                pred = (exact(x_test, x).to_dense() * scale) @ alpha
            row["exact_time"] = exact_time
            row["exact_rmse"] = float(rmse(y_test, pred.reshape(-1, 2)))
        rows.append(row)
        exact_note = f"{row['exact_time']:.3f}s" if row["exact_time"] is not None else "-"
        print(f"N={n:6d}  RF {rf_time:8.3f}s rmse {rf_rmse:.4f}  exact {exact_note}", flush=True)
    return rows


# ---------------------------------------------------------------- 2. error vs D
def make_kernel(kind: str, num_features: int, seed: int):
    if kind == "decomposable":
        k = DecomposableFeatureKernel(num_features, num_tasks=4, rank=4, diagonal=False,
                                      seed=seed).to(DT)
        factor = torch.randn(4, 4, generator=torch.Generator().manual_seed(7), dtype=DT)
        factor = factor / torch.linalg.matrix_norm(factor @ factor.T, 2).sqrt()  # ||A||_2 = 1
        with torch.no_grad():
            k.task_factor.copy_(factor)
        return k
    if kind == "curl-free":
        return CurlFreeFeatureKernel(num_features, input_dim=4, seed=seed).to(DT)
    if kind == "div-free":
        return DivFreeFeatureKernel(num_features, input_dim=4, seed=seed).to(DT)
    k = HelmholtzFeatureKernel(num_features, input_dim=4, seed=seed).to(DT)
    k.curl_outputscale = k.div_outputscale = 0.5
    return k


def error_vs_d(sizes, seeds: int, num_points: int = 40):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(num_points, 4, generator=g, dtype=DT) * 2 - 1
    kinds = ["decomposable", "curl-free", "div-free", "Helmholtz"]
    results = {kind: {"spectral": [], "frobenius": []} for kind in kinds}
    for kind in kinds:
        exact_kernel = make_kernel(kind, sizes[0], 0).exact_kernel()
        with torch.no_grad():
            exact = exact_kernel(x).to_dense()
        exact_blocks = exact.reshape(num_points, 4, num_points, 4).transpose(1, 2)
        for num_features in sizes:
            spec, frob = [], []
            for seed in range(seeds):
                with torch.no_grad():
                    approx = make_kernel(kind, num_features, 100 + seed)(x).to_dense()
                blocks = approx.reshape(num_points, 4, num_points, 4).transpose(1, 2)
                spec.append(float(torch.linalg.matrix_norm(blocks - exact_blocks, 2).max()))
                frob.append(float(relative_frobenius_error(approx, exact)))
            results[kind]["spectral"].append(float(np.mean(spec)))
            results[kind]["frobenius"].append(float(np.mean(frob)))
        slope = np.polyfit(np.log(sizes), np.log(results[kind]["spectral"]), 1)[0]
        results[kind]["slope"] = float(slope)
        print(f"{kind:13s} errors {np.round(results[kind]['spectral'], 4)} slope {slope:.2f}",
              flush=True)
    return results


# ---------------------------------------------------------------- report
def write_report(timing, errors, sizes_d, args, elapsed, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    ns = [r["N"] for r in timing]
    axes[0].loglog(ns, [r["rf_time"] for r in timing], "o-",
                   label=f"curl-free ORFF, RandomFeatureGP (D={args.num_features})")
    ex = [r for r in timing if r["exact_time"] is not None]
    axes[0].loglog([r["N"] for r in ex], [r["exact_time"] for r in ex], "s-",
                   label="exact curl-free GP (dense Cholesky)")
    axes[0].set_xlabel("N (2-D inputs, 2 outputs each)")
    axes[0].set_ylabel("training time (s)")
    axes[0].set_title("training time vs N")
    axes[0].legend()
    for kind, res in errors.items():
        axes[1].loglog(sizes_d, res["spectral"], "o-", label=f"{kind} (slope {res['slope']:.2f})")
    axes[1].set_xlabel("D (feature columns)")
    axes[1].set_ylabel("max_{x,z} ||K_hat - K||_2")
    axes[1].set_title("kernel error vs D, d = p = 4, points in [-1, 1]^4")
    axes[1].legend()
    fig.savefig(os.path.join(out_dir, "vector_fields.png"), dpi=110)
    plt.close(fig)

    cmd = "python benchmarks/vector_fields.py" + (" --quick" if args.quick else "")
    lines = [
        "# Vector fields: operator-valued random features vs the exact operator-valued GP",
        "",
        f"Command: `{cmd}` (total {elapsed:.0f} s). Machine: {platform.machine()}, "
        f"{os.cpu_count()} CPU cores (a shared 2-core machine: timings are indicative), "
        f"torch {torch.__version__} (threads {torch.get_num_threads()}), float64. "
        f"Load average at the end of the run: {os.getloadavg()[0]:.1f} (other jobs share the "
        "cores, which inflates absolute times; the ratios at large N are the informative part; "
        "the ORFF time at small N is the D x D Cholesky of D = 1000).",
        "",
        "## Training time against N (curl-free kernel, five-Gaussian gradient field)",
        "",
        f"Random features: `RandomFeatureGP(ScaleKernel(CurlFreeFeatureKernel({args.num_features}"
        ")))`.fit (weight-space solve, chunked). Exact: the dense `(2N) x (2N)` Gram of "
        "`CurlFreeKernel` plus Cholesky and solve (run while `N <= "
        f"{args.exact_max}`). Same hyperparameters (lengthscale 0.35, noise variance 0.01); "
        "test RMSE against the noise-free field on 500 points.",
        "",
        "| N | ORFF fit (s) | exact fit (s) | exact / ORFF | ORFF test RMSE | exact test RMSE |",
        "|---|---|---|---|---|---|",
    ]
    for r in timing:
        if r["exact_time"] is None:
            lines.append(f"| {r['N']} | {r['rf_time']:.3f} | - | - | {r['rf_rmse']:.4f} | - |")
        else:
            lines.append(
                f"| {r['N']} | {r['rf_time']:.3f} | {r['exact_time']:.3f} | "
                f"{r['exact_time'] / r['rf_time']:.1f}x | {r['rf_rmse']:.4f} | "
                f"{r['exact_rmse']:.4f} |")
    lines += [
        "",
        "## Kernel approximation error against D (d = p = 4)",
        "",
        f"{args.points} points uniform in [-1, 1]^4, {args.seeds} seeds; lengthscale 1; "
        "decomposable: Gaussian k times a fixed full-rank A with ||A||_2 = 1; Helmholtz: "
        "outputscales 1/2 each (so every kernel has ||K(x, x)||_2 = 1). "
        "Error: mean over seeds of max over pairs of ||K_hat(x, z) - K(x, z)||_2; in "
        "brackets the relative Frobenius error of the (4N) x (4N) Gram matrix.",
        "",
        "| D | " + " | ".join(errors) + " |",
        "|---|" + "---|" * len(errors),
    ]
    for i, d in enumerate(sizes_d):
        cells = [f"{res['spectral'][i]:.4f} ({res['frobenius'][i]:.4f})"
                 for res in errors.values()]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    lines += [
        "| log-log slope | " + " | ".join(f"{res['slope']:.2f}" for res in errors.values())
        + " |",
        "",
        "All four converge at the Monte Carlo rate D^{-1/2} (slope about -0.5), with different "
        "constants (the curl- and div-free factors grow with ||omega||: heavier tails), as in "
        "Fig. 1 of the ORFF paper.",
        "",
        "![vector fields](vector_fields.png)",
        "",
    ]
    with open(os.path.join(out_dir, "vector_fields.md"), "w") as fh:
        fh.write("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a short run")
    parser.add_argument("--num-features", type=int, default=1000)
    parser.add_argument("--exact-max", type=int, default=None,
                        help="largest N for the exact GP (default 3000; quick: 1000)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--points", type=int, default=40)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs",
                                                      "benchmarks"))
    args = parser.parse_args()
    if args.quick:
        sizes_n = [100, 300, 1000, 3000, 10000]
        sizes_d = [24, 120, 480, 2400]
        args.exact_max = args.exact_max or 1000
        args.seeds = args.seeds or 2
    else:
        sizes_n = [100, 300, 1000, 3000, 10000, 30000, 100000]
        sizes_d = [24, 48, 120, 240, 480, 1200, 2400, 4800, 9600]
        args.exact_max = args.exact_max or 3000
        args.seeds = args.seeds or 5
    start = time.perf_counter()
    timing = time_vs_n(sizes_n, args.exact_max, args.num_features)
    errors = error_vs_d(sizes_d, args.seeds, args.points)
    write_report(timing, errors, sizes_d, args, time.perf_counter() - start, args.out)


if __name__ == "__main__":
    main()
