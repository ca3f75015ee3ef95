"""Random Fourier features: approximation error and speed of iid, orthogonal, structured sampling.

Three questions, each answered side by side in one run:

1. Kernel-approximation MSE against ``D / d`` (1..10 frequencies per input dimension) for iid
   (RFF), orthogonal (ORF) and structured (SORF) sampling of the RBF kernel, on a bundled UCI set
   (wine-quality-red, d = 11) and on scikit-learn's bundled digits (d = 64). The lengthscale is
   the mean distance to the 50th nearest neighbour (Yu et al. 2016). Reported as MSE and as the
   ratio to iid.
2. Feature-construction time against d (64..4096) at fixed N and D for ORF, SORF and
   ``gpytorch.kernels.RFFKernel`` (plus the time to draw the random weights).
3. One ExactGP training step (marginal likelihood, backward, Adam) at N = 10^5 with rfgp's
   ``FourierFeatureKernel`` against ``gpytorch.kernels.RFFKernel`` at equal D.

Usage::

    python benchmarks/fourier_features.py            # full run (a few minutes)
    python benchmarks/fourier_features.py --quick    # smaller sizes, for a smoke test

Writes ``docs/benchmarks/fourier_features.md`` and ``docs/benchmarks/fourier_features.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import gpytorch
import numpy as np
import torch
from _fourier_report import ERROR_METHODS, write_markdown, write_plot
from _harness import timed

from rfgp.datasets import load_uci, standardize
from rfgp.kernels import FourierFeatureKernel

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "docs" / "benchmarks"


# ---------------------------------------------------------------- 1. approximation error
def nearest_neighbour_lengthscale(x: torch.Tensor, k: int = 50, num_queries: int = 1000,
                                  seed: int = 0) -> float:
    """Mean distance to the k-th nearest neighbour over (at most) ``num_queries`` sampled points."""
    gen = torch.Generator().manual_seed(seed)
    queries = x[torch.randperm(len(x), generator=gen)[:num_queries]]
    dist = torch.cdist(queries, x)
    # Column 0 of the sorted distances is the point itself.
    return dist.sort(dim=-1).values[:, k].mean().item()


def load_sets():
    from sklearn.datasets import load_digits

    x_wine, _ = load_uci("wine-quality-red")
    x_wine = standardize(x_wine)[0]
    x_digits = torch.from_numpy(load_digits().data).double() / 16.0
    return {"wine-quality-red (UCI)": x_wine, "digits (sklearn)": x_digits}


def approximation_error(x, ratios, num_points, num_seeds):
    lengthscale = nearest_neighbour_lengthscale(x)
    gen = torch.Generator().manual_seed(1)
    sub = x[torch.randperm(len(x), generator=gen)[:num_points]]
    d = x.shape[-1]
    dist = torch.cdist(sub, sub)
    exact = torch.exp(-dist.pow(2) / (2 * lengthscale**2))
    off_diagonal = ~torch.eye(len(sub), dtype=torch.bool)
    z = (dist / lengthscale)[off_diagonal]
    results = {s: np.zeros((len(ratios), num_seeds)) for s in ERROR_METHODS}
    with torch.no_grad():
        for i, ratio in enumerate(ratios):
            for method, options in ERROR_METHODS.items():
                for seed in range(num_seeds):
                    kernel = FourierFeatureKernel(2 * ratio * d, **options,
                                                  seed=1000 * seed + ratio).double()
                    kernel.lengthscale = torch.tensor(lengthscale, dtype=torch.float64)
                    phi = kernel.features(sub)
                    err = (phi @ phi.T - exact)[off_diagonal].pow(2).mean().item()
                    results[method][i, seed] = err
    return d, lengthscale, z, results


# ---------------------------------------------------------------- timing helpers
def median_time(fn, repeats: int) -> float:
    fn()
    return float(np.median([timed(fn)[1] for _ in range(repeats)]))


# ---------------------------------------------------------------- 2. feature construction
def feature_timing(dims, num_points, num_frequencies, repeats):
    rows = []
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for d in dims:
            x = torch.randn(num_points, d, generator=gen)
            row = {"d": d}
            for name in ("orthogonal", "structured", "structured-fwht"):
                sampling = "structured" if name.startswith("structured") else name
                kernel = FourierFeatureKernel(2 * num_frequencies, sampling=sampling,
                                              input_dim=d)
                if name == "structured-fwht":
                    kernel.structured_dense_max_dim = 0
                row[f"draw {name}"] = median_time(
                    partial(kernel.resample, torch.Generator().manual_seed(1)), 1)
                row[name] = median_time(partial(kernel.features, x), repeats)
                row[f"proj {name}"] = median_time(partial(kernel.projections, x), repeats)
            rff = gpytorch.kernels.RFFKernel(num_samples=num_frequencies)
            rff(x[:2]).to_dense()  # draws the weights
            row["draw gpytorch"] = median_time(partial(rff._init_weights, d, num_frequencies), 1)
            row["gpytorch"] = median_time(partial(gpytorch_root, rff, x), repeats)
            row["proj gpytorch"] = median_time(partial(gpytorch_projection, rff, x), repeats)
            rows.append(row)
            print(f"  d={d:5d}  " + "  ".join(f"{k}={v * 1e3:.1f}ms" for k, v in row.items()
                                              if k != "d"), flush=True)
    return rows


def gpytorch_root(kernel, x):
    return kernel(x).evaluate_kernel().root


def gpytorch_projection(kernel, x):
    # The projection inside RFFKernel._featurize, without the cos/sin.
    return x @ (kernel.randn_weights / kernel.lengthscale.transpose(-1, -2))


# ---------------------------------------------------------------- 3. ExactGP training step
class GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def adam_step(model, mll, optimizer, x, y, losses):
    optimizer.zero_grad()
    loss = -mll(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())


def training_step_timing(num_points, num_frequencies, input_dim, repeats):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, input_dim, generator=gen) * 2 - 1
    y = torch.sin(3 * x).sum(-1) + 0.1 * torch.randn(num_points, generator=gen)
    kernels = {
        "rfgp FourierFeatureKernel (iid)": FourierFeatureKernel(2 * num_frequencies, seed=0),
        "rfgp FourierFeatureKernel (structured)": FourierFeatureKernel(
            2 * num_frequencies, sampling="structured", seed=0),
        "gpytorch RFFKernel": gpytorch.kernels.RFFKernel(num_samples=num_frequencies),
    }
    steps, losses, times = {}, {}, {name: [] for name in kernels}
    for name, kernel in kernels.items():
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = GP(x, y, likelihood, kernel)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        model.train()
        likelihood.train()
        losses[name] = []
        steps[name] = partial(adam_step, model, mll, optimizer, x, y, losses[name])
    # Round-robin over the models (the first round is a warm-up), so that a change in the load
    # of the shared machine hits every model alike.
    for round_index in range(repeats + 1):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if round_index > 0:
                times[name].append(time.perf_counter() - start)
    results = {}
    for name in kernels:
        results[name] = (float(np.median(times[name])), losses[name][-1])
        print(f"  {name}: {results[name][0]:.3f} s/step (loss {results[name][1]:.4f})",
              flush=True)
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--output-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.quick:
        ratios, num_points, num_seeds = [1, 2, 4], 200, 3
        dims, feat_n, feat_m, feat_repeats = [64, 256, 1024], 256, 1024, 2
        gp_n, gp_m, gp_repeats = 5000, 128, 2
    else:
        ratios, num_points, num_seeds = list(range(1, 11)), 500, 10
        dims, feat_n, feat_m, feat_repeats = [64, 128, 256, 512, 1024, 2048, 4096], 1024, 4096, 3
        gp_n, gp_m, gp_repeats = 100_000, 256, 4
    started = time.time()

    print("1. kernel approximation error", flush=True)
    mse = {}
    for name, x in load_sets().items():
        mse[name] = approximation_error(x, ratios, num_points, num_seeds)
        print(f"  {name}: d = {mse[name][0]}, lengthscale {mse[name][1]:.3f}", flush=True)
    print("2. feature construction time", flush=True)
    feat = feature_timing(dims, feat_n, feat_m, feat_repeats)
    print("3. ExactGP training step", flush=True)
    gp_d = 8
    steps = training_step_timing(gp_n, gp_m, gp_d, gp_repeats)
    elapsed = time.time() - started

    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_plot(args.output_dir / "fourier_features.png", ratios, mse, feat)
    write_markdown(args.output_dir / "fourier_features.md", args, ratios, num_points, num_seeds,
                   mse, feat, feat_n, feat_m, steps, gp_n, gp_m, gp_d, elapsed)
    print(f"wrote {args.output_dir / 'fourier_features.md'} ({elapsed:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
