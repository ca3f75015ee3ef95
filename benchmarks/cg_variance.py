"""Predictive variances of a ``solve="cg"`` fit: the low-rank form against one CG per query.

On a bundled UCI set (split 0 of ``benchmarks/regression_uci.py``: a random 90/10 split,
standardised), a ``D``-feature model with the lengthscales of the set's recorded recipe fit
(``docs/benchmarks/calibrated_features.jsonl``) and the outputscale factor and noise of its
own evidence (the ``exact`` record of ``docs/benchmarks/krylov_calibration.jsonl``) is fitted
three ways on the same features:

* ``auto``: ``solve="cg"`` with the default ``cg_variance="auto"`` (the low-rank form; where
  its bound exceeds the tolerance, per-query CG refinement or, where that would cost more, the
  Cholesky factor of ``B``: its route is recorded);
* ``lowrank``: ``cg_variance="lowrank"`` (the low-rank form, refined per query by CG
  preconditioned with it where its bound exceeds the tolerance; ``B`` never formed);
* ``exact``: the same fit's variances by one CG solve per query row, on the first
  ``--exact-rows`` test rows (its cost is linear in the rows: the same iterations per column);
* ``weight``: the Cholesky solve, the reference for the errors.

Cost is counted in column products with ``Phi^H S^-1 Phi`` (one pass over ``Phi`` and one over
``Phi^H`` for one vector), which do not depend on the machine's load; the seconds do.

Usage::

    python benchmarks/cg_variance.py --set pol --features 8192 --test-rows 1000

Records are appended to docs/benchmarks/cg_variance.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
from gpytorch.kernels import ScaleKernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calibrated_features import kernel_at, latest, load  # noqa: E402
from krylov_calibration import ProductCounter  # noqa: E402

from rfgp import RandomFeatureGP  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
RECORDS = OUT / "cg_variance.jsonl"


def _records(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_of(name: str, size: int) -> tuple:
    recipe = [r for r in latest(_records(OUT / "calibrated_features.jsonl"))
              if r.get("kind") == "recipe" and r["set"] == name][-1]
    scale = [r for r in _records(OUT / "krylov_calibration.jsonl")
             if r["set"] == name and r["method"] == "exact" and r["D"] == size][-1]
    return recipe, scale["factor"], scale["noise"]


def _nll(y, mean, var):
    return 0.5 * (torch.log(2 * math.pi * var) + (y - mean).square() / var)


def measure(name: str, size: int, test_rows: int, exact_rows: int) -> dict:
    xtr, ytr, xte, yte = load(name, 10**9)
    xte, yte = xte[:test_rows], yte[:test_rows]
    recipe, factor, noise = model_of(name, size)

    def kernel():
        k = kernel_at(recipe, size, xtr.shape[1])
        for part in k.modules():  # the factor multiplies every component's outputscale
            if isinstance(part, ScaleKernel):
                part.outputscale = part.outputscale * factor
        return k

    record = {"set": name, "D": size, "rows": xtr.shape[0], "test_rows": xte.shape[0],
              "noise": noise, "factor": factor, "threads": torch.get_num_threads(),
              "machine": platform.machine()}
    gp = RandomFeatureGP(kernel(), noise=noise, solve="cg")
    with ProductCounter() as count:
        started = time.perf_counter()
        gp.fit(xtr, ytr)
    record.update(fit_products=count.columns, fit_seconds=time.perf_counter() - started,
                  cg_info=gp.cg_info)
    with ProductCounter() as count:
        started = time.perf_counter()
        mean_a, std_a = gp.predict(xte, return_std=True)
    record.update(auto_products=count.columns, auto_seconds=time.perf_counter() - started,
                  auto_routes=gp.cg_info["variance_routes"])
    gp._state.solver.forget_variances()
    gp.cg_settings.variance = "lowrank"
    with ProductCounter() as count:
        started = time.perf_counter()
        mean, std = gp.predict(xte, return_std=True)
    inverse = gp._state.solver.low_rank_inverses()[0]
    record.update(lowrank_products=count.columns, lowrank_seconds=time.perf_counter() - started,
                  lowrank_rank=inverse.rank, lowrank_bound=inverse.bound,
                  lowrank_build_products=inverse.products,
                  tolerance=gp.cg_settings.variance_tolerance,
                  refined=inverse.bound > gp.cg_settings.variance_tolerance)
    gp.cg_settings.variance = "exact"
    with ProductCounter() as count:
        started = time.perf_counter()
        std_exact = gp.predict(xte[:exact_rows], return_std=True)[1]
    record.update(exact_rows=exact_rows, exact_products=count.columns,
                  exact_seconds=time.perf_counter() - started)
    started = time.perf_counter()
    weight = RandomFeatureGP(kernel(), noise=noise, solve="weight").fit(xtr, ytr)
    mean_w, std_w = weight.predict(xte, return_std=True)
    record["weight_seconds"] = time.perf_counter() - started
    var, var_w, var_e = std.square(), std_w.square(), std_exact.square()
    relative = (var - var_w) / var_w
    relative_a = (std_a.square() - var_w) / var_w
    record.update(
        auto_relative_max=float(relative_a.abs().max()),
        mnll_auto=float(_nll(yte, mean_a, std_a.square() + noise).mean()),
        lowrank_relative_max=float(relative.max()), lowrank_relative_min=float(relative.min()),
        lowrank_relative_mean=float(relative.mean()),
        exact_relative_max=float(((var_e - var_w[:exact_rows]) / var_w[:exact_rows]).abs().max()),
        mnll_lowrank=float(_nll(yte, mean, var + noise).mean()),
        mnll_weight=float(_nll(yte, mean_w, var_w + noise).mean()),
    )
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="pol")
    parser.add_argument("--features", type=int, default=8192)
    parser.add_argument("--test-rows", type=int, default=1000)
    parser.add_argument("--exact-rows", type=int, default=100)
    args = parser.parse_args()
    record = measure(args.set, args.features, args.test_rows, args.exact_rows)
    print(json.dumps(record))
    with RECORDS.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
