"""The measurements of the scaling benchmark (benchmarks/scaling.py) that run in a fresh process
each: the data, the fits of rfgp, its peers and the GEMM floor, and the precision variants.

``run_worker(spec)`` starts ``python benchmarks/scaling.py --worker SPEC``, which calls
:func:`worker` and prints its JSON result, so that the peak memory (``ru_maxrss``) belongs to
that one measurement.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve().parent / "scaling.py"
D_IN = 8
NUM_FEATURES = 1024
NUM_TEST = 10_000
NOISE = 0.1
LENGTHSCALE = 1.0
STREAM_CHUNK = 1 << 16
FLOOR_BLOCK = 1 << 18


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def synthetic_data(n: int, seed: int, dtype):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, D_IN, generator=g, dtype=dtype)
    y = torch.sin(x.sum(-1)) + 0.3 * torch.randn(n, generator=g, dtype=dtype)
    return x, y


def worker(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    if spec["method"] == "precision":
        return _precision_worker(spec)
    dtype = getattr(torch, spec["dtype"])
    n, method = spec["n"], spec["method"]
    xt, _ = synthetic_data(NUM_TEST, 1, dtype)
    # Warm-up on a small problem first (library loading, thread pools, first-call paths), so
    # the measured call is the steady state for every method alike.
    if method == "floor":
        small = torch.randn(2048, NUM_FEATURES, dtype=dtype)
        small.T @ small
        base = _rss_mb()
        z = torch.randn(min(n, FLOOR_BLOCK), NUM_FEATURES, dtype=dtype)
        elapsed, done = 0.0, 0
        while done < n:
            rows = min(FLOOR_BLOCK, n - done)
            block = z[:rows]
            t0 = time.perf_counter()
            block.T @ block
            elapsed += time.perf_counter() - t0
            done += rows
        return {"fit": elapsed, "predict": 0.0, "base_mb": base, "peak_mb": _rss_mb()}
    run = _rfgp if method == "rfgp_stream" else globals()["_" + method]
    xw, yw = synthetic_data(2048, 2, dtype)
    run(xw, yw, xt[:256], 2048, dtype)
    if method == "rfgp_stream":
        base = _rss_mb()
        fit, predict = _rfgp_stream(n, xt, dtype)
    else:
        x, y = synthetic_data(n, 0, dtype)
        base = _rss_mb()
        fit, predict = run(x, y, xt, n, dtype)
    out = {"fit": fit, "predict": predict, "base_mb": base, "peak_mb": _rss_mb()}
    if method in ("gpytorch_rff", "exact"):
        out["combined"] = True
    return out


def _rfgp(x, y, xt, n, dtype):
    from rfgp import RandomFeatureGP
    from rfgp.kernels import FourierFeatureKernel

    kernel = FourierFeatureKernel(NUM_FEATURES, seed=0).to(dtype)
    kernel.lengthscale = LENGTHSCALE
    gp = RandomFeatureGP(kernel, noise=NOISE)
    t0 = time.perf_counter()
    gp.fit(x, y)
    t1 = time.perf_counter()
    gp.predict(xt, return_std=True)
    return t1 - t0, time.perf_counter() - t1


def _sklearn(x, y, xt, n, dtype):
    import numpy as np
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.linear_model import Ridge

    xn, yn, xtn = x.numpy(), y.numpy(), xt.numpy()
    t0 = time.perf_counter()
    sampler = RBFSampler(gamma=1 / (2 * LENGTHSCALE**2), n_components=NUM_FEATURES, random_state=0)
    feats = sampler.fit_transform(xn)
    model = Ridge(alpha=NOISE, fit_intercept=False).fit(feats, yn)
    t1 = time.perf_counter()
    np.asarray(model.predict(sampler.transform(xtn)))
    return t1 - t0, time.perf_counter() - t1


def _gpytorch(x, y, xt, n, dtype, exact):
    import gpytorch
    import torch

    if exact:
        covar = gpytorch.kernels.RBFKernel()
    else:
        covar = gpytorch.kernels.RFFKernel(num_samples=NUM_FEATURES // 2, num_dims=D_IN)
    covar.lengthscale = LENGTHSCALE

    class Model(gpytorch.models.ExactGP):
        def __init__(self, likelihood):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = covar

        def forward(self, inp):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(inp), self.covar_module(inp)
            )

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = NOISE
    model = Model(likelihood).to(dtype)
    model.eval()
    # The exact GP uses Cholesky (as rfgp does): GPyTorch's default iterative solves need
    # many minutes for the 10^4 predictive variances at N = 10^4.
    cholesky_size = n + 1 if exact else gpytorch.settings.max_cholesky_size.value()
    t0 = time.perf_counter()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(cholesky_size):
        pred = model(xt)
        _ = (pred.mean, pred.variance)
    return time.perf_counter() - t0, 0.0


def _gpytorch_rff(x, y, xt, n, dtype):
    return _gpytorch(x, y, xt, n, dtype, exact=False)


def _exact(x, y, xt, n, dtype):
    return _gpytorch(x, y, xt, n, dtype, exact=True)


def _rfgp_stream(n, xt, dtype):
    from rfgp import RandomFeatureGP
    from rfgp.kernels import FourierFeatureKernel

    def batches():
        for index, start in enumerate(range(0, n, STREAM_CHUNK)):
            yield synthetic_data(min(STREAM_CHUNK, n - start), 1000 + index, dtype)

    kernel = FourierFeatureKernel(NUM_FEATURES, seed=0).to(dtype)
    kernel.lengthscale = LENGTHSCALE
    gp = RandomFeatureGP(kernel, noise=NOISE)
    t0 = time.perf_counter()
    gp.fit_stream(batches())
    t1 = time.perf_counter()
    gp.predict(xt, return_std=True)
    return t1 - t0, time.perf_counter() - t1


def run_worker(spec: dict, timeout: float, rfgp_path: str = str(ROOT)) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONPATH=rfgp_path,
               SCALING_RFGP_PATH=rfgp_path)
    cmd = [sys.executable, str(SCRIPT), "--worker", json.dumps(spec)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout > {timeout:.0f} s"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1][:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _precision_kernel(dtype):
    """D float32-drawn RFF weights (the same values in every variant), in ``dtype``."""
    import torch

    from rfgp.kernels import FourierFeatureKernel

    kernel = FourierFeatureKernel(NUM_FEATURES, seed=0)
    kernel.lengthscale = LENGTHSCALE
    kernel.features(torch.zeros(1, D_IN))
    return kernel.to(dtype)


def _precision_worker(spec: dict) -> dict:
    """Fit one variant on N float32-generated points; save the test predictions."""
    import torch

    from rfgp import RandomFeatureGP

    variant = spec["variant"]
    dtype = torch.float64 if variant == "float64" else torch.float32
    if variant == "floor":
        return _floor_time(spec["n"], getattr(torch, spec["dtype"]))
    options = {"statistics_dtype": torch.float64} if variant == "mixed" else {}
    xt = synthetic_data(NUM_TEST, 1, torch.float32)[0].to(dtype)
    xw, yw = synthetic_data(2048, 2, torch.float32)
    RandomFeatureGP(_precision_kernel(dtype), noise=NOISE, **options).fit(
        xw.to(dtype), yw.to(dtype)).predict(xt[:256])
    x, y = synthetic_data(spec["n"], 0, torch.float32)
    x, y = x.to(dtype), y.to(dtype)
    gp = RandomFeatureGP(_precision_kernel(dtype), noise=NOISE, solve="weight", **options)
    t0 = time.perf_counter()
    gp.fit(x, y)
    t1 = time.perf_counter()
    mean, std = gp.predict(xt, return_std=True)
    t2 = time.perf_counter()
    torch.save({"mean": mean, "std": std}, spec["out"])
    return {"fit": t1 - t0, "predict": t2 - t1, "peak_mb": _rss_mb()}


def _floor_time(n: int, dtype) -> dict:
    import torch

    small = torch.randn(2048, NUM_FEATURES, dtype=dtype)
    small.T @ small
    z = torch.randn(min(n, FLOOR_BLOCK), NUM_FEATURES, dtype=dtype)
    elapsed, done = 0.0, 0
    while done < n:
        block = z[: min(FLOOR_BLOCK, n - done)]
        t0 = time.perf_counter()
        block.T @ block
        elapsed += time.perf_counter() - t0
        done += block.shape[0]
    return {"fit": elapsed, "predict": 0.0, "peak_mb": _rss_mb()}
