r"""The exact GP baseline of the benchmarks: evidence-maximising hyperparameters by L-BFGS, the
exact posterior by a float64 Cholesky.

Model: :math:`y = m + f(x) + \varepsilon`, :math:`f \sim GP(0, s\,k)`, :math:`\varepsilon \sim
N(0, \sigma^2)`, with the ARD RBF kernel :math:`k(x, x') = \exp(-\tfrac12 \sum_j (x_j -
x'_j)^2 / \ell_j^2)` (GPyTorch's ``ScaleKernel(RBFKernel(ard_num_dims=d))`` with a constant
mean and a Gaussian likelihood). The negative log evidence per datum,

.. math::
    \mathcal L(\theta) = \frac1{2n}\left[r^\top K^{-1} r + \log|K| + n \log 2\pi\right],
    \qquad K = s\,k(X, X) + \sigma^2 I,\ r = y - m,

is minimised over :math:`\theta = (\log\ell, \log s, \log(\sigma^2 - \sigma^2_{\min}), m)` by
scipy's L-BFGS-B with the analytic gradient :math:`\partial_\theta \mathcal L = \frac1{2n}
\operatorname{tr}[(K^{-1} - \alpha\alpha^\top) \partial_\theta K]`, :math:`\alpha = K^{-1} r`.
For :math:`\log \ell_j` the trace is :math:`\sum_i z_{ij}^2 (M 1)_i - z_j^\top M z_j` with
:math:`M = (K^{-1} - \alpha\alpha^\top) \circ s k` and :math:`z = x / \ell`: one matrix product
instead of ``d`` passes over ``n x n`` matrices.

:func:`fit_hyperparameters` runs several starts (median-distance lengthscales scaled by
``scales``) to convergence on a subsample of ``start_rows`` rows, then continues the best on at
most ``max_rows`` rows. :class:`ExactPosterior` conditions on all training rows with one
in-place float64 Cholesky (``n^2`` doubles: 3.2 GB at ``n = 2 * 10^4``) and predicts in chunks.

Example::

    mean, var, info = exact_gp(x_train, y_train, x_test)   # var: of y (noise included)
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import scipy.optimize
import torch
from torch import Tensor

#: The smallest noise variance (in units of the targets' variance when they are standardised).
NOISE_FLOOR = 1e-6
#: Bounds on the log-parameters (inputs and targets standardised): lengthscales e^-7 .. e^7.
LOG_BOUNDS = {"lengthscale": (-7.0, 7.0), "outputscale": (-12.0, 6.0), "noise": (-16.0, 4.0)}


@dataclass
class ExactHyperparameters:
    """Hyperparameters of the exact GP: ``lengthscale`` ``(d,)``, ``outputscale`` ``s``, ``noise``
    ``sigma^2`` and the constant ``mean`` ``m``."""

    lengthscale: np.ndarray
    outputscale: float
    noise: float
    mean: float
    info: Dict = field(default_factory=dict)

    def to_vector(self) -> np.ndarray:
        """``theta = (log l, log s, log(sigma^2 - floor), m)``."""
        return np.concatenate([np.log(self.lengthscale), [math.log(self.outputscale),
                               math.log(self.noise - NOISE_FLOOR), self.mean]])

    @classmethod
    def from_vector(cls, theta: np.ndarray, info: Optional[Dict] = None) -> ExactHyperparameters:
        theta = np.asarray(theta, dtype=np.float64)
        return cls(np.exp(theta[:-3]), float(np.exp(theta[-3])),
                   float(np.exp(theta[-2]) + NOISE_FLOOR), float(theta[-1]), info or {})


def rbf_ard(x1: Tensor, x2: Tensor, lengthscale: Tensor, outputscale: float) -> Tensor:
    """``s exp(-||(x1 - x2) / l||^2 / 2)``: ``(n1, d), (n2, d) -> (n1, n2)``."""
    z1, z2 = x1 / lengthscale, x2 / lengthscale
    sq = (z1.square().sum(-1, keepdim=True) + z2.square().sum(-1) - 2 * z1 @ z2.T).clamp_min_(0)
    return sq.mul_(-0.5).exp_().mul_(outputscale)


def negative_log_evidence(theta: np.ndarray, x: Tensor, y: Tensor) -> Tuple[float, np.ndarray]:
    """The negative log evidence per datum and its gradient in ``theta`` (see the module).

    Args:
        theta: ``(d + 3,)`` ``(log l, log s, log(sigma^2 - floor), m)``.
        x: ``(n, d)`` float64 inputs.
        y: ``(n,)`` float64 targets.

    Returns:
        ``(value, gradient)``; ``(inf, zeros)`` when the kernel matrix is not positive definite.
    """
    n, d = x.shape
    hyper = ExactHyperparameters.from_vector(theta)
    ls = torch.from_numpy(hyper.lengthscale)
    kf = rbf_ard(x, x, ls, hyper.outputscale)  # [n, n]
    k = kf + hyper.noise * torch.eye(n, dtype=x.dtype)
    chol, fail = torch.linalg.cholesky_ex(k)
    if int(fail):
        return math.inf, np.zeros_like(theta)
    del k
    r = (y - hyper.mean).unsqueeze(-1)
    alpha = torch.cholesky_solve(r, chol)  # [n, 1]
    value = 0.5 * (float(r.T @ alpha) + 2 * float(chol.diagonal().log().sum())
                   + n * math.log(2 * math.pi)) / n
    w = torch.cholesky_inverse(chol)
    del chol
    w.sub_(alpha @ alpha.T)  # K^-1 - alpha alpha^T
    trace_w = float(w.diagonal().sum())
    m = w.mul_(kf)  # [n, n], in place of w
    del kf
    z = x / ls
    row = m.sum(-1)
    grad_ls = (z.square() * row.unsqueeze(-1)).sum(0) - (z * (m @ z)).sum(0)
    grad = np.empty_like(theta)
    grad[:d] = grad_ls.numpy() / n
    grad[d] = 0.5 * float(row.sum()) / n
    grad[d + 1] = 0.5 * (hyper.noise - NOISE_FLOOR) * trace_w / n
    grad[d + 2] = -float(alpha.sum()) / n
    return value, grad


def _median_scales(x: Tensor, generator: torch.Generator, pairs: int = 20000) -> np.ndarray:
    # Per-input median |x_j - x'_j| over random pairs: the scale a lengthscale starts from.
    n = x.shape[0]
    i = torch.randint(0, n, (pairs,), generator=generator)
    j = torch.randint(0, n, (pairs,), generator=generator)
    med = (x[i] - x[j]).abs().median(0).values.numpy()
    return np.where(med > 0, med, 1.0)


def _bounds(d: int):
    return ([LOG_BOUNDS["lengthscale"]] * d + [LOG_BOUNDS["outputscale"], LOG_BOUNDS["noise"],
                                               (None, None)])


def _minimise(theta0: np.ndarray, x: Tensor, y: Tensor, max_iter: int, gtol: float):
    result = scipy.optimize.minimize(
        negative_log_evidence, theta0, args=(x, y), jac=True, method="L-BFGS-B",
        bounds=_bounds(x.shape[1]),
        options={"maxiter": max_iter, "gtol": gtol, "ftol": 1e-13, "maxcor": 20})
    return result


def projected_gradient_norm(theta: np.ndarray, grad: np.ndarray, d: int) -> float:
    """The infinity norm of the gradient with components pushing out of an active bound
    dropped (zero at a bound-constrained optimum)."""
    g = grad.copy()
    for i, (low, high) in enumerate(_bounds(d)):
        if low is not None and theta[i] <= low + 1e-9 and g[i] > 0:
            g[i] = 0.0
        if high is not None and theta[i] >= high - 1e-9 and g[i] < 0:
            g[i] = 0.0
    return float(np.abs(g).max())


def fit_hyperparameters(
    x: Tensor,
    y: Tensor,
    max_rows: int = 10000,
    start_rows: int = 2000,
    scales: Sequence[float] = (0.5, 1.0, 2.0, 4.0),
    seed: int = 0,
    max_iter: int = 500,
    gtol: float = 1e-6,
) -> ExactHyperparameters:
    """Evidence-maximising hyperparameters by L-BFGS from several starts.

    Every start (lengthscales ``c * median |x_j - x'_j|`` for ``c`` in ``scales``, outputscale
    ``0.9 var(y)``, noise ``0.1 var(y)``, mean ``mean(y)``) runs to convergence on a random
    subsample of ``start_rows`` rows; the start with the largest evidence there continues to
    convergence on ``max_rows`` rows (all rows when there are fewer).

    Args:
        x: ``(n, d)`` inputs.
        y: ``(n,)`` targets.
        max_rows: rows of the final optimisation (at most 10^4 is cheap on two cores).
        start_rows: rows of each start's optimisation.
        scales: the lengthscale factors of the starts.
        seed: seed of the subsamples.
        max_iter: L-BFGS iterations per optimisation.
        gtol: convergence tolerance on the projected gradient (per datum).

    Returns:
        :class:`ExactHyperparameters` whose ``info`` holds the evidence per start, the final
        per-datum negative log evidence, projected gradient norm, iterations and seconds.
    """
    x = torch.as_tensor(x, dtype=torch.float64)
    y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
    n, d = x.shape
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    start = time.perf_counter()
    xs, ys = x[order[:start_rows]], y[order[:start_rows]]
    med = _median_scales(x, gen)
    var = float(ys.var())
    starts = []
    for c in scales:
        theta0 = ExactHyperparameters(c * med, 0.9 * var, 0.1 * var + NOISE_FLOOR,
                                      float(ys.mean())).to_vector()
        result = _minimise(theta0, xs, ys, max_iter, gtol)
        starts.append((float(result.fun), c, result.x))
    best = min(starts, key=lambda s: s[0])
    info = {"starts": {str(c): round(v, 6) for v, c, _ in starts}, "best_start": best[1],
            "start_rows": int(xs.shape[0])}
    theta = best[2]
    if n > start_rows:
        xf, yf = x[order[:max_rows]], y[order[:max_rows]]
        result = _minimise(theta, xf, yf, max_iter, gtol)
        theta = result.x
    else:
        xf, yf = xs, ys
    value, grad = negative_log_evidence(theta, xf, yf)
    info.update({"rows": int(xf.shape[0]), "nll_per_datum": value,
                 "projected_gradient": projected_gradient_norm(theta, grad, d),
                 "seconds": time.perf_counter() - start})
    return ExactHyperparameters.from_vector(theta, info)


class ExactPosterior:
    r"""The exact GP posterior given all training rows, by one float64 Cholesky.

    :math:`\mu(x_*) = m + s k(x_*, X) \alpha`, :math:`\alpha = K^{-1}(y - m)`;
    :math:`\operatorname{var} f(x_*) = s - \|L^{-1} s k(X, x_*)\|^2`, ``K = L L^T``. The ``n x n``
    matrix is built in row blocks into one array and factorised in place (LAPACK ``potrf``), so
    the peak memory is about ``8 n^2`` bytes.

    Args:
        x: ``(n, d)`` training inputs.
        y: ``(n,)`` targets.
        hyper: the hyperparameters.
    """

    def __init__(self, x: Tensor, y: Tensor, hyper: ExactHyperparameters,
                 block: int = 2048) -> None:
        self.x = torch.as_tensor(x, dtype=torch.float64)
        y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
        self.hyper = hyper
        self.lengthscale = torch.from_numpy(np.asarray(hyper.lengthscale, dtype=np.float64))
        n = self.x.shape[0]
        # torch's Cholesky, not scipy's potrf: scipy's bundled OpenBLAS potrf crashed (a
        # segfault) factorising bike's 15,641-row kernel matrix in place.
        jitter = 0.0
        for _attempt in range(6):
            k = torch.empty(n, n, dtype=torch.float64)
            for lo in range(0, n, block):
                k[lo:lo + block] = rbf_ard(self.x[lo:lo + block], self.x, self.lengthscale,
                                           hyper.outputscale)
            k.diagonal().add_(hyper.noise + jitter)
            chol, info = torch.linalg.cholesky_ex(k)
            del k
            if int(info) == 0:
                break
            jitter = max(jitter * 10, 1e-8 * hyper.outputscale)
            warnings.warn(f"exact GP: Cholesky failed, retrying with jitter {jitter:.2g}")
        else:
            raise RuntimeError("exact GP: the kernel matrix is not positive definite")
        self.chol = chol  # lower triangular L, K = L L^T
        self.jitter = jitter
        residual = (y - hyper.mean).reshape(-1, 1)
        self.alpha = torch.cholesky_solve(residual, chol).reshape(-1).numpy()
        self.log_evidence = -0.5 * (float(residual.reshape(-1) @ torch.from_numpy(self.alpha))
                                    + 2 * float(chol.diagonal().log().sum())
                                    + n * math.log(2 * math.pi))

    def predict(self, x: Tensor, chunk: int = 1024) -> Tuple[np.ndarray, np.ndarray]:
        """Mean and variance of ``f(x)`` (add ``hyper.noise`` for ``y``): two ``(m,)`` arrays.

        Test rows go ``chunk`` at a time, so the ``n x chunk`` cross-covariance bounds memory.
        """
        x = torch.as_tensor(x, dtype=torch.float64)
        means, variances = [], []
        for lo in range(0, x.shape[0], chunk):
            cross = rbf_ard(self.x, x[lo:lo + chunk], self.lengthscale,
                            self.hyper.outputscale).numpy()  # [n, c]
            means.append(self.hyper.mean + cross.T @ self.alpha)
            v = torch.linalg.solve_triangular(self.chol, torch.from_numpy(cross),
                                              upper=False).numpy()
            variances.append(np.maximum(self.hyper.outputscale - np.square(v).sum(0), 0.0))
        return np.concatenate(means), np.concatenate(variances)


def exact_gp(xtr: Tensor, ytr: Tensor, xte: Tensor, seed: int = 0, max_rows: int = 10000,
             start_rows: int = 2000) -> Tuple[np.ndarray, np.ndarray, Dict]:
    """The benchmark's exact GP: :func:`fit_hyperparameters` then :class:`ExactPosterior` on
    all training rows: ``(mean, variance of y, info)`` at ``xte``."""
    hyper = fit_hyperparameters(xtr, ytr, max_rows=max_rows, start_rows=start_rows, seed=seed)
    start = time.perf_counter()
    posterior = ExactPosterior(xtr, ytr, hyper)
    mean, var = posterior.predict(xte)
    info = {**hyper.info, "posterior_seconds": time.perf_counter() - start,
            "lengthscale": [round(float(v), 5) for v in hyper.lengthscale],
            "outputscale": hyper.outputscale, "noise": hyper.noise, "mean": hyper.mean,
            "log_evidence_per_datum": posterior.log_evidence / xtr.shape[0],
            "jitter": posterior.jitter, "solver": "cholesky float64"}
    return mean, var + hyper.noise, info
