"""Batch Bayesian optimisation: rfgp Thompson sampling against exact-GP Thompson sampling.

On BoTorch's synthetic test functions (maximising the negated function) every method starts from
the same Sobol design of ``q`` points and proposes ``q`` points per iteration:

* ``rfgp-ts``: :class:`rfgp.RandomFeatureGP` with ``FourierFeatureKernel(D, "rbf", ARD,
  orthogonal frequencies)``, the model of the exact baseline (RBF with ARD, BoTorch's
  dimension-scaled log-normal lengthscale prior started at its mode, its lengthscale
  constraint ``>= 0.025``, its log-normal noise prior, and a constant prior mean fitted with
  the hyperparameters like ``SingleTaskGP``'s ``ConstantMean``): the MAP hyperparameters are
  re-fitted each iteration by L-BFGS on rfgp's feature-space evidence
  (``log_marginal_likelihood``, ``O(N D^2)``) with ``D = --num-features`` (512), from the
  priors' modes as each exact-GP fit starts;
  the posterior the paths come from is then fitted once with
  :func:`rfgp.bayesopt.posterior_num_features` ``(N)`` features (the smallest power of two
  ``>= 2N``, from 512 up to ``--posterior-max-features``), against variance starvation when
  ``N`` approaches ``D``. :func:`rfgp.bayesopt.thompson_sample` draws ``q`` weight-space
  sample paths and maximises each by projected Adam (30 steps of at most 0.002 per coordinate
  in the unit cube) from its two best starts among the shared candidates.
* ``rfgp-ts-fixed``: the same, with the paths drawn from the 512-feature fit (the ablation of
  the growing posterior).
* ``rfgp-ts-warm``: the same as ``rfgp-ts``, each fit warm-started from the previous one (the
  ablation of the cold start).
* ``rfgp-ts-candidates``: the model and paths of ``rfgp-ts``, each path's maximum over the
  candidate set (``steps=0``): the selection rule of ``MaxPosteriorSampling``, with
  random-feature paths in place of joint exact draws.
* ``exact-ts``: BoTorch ``SingleTaskGP`` (its default kernel and priors, ``Standardize``),
  ``fit_gpytorch_mll`` each iteration, ``MaxPosteriorSampling`` (joint exact posterior draws
  over the candidate set, without replacement).
* ``exact-pathwise``: the same fitted ``SingleTaskGP``, BoTorch's pathwise sampler
  (``draw_matheron_paths``: random-feature prior plus the exact Matheron update) and
  ``optimize_posterior_samples`` (L-BFGS-B from the best raw samples).
* ``random``: uniform random search.

The candidate set (``MaxPosteriorSampling``) and the starting pool (rfgp) are the same kind of
set: uniform points plus Gaussian perturbations of the best points so far. Inputs are scaled
to the unit cube; rfgp's targets are standardised per iteration.

Each iteration's time (model fit + batch selection; the test function costs nothing) is
measured with ``time.perf_counter`` on one thread per method; the methods run one after the
other in one process, so the ratios compare like with like on the same (shared) machine.

Usage::

    python benchmarks/bayesopt.py --quick    # a short run (a minute or two)
    # the run on the benchmark page (about an hour on one core):
    python benchmarks/bayesopt.py --seeds 3 --iterations 30 --exact-iterations 10 \\
        --methods rfgp-ts rfgp-ts-fixed exact-ts exact-pathwise random
    # the full size for a dedicated machine:
    python benchmarks/bayesopt.py --seeds 5 --iterations 60 --exact-iterations 40 \\
        --sweep-sizes 500 1000 2000 4000
    # or the two parts side by side, then the report:
    python benchmarks/bayesopt.py --part loops & python benchmarks/bayesopt.py --part sweep
    python benchmarks/bayesopt.py --part report
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT_DIR = ROOT / "docs" / "benchmarks"

from _bo_methods import make_problem, run_one, timing_sweep  # noqa: E402

METHODS = ("rfgp-ts", "rfgp-ts-fixed", "rfgp-ts-warm", "rfgp-ts-candidates", "exact-ts",
           "exact-pathwise", "random")
LABELS = {
    "rfgp-ts": "rfgp Thompson, D grows with N",
    "rfgp-ts-fixed": "rfgp Thompson, D fixed",
    "rfgp-ts-warm": "rfgp Thompson, D grows, warm-started fits",
    "rfgp-ts-candidates": "rfgp Thompson, candidate set",
    "exact-ts": "exact GP, MaxPosteriorSampling",
    "exact-pathwise": "exact GP, pathwise sampler",
    "random": "random search",
}


def mean_se(values):
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def summarise(results, problems, methods, seeds):
    """Per problem and method: regret (mean, standard error over seeds) at the evaluations all
    methods reached ('matched') and at the method's own end; the time of the iteration that
    reached the matched evaluations and of the last iteration."""
    rows = []
    for problem in problems:
        optimum = float(make_problem(problem).optimal_value)  # of the negated function
        matched = min(results[problem][m][str(s)][-1]["evaluations"]
                      for m in methods for s in seeds)
        for method in methods:
            traces = [results[problem][method][str(s)] for s in seeds]
            at = next(i for i, step in enumerate(traces[0]) if step["evaluations"] == matched)
            regret, regret_se = mean_se([optimum - t[at]["best"] for t in traces])
            final, final_se = mean_se([optimum - t[-1]["best"] for t in traces])
            rows.append(
                {
                    "problem": problem,
                    "method": method,
                    "matched_evaluations": matched,
                    "regret": regret,
                    "regret_se": regret_se,
                    "evaluations": traces[0][-1]["evaluations"],
                    "final_regret": final,
                    "final_regret_se": final_se,
                    "matched_iteration_s": sum(t[at]["seconds"] for t in traces) / len(traces),
                    "last_iteration_s": sum(t[-1]["seconds"] for t in traces) / len(traces),
                    "total_s": sum(sum(step["seconds"] for step in t) for t in traces)
                    / len(traces),
                }
            )
    return rows


def plot(results, problems, methods, seeds, path, sweep=None, sweep_problem=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = len(problems) + (1 if sweep else 0)
    fig, axes = plt.subplots(3, columns, figsize=(5 * columns, 11), squeeze=False)
    for col, problem in enumerate(problems):
        optimum = float(make_problem(problem).optimal_value)  # of the negated function
        for method in methods:
            traces = [results[problem][method][str(s)] for s in seeds]
            evals = [step["evaluations"] for step in traces[0]]
            regret = [
                sum(optimum - t[i]["best"] for t in traces) / len(traces) for i in range(len(evals))
            ]
            cumulative = [
                sum(sum(step["seconds"] for step in t[: i + 1]) for t in traces) / len(traces)
                for i in range(len(evals))
            ]
            per_iter = [
                sum(t[i]["seconds"] for t in traces) / len(traces) for i in range(1, len(evals))
            ]
            style = {"label": LABELS[method], "color": f"C{METHODS.index(method)}"}
            axes[0, col].plot(evals, regret, **style)
            if method != "random":
                axes[1, col].plot(cumulative, regret, **style)
                axes[2, col].plot(evals[:-1], per_iter, marker=".", **style)
        axes[0, col].set(title=problem, xlabel="evaluations", ylabel="regret (mean over seeds)",
                         yscale="log")
        axes[1, col].set(xlabel="cumulative model + selection time (s)", ylabel="regret",
                         yscale="log")
        axes[2, col].set(xlabel="evaluations so far (N)", ylabel="seconds per BO iteration",
                         yscale="log")
    axes[0, 0].legend(fontsize=8)
    axes[2, 0].legend(fontsize=8)
    if sweep:
        ax = axes[2, -1]
        sizes = [row["n"] for row in sweep]
        for method in methods:
            if method in sweep[0]:
                ax.plot(sizes, [row[method] for row in sweep], marker="o", label=LABELS[method],
                        color=f"C{METHODS.index(method)}")
        ax.set(title=f"{sweep_problem}: one iteration at N points", xlabel="N",
               ylabel="seconds per BO iteration", xscale="log", yscale="log")
        ax.legend(fontsize=8)
        axes[0, -1].axis("off")
        axes[1, -1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(rows, config, path, plot_name, elapsed, sweep=None):
    exact_iterations = config.get("exact_iterations", config["iterations"])
    posterior_max = config.get("posterior_max_features", config["num_features"])
    lines = [
        "# Batch Bayesian optimisation",
        "",
        "Produced by `python benchmarks/bayesopt.py` "
        + ("`--quick` " if config["quick"] else "")
        + f"on {config['machine']} (a shared 2-core machine; other jobs ran at the same time,"
        " so absolute times are noisy and the ratios measured side by side are what counts).",
        "",
        f"Settings: batch q = {config['q']}, a Sobol design of q points, then "
        f"{config['iterations']} iterations ({config['q'] * (config['iterations'] + 1)} "
        f"evaluations) for rfgp and random search and {exact_iterations} iterations "
        f"({config['q'] * (exact_iterations + 1)} evaluations) for the exact GP; seeds "
        f"{config['seeds']}. rfgp: RBF, ARD, orthogonal Fourier features, the exact GP's "
        "priors, lengthscale constraint and constant mean; hyperparameters fitted with "
        f"D = {config['num_features']} features, paths drawn from a posterior with "
        f"`posterior_num_features(N)` features (the smallest power of two >= 2N, between "
        f"{config['num_features']} and {posterior_max}; 'D fixed': {config['num_features']}). "
        f"Candidate / start pool of {config['pool']} points, "
        f"one torch thread. Wall time summed over the parts of the run: "
        f"{elapsed / 60:.1f} minutes (the parts may run as processes side by side).",
        "",
        "Regret is the optimum minus the best value found (mean over seeds, ± standard error), "
        "at the evaluations every method reached ('matched') and at the method's own end; "
        "'iteration' is the mean time of the iteration that reached the matched evaluations "
        f"(model fit + choosing the batch on N = matched - {config['q']} points), 'last "
        "iteration' that of the method's final one; 'speed-up' divides the exact GP's "
        "iteration time by that of rfgp with gradient ascent at the same N; 'total time' is the "
        "model + selection time of a whole run.",
        "",
        "| problem | method | regret, matched evaluations | iteration (s) | speed-up of rfgp "
        "| evaluations | regret at the end | last iteration (s) | total time (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def value(mean, se):
        return f"{mean:.3g}" + ("" if math.isnan(se) else f" ± {se:.2g}")

    for row in rows:
        ref = next(
            r for r in rows if r["problem"] == row["problem"] and r["method"] == "rfgp-ts"
        )
        speedup = (
            f"{row['matched_iteration_s'] / ref['matched_iteration_s']:.1f}x"
            if row["method"].startswith("exact")
            else ""
        )
        lines.append(
            f"| {row['problem']} | {LABELS[row['method']]} | "
            f"{value(row['regret'], row['regret_se'])} ({row['matched_evaluations']}) | "
            f"{row['matched_iteration_s']:.2f} | {speedup} | {row['evaluations']} | "
            f"{value(row['final_regret'], row['final_regret_se'])} | "
            f"{row['last_iteration_s']:.2f} | {row['total_s']:.1f} |"
        )
    if sweep:
        rfgp_rows = [m for m in ("rfgp-ts", "rfgp-ts-fixed") if m in sweep[0]]
        lines += [
            "",
            f"## Time per iteration as the data grow ({config['sweep_problem']})",
            "",
            "One BO iteration (hyperparameter fit from the initial values + choosing a batch of "
            f"q = {config['q']}) on N Sobol points of the problem, each method from scratch:",
            "",
            "| N | " + " | ".join(LABELS[m] + " (s)" for m in sweep[0] if m != "n")
            + " | " + " | ".join(f"speed-up of {r} over "
                                 + ", ".join(m for m in sweep[0] if m.startswith("exact"))
                                 for r in rfgp_rows)
            + " |",
            "|---:|" + "---:|" * (len(sweep[0]) - 1 + len(rfgp_rows)),
        ]
        for row in sweep:
            ratios = [
                ", ".join(f"{row[m] / row[r]:.1f}x" for m in row if m.startswith("exact"))
                for r in rfgp_rows
            ]
            lines.append(
                f"| {row['n']} | "
                + " | ".join(f"{row[m]:.2f}" for m in row if m != "n")
                + " | " + " | ".join(ratios) + " |"
            )
    lines += ["", f"![regret and time per iteration]({plot_name})", ""]
    path.write_text("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument(
        "--part", default="all", choices=["all", "loops", "sweep", "report"],
        help="run the BO loops, the timing sweep (each saves its JSON; two processes can run "
        "them side by side), write the report from the saved JSON, or all three",
    )
    parser.add_argument("--problems", nargs="+", default=["hartmann6", "ackley10", "levy20"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--q", type=int, default=50)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--exact-iterations", type=int, default=None,
        help="iterations of the exact-GP methods (default --iterations; their cost grows as N^3)",
    )
    parser.add_argument(
        "--posterior-max-features", type=int, default=4096,
        help="largest D of rfgp's posterior (it grows with N: "
        "rfgp.bayesopt.posterior_num_features)",
    )
    parser.add_argument("--num-features", type=int, default=512)
    parser.add_argument("--pool", type=int, default=1000)
    parser.add_argument("--fit-iterations", type=int, default=20)
    parser.add_argument("--sweep-problem", default="ackley10")
    parser.add_argument("--sweep-sizes", nargs="*", type=int, default=[500, 1000, 2000])
    parser.add_argument("--output", default="bayesopt")
    parser.add_argument(
        "--merge", nargs="*", default=[],
        help="report: also merge the loops of these outputs (e.g. one process per problem, "
        "each run with --part loops --problems P --output NAME)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.iterations, args.pool, args.sweep_sizes = 1, 3, 500, [200, 400]
    import torch

    torch.set_num_threads(1)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    loops_path = OUT_DIR / f"{args.output}.json"
    sweep_path = OUT_DIR / f"{args.output}_sweep.json"
    seeds = list(range(args.seeds))
    if args.part in ("all", "loops"):
        results = {}
        began = time.perf_counter()
        config = {
            "quick": args.quick,
            "q": args.q,
            "iterations": args.iterations,
            "exact_iterations": (args.exact_iterations if args.exact_iterations is not None
                                 else args.iterations),
            "posterior_max_features": args.posterior_max_features,
            "seeds": seeds,
            "problems": [],
            "methods": args.methods,
            "num_features": args.num_features,
            "pool": args.pool,
            "machine": f"{platform.machine()} / torch {torch.__version__}",
        }
        for problem in args.problems:
            results[problem] = {m: {} for m in args.methods}
            for seed in seeds:
                for method in args.methods:
                    iterations = (args.exact_iterations if method.startswith("exact")
                                  and args.exact_iterations is not None else args.iterations)
                    trace = run_one(
                        problem, method, seed, args.q, iterations, args.num_features,
                        args.pool, args.fit_iterations, args.posterior_max_features,
                    )
                    results[problem][method][str(seed)] = trace
                    total = sum(step["seconds"] for step in trace)
                    print(
                        f"{problem:10s} seed {seed} {method:18s} best {trace[-1]['best']:9.4f} "
                        f"time {total:7.1f} s (last iteration {trace[-1]['seconds']:.2f} s)",
                        flush=True,
                    )
            # Saved after every problem, so a run stopped early keeps the finished problems.
            config["problems"].append(problem)
            config["minutes"] = (time.perf_counter() - began) / 60
            loops_path.write_text(json.dumps({"config": config, "results": results}, indent=1))
    if args.part in ("all", "sweep") and args.sweep_sizes:
        began = time.perf_counter()
        sweep = []
        for size in args.sweep_sizes:  # saved after every size
            sweep += timing_sweep(
                args.sweep_problem, [size], args.methods, args.q, args.num_features,
                args.pool, args.fit_iterations, args.posterior_max_features,
            )
            sweep_path.write_text(json.dumps({
                "problem": args.sweep_problem, "rows": sweep,
                "minutes": (time.perf_counter() - began) / 60,
            }, indent=1))
    if args.part in ("all", "report"):
        saved = json.loads(loops_path.read_text()) if loops_path.exists() else None
        for name in args.merge:  # later outputs replace earlier ones method by method
            part = json.loads((OUT_DIR / f"{name}.json").read_text())
            if saved is None:
                saved = part
                continue
            for problem, methods in part["results"].items():
                saved["results"].setdefault(problem, {}).update(methods)
                if problem not in saved["config"]["problems"]:
                    saved["config"]["problems"].append(problem)
            saved["config"]["methods"] += [
                m for m in part["config"]["methods"] if m not in saved["config"]["methods"]
            ]
            saved["config"]["minutes"] += part["config"]["minutes"]
        config, results = saved["config"], saved["results"]
        sweep_saved = json.loads(sweep_path.read_text()) if sweep_path.exists() else None
        sweep = sweep_saved["rows"] if sweep_saved else None
        config["sweep_problem"] = sweep_saved["problem"] if sweep_saved else None
        minutes = config["minutes"] + (sweep_saved["minutes"] if sweep_saved else 0.0)
        problems, methods, seeds = config["problems"], config["methods"], config["seeds"]
        rows = summarise(results, problems, methods, seeds)
        plot_name = f"{args.output}.png"
        plot(results, problems, methods, seeds, OUT_DIR / plot_name, sweep,
             config["sweep_problem"])
        write_markdown(rows, config, OUT_DIR / f"{args.output}.md", plot_name, minutes * 60,
                       sweep)
        for row in rows:
            print(row)


if __name__ == "__main__":
    main()
