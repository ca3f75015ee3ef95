r"""Hyperparameter selection: a safeguarded optimiser of the evidence and a grid search.

:func:`minimize_safeguarded` minimises a loss over a list of parameters with L-BFGS (strong-Wolfe
line search) or Adam. Trial points where the loss or its gradient is not finite (or outside a
box) get a large finite *barrier* loss, so the line search backs off instead of failing; the
best point evaluated is kept and restored at the end, and a :class:`ConvergenceWarning` says
when the optimisation did not converge. :func:`select_by_score` picks the grid value of
smallest score.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from linear_operator.utils.errors import NotPSDError
from linear_operator.utils.warnings import NumericalWarning
from torch import Tensor

from rfgp._validation import check_choice, check_int, check_positive
from rfgp.inference._noise import targets_as_rows

__all__ = [
    "ConvergenceWarning",
    "Objective",
    "minimize_lbfgs",
    "minimize_safeguarded",
    "optimize_evidence",
    "select_by_score",
    "select_noise_on_validation",
]

# The gradient max-norm of the per-datum loss below which the optimisation has converged.
GRAD_TOLERANCE = 1e-4
# The log-noise stays within this distance of the log of the targets' mean square.
LOG_NOISE_RANGE = 25.0


class ConvergenceWarning(UserWarning):
    """An iterative optimisation stopped before it converged."""


@dataclass
class Objective:
    """A loss over ``params`` that remembers the best finite point it evaluated.

    Args:
        params: the tensors optimised (leaves with ``requires_grad``).
        loss: computes the loss at the current parameter values.
        feasible: whether the current values are inside the allowed box.

    Attributes:
        evaluations: the loss at every finite point evaluated, in order.
    """

    params: List[Tensor]
    loss: Callable[[], Tensor]
    feasible: Callable[[], bool]
    best_loss: float = math.inf
    best_state: Optional[List[Tensor]] = None
    best_grad: float = math.inf
    barrier: Optional[float] = field(default=None)
    evaluations: List[float] = field(default_factory=list)

    def evaluate(self) -> Optional[Tensor]:
        """Loss (gradients set) at the current point; ``None`` where it is not finite."""
        for p in self.params:
            p.grad = None
        finite = all(bool(torch.isfinite(p).all()) for p in self.params)
        if not finite or not self.feasible():
            return None
        try:
            loss = self.loss()
        except NotPSDError:
            return None  # a trial point the data cannot be factorised at
        if not bool(torch.isfinite(loss)):
            return None
        loss.backward()
        grads = [p.grad for p in self.params if p.grad is not None]
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            return None
        value = float(loss.detach())
        self.evaluations.append(value)
        if value < self.best_loss:
            self.best_loss = value
            self.best_state = [p.detach().clone() for p in self.params]
            self.best_grad = max((float(g.abs().max()) for g in grads), default=0.0)
        return loss.detach()

    def closure(self) -> Tensor:
        """:meth:`evaluate` with the barrier loss (zero gradient) at non-finite points."""
        loss = self.evaluate()
        if loss is not None:
            return loss
        if self.barrier is None:
            raise ValueError(
                "the log marginal likelihood is not finite at the initial hyperparameters "
                "and noise; start from other values"
            )
        for p in self.params:
            p.grad = torch.zeros_like(p)
        return torch.tensor(self.barrier, dtype=self.params[0].dtype, device=self.params[0].device)

    def start(self) -> Tensor:
        """Evaluate the starting point and set :attr:`barrier` from it: a finite loss far
        above any the optimiser will reach, so a line search rejects a failed trial point."""
        first = self.closure()
        self.barrier = abs(float(first)) * 10.0 + 1e3
        return first

    def restore_best(self) -> None:
        with torch.no_grad():
            for p, value in zip(self.params, self.best_state):
                p.copy_(value)


def _lbfgs_steps(objective: Objective, lr: float, steps) -> List[float]:
    opt = torch.optim.LBFGS(objective.params, lr=lr, max_iter=20, line_search_fn="strong_wolfe")
    losses: List[float] = []
    for _ in steps:
        opt.step(objective.closure)
        # LBFGS returns the loss before its step; the loss after it is the best seen.
        losses.append(objective.best_loss)
        if len(losses) > 1 and losses[-1] == losses[-2]:
            break  # LBFGS met its own tolerances: further steps would not move
    return losses


def _adam_steps(objective: Objective, lr: float, steps, project: Callable[[], None]):
    opt = torch.optim.Adam(objective.params, lr=lr)
    losses: List[float] = []
    for _ in steps:
        loss = objective.evaluate()
        if loss is None:
            return losses, True
        opt.step()
        project()
        losses.append(float(loss))
    objective.evaluate()  # the point after the last step
    return losses, False


def _warn_if_not_converged(objective: Objective, method: str, losses, failed: bool) -> None:
    changing = len(losses) < 2 or abs(losses[-1] - losses[-2]) > 1e-9 * max(1.0, abs(losses[-1]))
    if failed or (objective.best_grad > GRAD_TOLERANCE and changing):
        warnings.warn(
            f"optimize_hyperparameters ({method}) did not converge in {len(losses)} "
            f"iterations (gradient max-norm {objective.best_grad:.3g}"
            + (", stopped at a non-finite loss" if failed else "")
            + "); the best parameters evaluated are kept. Increase num_iterations or change lr.",
            ConvergenceWarning,
        )


def minimize_safeguarded(
    objective: Objective,
    method: str,
    num_iterations: int,
    lr: float,
    project: Callable[[], None] = lambda: None,
    progress: bool = False,
) -> List[float]:
    """Minimise ``objective`` and leave its parameters at the best point evaluated.

    Args:
        objective: the loss and its parameters.
        method: ``"lbfgs"`` or ``"adam"``.
        num_iterations: L-BFGS outer iterations (up to 20 evaluations each) or Adam steps.
        lr: learning rate.
        project: puts the parameters back into the box after an Adam step.
        progress: show a ``tqdm`` progress bar.

    Returns:
        The loss after each iteration.
    """
    objective.start()
    steps = range(num_iterations)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=f"optimize ({method})")
    if method == "lbfgs":
        losses, failed = _lbfgs_steps(objective, lr, steps), False
    else:
        losses, failed = _adam_steps(objective, lr, steps, project)
    objective.restore_best()
    _warn_if_not_converged(objective, method, losses, failed)
    return losses


def minimize_lbfgs(
    params: List[Tensor],
    loss: Callable[[], Tensor],
    max_iterations: int,
    tolerance: float,
    feasible: Callable[[], bool] = lambda: True,
) -> Tuple[List[float], int, bool]:
    """L-BFGS (strong-Wolfe line search) on ``loss`` over ``params``, run to its tolerances.

    L-BFGS stops when the largest gradient entry is below ``tolerance``, the loss changes by
    less than ``tolerance**2``, or after ``max_iterations`` iterations. A trial point whose loss
    or gradient is not finite, or that cannot be factorised (``NotPSDError``), gets a finite
    loss far above the first one (see :class:`Objective`), so the line search backs off; the
    best point evaluated is restored at the end.

    Args:
        params: leaf tensors with ``requires_grad``, changed in place.
        loss: computes the loss at the current values of ``params``.
        max_iterations: L-BFGS iterations (each one line search, a few evaluations).
        tolerance: gradient tolerance.
        feasible: whether the current values are allowed; other trial points get the barrier
            loss, as non-finite ones do.

    Returns:
        ``(losses, iterations, converged)``: the loss at every finite evaluation, the number
        of iterations, and whether L-BFGS stopped on its tolerances before ``max_iterations``.

    Example:
        >>> w = torch.tensor([3.0, -2.0], dtype=torch.float64, requires_grad=True)
        >>> losses, iterations, converged = minimize_lbfgs(
        ...     [w], lambda: ((w - 1.0) ** 2).sum(), max_iterations=50, tolerance=1e-8)
        >>> converged, torch.allclose(w.detach(), torch.ones(2, dtype=torch.float64))
        (True, True)
    """
    max_iterations = check_int("max_iterations", max_iterations)
    tolerance = check_positive("tolerance", tolerance)
    objective = Objective(params, loss, feasible)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        objective.start()
        opt = torch.optim.LBFGS(
            params, lr=1.0, max_iter=max_iterations, max_eval=int(max_iterations * 2.5),
            tolerance_grad=tolerance, tolerance_change=tolerance**2, history_size=20,
            line_search_fn="strong_wolfe",
        )
        opt.step(objective.closure)
    iterations = int(opt.state[params[0]]["n_iter"])
    objective.restore_best()
    return objective.evaluations, iterations, iterations < max_iterations


def select_by_score(values: Sequence[float], score: Callable[[float], float]) -> tuple:
    """The value of smallest score (the first on ties), and all scores.

    A value whose score raises ``NotPSDError`` (a noise too small to factorise) scores ``inf``.

    Example:
        >>> select_by_score([1.0, 2.0, 3.0], lambda v: (v - 2.0) ** 2)
        (2.0, [1.0, 0.0, 1.0])
    """
    scores = []
    for value in values:
        try:
            scores.append(float(score(value)))
        except NotPSDError:
            scores.append(math.inf)
    if all(math.isinf(s) for s in scores):
        raise NotPSDError("select_noise: no noise value in the grid could be factorised")
    best = min(range(len(values)), key=lambda i: (scores[i], i))
    return values[best], scores


def _noise_box(y_rows: Tensor) -> tuple:
    """Bounds of the log-noise: the log of the targets' mean square plus or minus 25."""
    centre = math.log(float(y_rows.detach().square().mean()) or 1.0)
    return centre - LOG_NOISE_RANGE, centre + LOG_NOISE_RANGE


def optimize_evidence(gp: Any, x: Tensor, y: Tensor, noise: Any, method: str,
                      num_iterations: int, lr: Optional[float], optimize_noise: bool,
                      progress: bool) -> List[float]:
    """``RandomFeatureGP.optimize_hyperparameters`` (see there), through the model's public
    methods: the evidence :meth:`log_marginal_likelihood(x, y, noise)` is minimised per datum
    over the kernel's trainable parameters and the log of the model noise; then ``gp.fit``."""
    check_choice("method", method, ("lbfgs", "adam"))
    num_iterations = check_int("num_iterations", num_iterations)
    lr = (1.0 if method == "lbfgs" else 0.05) if lr is None else check_positive("lr", lr)
    x = gp.feature_map.check_input(x, "x")
    y_rows = targets_as_rows(y, x.shape[0], gp.outputs_per_input)[0]
    if gp.feature_map.needs_allocation:
        gp.feature_map.allocate(x)
    params = [p for p in gp.kernel.parameters() if p.requires_grad]
    log_noise = None
    if noise is None and optimize_noise:
        log_noise = gp.noise.detach().to(x).log().clone().requires_grad_(True)
        params.append(log_noise)
    if not params:
        raise ValueError("there is nothing to optimise: the kernel has no trainable parameters "
                         "and the noise is fixed")
    low, high = _noise_box(y_rows)

    def project() -> None:
        if log_noise is not None:
            with torch.no_grad():
                log_noise.clamp_(low, high)

    def loss() -> Tensor:
        value = noise if log_noise is None else log_noise.exp()
        return -gp.log_marginal_likelihood(x, y, value) / y_rows.numel()

    def feasible() -> bool:
        return log_noise is None or bool(((log_noise >= low) & (log_noise <= high)).all())

    project()
    objective = Objective(params, loss, feasible)
    losses = minimize_safeguarded(objective, method, num_iterations, lr, project, progress)
    if log_noise is not None:
        gp.noise = log_noise.detach().exp().to(gp.noise.dtype).reshape(gp.noise.shape)
    gp.fit(x, y, noise)
    return losses


def _check_grid(grid: Optional[Sequence[float]]) -> List[float]:
    values = [2.0**k for k in range(-15, 16)] if grid is None else list(grid)
    if not values or any(isinstance(v, bool) or not isinstance(v, (int, float))
                         or not 0 < v < math.inf for v in values):
        raise ValueError(f"grid must be a non-empty sequence of positive floats, got {grid!r}")
    return values


def select_noise_on_validation(gp: Any, x_train: Tensor, y_train: Tensor, x_val: Tensor,
                               y_val: Tensor, grid: Optional[Sequence[float]]) -> tuple:
    """``RandomFeatureGP.select_noise`` (see there): returns the best noise and
    ``(grid, scores)``; the model is left fitted with the best noise."""
    from rfgp.metrics import mnll

    values = _check_grid(grid)
    x_val = gp.feature_map.check_input(x_val, "x_val")
    if x_val.shape[0] == 0:
        raise ValueError("x_val must hold at least one row to score the noise, got 0")
    targets_as_rows(y_val, x_val.shape[0], gp.outputs_per_input, "y_val")
    gp.noise = torch.tensor(float(values[0]), dtype=torch.float64)
    gp.fit(x_train, y_train)
    x_val = x_val.to(gp.dtype)
    with torch.no_grad():
        phi = gp.base_kernel.features(x_val)
        corr = gp.feature_map.variance_correction(x_val) if gp.correct_variance else None

    def score(value: float) -> float:
        gp.noise = torch.tensor(float(value), dtype=torch.float64)
        with torch.no_grad():
            mean, std = gp.predict_from_features(phi, corr, return_std=True)
        return float(mnll(y_val.to(mean), mean, std.square() + value))

    best, scores = select_by_score(values, score)
    gp.noise = torch.tensor(float(best), dtype=torch.float64)
    return float(best), (values, scores)
