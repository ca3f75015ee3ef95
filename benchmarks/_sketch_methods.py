"""The measurements of the polynomial-sketch benchmark (benchmarks/polynomial_sketches.py): the
digits data, sketched Gram matrices against the exact kernel with the closed-form prediction of
their error (part 1), and the feature-construction and training timings (part 2).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time

import torch

from rfgp.kernels import DotProductKernel, PolynomialSketchKernel, apply_sketch
from rfgp.metrics import relative_frobenius_error
from rfgp.variance import sketch_variance

LENGTHSCALE, BIAS = math.sqrt(2.0), 0.5
PROJECTIONS = ["gaussian", "rademacher", "tensorsketch", "tensorsrht"]
MODES = ["real", "complex", "ctr"]


def load_digits_unit(centred: bool) -> torch.Tensor:
    from sklearn.datasets import load_digits

    x = torch.from_numpy(load_digits().data[:, 1:]).to(torch.float64)  # 63 pixels
    if centred:
        x = x - x.mean(0)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def sketch_gram(x, degree, size, projection, mode, seed):
    """K_hat (N x N) at real output size ``size``; complex for mode 'complex'."""
    if mode == "real":
        k = PolynomialSketchKernel(degree, size, bias=BIAS, projection=projection, seed=seed)
    else:
        k = PolynomialSketchKernel.ctr(degree, size, bias=BIAS, projection=projection, seed=seed)
    k = k.double()
    k.lengthscale = LENGTHSCALE
    k.bias = BIAS
    with torch.no_grad():
        if mode == "complex":
            phi = k.features(x)
            return phi @ phi.conj().T
        phi = k.real_features(x)
        return phi @ phi.T


def predicted_error(x, degree, size, projection, mode, exact_norm):
    """sqrt(sum_ij V(x_i, x_j)) / ||K||_F from the closed-form variances."""
    bias = torch.full((x.shape[0], 1), math.sqrt(BIAS), dtype=x.dtype)
    z = torch.cat([x / LENGTHSCALE, bias], dim=-1)  # the sketched (homogenised) inputs
    num = size if mode == "real" else size // 2
    total = 0.0
    for start in range(0, z.shape[0], 100):
        v = sketch_variance(z[start : start + 100, None, :], z[None, :, :], degree, num,
                            projection, complex=mode != "real", ctr=mode == "ctr")
        total += float(v.sum())
    return math.sqrt(total) / exact_norm


def run_errors(degrees, multiples, seeds, num_rows):
    d = 64
    results = {}  # (centred, degree, D, projection, mode) -> (errors list, predicted list)
    exact_kernel = {p: DotProductKernel("polynomial", degree=p, bias=BIAS).double()
                    for p in degrees}
    for k in exact_kernel.values():
        k.lengthscale = LENGTHSCALE
        k.bias = BIAS
    for centred in (False, True):
        data = load_digits_unit(centred)
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(1000 + seed)
            x = data[torch.randperm(data.shape[0], generator=gen)[:num_rows]]
            for degree in degrees:
                with torch.no_grad():
                    exact = exact_kernel[degree](x).to_dense()
                norm = float(exact.norm())
                for mult in multiples:
                    size = mult * d
                    for projection in PROJECTIONS:
                        for mode in MODES:
                            gram = sketch_gram(x, degree, size, projection, mode,
                                               seed=seed * 7919 + degree * 31 + mult)
                            err = float(relative_frobenius_error(gram, exact, real_part=False))
                            key = (centred, degree, size, projection, mode)
                            entry = results.setdefault(key, ([], []))
                            entry[0].append(err)
                            if seed == 0 and mode != "complex":  # costly: one subset
                                entry[1].append(predicted_error(x, degree, size, projection,
                                                                mode, norm))
            print(f"  errors: centred={centred} seed {seed + 1}/{seeds} done", flush=True)
    return results


def best_times(fns, repeats):
    """Minimum over ``repeats`` rounds, the methods timed in alternation within each round (the
    machine is shared: alternation spreads the other jobs' load over all methods alike)."""
    best = {key: math.inf for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - t)
    return best


def srht_stages(x, weights, degree):
    """Self time of each operation of the TensorSRHT plan (one profiled run, unbatched
    weights): stage-1 GEMMs (``bmm``), stage-2 GEMMs (``mm``), permutation gathers
    (``index_select``), products over degrees (``mul_``), transposed copies (``copy_``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        apply_sketch(x, weights, degree, "tensorsrht")
        total = time.perf_counter() - start
    stages = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    return stages, total


def run_timing(num_rows, repeats, full=True, slow=True):
    """Part 2 for the current thread count; ``full=False`` times only the methods the targets
    compare (compiled TensorSRHT and the dense sketch, real and CtR), ``slow=False`` leaves
    out TensorSketch and scikit-learn."""
    from sklearn.kernel_approximation import PolynomialCountSketch

    d_in, degree, size = 1023, 7, 5 * 1024
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_rows, d_in, generator=gen)
    x = x / x.norm(dim=-1, keepdim=True)
    fns, kernels = {}, {}
    projections = ("tensorsrht", "tensorsketch", "rademacher") if full and slow else (
        "tensorsrht", "rademacher")
    for projection in projections:
        for mode in ("real", "ctr"):
            if mode == "real":
                k = PolynomialSketchKernel(degree, size, bias=1.0, projection=projection, seed=0)
            else:
                k = PolynomialSketchKernel.ctr(degree, size, bias=1.0, projection=projection,
                                               seed=0)
            # draw the weights and compile (numba: once per dtype and array layout) outside
            # the timing, with and without autograd
            with torch.no_grad():
                k.real_features(x[:128])
            k.real_features(x[:128]).sum().backward()
            kernels[(projection, mode)] = k
            fns[(projection, mode)] = lambda k=k: k.real_features(x)
    # the sketches alone, on the homogenised input (no input validation, no lengthscale/bias)
    with torch.no_grad():
        z = kernels[("tensorsrht", "real")].homogenize(x)
    for projection in ("tensorsrht", "rademacher"):
        w = weights(kernels[(projection, "real")])
        fns[(projection, "apply")] = lambda w=w, p=projection: apply_sketch(z, w, degree, p)
    if full:
        # the same TensorSRHT calls through the GEMM path (what runs without numba or on a GPU)
        for key in (("tensorsrht", "real"), ("tensorsrht", "ctr"), ("tensorsrht", "apply")):
            fns[("tensorsrht-gemm", key[1])] = gemm_path(fns[key])
        if slow:
            xn = x.numpy()
            sk = PolynomialCountSketch(degree=degree, gamma=1.0, coef0=1.0, n_components=size,
                                       random_state=0).fit(xn)
            fns[("sklearn", "real")] = lambda: sk.transform(xn)
        a = torch.randn(num_rows, 1024, generator=gen)
        b = torch.randn(1024, degree * size, generator=gen)
        fns[("gemm", "real")] = lambda: a @ b
    with torch.no_grad():
        rows = best_times(fns, repeats)
        for key, value in rows.items():
            print(f"  timing {key}: {value:.3f} s", flush=True)
        if full:
            rows[("stages", "profiled")] = gemm_path(srht_stages)(
                z, weights(kernels[("tensorsrht", "real")]), degree)
    rows[("compiled", "available")] = compiled_available()
    rows.update(run_training_timing(x, kernels, repeats, full, slow))
    return rows


def run_training_timing(x, kernels, repeats, full=True, slow=True):
    """Training mode: features with autograd on (lengthscale and bias learnable), and
    features plus the backward pass of a fixed incoming gradient ``G`` (as from a loss
    ``sum(Phi * G)``) to the lengthscale and the bias."""
    gen = torch.Generator().manual_seed(1)
    grad = torch.randn(x.shape[0], 5120, generator=gen)
    cases = {"tensorsrht": ("tensorsrht", "real"), "tensorsrht-ctr": ("tensorsrht", "ctr"),
             "rademacher": ("rademacher", "real")}
    fns = {}
    for name, key in cases.items():
        k = kernels[key]

        def forward(k=k):
            return k.real_features(x)

        def forward_backward(k=k):
            k.zero_grad(set_to_none=True)
            k.real_features(x).backward(grad)

        fns[("train-forward", name)] = forward
        fns[("train-both", name)] = forward_backward
        if name.startswith("tensorsrht") and full and (slow or name == "tensorsrht"):
            fns[("train-forward", name + "-gemm")] = gemm_path(forward)
            fns[("train-both", name + "-gemm")] = gemm_path(forward_backward)
    rows = best_times(fns, repeats)
    for key, value in rows.items():
        print(f"  timing {key}: {value:.3f} s", flush=True)
    return rows


def weights(kernel):
    """A kernel's random weights by name (drawn already)."""
    return {name: getattr(kernel, name) for name in kernel.random_weight_names}


def compiled_available() -> bool:
    """Whether TensorSRHT takes the compiled kernels here: numba installed and not switched off
    by ``RFGP_DISABLE_NUMBA``."""
    disabled = os.environ.get("RFGP_DISABLE_NUMBA", "").strip() not in ("", "0")
    return importlib.util.find_spec("numba") is not None and not disabled


def gemm_path(fn):
    """``fn`` run with the compiled TensorSRHT kernel switched off (``RFGP_DISABLE_NUMBA=1``,
    read at every call)."""

    def run(*args):
        previous = os.environ.get("RFGP_DISABLE_NUMBA")
        os.environ["RFGP_DISABLE_NUMBA"] = "1"
        try:
            return fn(*args)
        finally:
            if previous is None:
                del os.environ["RFGP_DISABLE_NUMBA"]
            else:
                os.environ["RFGP_DISABLE_NUMBA"] = previous

    return run
