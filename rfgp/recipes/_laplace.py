r"""The Laplace average: the final kernel weighs the lengthscales the data leave uncertain.

The evidence maximum is one point of a posterior that, on a few hundred or thousand rows, is
broad. The Hessian of the last search stage's evidence at its maximum
(:func:`~rfgp.inference._laplace.evidence_hessian`, :math:`d + 3` gradient evaluations, scaled
to all rows) gives the Laplace approximation, from which ``lengthscale_draws`` lengthscale
vectors are drawn; the final kernel is their average,
:math:`\bar k = \frac{s}{S} \sum_i k_{\ell^{(i)}}` (:func:`lengthscale_mixture_kernel`),
which random Fourier features make free: each draw gets ``D / S`` of the ``D`` features. On
many rows the posterior narrows and the average tends to the kernel at the maximum.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Optional

import torch
from gpytorch.kernels import AdditiveKernel
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from rfgp._report import FitReport
from rfgp._validation import all_finite, check_int, check_seed, check_tensor
from rfgp.inference import evidence_hessian, lengthscale_draws
from rfgp.recipes._schedule import Plan
from rfgp.recipes._stage import RecipeData, Searched, Stage
from rfgp.recipes._start import make_ard_kernel, set_hyperparameters

__all__ = ["LAPLACE", "hessian_cost", "laplace", "lengthscale_mixture_kernel", "plan_laplace"]

# A bounded lengthscale this close to its bound is held there by the Laplace draws: the
# maximum lies on the bound, where the evidence's curvature says nothing about the spread.
_AT_BOUND = 0.99


def hessian_cost(options: Any, input_dim: int, evaluation: float) -> float:
    """Multiply-adds of the Laplace Hessian: :math:`d + 3` gradients of an evidence whose
    evaluation costs ``evaluation`` (none without ``lengthscale_draws``)."""
    return (input_dim + 3) * evaluation if options.lengthscale_draws else 0.0


def plan_laplace(plan: Plan) -> None:
    """Book the Hessian of the last search stage's evidence; its bound on the ledger is the
    Hessian of that evidence at its most rows (``plan.most_evaluation``)."""
    plan.bounds["laplace"] = hessian_cost(plan.options, plan.input_dim, plan.most_evaluation)
    hessian = hessian_cost(plan.options, plan.input_dim, plan.evaluation)
    if hessian:
        plan.book("laplace", hessian)


def laplace(data: RecipeData, searched: Searched, report: FitReport) -> Optional[Searched]:
    """Draw ``lengthscale_draws`` lengthscale vectors from the Laplace approximation at the
    searched model and hand them on relative to its lengthscales (``draws``), so that every
    candidate centre of the final fit gets the same relative spread (``None`` without draws).

    Nothing is drawn (the kernel at the maximum is kept) where the outputscale reached zero
    or, with a warning, where the evidence cannot be factorised next to the maximum."""
    num_draws = data.options.lengthscale_draws
    if not num_draws:
        return None
    gp = searched.model
    xs, ys = searched.data(data)
    centre = searched.lengthscale()
    outputscale = gp.kernel.outputscale.detach()
    if not float(outputscale) > 0:
        return searched
    try:
        hessian = evidence_hessian(gp.kernel.base_kernel, xs, ys, centre, outputscale,
                                   gp.noise.detach().to(xs),
                                   exact=searched.evidence != "features", blocks=searched.blocks)
    except NotPSDError:
        hessian = None
    if hessian is None or not all_finite(hessian):
        warnings.warn(
            "fit_auto: the evidence could not be evaluated next to its maximum, so the "
            "lengthscales are not averaged (the kernel at the maximum is used)",
            RuntimeWarning,
        )
        return searched
    bound = searched.bound
    fixed = None if bound is None else centre >= _AT_BOUND * bound
    # The Hessian is per datum: scaled to every row (the stage's rows may be fewer).
    draws = lengthscale_draws(centre, hessian * data.num_entries, num_draws, data.generator,
                              fixed, bound)
    return replace(searched, draws=draws / centre)


def lengthscale_mixture_kernel(
    num_features: int,
    lengthscales: Tensor,
    outputscale: Tensor,
    spectral: str = "rbf",
    seed: int = 0,
) -> AdditiveKernel:
    r"""The average of ``S`` ARD kernels at the lengthscales ``lengthscales[i]``, as random
    Fourier features: ``num_features`` columns in all, about ``num_features / S`` per kernel.

    .. math::
        \bar k(x, x') = \frac{s}{S} \sum_{i=1}^{S} k_{\ell^{(i)}}(x, x'),

    an ``AdditiveKernel`` of ``S`` parts ``ScaleKernel(FourierFeatureKernel(D_i))`` (orthogonal
    frequencies, independent per part) with outputscale :math:`s / S` each. Its features are
    the parts' side by side, so the fit costs what one kernel of ``num_features`` features
    costs, and their kernel estimate is unbiased for :math:`\bar k`. With more draws than
    frequencies (``S > num_features / 2``) the first ``num_features / 2`` draws are used.

    Args:
        num_features: ``D`` in all (even).
        lengthscales: ``(S, d)`` positive lengthscales, one row per part (see
            :func:`~rfgp.inference._laplace.lengthscale_draws`).
        outputscale: 0-d positive :math:`s`.
        spectral: ``"rbf"`` or a Matérn kernel.
        seed: seed of the parts' frequencies.

    Returns:
        The kernel, in ``lengthscales``' dtype and device.

    Example:
        >>> ells = torch.tensor([[1.0, 2.0], [1.5, 2.5]], dtype=torch.float64)
        >>> k = lengthscale_mixture_kernel(64, ells, torch.tensor(2.0, dtype=torch.float64))
        >>> [part.base_kernel.num_features for part in k.kernels]
        [32, 32]
        >>> float(k.kernels[0].outputscale.detach())
        1.0
    """
    num_features = check_int("num_features", num_features, minimum=2)
    if num_features % 2:
        raise ValueError(f"num_features must be even (cos and sin columns), got {num_features}")
    lengthscales = check_tensor("lengthscales", lengthscales, min_dim=2, max_dim=2,
                                non_empty=True).detach()
    if not bool((lengthscales > 0).all()):
        raise ValueError("lengthscales must be positive")
    outputscale = check_tensor("outputscale", outputscale).detach().to(lengthscales)
    if outputscale.dim() != 0:
        raise ValueError(
            f"outputscale must be a 0-d tensor (one outputscale shared by the parts), got shape "
            f"{tuple(outputscale.shape)}"
        )
    if not float(outputscale) > 0:
        raise ValueError(f"outputscale must be positive, got {float(outputscale)}")
    seed = check_seed("seed", seed)
    frequencies = num_features // 2
    parts = min(lengthscales.shape[0], frequencies)
    sizes = [frequencies // parts + (i < frequencies % parts) for i in range(parts)]
    seeds = torch.randint(2**62, (parts,), generator=torch.Generator().manual_seed(seed))
    kernels = []
    for i, size in enumerate(sizes):
        part = make_ard_kernel(2 * size, lengthscales.shape[1], spectral, seed=int(seeds[i]),
                               dtype=lengthscales.dtype).to(lengthscales.device)
        set_hyperparameters(part, lengthscales[i], outputscale / parts)
        kernels.append(part)
    return AdditiveKernel(*kernels)


LAPLACE = Stage("laplace", laplace, ((40, plan_laplace),))
