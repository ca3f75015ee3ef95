"""The methods of the Bayesian-optimisation benchmark (benchmarks/bayesopt.py): the test
problems, the proposers (rfgp Thompson sampling in its variants, the exact GP's
``MaxPosteriorSampling`` and pathwise sampler, random search), one BO loop per (problem,
method, seed) and the timing sweep of one iteration at growing N.

Every proposer has ``propose(x_unit, y, q, generator) -> (q, dim)`` points of the unit cube.
"""

from __future__ import annotations

import math
import time
import warnings
from functools import partial

from _harness import timed


def make_problem(name: str):
    from botorch.test_functions import Ackley, Hartmann, Levy

    if name == "hartmann6":
        return Hartmann(dim=6, negate=True)
    if name == "ackley10":
        return Ackley(dim=10, negate=True)
    if name == "levy20":
        return Levy(dim=20, negate=True)
    raise ValueError(f"unknown problem {name!r}")


def candidate_pool(x_unit, y, size: int, generator):
    """``size`` points of the unit cube: half uniform, half Gaussian perturbations (sd 0.1) of
    the five best points so far."""
    import torch

    dim = x_unit.shape[1]
    uniform = torch.rand(size // 2, dim, generator=generator, dtype=x_unit.dtype)
    best = x_unit[y.topk(min(5, y.shape[0])).indices]
    centres = best[torch.randint(best.shape[0], (size - size // 2,), generator=generator)]
    local = centres + 0.1 * torch.randn(centres.shape, generator=generator, dtype=x_unit.dtype)
    return torch.cat([uniform, local.clamp(0.0, 1.0)])


class RfgpThompson:
    """rfgp: the same model as the exact baseline (RBF, ARD, BoTorch's priors), in features."""

    def __init__(self, dim: int, num_features: int, seed: int, pool: int, fit_iterations: int,
                 sampling: str = "orthogonal", steps: int = 30, fit_features=None,
                 posterior_features=None, constrain: bool = True, learn_mean: bool = True,
                 warm_start: bool = False):
        import torch
        from gpytorch.priors import LogNormalPrior

        # SingleTaskGP's defaults: dimension-scaled log-normal lengthscale prior started at its
        # mode, log-normal noise prior started at its mode.
        self.lengthscale_prior = LogNormalPrior(math.sqrt(2) + 0.5 * math.log(dim), math.sqrt(3))
        self.noise_prior = LogNormalPrior(-4.0, 1.0)
        self.dim = dim
        self.seed = seed
        self.sampling = sampling
        self.constrain = constrain
        self.num_features = num_features
        # Callables N -> D: the features of the hyperparameter fit and of the posterior the
        # paths are drawn from (None: num_features).
        self.fit_features = fit_features
        self.posterior_features = posterior_features
        self.kernel = self.make_kernel(
            num_features, torch.full((1, dim), float(self.lengthscale_prior.mode))
        )
        self.log_noise = torch.tensor(float(self.noise_prior.mode), dtype=torch.float64).log()
        # SingleTaskGP's ConstantMean: a constant prior mean fitted with the hyperparameters.
        self.learn_mean = learn_mean
        self.mean = torch.tensor(0.0, dtype=torch.float64)
        # False: every fit starts from the priors' modes and a zero mean, as each exact-GP fit
        # does. Warm starts from the previous fit can stay in a spurious optimum of the
        # 512-feature evidence (one lengthscale at its lower bound, the model near white noise:
        # Levy-20, seed 1, stalled at regret 39 after 1550 evaluations).
        self.warm_start = warm_start
        self.pool = pool
        self.fit_iterations = fit_iterations
        self.steps = steps

    def make_kernel(self, num_features, lengthscale):
        from gpytorch.constraints import GreaterThan

        from rfgp.kernels import FourierFeatureKernel

        # SingleTaskGP's lengthscale constraint (>= 0.025) when constrain is set.
        extra = {"lengthscale_constraint": GreaterThan(0.025)} if self.constrain else {}
        kernel = FourierFeatureKernel(
            num_features, spectral="rbf", sampling=self.sampling, ard_num_dims=self.dim,
            seed=self.seed, **extra,
        ).double()
        kernel.lengthscale = lengthscale.detach().double()
        return kernel

    def fit(self, x_unit, ys):
        """MAP hyperparameters and constant mean (L-BFGS on rfgp's feature-space evidence plus
        the priors), from the priors' modes (or the previous fit with ``warm_start``); returns
        the GP of the residuals from the mean, fitted on all rows with the posterior's
        features."""
        import torch

        from rfgp import RandomFeatureGP

        n = x_unit.shape[0]
        if not self.warm_start:
            self.kernel.lengthscale = torch.full_like(
                self.kernel.lengthscale, float(self.lengthscale_prior.mode)
            )
            self.log_noise = torch.tensor(float(self.noise_prior.mode), dtype=torch.float64).log()
            self.mean = torch.zeros_like(self.mean)
        width = self.fit_features(n) if self.fit_features else self.num_features
        if width != self.kernel.num_features:
            self.kernel = self.make_kernel(width, self.kernel.lengthscale)
        gp = RandomFeatureGP(self.kernel, noise=float(self.log_noise.exp()))
        log_noise = self.log_noise.clone().requires_grad_(True)
        mean = self.mean.clone().requires_grad_(self.learn_mean)
        params = [self.kernel.raw_lengthscale, log_noise] + ([mean] if self.learn_mean else [])
        optimiser = torch.optim.LBFGS(
            params, lr=1.0, max_iter=self.fit_iterations, line_search_fn="strong_wolfe"
        )

        def closure():
            optimiser.zero_grad()
            noise = log_noise.exp() + 1e-4
            loss = -(
                gp.log_marginal_likelihood(x_unit, ys - mean, noise)
                + self.lengthscale_prior.log_prob(self.kernel.lengthscale).sum()
                + self.noise_prior.log_prob(noise)
            ) / n
            loss.backward()
            return loss

        state = [p.detach().clone() for p in params]
        try:
            optimiser.step(closure)
        except Exception:  # a failed line search: keep the previous hyperparameters
            with torch.no_grad():
                for p, old in zip(params, state):
                    p.copy_(old)
        self.log_noise = log_noise.detach()
        self.mean = mean.detach()
        noise = float(self.log_noise.exp()) + 1e-4
        posterior = self.posterior_features(n) if self.posterior_features else width
        kernel = (self.kernel if posterior == width
                  else self.make_kernel(posterior, self.kernel.lengthscale))
        # The paths are f(x) + mean: the constant moves no maximiser, so they are drawn
        # from the GP of the residuals.
        with torch.no_grad():
            return RandomFeatureGP(kernel, noise=noise).fit(x_unit, ys - self.mean)

    def propose(self, x_unit, y, q, generator):
        import torch

        from rfgp.bayesopt import thompson_sample

        gp = self.fit(x_unit, (y - y.mean()) / y.std())
        bounds = torch.stack([torch.zeros(x_unit.shape[1]), torch.ones(x_unit.shape[1])]).double()
        return thompson_sample(
            gp,
            bounds,
            q,
            raw_samples=self.pool // 2,
            candidates=candidate_pool(x_unit, y, self.pool // 2, generator),
            num_restarts=2,
            steps=self.steps,
            lr=0.002,  # at most ~0.06 per coordinate: a local refinement of the best starts
            generator=generator,
        )


def fit_exact(x_unit, y):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    model = SingleTaskGP(x_unit, y.unsqueeze(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    return model


class ExactThompson:
    def __init__(self, pool: int):
        self.pool = pool

    def propose(self, x_unit, y, q, generator):
        import torch
        from botorch.generation import MaxPosteriorSampling

        model = fit_exact(x_unit, y)
        candidates = candidate_pool(x_unit, y, self.pool, generator)
        with torch.no_grad():
            return MaxPosteriorSampling(model=model, replacement=False)(candidates, num_samples=q)


class ExactPathwise:
    def __init__(self, pool: int):
        self.pool = pool

    def propose(self, x_unit, y, q, generator):
        import torch
        from botorch.sampling.pathwise import draw_matheron_paths
        from botorch.utils.sampling import optimize_posterior_samples

        model = fit_exact(x_unit, y)
        paths = draw_matheron_paths(model, sample_shape=torch.Size([q]))
        bounds = torch.stack([torch.zeros(x_unit.shape[1]), torch.ones(x_unit.shape[1])]).double()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x_opt, _ = optimize_posterior_samples(
                paths, bounds, raw_samples=self.pool, num_restarts=2
            )
        return x_opt.reshape(q, -1).detach()


class RandomSearch:
    def propose(self, x_unit, y, q, generator):
        import torch

        return torch.rand(q, x_unit.shape[1], generator=generator, dtype=x_unit.dtype)


def make_optimizer(method, dim, seed, num_features, pool, fit_iterations, posterior_max):
    """The proposer of ``method``; rfgp's posterior width grows with the data by
    :func:`rfgp.bayesopt.posterior_num_features` (at least ``num_features``, at most
    ``posterior_max``) except in ``rfgp-ts-fixed``."""
    from rfgp.bayesopt import posterior_num_features

    if method.startswith("rfgp-ts"):
        def grow(n):
            return posterior_num_features(n, minimum=num_features,
                                          maximum=max(posterior_max, num_features))

        return RfgpThompson(
            dim, num_features, seed, pool, fit_iterations,
            steps=0 if method == "rfgp-ts-candidates" else 30,
            posterior_features=None if method == "rfgp-ts-fixed" else grow,
            warm_start=method == "rfgp-ts-warm",
        )
    if method == "exact-ts":
        return ExactThompson(pool)
    if method == "exact-pathwise":
        return ExactPathwise(pool)
    return RandomSearch()


def run_one(problem_name, method, seed, q, iterations, num_features, pool, fit_iterations=20,
            posterior_max=4096):
    import torch
    from torch.quasirandom import SobolEngine

    torch.manual_seed(seed)  # BoTorch's samplers draw from the global RNG
    problem = make_problem(problem_name)
    dim = problem.dim
    lower, upper = problem.bounds[0].double(), problem.bounds[1].double()

    def evaluate(x_unit):
        return problem(lower + x_unit * (upper - lower)).double()

    x = SobolEngine(dim, scramble=True, seed=seed).draw(q).double()
    y = evaluate(x)
    generator = torch.Generator().manual_seed(1000 + seed)
    optimizer = make_optimizer(method, dim, seed, num_features, pool, fit_iterations,
                               posterior_max)
    trace = [{"evaluations": int(y.shape[0]), "best": float(y.max()), "seconds": 0.0}]
    for _ in range(iterations):
        batch, seconds = timed(partial(optimizer.propose, x, y, q, generator))
        x = torch.cat([x, batch.to(x)])
        y = torch.cat([y, evaluate(batch.to(x))])
        trace.append(
            {"evaluations": int(y.shape[0]), "best": float(y.max()), "seconds": seconds}
        )
    return trace


def timing_sweep(problem_name, sizes, methods, q, num_features, pool, fit_iterations=20,
                 posterior_max=4096):
    """Seconds of one BO iteration (fit from the initial hyperparameters + batch selection) at
    N Sobol points. Each rfgp method is one ``propose`` call; the exact GP is fitted once per
    N, each exact selection rule is timed on that fit, and its iteration is fit + selection."""
    import torch
    from botorch.generation import MaxPosteriorSampling
    from botorch.sampling.pathwise import draw_matheron_paths
    from botorch.utils.sampling import optimize_posterior_samples
    from torch.quasirandom import SobolEngine


    problem = make_problem(problem_name)
    lower, upper = problem.bounds[0].double(), problem.bounds[1].double()
    bounds = torch.stack([torch.zeros(problem.dim), torch.ones(problem.dim)]).double()
    rows = []
    for n in sizes:
        x = SobolEngine(problem.dim, scramble=True, seed=n).draw(n).double()
        y = problem(lower + x * (upper - lower)).double()
        generator = torch.Generator().manual_seed(0)
        candidates = candidate_pool(x, y, pool, generator)
        row = {"n": n}
        for method in methods:
            if method.startswith("rfgp"):
                proposer = make_optimizer(method, problem.dim, 0, num_features, pool,
                                          fit_iterations, posterior_max)
                start = time.perf_counter()
                proposer.propose(x, y, q, generator)
                row[method] = time.perf_counter() - start
        if any(m.startswith("exact") for m in methods):
            torch.manual_seed(0)
            start = time.perf_counter()
            model = fit_exact(x, y)
            fit_seconds = time.perf_counter() - start
            if "exact-ts" in methods:
                start = time.perf_counter()
                with torch.no_grad():
                    MaxPosteriorSampling(model=model, replacement=False)(candidates, num_samples=q)
                row["exact-ts"] = fit_seconds + time.perf_counter() - start
            if "exact-pathwise" in methods:
                start = time.perf_counter()
                paths = draw_matheron_paths(model, sample_shape=torch.Size([q]))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    optimize_posterior_samples(paths, bounds, raw_samples=pool, num_restarts=2)
                row["exact-pathwise"] = fit_seconds + time.perf_counter() - start
        print("sweep", problem_name, row, flush=True)
        rows.append(row)
    return rows
