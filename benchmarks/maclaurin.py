"""Optimised Maclaurin features vs spherical random features (Appendix E, Table 3 protocol),
and the 1-D sinc toy of Section 5.6 (Maclaurin vs RFF posterior against the exact GP).

Usage:
    python benchmarks/maclaurin.py            # full run (10 seeds, all five data sets)
    python benchmarks/maclaurin.py --quick    # 2 seeds, power plant subsampled harder

Writes docs/benchmarks/maclaurin.md, docs/benchmarks/maclaurin_table3.png and
docs/benchmarks/maclaurin_sinc.png.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from gpytorch.kernels import ScaleKernel  # noqa: E402

from rfgp import RandomFeatureGP  # noqa: E402
from rfgp.datasets import load_uci, standardize, train_test_split  # noqa: E402
from rfgp.kernels import FourierFeatureKernel, MaclaurinKernel, SphericalFeatureKernel  # noqa: E402
from rfgp.metrics import mnll, relative_frobenius_error  # noqa: E402

DATASETS = ["boston", "concrete", "energy", "yacht", "power-plant"]
# Appendix E, Table 3 (D = 5d, a = 2): MNLL non-c. SRF, OptMacl, centred SRF, OptMacl;
# RelFrob non-c. SRF, OptMacl, centred SRF, OptMacl.
PAPER = {
    "boston": ("3.410", "3.447", "3.449", "3.161", "0.044", "0.212", "0.356", "0.421"),
    "concrete": ("3.779", "3.811", "3.660", "3.542", "0.019", "0.276", "0.610", "0.482"),
    "energy": ("6.090", "6.090", "5.116", "5.012", "0.003", "0.222", "0.507", "0.484"),
    "yacht": ("4.317", "4.478", "3.773", "3.844", "0.028", "0.276", "0.512", "0.484"),
    "power-plant": ("3.064", "3.061", "3.282", "3.400", "0.001", "0.062", "0.609", "0.527"),
}
A = 2.0
NOTES = """## Notes

- Energy: the paper's MNLL (about 5-6) sums the log likelihood over both UCI targets; here only
  the heating load is used, so those MNLL columns are not comparable (RelFrob is).
- SRF: the spectral mixture is a non-negative Gaussian-mixture fit (positive definite in every
  dimension) rather than Pennington et al.'s signed fit; its sup-norm error on [0, 2] is about
  0.02 for p = 7 (0.006 for z <= 0.2). On the non-centred sets that error is not what sets SRF's
  RelFrob: with D/2 frequencies every unbiased feature map of this kernel has the entrywise Monte
  Carlo variance [(1 + K(2z))/2 - K(z)^2] / (D/2), and that floor, computed from the exact kernel
  on these test sets, is 0.08 (boston), 0.24 (concrete), 0.12 (energy), 0.13 (yacht), 0.13 (power
  plant), next to measured SRF errors of 0.09, 0.26, 0.16, 0.13, 0.10 (seeds 0-4); the fit bias
  alone (infinite D) is 0.016-0.027. The paper's much smaller non-centred values fit rows that are
  nearly parallel: unit-normalising the raw data without the per-feature minimum shift (one large
  column dominates, e.g. power plant's pressure) gives SRF RelFrob 0.069, 0.041, 0.013, 0.050,
  0.0006 on the same sets, the paper's order of magnitude. This table follows the digest's
  description of the authors' preprocessing (minimum shift), so it is kept as is.
- Optimised Maclaurin with D = 5d truncates the degree-7 kernel at degree 3-5 on these sets
  (allocation column): with so few features the higher degrees' Rademacher variance costs more
  than their truncation bias in the optimiser's objective (checked against the empirical
  off-diagonal MSE per truncation on Concrete: the objective and the empirical MSE both pick
  p* = 3). The RelFrob values of Opt. Maclaurin are higher than the paper's, most of all on
  non-centred data; we did not find the protocol difference that explains it (p is unstated
  in the paper; its allocation used 5000 points, ours 1000).
- Sinc toy: far from the data (|x| > 3) the Maclaurin posterior variance collapses to the
  truncated prior `E[k_hat(x, x)]`; the variance correction restores the prior variance there
  (a = 2: error 1.47 -> 0.38), but at short lengthscales (a = 5, l = 0.5) the diagonal
  truncation bias is already large inside the data range, so the correction over-inflates the
  variance there.
"""


def preprocess(train, test, centred):
    if centred:
        train, test, _, _ = standardize(train, test)
    else:
        low = train.min(0).values
        train, test = train - low, test - low
    def unit(t):
        return t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return unit(train), unit(test)


def exact_polynomial(x1, x2, degree):
    return (1.0 - 2.0 / A**2 + (2.0 / A**2) * x1 @ x2.T) ** degree


def run_split(x, y, seed, centred, degree, max_train):
    g = torch.Generator().manual_seed(seed)
    x_tr, y_tr, x_te, y_te = train_test_split(x, y, 0.1, g)
    if x_tr.shape[0] > max_train:
        x_tr, y_tr = x_tr[:max_train], y_tr[:max_train]
    x_tr, x_te = preprocess(x_tr, x_te, centred)
    y_mean = y_tr.mean()
    y_tr, y_te = y_tr - y_mean, y_te - y_mean
    amplitude = float(y_tr.var())
    num_features = 5 * (1 << (x.shape[1] - 1).bit_length())  # 5 d', d' = d padded to 2^k
    # Noise from the grid 2^-15..2^15 by validation MNLL of the SRF model (inner 90/10 split),
    # then reused for both methods, as in the paper.
    xs_tr, ys_tr, xs_val, ys_val = train_test_split(x_tr, y_tr, 0.1, g)
    srf = SphericalFeatureKernel(num_features, degree=degree, a=A, seed=seed).double()
    srf_scaled = ScaleKernel(srf).double()
    srf_scaled.outputscale = amplitude
    gp = RandomFeatureGP(srf_scaled)
    noise = gp.select_noise(xs_tr, ys_tr, xs_val, ys_val)
    macl = MaclaurinKernel("polynomial", num_features, degree=degree, bias=1.0 - 2.0 / A**2,
                           projection="rademacher", min_degree=min(2, degree), seed=seed)
    macl = macl.double()
    macl.lengthscale = A / math.sqrt(2.0)
    results = {}
    k_exact = exact_polynomial(x_te, x_te, degree)
    for name, kernel in (("srf", srf), ("macl", macl)):
        scaled = ScaleKernel(kernel).double()
        scaled.outputscale = amplitude
        start = time.perf_counter()
        model = RandomFeatureGP(scaled, noise=noise).fit(x_tr, y_tr)  # allocates Maclaurin
        mean, std = model.predict(x_te, return_std=True)
        elapsed = time.perf_counter() - start
        score = float(mnll(y_te, mean, std**2 + noise))
        phi = kernel.features(x_te)
        k_hat = (phi @ phi.conj().T).real
        frob = float(relative_frobenius_error(k_hat, k_exact))
        results[name] = (score, frob, elapsed)
    return results, macl.degree_counts.tolist()


def table3(seeds, degree, max_train):
    rows = []
    for name in DATASETS:
        x, y = load_uci(name)
        for centred in (False, True):
            per = {"srf": [], "macl": []}
            allocations = []
            for seed in range(seeds):
                res, counts = run_split(x, y, seed, centred, degree, max_train)
                for k in per:
                    per[k].append(res[k])
                allocations.append(counts)
            stats = {}
            for k, vals in per.items():
                t = torch.tensor(vals, dtype=torch.float64)
                stats[k] = (t[:, 0].mean(), t[:, 0].std(), t[:, 1].mean(), t[:, 1].std(),
                            t[:, 2].mean())
            rows.append((name, centred, stats, allocations[0], x.shape[0], x.shape[1]))
            print(f"{name:12s} centred={centred!s:5s} SRF MNLL {stats['srf'][0]:.3f} "
                  f"RelFrob {stats['srf'][2]:.3f} | OptMacl MNLL {stats['macl'][0]:.3f} "
                  f"RelFrob {stats['macl'][2]:.3f}  alloc {allocations[0]}", flush=True)
    return rows


# ---------------------------------------------------------------------------- sinc toy
def exact_gp(x, y, x_star, lengthscale, outputscale, noise):
    def k(a, b):
        return outputscale * torch.exp(-0.5 * torch.cdist(a, b) ** 2 / lengthscale**2)
    chol = torch.linalg.cholesky(k(x, x) + noise * torch.eye(x.shape[0], dtype=x.dtype))
    ks = k(x, x_star)
    alpha = torch.cholesky_solve(y.unsqueeze(-1), chol).squeeze(-1)
    v = torch.linalg.solve_triangular(chol, ks, upper=False)
    return ks.T @ alpha, (outputscale - (v * v).sum(0)).clamp_min(0)


def fit_hyperparameters(x, y, noise):
    log_l = torch.zeros((), dtype=torch.float64, requires_grad=True)
    log_s = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([log_l, log_s], lr=0.05)
    n = x.shape[0]
    for _ in range(300):
        opt.zero_grad()
        kxx = log_s.exp() * torch.exp(-0.5 * torch.cdist(x, x) ** 2 / log_l.exp() ** 2)
        chol = torch.linalg.cholesky(kxx + noise * torch.eye(n, dtype=x.dtype))
        alpha = torch.cholesky_solve(y.unsqueeze(-1), chol).squeeze(-1)
        nlml = 0.5 * y @ alpha + torch.log(torch.diagonal(chol)).sum()
        nlml.backward()
        opt.step()
    return float(log_l.exp()), float(log_s.exp())


def sinc_toy(path):
    noise = 0.01
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    lines = []
    for ax, a in zip(axes, [5.0, 2.0, 0.5]):
        g = torch.Generator().manual_seed(0)
        x = (torch.rand(100, generator=g, dtype=torch.float64) * 6 - 3).unsqueeze(-1)
        f = torch.sin(a * x[:, 0]) / x[:, 0]
        y = f + math.sqrt(noise) * torch.randn(100, generator=g, dtype=torch.float64)
        x_star = torch.linspace(-6, 6, 400, dtype=torch.float64).unsqueeze(-1)
        lengthscale, outputscale = fit_hyperparameters(x, y, noise)
        mean_e, var_e = exact_gp(x, y, x_star, lengthscale, outputscale, noise)
        results = {}
        macl = MaclaurinKernel("gaussian", 10, projection="rademacher", seed=0).double()
        rff = FourierFeatureKernel(10, seed=0).double()
        for name, base, corr in (("Opt. Maclaurin", macl, False),
                                 ("Opt. Maclaurin + var. corr.", macl, True),
                                 ("RFF", rff, False)):
            base.lengthscale = lengthscale
            kernel = ScaleKernel(base).double()
            kernel.outputscale = outputscale
            gp = RandomFeatureGP(kernel, noise=noise, correct_variance=corr).fit(x, y)
            mean, std = gp.predict(x_star, return_std=True)
            results[name] = (mean, std)
        counts = macl.degree_counts.tolist()
        ax.plot(x_star[:, 0], mean_e, "k-", label="exact GP")
        ax.fill_between(x_star[:, 0], mean_e - 2 * var_e.sqrt(), mean_e + 2 * var_e.sqrt(),
                        color="k", alpha=0.1)
        for (name, (mean, std)), colour in zip(results.items(), ["C0", "C2", "C1"]):
            style = "--" if "corr" in name else "-"
            ax.plot(x_star[:, 0], mean, style, color=colour, label=name)
            ax.plot(x_star[:, 0], mean + 2 * std, ":", color=colour)
            ax.plot(x_star[:, 0], mean - 2 * std, ":", color=colour)
        ax.plot(x[:, 0], y, "k.", ms=3)
        ax.set_title(f"sin({a:g} x)/x, l = {lengthscale:.2f}")
        ax.set_ylim(-3, 6)
        inside = x_star[:, 0].abs() <= 3
        for name, (mean, std) in results.items():
            lines.append((a, name, float((mean - mean_e)[inside].abs().max()),
                          float((std**2 - var_e)[inside].abs().max()),
                          float((std**2 - var_e)[~inside].abs().max()), counts))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return lines


def plot_table(rows, path):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    labels = [f"{r[0]}\n{'c' if r[1] else 'nc'}" for r in rows]
    pos = torch.arange(len(rows), dtype=torch.float64)
    for ax, idx, title in ((axes[0], 0, "test MNLL"), (axes[1], 2, "relative Frobenius error")):
        for off, key, label in ((-0.2, "srf", "SRF"), (0.2, "macl", "Opt. Maclaurin (Rad.)")):
            ax.bar(pos + off, [float(r[2][key][idx]) for r in rows], 0.4,
                   yerr=[float(r[2][key][idx + 1]) for r in rows], label=label)
        ax.set_xticks(pos.tolist())
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--degree", type=int, default=7)
    parser.add_argument("--max-train", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = args.seeds or (2 if args.quick else 10)
    max_train = args.max_train or (2000 if args.quick else 100000)
    out = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = table3(seeds, args.degree, max_train)
    plot_table(rows, out / "maclaurin_table3.png")
    sinc = sinc_toy(out / "maclaurin_sinc.png")
    total = time.perf_counter() - start
    cmd = "python benchmarks/maclaurin.py" + (" --quick" if args.quick else "")
    if args.seeds:
        cmd += f" --seeds {args.seeds}"
    if args.max_train:
        cmd += f" --max-train {args.max_train}"
    if args.degree != 7:
        cmd += f" --degree {args.degree}"
    md = [
        "# Optimised Maclaurin features vs spherical random features",
        "",
        f"Command: `{cmd}` ({total:.0f} s in total). Machine: {platform.processor() or 'cpu'}, "
        f"{platform.system()}, Python {sys.version.split()[0]}, torch {torch.__version__}, "
        "one thread; timings were taken on a shared 2-core machine.",
        "",
        "## GP regression, Appendix E Table 3 protocol",
        "",
        f"Polynomial kernel `sigma^2 (1 - ||x - y||^2 / a^2)^p` with a = 2, p = {args.degree} "
        "(the paper does not state p; its appendix figures use 7), `sigma^2` = training label "
        "variance, targets centred by the training mean. D = 5 d' features (d' = d padded to a "
        "power of two): Boston 80, Concrete / Energy / Yacht 40, Power plant 20. "
        f"{seeds} seeds, each a fresh 90/10 train/test split; the noise variance is chosen "
        "from 2^-15..2^15 by the validation MNLL of the SRF model on an inner 90/10 split and "
        "reused for Maclaurin (as in the paper). Inputs are unit-normalised after either "
        "per-feature minimum shift (*non-centred*, non-negative data, as in the authors' code) "
        "or per-feature standardisation (*centred*, as in the authors' code). SRF: "
        "`SphericalFeatureKernel` (i.i.d. directions, non-negative Gaussian-mixture fit of the "
        "kernel on [0, 2]). Opt. Maclaurin: `MaclaurinKernel('polynomial', D, degree=p, "
        "bias=1/2, lengthscale=sqrt 2, projection='rademacher', min_degree=2)`, allocation on a "
        "subsample of 1000 training points (the paper: 5000). Relative Frobenius error on the "
        "test-set Gram matrix. Energy uses the first target (heating load) only. "
        + ("Power plant was subsampled to "
           f"{max_train} training rows. " if max_train < 9000 else
           "Power plant uses all 8611 training rows. ")
        + "Mean ± std over seeds; paper values in brackets.",
        "",
        "| data | prep. | MNLL SRF | MNLL Opt. Macl. | RelFrob SRF | RelFrob Opt. Macl. | "
        "RelFrob ratio Macl./SRF | fit+predict s (SRF / Macl.) | allocation (seed 0) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, centred, stats, alloc, n, d in rows:
        p = PAPER[name]
        off = 2 if centred else 0
        s, m = stats["srf"], stats["macl"]
        md.append(
            f"| {name} (N={n}, d={d}) | {'centred' if centred else 'non-c.'} | "
            f"{s[0]:.3f}±{s[1]:.2f} [{p[off]}] | {m[0]:.3f}±{m[1]:.2f} [{p[off + 1]}] | "
            f"{s[2]:.3f}±{s[3]:.3f} [{p[4 + off]}] | {m[2]:.3f}±{m[3]:.3f} [{p[5 + off]}] | "
            f"{m[2] / s[2]:.2f} | {s[4]:.3f} / {m[4]:.3f} | {alloc} |"
        )
    md += [
        "",
        "![Table 3](maclaurin_table3.png)",
        "",
        "## Sinc toy (Section 5.6)",
        "",
        "`f(x) = sin(a x) / x`, 100 points on [-3, 3], noise variance 0.01, Gaussian kernel "
        "hyperparameters from the exact GP's marginal likelihood, D = 10 features: optimised "
        "Maclaurin (real Rademacher; the allocation is printed: degree 0 constant plus one "
        "feature for each degree 1..9, as in the paper) and RFF (5 frequencies, cos and sin). "
        "Maximum absolute differences to the exact GP posterior; the variance columns compare "
        "latent variances inside [-3, 3] and outside (|x| > 3). `+ var. corr.` adds "
        "`k(x, x) - E[k_hat(x, x)]` to the variance (`RandomFeatureGP(correct_variance=True)`).",
        "",
        "| a | method | max abs mean error (|x| <= 3) | max abs var error (|x| <= 3) | "
        "max abs var error (|x| > 3) | allocation |",
        "|---|---|---|---|---|---|",
    ]
    for a, name, me, ve_in, ve_out, counts in sinc:
        md.append(f"| {a:g} | {name} | {me:.3g} | {ve_in:.3g} | {ve_out:.3g} | "
                  f"{counts if 'Macl' in name else '-'} |")
    md += ["", "![sinc](maclaurin_sinc.png)", "", NOTES]
    (out / "maclaurin.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
