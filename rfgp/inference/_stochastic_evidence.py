r"""The log evidence at large ``D``: stochastic Lanczos quadrature and an unbiased gradient.

With real-form features :math:`Z`, :math:`B = Z^\top S^{-1} Z + I` and
:math:`h = Z^\top S^{-1} y`, per output column

.. math::
    \log p(y) = -\tfrac12\left[y^\top S^{-1} y - h^\top B^{-1} h + \log|B| + \log|S|
    + N \log 2\pi\right].

The quadratic term is exact up to the CG tolerance (:math:`w = B^{-1} h` by CG). With the Nyström
preconditioner :math:`P`, :math:`\log|B| = \log|P| + \mathrm{tr}\log(P^{-1/2} B P^{-1/2})`; the
trace is estimated with Rademacher probes :math:`v` (:math:`E[v v^\top] = I`), each
:math:`v^\top \log(\tilde B) v` by the Lanczos quadrature of a preconditioned CG run on
:math:`B u = P^{1/2} v` (whose Lanczos start vector is :math:`v`); the standard error is that of
the mean over probes.

The gradient is unbiased too. For the quadratic term, with :math:`w` held fixed,
:math:`\|S^{-1/2}(y - Z w)\|^2 + \|w\|^2` equals :math:`y^\top S^{-1} y - h^\top B^{-1} h` at
:math:`w = B^{-1}h` and has its gradient there (the gradient in :math:`w` vanishes). For the
log-determinant, :math:`\partial \log|B| = \mathrm{tr}(B^{-1}\partial B) =
E[u^\top \partial B\, r]` with :math:`u = B^{-1}P^{1/2}v`, :math:`r = P^{-1/2}v`, carried by the
surrogate :math:`(Z u)^\top S^{-1} (Z r)` with :math:`u, r` fixed; autograd differentiates the
feature map and the noise chunk by chunk (recomputing each chunk's features in the backward pass).
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from rfgp._ops import power_of_two_scale
from rfgp._validation import check_generator
from rfgp.inference._cg_solver import ConjugateGradientSolver, fitted_log_evidence
from rfgp.inference._evidence import LOG_2PI, check_representable
from rfgp.inference._feature_operator import FeatureOperator
from rfgp.inference._iterative import CGSettings
from rfgp.inference._logdet_probes import column_logdets, logdet_probes, probe_standard_error
from rfgp.inference._noise import evidence_rows

__all__ = ["stochastic_log_evidence"]



def _chunk_terms(feature_map, weights: Tensor, left: Tensor, right: Tensor, probe_columns: Tensor,
                 x: Tensor, y: Tensor, noise: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """One chunk's data-fit, trace surrogate and log-noise sums (differentiable)."""
    z = feature_map.real_rows(x).to(weights.dtype)  # (n, W)
    noise = noise.to(weights.dtype)
    inverse = noise.reciprocal()
    quad = ((y - z @ weights).square() * inverse).sum(0)  # (T,)
    trace = ((z @ left) * (z @ right) * inverse[:, probe_columns]).sum(0)  # (G P,)
    return quad, trace, noise.log().sum(0)


def stochastic_log_evidence(gp: Any, x: Optional[Tensor] = None, y: Optional[Tensor] = None,
                            noise: Any = None, *, num_probes: Optional[int] = None,
                            generator: Optional[torch.Generator] = None) -> Tuple[Tensor, float]:
    r"""The log evidence of a random-feature GP by CG and stochastic Lanczos quadrature.

    The quadratic term is exact up to the CG tolerance; the log-determinant is estimated with
    Rademacher probes by the Lanczos quadrature of preconditioned CG runs (the standard error
    is that of the mean over probes). Without ``x`` and ``y`` it is the fitted
    model's (an iterative fit's estimate; the exact value, standard error 0, for the other
    solvers). With them it is recomputed from the data and is differentiable in the kernel's
    hyperparameters and ``noise``; its gradient is an unbiased estimate of the exact one. The
    probes are drawn from ``generator`` (default: seed 0), so repeated calls with the same
    hyperparameters give the same value and an optimiser sees a smooth objective.

    Args:
        gp: a :class:`~rfgp.RandomFeatureGP` (its kernel, noise and CG settings are used).
        x, y, noise: as in :meth:`~rfgp.RandomFeatureGP.log_marginal_likelihood`.
        num_probes: Rademacher probes (default: the model's, 16).
        generator: ``torch.Generator`` of the probes (on the CPU).

    Returns:
        ``(value, standard_error)``: a scalar tensor and a float, the standard error of the
        log-determinant's Monte Carlo mean.

    Raises:
        TypeError: ``gp`` is not a :class:`~rfgp.RandomFeatureGP`, or ``generator`` is not a
            ``torch.Generator``; ValueError: ``num_probes`` below 2 or a generator off the CPU.
            Arguments are checked before anything is computed; the fitted model's settings
            are never changed (``num_probes`` applies to this call alone).

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.rand(100, 2, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=0.1, solve="cg")
        >>> value, error = stochastic_log_evidence(gp, x, torch.sin(4 * x[:, 0]))
        >>> value.shape, error >= 0
        (torch.Size([]), True)
    """
    # Recognised by its fitted-solver interface: RandomFeatureGP's module imports this one.
    if not all(hasattr(gp, name) for name in ("cg_settings", "feature_map", "_current")):
        raise TypeError(f"gp must be a RandomFeatureGP, got {type(gp).__name__}")
    if (x is None) != (y is None):
        raise ValueError("x and y must be given together (or both omitted)")
    generator = check_generator("generator", generator)
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (the probes are drawn on the "
                         f"CPU), got one on {generator.device}")
    # Validated before anything else: a fitted model's own settings are never changed.
    settings: CGSettings = gp.cg_settings
    if num_probes is not None:
        settings = CGSettings(**{**settings.state(), "num_probes": num_probes})
    if x is None:
        if noise is not None:
            raise ValueError("noise needs x and y; without them the fitted noise is used")
        state = gp._current("stochastic_log_evidence")
        if not isinstance(state.solver, ConjugateGradientSolver):
            return gp.log_marginal_likelihood(), 0.0
        # A copy of the fitted solver that differs in its settings alone.
        solver = copy.copy(state.solver)
        solver.settings = settings
        value, error = fitted_log_evidence(solver, generator)
        return value, error
    fm = gp.feature_map
    p = fm.outputs_per_input
    x, rows_y, rows_noise = evidence_rows(fm, gp.noise, x, y, noise, gp.prior_mean)
    rows_noise = rows_noise.to(device=x.device)

    scale = power_of_two_scale(rows_y)
    dtype = gp.statistics_dtype or x.dtype
    chunk = gp._factory.default_chunk()
    targets = (rows_y.detach() / scale).to(dtype)
    op = FeatureOperator(fm, [(x.detach(), targets, rows_noise.detach().to(dtype))], False,
                         dtype, chunk, settings.cache_bytes)
    solver = ConjugateGradientSolver(op, settings, False, None, scale)
    with torch.no_grad():
        solver.factorise(None)
        estimates, left, right, columns = logdet_probes(solver, generator)
    groups = solver.groups()
    weights = solver.mean_weights
    probe_columns = torch.as_tensor(columns, dtype=torch.long, device=x.device)
    t = targets.shape[1]
    quad = (weights.square().sum(0)).clone()
    trace = (left * right).sum(0)
    log_noise = torch.zeros(t, dtype=dtype, device=x.device)
    differentiate = torch.is_grad_enabled()
    for start in range(0, x.shape[0], chunk):
        stop = min(start + chunk, x.shape[0])
        rows = slice(start * p, stop * p)
        args = (fm, weights, left, right, probe_columns, x[start:stop], targets[rows],
                rows_noise[rows])
        if differentiate:
            terms = checkpoint(_chunk_terms, *args, use_reentrant=False)
        else:
            terms = _chunk_terms(*args)
        quad, trace = quad + terms[0], trace + terms[1]
        log_noise = log_noise + terms[2]
    probes = settings.num_probes
    logdet = column_logdets(estimates, groups, t, quad.detach())
    for g, cols in enumerate(groups):
        block = trace[g * probes : (g + 1) * probes]
        logdet = logdet.index_add(0, torch.as_tensor(cols, device=x.device),
                                  (block - block.detach()).mean().expand(len(cols)))
    total = -0.5 * (quad * scale**2 + logdet + log_noise + rows_y.shape[0] * LOG_2PI).sum()
    return check_representable(total, scale), probe_standard_error(estimates, groups)
