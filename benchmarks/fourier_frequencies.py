"""Frequency schemes of random Fourier features judged by the GP posterior they give.

At equal D, which frequencies bring the random-feature GP closest to the exact GP? Schemes of
``FourierFeatureKernel(sampling=...)``: ``iid`` (Rahimi–Recht), ``orthogonal`` (ORF blocks),
``qmc`` (scrambled Sobol points through the Gaussian inverse CDF for the direction and the
inverse CDF of the radial law for the norm) and ``qmc_orthogonal`` (ORF directions, stratified
Sobol radii).

Per bundled set (training rows capped so that the exact posterior is cheap), one random split
with inputs and targets standardised by the training rows: the exact GP's hyperparameters (ARD
RBF lengthscales, outputscale, noise, constant mean) by L-BFGS on the exact evidence
(``benchmarks/_exact_gp.py``); then, with exactly those hyperparameters, the exact posterior and
the random-feature posterior (``k_hat = s Phi Phi^T``) for each scheme, D and seed. Scores on the
held-out rows, both about the predictive distribution of ``y`` (noise included):

* MNLL gap: the random-feature GP's test MNLL minus the exact GP's (0 is the exact GP);
* KL: ``KL(exact || random features)`` between the joint Gaussian predictive distributions of
  the held-out targets (all of them jointly, in nats; 0 is the exact GP).

The Gram error is not scored: it is known not to predict the quality of the GP.

Records go to ``docs/benchmarks/fourier_frequencies.jsonl`` (one per set, scheme, D, seed, and
one per set with its hyperparameters), so a run cut short resumes; the page is written from
them.

Usage::

    python benchmarks/fourier_frequencies.py            # every set, D = 256, 1024, 4096
    python benchmarks/fourier_frequencies.py --quick    # concrete, D = 256, 2 seeds, temp dir
    python benchmarks/fourier_frequencies.py --page-only

Writes ``docs/benchmarks/fourier_frequencies.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _exact_gp import ExactHyperparameters, fit_hyperparameters, rbf_ard  # noqa: E402
from _pages import write_page  # noqa: E402

from rfgp.datasets import load_uci, standardize  # noqa: E402
from rfgp.kernels import FourierFeatureKernel  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"
SCHEMES = ["iid", "orthogonal", "qmc", "qmc_orthogonal"]
#: set -> the most training rows used (the exact posterior is an n x n Cholesky).
SETS = {"concrete": 3000, "energy": 3000, "power-plant": 3000, "elevators": 3000, "pol": 3000}
FEATURES = [256, 1024, 4096]
#: Held-out rows: a fifth of the set, at most this many.
TEST_ROWS = 500


# ====================================================================== data and posteriors
def split(name: str, max_train: int, seed: int = 0):
    """One random split: at most ``TEST_ROWS`` (a fifth of the set) held-out rows and at most
    ``max_train`` training rows, standardised with the training statistics."""
    x, y = load_uci(name)
    n = x.shape[0]
    n_test = min(TEST_ROWS, n // 5)
    n_train = min(max_train, n - n_test)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    train, test = order[:n_train], order[n_train:n_train + n_test]
    xtr, xte, _, _ = standardize(x[train], x[test])
    ytr, yte, _, _ = standardize(y[train], y[test])
    return xtr.double(), ytr.double(), xte.double(), yte.double()


def predictive(k_train, k_cross, k_test, residual, noise):
    """Joint predictive distribution of the test targets for a GP with prior covariances
    ``k_train`` ``(n, n)``, ``k_cross`` ``(n, m)``, ``k_test`` ``(m, m)`` and Gaussian noise:
    ``(mean (m,) without the constant, covariance (m, m))``."""
    n, m = k_cross.shape
    chol = torch.linalg.cholesky(k_train + noise * torch.eye(n, dtype=k_train.dtype))
    alpha = torch.cholesky_solve(residual.unsqueeze(-1), chol).squeeze(-1)
    v = torch.linalg.solve_triangular(chol, k_cross, upper=False)  # [n, m]
    cov = k_test - v.T @ v + noise * torch.eye(m, dtype=k_train.dtype)
    return k_cross.T @ alpha, 0.5 * (cov + cov.T)


def gaussian_kl(mean_p, cov_p, mean_q, cov_q) -> float:
    """``KL(N(mean_p, cov_p) || N(mean_q, cov_q))`` in nats."""
    chol_q = torch.linalg.cholesky(cov_q)
    chol_p = torch.linalg.cholesky(cov_p)
    m = mean_p.shape[0]
    trace = torch.cholesky_solve(cov_p, chol_q).diagonal().sum()
    diff = (mean_q - mean_p).unsqueeze(-1)
    quad = (torch.linalg.solve_triangular(chol_q, diff, upper=False) ** 2).sum()
    logdet = 2 * (chol_q.diagonal().log().sum() - chol_p.diagonal().log().sum())
    return float(0.5 * (trace + quad - m + logdet))


def mnll(y, mean, var) -> float:
    return float((0.5 * torch.log(2 * math.pi * var) + 0.5 * (y - mean) ** 2 / var).mean())


def rmse(y, mean) -> float:
    return float(((y - mean) ** 2).mean().sqrt())


def exact_predictive(xtr, ytr, xte, hyper: ExactHyperparameters):
    ls = torch.from_numpy(np.asarray(hyper.lengthscale, dtype=np.float64))
    s = hyper.outputscale
    mean, cov = predictive(rbf_ard(xtr, xtr, ls, s), rbf_ard(xtr, xte, ls, s),
                           rbf_ard(xte, xte, ls, s), ytr - hyper.mean, hyper.noise)
    return mean + hyper.mean, cov


def feature_predictive(xtr, ytr, xte, hyper: ExactHyperparameters, scheme: str,
                       num_features: int, seed: int):
    kernel = FourierFeatureKernel(num_features, sampling=scheme, ard_num_dims=xtr.shape[1],
                                  seed=seed).double()
    kernel.lengthscale = torch.as_tensor(hyper.lengthscale, dtype=torch.float64)
    with torch.no_grad():
        phi_train, phi_test = kernel.features(xtr), kernel.features(xte)  # [n, D], [m, D]
    s = hyper.outputscale
    mean, cov = predictive(s * phi_train @ phi_train.T, s * phi_train @ phi_test.T,
                           s * phi_test @ phi_test.T, ytr - hyper.mean, hyper.noise)
    return mean + hyper.mean, cov


# ====================================================================== driver
def load_rows(path: Path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append(path: Path, row: dict) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(row, default=float) + "\n")


def run(args, records: Path) -> None:
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    rows = load_rows(records)
    done = {(r["set"], r["scheme"], r["D"], r["seed"]) for r in rows if r.get("kind") == "fit"}
    for name in args.sets:
        xtr, ytr, xte, yte = split(name, SETS.get(name, 3000))
        stored = [r for r in rows if r.get("kind") == "hyper" and r["set"] == name]
        if stored:
            h = stored[-1]
            hyper = ExactHyperparameters(np.array(h["lengthscale"]), h["outputscale"],
                                         h["noise"], h["mean"])
        else:
            start = time.perf_counter()
            hyper = fit_hyperparameters(xtr, ytr, max_rows=xtr.shape[0], start_rows=1000)
            append(records, {"kind": "hyper", "set": name, "n_train": xtr.shape[0],
                             "n_test": xte.shape[0], "d": xtr.shape[1],
                             "lengthscale": [float(v) for v in hyper.lengthscale],
                             "outputscale": hyper.outputscale, "noise": hyper.noise,
                             "mean": hyper.mean, "seconds": time.perf_counter() - start,
                             "nll_per_datum": hyper.info["nll_per_datum"],
                             "projected_gradient": hyper.info["projected_gradient"]})
            print(f"{name}: hyperparameters in {time.perf_counter() - start:.1f} s, noise "
                  f"{hyper.noise:.3g}", flush=True)
        mean_e, cov_e = exact_predictive(xtr, ytr, xte, hyper)
        var_e = cov_e.diagonal()
        exact_mnll, exact_rmse = mnll(yte, mean_e, var_e), rmse(yte, mean_e)
        for num_features in args.features:
            for scheme in args.schemes:
                for seed in range(args.seeds):
                    if (name, scheme, num_features, seed) in done:
                        continue
                    mean_f, cov_f = feature_predictive(xtr, ytr, xte, hyper, scheme,
                                                       num_features, seed)
                    row = {"kind": "fit", "set": name, "scheme": scheme, "D": num_features,
                           "seed": seed, "n_train": xtr.shape[0], "n_test": xte.shape[0],
                           "d": xtr.shape[1], "exact_mnll": exact_mnll, "exact_rmse": exact_rmse,
                           "mnll_gap": mnll(yte, mean_f, cov_f.diagonal()) - exact_mnll,
                           "rmse_gap": rmse(yte, mean_f) - exact_rmse,
                           "kl": gaussian_kl(mean_e, cov_e, mean_f, cov_f)}
                    append(records, row)
                    print(f"{name:12s} D {num_features:5d} {scheme:15s} seed {seed} "
                          f"MNLL gap {row['mnll_gap']:+.4f} KL {row['kl']:9.3f}", flush=True)


# ====================================================================== page
def _fmt(values, digits=3):
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.{digits}f} ± {values.std():.{digits}f}"


def write_markdown(rows, path: Path) -> None:
    fits = [r for r in rows if r.get("kind") == "fit"]
    hypers = {r["set"]: r for r in rows if r.get("kind") == "hyper"}
    sets = list(dict.fromkeys(r["set"] for r in fits))
    schemes = [s for s in SCHEMES if any(r["scheme"] == s for r in fits)]
    features = sorted({r["D"] for r in fits})

    def cell(name, scheme, num_features, key):
        return [r[key] for r in fits if (r["set"], r["scheme"], r["D"]) ==
                (name, scheme, num_features)]

    out = ["# Fourier frequency schemes: the posterior against the exact GP's", "",
           "Each set: one random split (at most 500 held-out rows, a fifth of the set; at most "
           "3,000 training rows), inputs and targets standardised by the training rows. The "
           "exact GP's hyperparameters (ARD RBF, L-BFGS on the exact evidence, "
           "`benchmarks/_exact_gp.py`) are used by every model, so the tables measure the "
           "feature approximation alone. MNLL gap: the random-feature GP's test MNLL (of y) "
           "minus the exact GP's. KL: KL(exact || random features) between the joint "
           "predictive distributions of all held-out targets, in nats. Entries: mean ± standard "
           "deviation over the seeds (the random frequencies); **bold**: the lowest mean in the "
           "row.", "",
           f"Records of `python benchmarks/fourier_frequencies.py` "
           f"({platform.processor() or platform.machine()}, Python "
           f"{platform.python_version()}, torch {torch.__version__}).", "",
           "## Sets and hyperparameters", "",
           "| data set | training rows | held-out rows | d | noise | outputscale | "
           "exact GP test MNLL | exact GP test RMSE |", "|---|---|---|---|---|---|---|---|"]
    for name in sets:
        h = hypers.get(name, {})
        first = next(r for r in fits if r["set"] == name)
        out.append(f"| {name} | {first['n_train']} | {first['n_test']} | {first['d']} | "
                   f"{h.get('noise', float('nan')):.4g} | {h.get('outputscale', float('nan')):.3g}"
                   f" | {first['exact_mnll']:.3f} | {first['exact_rmse']:.3f} |")
    wins = {key: {s: 0 for s in schemes} for key in ("mnll_gap", "kl")}
    for key, title in (("mnll_gap", "MNLL gap to the exact GP"),
                       ("kl", "KL(exact || random features) on the held-out targets (nats)")):
        out += ["", f"## {title}", "",
                "| data set | D | " + " | ".join(schemes) + " |",
                "|---|---|" + "---|" * len(schemes)]
        for name in sets:
            for num_features in features:
                cells = {s: cell(name, s, num_features, key) for s in schemes}
                means = {s: np.mean(v) for s, v in cells.items() if v}
                if not means:
                    continue
                best = min(means, key=means.get)
                wins[key][best] += 1
                shown = [(f"**{_fmt(cells[s], 4 if key == 'mnll_gap' else 2)}**" if s == best
                          else _fmt(cells[s], 4 if key == "mnll_gap" else 2))
                         if cells[s] else "-" for s in schemes]
                seeds = len(next(v for v in cells.values() if v))
                out.append(f"| {name} | {num_features} ({seeds} seeds) | " + " | ".join(shown)
                           + " |")
    out += ["", "## Wins", "", "Rows (set, D) where a scheme has the lowest mean:", "",
            "| score | " + " | ".join(schemes) + " |", "|---|" + "---|" * len(schemes)]
    for key, label in (("mnll_gap", "MNLL gap"), ("kl", "KL")):
        out.append(f"| {label} | " + " | ".join(str(wins[key][s]) for s in schemes) + " |")
    if "orthogonal" in schemes:
        others = [s for s in schemes if s != "orthogonal"]
        out += ["", "Against `orthogonal` (today's ORF): rows (set, D) where a scheme's mean is "
                "lower / higher by more than two standard errors of the difference of the means "
                "(independent seeds), out of the rows measured:", "",
                "| score | " + " | ".join(others) + " |", "|---|" + "---|" * len(others)]
        for key, label in (("mnll_gap", "MNLL gap"), ("kl", "KL")):
            counts = []
            for scheme in others:
                better = worse = total = 0
                for name in sets:
                    for num_features in features:
                        a = cell(name, scheme, num_features, key)
                        b = cell(name, "orthogonal", num_features, key)
                        if len(a) < 2 or len(b) < 2:
                            continue
                        total += 1
                        diff = np.mean(a) - np.mean(b)
                        se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
                        better += diff < -2 * se
                        worse += diff > 2 * se
                counts.append(f"{better} / {worse} of {total}")
            out.append(f"| {label} | " + " | ".join(counts) + " |")
    write_page(path, "\n".join(out) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=list(SETS))
    parser.add_argument("--schemes", nargs="*", default=SCHEMES)
    parser.add_argument("--features", type=int, nargs="*", default=FEATURES)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of the records and the page (default docs/benchmarks)")
    parser.add_argument("--page-only", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="concrete, D = 256, 2 seeds, into a temporary folder")
    args = parser.parse_args()
    out = args.out or OUT
    if args.quick:
        out = Path(tempfile.mkdtemp())
        args.sets, args.features, args.seeds = ["concrete"], [256], 2
    out.mkdir(parents=True, exist_ok=True)
    records = out / "fourier_frequencies.jsonl"
    if not args.page_only:
        run(args, records)
    write_markdown(load_rows(records), out / "fourier_frequencies.md")
    print(f"wrote {out / 'fourier_frequencies.md'}")


if __name__ == "__main__":
    main()
