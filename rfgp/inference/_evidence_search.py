r"""The evidence search: L-BFGS on the negative log evidence per datum, over one interface.

Every evidence search of the recipes is :func:`search_evidence` on an
:class:`EvidenceObjective`: the trainable parameters, the loss, which points are feasible and
what to write back at the end. :func:`regression_objective` builds the objective of a
:class:`~rfgp.RandomFeatureGP` (the random-feature evidence, the exact kernel's, or the sum of
the exact evidences of blocks of neighbouring rows, with the noise as a parameter);
:func:`dirichlet_objective` that of the classifier's ``C`` regressions with the transform's
fixed noise. :func:`maximize_evidence` is the regression search in one call;
:func:`search_two_paths` runs a search from a start along two paths (L-BFGS, and L-BFGS after
an Adam warm-up) and keeps the higher evidence, :func:`two_path_search` on the regression
objective. The recipes' stages (:mod:`rfgp.recipes`) decide what to search on, these
functions how.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, NamedTuple, Optional

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import ScaleKernel
from torch import Tensor

from rfgp._units import NOISE_FLOOR
from rfgp._validation import all_finite, check_class_targets
from rfgp.inference._evidence import fourier_kernel_negative_log_evidence, negative_log_evidence
from rfgp.inference._feature_gp import RandomFeatureGP
from rfgp.inference._heteroscedastic_evidence import heteroscedastic_negative_log_evidence
from rfgp.inference._selection import Objective, minimize_lbfgs, minimize_safeguarded
from rfgp.kernels._fourier import FourierFeatureKernel

__all__ = [
    "WARM_UP_LR",
    "WARM_UP_STEPS",
    "EvidenceObjective",
    "SearchResult",
    "bounded_lengthscale",
    "dirichlet_objective",
    "maximize_evidence",
    "regression_objective",
    "search_evidence",
    "search_two_paths",
    "two_path_search",
]


#: Adam steps and learning rate of the warm-up path of :func:`two_path_search`.
WARM_UP_STEPS = 100
WARM_UP_LR = 0.1


class SearchResult(NamedTuple):
    """What a search did: the loss at every evaluation, the L-BFGS iterations, and whether it
    stopped on its tolerances before its iteration limit."""

    losses: List[float]
    iterations: int
    converged: bool


@dataclass
class EvidenceObjective:
    """A negative log evidence per datum, as :func:`search_evidence` minimises it.

    Attributes:
        params: leaf tensors that require grad (changed in place).
        loss: the loss at their current values.
        feasible: whether the current values are allowed (others are backed off from).
        finish: called once after the search (writes derived values back to the model).
    """

    params: List[Tensor]
    loss: Callable[[], Tensor]
    feasible: Callable[[], bool] = lambda: True
    finish: Callable[[], None] = lambda: None


def search_evidence(objective: EvidenceObjective, max_iterations: int,
                    tolerance: float) -> SearchResult:
    """Minimise ``objective`` by L-BFGS (strong-Wolfe line search) until the largest gradient
    entry is below ``tolerance``, the loss changes by less than ``tolerance**2``, or
    ``max_iterations`` iterations; the best point evaluated is kept.

    Example:
        >>> w = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
        >>> result = search_evidence(EvidenceObjective([w], lambda: (w - 1).square().sum()),
        ...                          50, 1e-8)
        >>> result.converged, round(float(w.detach()), 6)
        (True, 1.0)
    """
    result = SearchResult(*minimize_lbfgs(objective.params, objective.loss, max_iterations,
                                          tolerance, objective.feasible))
    objective.finish()
    return result


@contextmanager
def bounded_lengthscale(kernel: ScaleKernel, upper: Optional[Tensor]) -> Iterator[None]:
    r"""Within the block, the base kernel's lengthscales are :math:`u \cdot \mathrm{sigmoid}(r)`
    in its raw parameter :math:`r`: an optimiser of the kernel's parameters keeps every
    lengthscale in :math:`(0, u)`. The kernel's own constraint and the lengthscale reached
    are restored afterwards. A lengthscale at or above its bound starts at 0.9 times it.

    Args:
        kernel: a ``ScaleKernel`` around a kernel with ARD lengthscales.
        upper: ``(d,)`` positive bounds, or ``None`` for no change.

    Example:
        >>> k = ScaleKernel(FourierFeatureKernel(16, ard_num_dims=2, seed=0)).double()
        >>> k.base_kernel.lengthscale = torch.tensor([[1.0, 9.0]], dtype=torch.float64)
        >>> with bounded_lengthscale(k, torch.tensor([4.0, 4.0], dtype=torch.float64)):
        ...     _ = k.base_kernel.raw_lengthscale.data.fill_(50.0)  # any raw value
        ...     inside = bool((k.base_kernel.lengthscale <= 4.0).all())
        >>> inside, type(k.base_kernel.raw_lengthscale_constraint).__name__
        (True, 'Positive')
    """
    if upper is None:
        yield
        return
    base = kernel.base_kernel
    num_inputs = base.raw_lengthscale.shape[-1]
    if upper.numel() != num_inputs:
        raise ValueError(
            f"lengthscale bounds must have one entry per lengthscale ({num_inputs}), got shape "
            f"{tuple(upper.shape)}"
        )
    upper = upper.detach().to(base.raw_lengthscale).reshape(num_inputs)
    if not bool((upper > 0).all()) or not all_finite(upper):
        raise ValueError(f"lengthscale bounds must be finite and positive, got {upper}")
    original = base.raw_lengthscale_constraint
    start = base.lengthscale.detach()
    start = torch.where(start < upper, start, 0.9 * upper)
    # Interval casts its bounds to torch's default dtype (float32): bounds beyond its range
    # (inputs at scales below about 1e-38 or above 1e38) would become 0 or inf. Its buffers
    # take the bounds in their own dtype instead.
    interval = Interval(0.0, 1.0)
    interval.lower_bound = torch.zeros_like(upper)
    interval.upper_bound = upper.clone()
    base.register_constraint("raw_lengthscale", interval)
    try:
        base.lengthscale = start
        yield
    finally:
        reached = base.lengthscale.detach().clone()
        base.register_constraint("raw_lengthscale", original)
        base.lengthscale = reached



def regression_objective(
    gp: RandomFeatureGP,
    x: Tensor,
    y: Tensor,
    exact: bool = False,
    blocks: Optional[List[Tensor]] = None,
    mean: bool = False,
) -> EvidenceObjective:
    r"""The objective :math:`-\log p(y) / (N T)` of ``gp`` over its kernel's trainable
    parameters and :math:`\log(\sigma^2 - \sigma^2_0)`, the floor :math:`\sigma^2_0` being
    :data:`~rfgp._units.NOISE_FLOOR` times the targets' mean square; ``finish`` sets
    the model noise to the point reached (the GP is not refitted).

    With ``mean``, a constant prior mean :math:`m_t` per target column too, with the prior
    :math:`m_t \sim N(0, v)`, :math:`v` the targets' mean square (the scale of any offset
    the targets can hold): the objective is
    :math:`-[\log p(y - m) + \log N(m; 0, v)] / (N T)`, whose minimiser in :math:`m` is
    its posterior mean given the hyperparameters (a mean the evidence cannot tell apart from
    the kernel's own constant part, as under long lengthscales and a large outputscale,
    stays near zero instead of drifting); ``finish`` sets
    :attr:`~rfgp.inference.RandomFeatureGP.prior_mean` to it. The gradient in :math:`m` is
    :math:`-\mathbf 1^\top C^{-1} (y - m) + m / v` per column, from the evidences'
    closed-form gradients in the targets.

    Args:
        gp: the model (its kernel's parameters and noise are changed by a search).
        x, y: training data.
        exact: the evidence of the exact kernel the features approximate (:math:`O(N^3)`;
            needs a ``ScaleKernel`` around a :class:`~rfgp.kernels.FourierFeatureKernel`).
        blocks: with ``exact``, row-index tensors that partition the rows
            (k-d blocks of neighbouring rows): the sum of the blocks' exact
            evidences, that of the kernel matrix with its cross-block entries set to zero.
        mean: search a constant prior mean too, from the model's own (without it, the
            evidence is that of ``y`` less the model's fixed prior mean).
    """
    if blocks is not None and not exact:
        raise ValueError("regression_objective(blocks=...) needs exact=True")
    floor = NOISE_FLOOR * max(float(y.square().mean()), 1e-300)
    start = (gp.noise.detach().to(x) - floor).clamp_min(floor)
    log_noise = start.log().clone().requires_grad_(True)
    params = [p for p in gp.kernel.parameters() if p.requires_grad] + [log_noise]
    scale = 1.0 / y.numel()
    # Real features of a ScaleKernel: the closed-form gradient (in weight space, or in function
    # space when N < D); other kernels go through the model's autograd evidence.
    base = gp.kernel.base_kernel if isinstance(gp.kernel, ScaleKernel) else None
    closed_form = (
        base is not None and not getattr(base, "is_complex", False)
        and base.num_outputs_per_input(x, x) == 1
    )
    y_cols = y.unsqueeze(-1) if y.dim() == 1 else y
    prior_variance = max(float(y_cols.square().mean()), 1e-300)
    if mean and not closed_form:
        raise TypeError(
            "regression_objective(mean=True) needs a ScaleKernel around a real kernel with one "
            f"output per input, got {type(gp.kernel).__name__}"
        )
    # The targets less the model's prior mean (searched from its value with ``mean``); the
    # autograd path below subtracts it itself.
    offset = None
    if mean or (closed_form and bool(gp.prior_mean.any())):
        offset = gp.prior_mean.detach().to(y_cols).reshape(-1).expand(y_cols.shape[1]).clone()
        if mean:
            params.append(offset.requires_grad_(True))
    # Random Fourier features (or their exact kernel): the evidence of the kernel's own
    # projections, with the gradient in closed form through them. A subclass that redefines
    # the features keeps the closed form of its own features below.
    fourier = isinstance(base, FourierFeatureKernel) and (
        exact or (closed_form and type(base)._features is FourierFeatureKernel._features))
    if exact and not isinstance(base, FourierFeatureKernel):
        raise TypeError(
            "the exact evidence needs a ScaleKernel around a FourierFeatureKernel, "
            f"got {type(gp.kernel).__name__}"
        )
    # The inputs as the kernel sees them, prepared once (checks, active_dims), not per step.
    prepared = base.prepare_input(x) if fourier else x

    def loss() -> Tensor:
        targets = y_cols if offset is None else y_cols - offset
        if fourier:
            value = fourier_kernel_negative_log_evidence(
                base, prepared, targets, base.lengthscale.reshape(-1), gp.kernel.outputscale,
                log_noise.exp() + floor, exact, blocks)
        elif closed_form:
            z = base.features(x) * gp.kernel.outputscale.sqrt()
            value = negative_log_evidence(z, targets, log_noise.exp() + floor)
        else:
            value = -gp.log_marginal_likelihood(x, y, log_noise.exp() + floor)
        if mean:  # the prior N(0, v) of the mean, less its constant
            value = value + 0.5 * offset.square().sum() / prior_variance
        return value * scale

    def finish() -> None:
        gp.noise = (log_noise.detach().exp() + floor).to(gp.noise.dtype).reshape(
            gp.noise.shape)
        if mean:
            found = offset.detach()
            gp.prior_mean = found[0] if found.numel() == 1 and y.dim() == 1 else found

    # A lengthscale that underflowed to 0 is outside the exact kernel's domain: the line
    # search backs off from it as from a non-finite loss.
    feasible = (lambda: bool((base.lengthscale > 0).all())) if exact else (lambda: True)
    return EvidenceObjective(params, loss, feasible, finish)


def dirichlet_objective(kernel: ScaleKernel, x: Tensor, targets: Tensor,
                        noise: Tensor) -> EvidenceObjective:
    r"""The objective :math:`-\sum_c \log N(y_c; 0, K + \mathrm{diag}(s_{\cdot c})) / (N C)`
    of the classifier's ``C`` Dirichlet regressions over ``kernel``'s trainable parameters,
    with the transform's noise ``s`` fixed (the ``C`` weighted Gram matrices share one
    :math:`Z^\top Z`).

    Args:
        kernel: a ``ScaleKernel`` around a real random-feature kernel with one output per
            input.
        x: ``(N, d)`` inputs.
        targets: ``(N, C)`` centred Dirichlet targets.
        noise: ``(N, C)`` fixed positive noise variances.
    """
    if not isinstance(kernel, ScaleKernel):
        raise TypeError(f"kernel must be a ScaleKernel, got {type(kernel).__name__}")
    x, targets, noise = check_class_targets(x, targets, noise)
    base = kernel.base_kernel
    params = [p for p in kernel.parameters() if p.requires_grad]
    scale = 1.0 / targets.numel()

    def loss() -> Tensor:
        z = base.features(x) * kernel.outputscale.sqrt()
        return heteroscedastic_negative_log_evidence(z, targets, noise) * scale

    return EvidenceObjective(params, loss)


def maximize_evidence(
    gp: RandomFeatureGP,
    x: Tensor,
    y: Tensor,
    max_iterations: int = 100,
    tolerance: float = 1e-6,
    exact: bool = False,
    max_lengthscale: Optional[Tensor] = None,
    blocks: Optional[List[Tensor]] = None,
    mean: bool = False,
) -> SearchResult:
    r"""Maximise :math:`\log p(y)` over the kernel's hyperparameters and the model noise:
    :func:`search_evidence` on :func:`regression_objective`, within
    :func:`bounded_lengthscale` when ``max_lengthscale`` is given.

    Args:
        gp: the model (its kernel's parameters and :attr:`~RandomFeatureGP.noise` are changed;
            it is not refitted).
        x, y: training data.
        max_iterations: L-BFGS iterations (each one line search, a few evaluations).
        tolerance: gradient tolerance on the loss per datum.
        exact, blocks: the evidence (see :func:`regression_objective`).
        mean: search the prior mean too (see :func:`regression_objective`).
        max_lengthscale: ``(d,)`` upper bounds on the lengthscales (``None``: unbounded);
            needs a ``ScaleKernel`` around a kernel with ARD lengthscales.

    Returns:
        The :class:`SearchResult`.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 1, generator=g, dtype=torch.float64)
        >>> y = torch.sin(8 * x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> k = ScaleKernel(FourierFeatureKernel(128, sampling="orthogonal", seed=0)).double()
        >>> gp = RandomFeatureGP(k, noise=0.5)
        >>> result = maximize_evidence(gp, x, y - y.mean(), 100, 1e-5)
        >>> bool(0.003 < float(gp.noise) < 0.03)
        True
    """
    if max_lengthscale is not None:
        if not isinstance(gp.kernel, ScaleKernel):
            raise TypeError(
                "maximize_evidence(max_lengthscale=...) needs a ScaleKernel around a kernel "
                f"with lengthscales, got {type(gp.kernel).__name__}"
            )
        with bounded_lengthscale(gp.kernel, max_lengthscale):
            return maximize_evidence(gp, x, y, max_iterations, tolerance, exact, None, blocks,
                                     mean)
    return search_evidence(regression_objective(gp, x, y, exact, blocks, mean), max_iterations,
                           tolerance)


def two_path_search(
    gp: RandomFeatureGP,
    x: Tensor,
    y: Tensor,
    max_iterations: int = 200,
    tolerance: float = 1e-4,
    exact: bool = False,
    blocks: Optional[List[Tensor]] = None,
    mean: bool = False,
) -> SearchResult:
    r"""The evidence search from ``gp``'s hyperparameters along two paths, the higher evidence
    kept: L-BFGS from the start, and L-BFGS after :data:`WARM_UP_STEPS` Adam steps
    (learning rate :data:`WARM_UP_LR` in the raw parameters) from the same start.

    From a start where the signal is smoothed away (every lengthscale near
    :math:`\sqrt d` standard deviations when few of ``d`` inputs matter), the evidence is
    nearly flat toward the relevant inputs and L-BFGS stops at "all noise" on its gradient
    tolerance; Adam's steps are of the learning rate's size whatever the gradient's, so they
    leave such a plateau. Neither path is better everywhere; the evidence decides.

    Args:
        gp, x, y, max_iterations, tolerance, exact, blocks, mean: as in
            :func:`maximize_evidence`.

    Returns:
        The :class:`SearchResult` of the kept path (its losses last, after the other's).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.rand(200, 1, generator=g, dtype=torch.float64)
        >>> y = torch.sin(8 * x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> k = ScaleKernel(FourierFeatureKernel(64, sampling="orthogonal", seed=0)).double()
        >>> gp = RandomFeatureGP(k, noise=0.5)
        >>> result = two_path_search(gp, x, y - y.mean(), 100, 1e-5)
        >>> bool(0.003 < float(gp.noise) < 0.03)
        True
    """
    return search_two_paths(lambda: regression_objective(gp, x, y, exact, blocks, mean),
                            lambda: _hyperparameters(gp), lambda state: _restore(gp, state),
                            max_iterations, tolerance)


def search_two_paths(objective: Callable[[], EvidenceObjective], save: Callable[[], Any],
                     restore: Callable[[Any], None], max_iterations: int,
                     tolerance: float) -> SearchResult:
    r""":func:`search_evidence` from the current point along two paths, the lower loss kept:
    L-BFGS from the start, and L-BFGS after :data:`WARM_UP_STEPS` Adam steps (learning rate
    :data:`WARM_UP_LR`) from the same start. The direct path is the single-path search
    itself, so the point kept is never worse than it.

    Args:
        objective: builds the :class:`EvidenceObjective` at the current point (called once
            per run).
        save: the state of the parameters the objective changes; ``restore(save())`` puts
            it back.
        restore: see ``save``.
        max_iterations, tolerance: of each L-BFGS run (:func:`search_evidence`).

    Returns:
        The :class:`SearchResult` of the kept path (its losses last, after the other's).

    Example:
        >>> w = torch.tensor([3.0], dtype=torch.float64, requires_grad=True)
        >>> def state():
        ...     return w.detach().clone()
        >>> def put(value):
        ...     w.data.copy_(value)
        >>> def objective():
        ...     return EvidenceObjective([w], lambda: (w - 1).square().sum())
        >>> result = search_two_paths(objective, state, put, 50, 1e-8)
        >>> round(float(w.detach()), 6)
        1.0
    """
    start = save()
    direct = search_evidence(objective(), max_iterations, tolerance)
    reached = save()
    restore(start)
    warm_objective = objective()
    warm = Objective(warm_objective.params, warm_objective.loss, warm_objective.feasible)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a warm-up is not run to convergence
        try:
            warm_losses = minimize_safeguarded(warm, "adam", WARM_UP_STEPS, WARM_UP_LR)
        except ValueError:  # the start itself cannot be evaluated: the direct path stands
            warm_losses = []
    warm_objective.finish()
    warmed = search_evidence(objective(), max_iterations, tolerance)
    best_direct = min(direct.losses, default=math.inf)
    best_warmed = min(warmed.losses, default=math.inf)
    iterations = direct.iterations + warmed.iterations
    if best_warmed < best_direct:
        return SearchResult(direct.losses + warm_losses + warmed.losses, iterations,
                            warmed.converged)
    restore(reached)
    return SearchResult(warm_losses + warmed.losses + direct.losses, iterations,
                        direct.converged)


def _hyperparameters(gp: RandomFeatureGP):
    """The kernel's trainable parameters, the noise and the prior mean, copied (the random
    weights stay)."""
    return ([p.detach().clone() for p in gp.kernel.parameters()], gp.noise.detach().clone(),
            gp.prior_mean.detach().clone())


def _restore(gp: RandomFeatureGP, state) -> None:
    values, noise, mean = state
    with torch.no_grad():
        for param, value in zip(gp.kernel.parameters(), values):
            param.copy_(value)
    gp.noise = noise.clone()
    gp.prior_mean = mean.clone()
