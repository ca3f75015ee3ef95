"""Large-D calibration: the Krylov calibration against the root search it replaces.

For a ``D``-feature model with fixed lengthscales, the outputscale and noise that maximise its
own evidence, found three ways on the same features:

* ``exact``: the weight-space maximum (one eigendecomposition of the ``D x D`` Gram matrix,
  ``rfgp.inference._calibration``), where ``D <= 8192``;
* ``search``: the per-evaluation root search the Krylov calibration replaced (a preconditioned
  CG solve over the targets and probes at every evaluation; ``calibrate_by_products`` of
  ``rfgp/inference/_iterative_calibration.py``, removed since): its records are kept and
  shown, but it is no longer run;
* ``krylov``: ``rfgp.inference._krylov_calibration`` (one Galerkin subspace of CG runs serves
  every ``c``);
* ``rows``: the same on products with the rows' ``G = Phi Phi^T`` (``N x N``, formed once;
  ``calibrate_by_rows``), where ``D`` exceeds the rows: its products are of ``N x N`` and
  counted apart (``N^2`` multiply-adds a column, against ``2 N D`` for the others).

Both iterative methods start where the recipe starts them: at the weight-space calibration of
the same lengthscales with 2048 features. The cost is counted in column products with
``G = Phi^T Phi`` (one pass over ``Phi`` and one over ``Phi^T`` for one vector), which do not
depend on the machine's load; the seconds do.

Data: a bundled UCI set (random 90/10 split with seed 0, standardised: split 0 of
``benchmarks/regression_uci.py``); lengthscales: the last recipe fit recorded for the set in
``docs/benchmarks/calibrated_features.jsonl`` (its Laplace draws).

Usage::

    python benchmarks/krylov_calibration.py --sets pol --sizes 8192 16384
    python benchmarks/krylov_calibration.py --page-only

Records are appended to docs/benchmarks/krylov_calibration.jsonl; the page
docs/benchmarks/krylov_calibration.md is written from them.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calibrated_features import kernel_at, latest, load  # noqa: E402

from rfgp._units import NOISE_FLOOR  # noqa: E402
from rfgp.inference._calibration import (  # noqa: E402
    feature_model_evidence,
    maximize_scale_evidence,
)
from rfgp.inference._cg_solver import FeatureOperator  # noqa: E402
from rfgp.inference._krylov_features import (  # noqa: E402
    calibrate_by_krylov,
    calibrate_by_rows,
)

OUT = ROOT / "docs" / "benchmarks"
RECORDS = OUT / "krylov_calibration.jsonl"
MODELS = OUT / "calibrated_features.jsonl"
CONDITION = 1e-10
START_FEATURES = 2048


class ProductCounter:
    """Counts the columns of every product with ``G`` (``FeatureOperator.gram``)."""

    def __init__(self) -> None:
        self.columns = 0
        self._gram = FeatureOperator.gram

    def __enter__(self) -> ProductCounter:
        counter = self

        def gram(op, v, columns):
            counter.columns += int(v.shape[1])
            return counter._gram(op, v, columns)

        FeatureOperator.gram = gram
        return self

    def __exit__(self, *exc) -> None:
        FeatureOperator.gram = self._gram


def recipe_model(name: str) -> dict:
    models = [r for r in latest([json.loads(line) for line in MODELS.read_text().splitlines()
                                 if line.strip()])
              if r.get("kind") == "recipe" and r["set"] == name]
    if not models:
        raise SystemExit(f"no recipe model recorded for {name} in {MODELS}")
    return models[-1]


def measure(name: str, sizes: list, rows: int, seed: int) -> list:
    xtr, ytr, _, _ = load(name, rows)
    model = recipe_model(name)
    floor = NOISE_FLOOR * float(ytr.square().mean())
    start_kernel = kernel_at(model, START_FEATURES, xtr.shape[1])
    start = feature_model_evidence(start_kernel, xtr, ytr)
    factor, noise, _ = maximize_scale_evidence(start, model["noise"], floor,
                                               condition=CONDITION)
    records = []
    for size in sizes:
        kernel = kernel_at(model, size, xtr.shape[1])
        common = {"set": name, "D": size, "rows": xtr.shape[0], "start_noise": noise,
                  "start_factor": factor, "threads": torch.get_num_threads(),
                  "machine": platform.machine()}
        cache = xtr.shape[0] * size * 8
        with ProductCounter() as counter:
            started = time.perf_counter()
            out = calibrate_by_krylov(kernel, xtr, ytr, noise, factor=factor,
                                      noise_floor=floor, condition=CONDITION, cache_bytes=cache,
                                      generator=torch.Generator().manual_seed(seed))
            seconds = time.perf_counter() - started
        # The trace estimate that places the start is counted with the sketch.
        records.append({**common, "method": "krylov", "noise": out.noise,
                        "factor": out.factor, "log_evidence": out.log_evidence,
                        "standard_error": out.standard_error, "rank": out.rank,
                        "iterations": out.iterations, "products": counter.columns,
                        "seconds": seconds,
                        "sketch_products": out.products["sketch"] + out.products.get("trace", 0),
                        "run_products": out.products["runs"], "run_scales": out.run_scales})
        print(json.dumps(records[-1]), flush=True)
        if size > xtr.shape[0]:
            started = time.perf_counter()
            out, gram = calibrate_by_rows(kernel, xtr, ytr, noise, factor=factor,
                                          noise_floor=floor, condition=CONDITION,
                                          cache_bytes=cache,
                                          generator=torch.Generator().manual_seed(seed))
            seconds = time.perf_counter() - started
            del gram
            records.append({**common, "method": "rows", "noise": out.noise,
                            "factor": out.factor, "log_evidence": out.log_evidence,
                            "standard_error": out.standard_error, "rank": out.rank,
                            "iterations": out.iterations,
                            "products": sum(out.products.values()), "seconds": seconds,
                            "sketch_products": out.products["sketch"]
                            + out.products.get("trace", 0),
                            "run_products": out.products["runs"], "run_scales": out.run_scales})
            print(json.dumps(records[-1]), flush=True)
        if size <= 8192:
            started = time.perf_counter()
            evidence = feature_model_evidence(kernel, xtr, ytr)
            exact_factor, exact_noise, loss = maximize_scale_evidence(
                evidence, noise, floor, factor_start=factor, condition=CONDITION)
            records.append({**common, "method": "exact", "noise": exact_noise,
                            "factor": exact_factor, "log_evidence": -loss / ytr.numel(),
                            "seconds": time.perf_counter() - started})
            print(json.dumps(records[-1]), flush=True)
    return records


def write_page(records: list) -> None:
    kept = {}
    for r in records:
        kept[(r["set"], r.get("rows", 0), r["D"], r["method"])] = r
    lines = [
        "# Large-D calibration: one Krylov space for every scale",
        "",
        "The outputscale and noise of a `D`-feature model by its own evidence "
        "(`benchmarks/krylov_calibration.py`): the Krylov calibration against the root search "
        "it replaces and, up to 8,192 features, the exact weight-space maximum. Cost in column "
        "products with `G = Phi^T Phi` (independent of the machine's load); seconds were "
        "measured on a shared two-core machine with other jobs running, so they are only "
        "indicative. Both iterative methods start at the 2,048-feature weight-space "
        "calibration, as the recipe starts them.",
        "",
        "| set | rows | D | method | products (sketch + runs) | CG iterations | rank | noise "
        "| log evidence per datum (± s.e.) | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, rows, size, method), r in sorted(kept.items()):
        if method in ("krylov", "rows"):
            products = f"{r['products']} ({r['sketch_products']} + {r['run_products']})"
        else:
            products = str(r.get("products", "—"))
        evidence = f"{r['log_evidence']:.5f}"
        if r.get("standard_error") is not None:
            evidence += f" ± {r['standard_error']:.1e}"
        lines.append(
            f"| {name} | {rows} | {size} | {method} | {products} | {r.get('iterations', '—')} "
            f"| {r.get('rank', '—')} | {r['noise']:.5g} | {evidence} | {r['seconds']:.0f} |")
    lines += [
        "",
        "Reading: the products are dominated by the Nyström sketch (which the CG fit then "
        "reuses) and by the runs over the target and 8 probe columns. The root search "
        "sizes its sketch for the solves of about 8 evaluations and so grows it further; "
        "the Krylov calibration runs once at its start and, where the root lies farther "
        "than a factor 1.1, once or twice more (the later runs warm-started). Each run "
        "solves the targets to 1e-8 and the probes to 1e-2 (their log-determinant's "
        "quadrature converges about twice as fast as the residual): the pol row at 8,192 "
        "features spends 336 products in three runs (74, 37 and 29 target iterations; 947 "
        "in two runs with the probes at 1e-5 before). The noise is compared with the "
        "exact maximum where the `D x D` path can compute it; the root search was not run "
        "beyond 8,192 features (at 8,192 it already took the longest of the three). The "
        "seconds of the 8,192 row (one thread) and of the others (two) were measured on "
        "the loaded machine: upper bounds. The `rows` method (with more features than "
        "rows) runs the same calibration on products with `G = Phi Phi^T`, `N x N`: its "
        "products cost `N^2` multiply-adds a column where the others' cost `2 N D`, and its "
        "seconds include forming `G` (`N^2 D / 2`); its rows ran on the otherwise idle "
        "machine, two threads, each beside a `krylov` row of the same features. On pol's "
        "first 5,400 training rows at 8,192 features both reach the exact maximum (noise "
        "0.006418 by the rows, 0.006429 by the features, 0.006446 exact; log evidence "
        "within 1.1 and 0.6 of their standard errors); on all 13,500 rows the rows' "
        "calibration took 50 s against 53 s at 16,384 features and 76 s against 114 s at "
        "32,768, the two noises within 0.4% of each other and the log evidences within "
        "their combined standard error. The fit that follows gains more: through the rows "
        "it is one Cholesky factor of the `G` already formed, which also serves the "
        "variances, where the features' route runs a CG solve and forms the rows' matrix "
        "again for the variances.",
    ]
    (OUT / "krylov_calibration.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["pol"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[8192, 16384])
    parser.add_argument("--rows", type=int, default=10**9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--page-only", action="store_true")
    args = parser.parse_args()
    if not args.page_only:
        for name in args.sets:
            with RECORDS.open("a") as handle:
                for record in measure(name, args.sizes, args.rows, args.seed):
                    handle.write(json.dumps(record) + "\n")
    records = [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]
    write_page(records)


if __name__ == "__main__":
    main()
