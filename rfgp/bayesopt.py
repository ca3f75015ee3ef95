r"""Batch Thompson sampling with random-feature posterior sample paths.

Thompson sampling picks the next batch of ``q`` evaluations by drawing ``q`` functions from the
posterior and evaluating each function's maximiser. With random features a posterior draw is a
whole function, :math:`f_s(x) = \mathrm{Re}\{\Phi(x)^\top w_s\}` with weights
:math:`w_s \sim N(\mu_w, B^{-1})` drawn once (:meth:`rfgp.RandomFeatureGP.sample_functions`), so
it is cheap to evaluate anywhere and differentiable in :math:`x`: each path is maximised by
projected gradient ascent from many starts, at ``O(D)`` per point and path, however many
observations the model holds. The recipe:

1. fit a :class:`~rfgp.RandomFeatureGP` (any rfgp kernel or sum / product of them, fixed or
   heteroscedastic noise, ``fit``, ``fit_stream`` or ``update``) on standardised targets;
2. draw ``q`` sample paths;
3. evaluate all paths on ``raw_samples`` random points of the box (plus any ``candidates``, e.g.
   perturbations of the best points so far), keep each path's ``num_restarts`` best points;
4. run Adam on those starts in the unit cube, clamping to the box after each step, keeping the
   best point each path has seen;
5. evaluate the ``q`` maximisers, :meth:`~rfgp.RandomFeatureGP.update` the model (or refit after
   re-standardising), repeat.

:func:`thompson_sample` does steps 2-4; :func:`maximize_paths` does 3-4 for any callable paths.
Fit a constant prior mean with the hyperparameters (the model's ``prior_mean``) and start
each hyperparameter fit from the priors; the
Thompson-sampling guide has the recipe. Once ``N`` is many times ``D``, draw the paths from a
posterior with more features than the hyperparameter fit used (:func:`posterior_num_features`):
a weight-space posterior with ``D`` features and ``N >> D`` observations is confident in every
direction of its ``D``-dimensional weight space, so its paths all look like the posterior mean
and the batch loses its diversity.

Example:
    >>> from rfgp import RandomFeatureGP
    >>> from rfgp.kernels import FourierFeatureKernel
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.rand(30, 2, generator=g, dtype=torch.float64)
    >>> y = -((x - 0.3) ** 2).sum(-1)
    >>> gp = RandomFeatureGP(FourierFeatureKernel(128, seed=0).double(), noise=1e-3)
    >>> gp = gp.fit(x, (y - y.mean()) / y.std())
    >>> bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    >>> batch = thompson_sample(gp, bounds, q=4, raw_samples=256, steps=20, generator=g)
    >>> batch.shape
    torch.Size([4, 2])
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from rfgp._validation import (
    KERNEL_INPUT_DTYPES,
    all_finite,
    check_generator,
    check_int,
    check_positive,
    check_real,
    check_tensor,
)

__all__ = ["maximize_paths", "posterior_num_features", "thompson_sample"]


def posterior_num_features(
    num_data: int, factor: float = 2.0, minimum: int = 512, maximum: int = 4096
) -> int:
    r"""Features ``D`` of the posterior Thompson paths are drawn from, for ``N`` observations.

    The smallest power of two :math:`D \ge` ``factor`` :math:`\cdot N`, clipped to
    ``[minimum, maximum]``. A weight-space posterior :math:`w \sim N(\mu_w, B^{-1})`,
    :math:`B = \Phi^\top \Phi / \sigma^2 + I`, has ``D`` directions: with :math:`N \ge D`
    well-spread observations every direction is pinned by the data, :math:`B^{-1}` is small
    everywhere and the paths are nearly the posterior mean even far from the data (variance
    starvation); with :math:`D \ge 2N` at least :math:`D - N` directions keep their prior
    variance, as the exact GP's posterior does away from the data. The fit costs
    :math:`O(N D^2 + D^3)` once per batch; the hyperparameters can be fitted with fewer
    features (they need the kernel's shape, not its posterior's rank). In the
    Bayesian-optimisation benchmark (q = 50, up to N = 1500 against 512 fitted features) it
    cost 1.4x to 2.6x per iteration and did not lower the regret: it is a safeguard for
    ``N`` many times the fit's ``D``.

    Args:
        num_data: ``N``, the number of observations (at least 1).
        factor: features per observation to aim for (positive).
        minimum, maximum: even bounds on ``D`` (``2 <= minimum <= maximum``).

    Returns:
        ``D``, an even integer.

    Example:
        >>> posterior_num_features(100), posterior_num_features(600), posterior_num_features(5000)
        (512, 2048, 4096)
    """
    num_data = check_int("num_data", num_data)
    factor = check_positive("factor", factor)
    minimum = check_int("minimum", minimum, minimum=2)
    maximum = check_int("maximum", maximum, minimum=minimum)
    for name, value in (("minimum", minimum), ("maximum", maximum)):
        if value % 2:
            raise ValueError(f"{name} must be even (a cos and a sin column per frequency), "
                             f"got {value}")
    target = check_real("factor * num_data", factor * num_data, low=0.0)
    features = 2
    while features < target and features < maximum:
        features *= 2
    return max(minimum, min(features, maximum))


def _check_bounds(bounds: Tensor) -> Tensor:
    check_tensor("bounds", bounds, min_dim=2, max_dim=2)
    if bounds.dtype not in KERNEL_INPUT_DTYPES:
        # Adam's steps underflow in half precision and the points turn NaN.
        raise TypeError(f"bounds must have dtype torch.float32 or torch.float64, got "
                        f"{bounds.dtype}")
    if bounds.shape[0] != 2 or bounds.shape[1] < 1:
        raise ValueError(f"bounds must have shape (2, d), got {tuple(bounds.shape)}")
    if not bool((bounds[0] < bounds[1]).all()):
        raise ValueError("bounds must have lower < upper in every dimension (row 0 < row 1)")
    # Points are lower + u * width: an infinite width (e.g. bounds of +-1e308) would make them
    # infinite.
    width = bounds[1] - bounds[0]
    if not all_finite(width):
        wide = (~torch.isfinite(width)).nonzero().flatten().tolist()
        raise ValueError(
            f"bounds must have a finite width (upper - lower) in every dimension, got an "
            f"infinite width in dimension(s) {wide}; rescale the inputs to a smaller box"
        )
    return bounds


def _in_box(unit: Tensor, bounds: Tensor) -> Tensor:
    """Points ``lower + u (upper - lower)`` of the unit cube's ``u``, clamped into the box
    (rounding can carry ``u = 1`` one ulp past ``upper``)."""
    point = bounds[0] + unit * (bounds[1] - bounds[0])
    return torch.minimum(torch.maximum(point, bounds[0]), bounds[1])


def _path_values(
    paths: Callable[[Tensor], Tensor], x: Tensor, objective: Optional[Callable[[Tensor], Tensor]]
) -> Tensor:
    """``(S, M)`` values of every path at ``x (M, d)``."""
    values = paths(x)
    if objective is not None:
        values = objective(values)
    if values.dim() != 2 or values.shape[1] != x.shape[0]:
        raise ValueError(
            "the paths (after the objective) must return (S, M) values for M points, got shape "
            f"{tuple(values.shape)} for M = {x.shape[0]}; pass objective= to reduce several "
            "outputs to one"
        )
    return values


def maximize_paths(
    paths: Callable[[Tensor], Tensor],
    bounds: Tensor,
    *,
    num_restarts: int = 8,
    raw_samples: int = 1024,
    steps: int = 100,
    lr: float = 0.02,
    candidates: Optional[Tensor] = None,
    objective: Optional[Callable[[Tensor], Tensor]] = None,
    generator: Optional[torch.Generator] = None,
) -> Tuple[Tensor, Tensor]:
    r"""Maximise each of ``S`` differentiable functions over a box by multi-start gradient ascent.

    The ``raw_samples`` uniform points of the box (and the ``candidates``) are evaluated under
    every path; each path's ``num_restarts`` best points start Adam on
    :math:`u \in [0, 1]^d` (:math:`x = l + u (h - l)`) with learning rate ``lr``, clamped to the
    cube after each step. All paths are evaluated at all current points in one call (one
    feature computation), and each path's ascent uses its own points' values.

    Args:
        paths: a callable ``x (M, d) -> (S, M)`` (or anything ``objective`` maps to that),
            differentiable in ``x``; e.g. :meth:`rfgp.RandomFeatureGP.sample_functions`. Paths
            without gradients need ``steps=0`` (the best start candidate, derivative-free).
        bounds: ``(2, d)`` finite lower and upper corners of the box, lower < upper, with a
            finite width ``upper - lower``.
        num_restarts: gradient-ascent starts per path.
        raw_samples: uniform random points scored to choose the starts.
        steps: Adam steps (0: return the best start).
        lr: Adam learning rate in the unit cube.
        candidates: optional ``(C, d)`` extra start candidates inside the box.
        objective: maps the paths' values to ``(S, M)`` (e.g. ``lambda v: v[..., 0]`` for the
            first of several outputs).
        generator: ``torch.Generator`` of the random points.

    Returns:
        ``(maximisers, values)``: ``(S, d)`` the best point found per path (inside the box,
        bounds included) and ``(S,)`` its value under that path.

    Raises:
        ValueError: bad bounds, paths that return NaN, or paths without gradients and
            ``steps > 0``.
        TypeError: a ``generator`` that is not a ``torch.Generator``.

    Example:
        >>> centres = torch.tensor([[0.2], [0.7]], dtype=torch.float64)
        >>> paths = lambda x: -(x[:, 0] - centres) ** 2          # (2, M)
        >>> bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
        >>> best, values = maximize_paths(paths, bounds, generator=torch.Generator().manual_seed(0))
        >>> torch.allclose(best, centres, atol=1e-3)
        True
    """
    bounds = _check_bounds(bounds)
    generator = check_generator("generator", generator)
    num_restarts = check_int("num_restarts", num_restarts)
    raw_samples = check_int("raw_samples", raw_samples)
    steps = check_int("steps", steps, minimum=0)
    lr = check_positive("lr", lr)
    lower, width = bounds[0], bounds[1] - bounds[0]
    dim = bounds.shape[1]
    device = generator.device if generator is not None else bounds.device
    unit = torch.rand(raw_samples, dim, generator=generator, dtype=bounds.dtype, device=device)
    unit = unit.to(bounds.device)
    if candidates is not None:
        check_tensor("candidates", candidates, min_dim=2, max_dim=2)
        if candidates.shape[1] != dim:
            raise ValueError(
                f"candidates must have shape (C, {dim}), got {tuple(candidates.shape)}"
            )
        inside = (candidates - lower) / width
        if not bool(((inside >= 0) & (inside <= 1)).all()):
            raise ValueError("candidates must lie inside bounds")
        unit = torch.cat([unit, inside.to(unit)])
    with torch.no_grad():
        raw_values = _path_values(paths, _in_box(unit, bounds), objective)  # (S, R)
    if bool(torch.isnan(raw_values).any()):
        raise ValueError(
            f"paths must return values that are not NaN, got {int(torch.isnan(raw_values).sum())}"
            f" NaN values at the {unit.shape[0]} start candidates"
        )
    num_paths = raw_values.shape[0]
    k = min(num_restarts, unit.shape[0])
    top = raw_values.topk(k, dim=1).indices  # (S, k)
    start = unit[top]  # (S, k, d)
    best_unit = start[:, 0].clone()
    best_value = raw_values.gather(1, top[:, :1]).squeeze(1).clone()
    if steps == 0:
        return _in_box(best_unit, bounds).detach(), best_value.detach()
    u = start.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([u], lr=lr)
    own = torch.arange(num_paths, device=u.device)
    # The ascent needs gradients even when the caller runs under torch.no_grad().
    with torch.enable_grad():
        for step in range(steps + 1):
            optimiser.zero_grad()
            points = _in_box(u, bounds).reshape(num_paths * k, dim)
            # Every path at every point: (S, S k) -> each path's own points (S, k).
            values = _path_values(paths, points, objective)
            values = values.reshape(num_paths, num_paths, k)[own, own]
            if step == 0 and not values.requires_grad:
                raise ValueError(
                    "paths must be differentiable in x for the gradient ascent (their values "
                    "carry no gradient with respect to the points); pass steps=0 to keep the "
                    "best of the random start candidates instead"
                )
            with torch.no_grad():
                step_best, where = values.max(dim=1)
                better = step_best > best_value
                best_value = torch.where(better, step_best, best_value)
                best_unit[better] = u[own, where][better]
            if step == steps:
                break
            (-values.sum()).backward()
            optimiser.step()
            with torch.no_grad():
                u.clamp_(0.0, 1.0)
    return _in_box(best_unit, bounds).detach(), best_value.detach()


def thompson_sample(
    model,
    bounds: Tensor,
    q: int,
    *,
    num_restarts: int = 8,
    raw_samples: int = 1024,
    steps: int = 100,
    lr: float = 0.02,
    candidates: Optional[Tensor] = None,
    objective: Optional[Callable[[Tensor], Tensor]] = None,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    r"""A batch of ``q`` points by Thompson sampling: the maximisers of ``q`` posterior draws.

    Draws ``q`` sample paths from the fitted model (:meth:`~rfgp.RandomFeatureGP.sample_functions`)
    and maximises each over the box with :func:`maximize_paths`. The model's targets should be
    oriented for maximisation (negate a loss).

    Args:
        model: a fitted :class:`rfgp.RandomFeatureGP` (any feature kernel or composition, fixed
            or heteroscedastic noise, fitted by ``fit``, ``fit_stream`` or ``update``).
        bounds: ``(2, d)`` box.
        q: batch size (number of paths).
        num_restarts, raw_samples, steps, lr, candidates, objective: as in
            :func:`maximize_paths`.
        generator: ``torch.Generator`` for the draws and the random starts.

    Returns:
        ``(q, d)`` points in the box.

    Raises:
        TypeError: a model without ``sample_functions`` (e.g. a classifier).

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.rand(20, 1, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=1e-2)
        >>> gp = gp.fit(x, torch.sin(6 * x[:, 0]))
        >>> bounds = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
        >>> batch = thompson_sample(gp, bounds, q=3, raw_samples=64, steps=10)
        >>> batch.shape, bool(((batch >= 0) & (batch <= 1)).all())
        (torch.Size([3, 1]), True)
    """
    q = check_int("q", q)
    generator = check_generator("generator", generator)
    if not callable(getattr(model, "sample_functions", None)):
        raise TypeError(
            "model must be a fitted rfgp.RandomFeatureGP (a model with sample_functions(q, "
            f"generator) that draws posterior functions to maximise), got a "
            f"{type(model).__name__}"
        )
    paths = model.sample_functions(q, generator=generator)
    maximisers, _ = maximize_paths(
        paths,
        bounds,
        num_restarts=num_restarts,
        raw_samples=raw_samples,
        steps=steps,
        lr=lr,
        candidates=candidates,
        objective=objective,
        generator=generator,
    )
    return maximisers
