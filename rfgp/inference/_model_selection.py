r"""The evidence of a :class:`~rfgp.inference.RandomFeatureGP` and the choice of its
hyperparameters by it (or by a validation set), as methods the model inherits.

The model's fit and predictions (:mod:`~rfgp.inference._feature_gp`) do not call these
methods; the methods read the model's feature map, noise and fitted solver, and refit it.

Internal: not part of the public API (see :mod:`rfgp.inference`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor

from rfgp.inference._evidence import log_evidence_from_features
from rfgp.inference._noise import evidence_rows
from rfgp.inference._selection import optimize_evidence, select_noise_on_validation
from rfgp.inference._stochastic_evidence import stochastic_log_evidence

__all__ = ["ModelSelection"]


class ModelSelection:
    """The evidence and hyperparameter-selection methods of
    :class:`~rfgp.inference.RandomFeatureGP` (a mixin: it holds no state of its own)."""

    # ================================================================== evidence
    def log_marginal_likelihood(self, x: Optional[Tensor] = None, y: Optional[Tensor] = None,
                                noise: Optional[Union[float, Tensor]] = None) -> Tensor:
        r"""Log evidence :math:`\log p(y)`, summed over outputs, computed in feature space.

        With :math:`Z` the real-form features, :math:`B = Z^\top S^{-1} Z + I` and
        :math:`h = Z^\top S^{-1} y`:
        :math:`\log p(y) = -\tfrac12(y^\top S^{-1} y - h^\top B^{-1} h + \log|B| +
        \sum_i \log s_i + N \log 2\pi)`, the evidence of the real GP with kernel
        :math:`\mathrm{Re}\,\hat k` (GPyTorch's ``ExactMarginalLogLikelihood`` times ``N``),
        also for ``complex_posterior=True``. On the ``"cg"`` path an unbiased stochastic
        estimate of :math:`\log|B|` (its standard error in the solver's
        ``evidence_standard_error``); a fit calibrated by the Krylov calibration
        (:func:`~rfgp.inference.fit_calibrated`) serves that calibration's estimate of the
        same model until it is refitted.

        Args:
            x, y, noise: without ``x`` and ``y``, the fitted data's evidence (not
                differentiable). With them, recomputed from ``x`` and ``y`` (at least one row),
                differentiable in the kernel hyperparameters and ``noise`` (``None``: the model
                noise). Features of all rows are held in memory for the backward pass.

        Returns:
            A scalar tensor.

        Raises:
            ValueError: when the value is not representable (targets of extreme scale).
        """
        if (x is None) != (y is None):
            raise ValueError("x and y must be given together (or both omitted)")
        if x is None:
            if noise is not None:
                raise ValueError("noise needs x and y; without them the fitted noise is used")
            state = self._current("log_marginal_likelihood")
            with torch.no_grad():
                return state.solver.log_evidence(self._column_noise(state.layout))
        if self.solve == "cg" or self.solve_used == "cg":
            return stochastic_log_evidence(self, x, y, noise)[0]
        x_checked, rows_y, rows_noise = evidence_rows(self.feature_map, self.noise, x, y, noise,
                                                     self.prior_mean)
        z = self.feature_map.real_rows(x_checked)
        return log_evidence_from_features(z, rows_y, rows_noise.to(rows_y), self.jitter)

    # ================================================================== hyperparameters
    def optimize_hyperparameters(
        self, x: Tensor, y: Tensor, noise: Optional[Union[float, Tensor]] = None,
        method: str = "lbfgs", num_iterations: int = 50, lr: Optional[float] = None,
        optimize_noise: bool = True, progress: bool = False,
    ) -> List[float]:
        r"""Maximise the log marginal likelihood over the kernel hyperparameters (and the noise).

        Minimises :math:`-\log p(y) / (N T)` over the kernel's trainable parameters and, when
        ``noise`` is ``None`` and ``optimize_noise``, the log of the model noise (kept within
        :math:`\log m \pm 25`, :math:`m` the targets' mean square); then refits. The random
        weights stay fixed. Non-finite trial points get a large finite loss (the line search
        backs off); the best point evaluated is kept; a :class:`ConvergenceWarning` says when
        the optimisation did not converge.

        Args:
            x, y: training data (as in :meth:`fit`).
            noise: fixed noise (not optimised); ``None`` uses and optimises the model noise.
            method: ``"lbfgs"`` (strong-Wolfe line search) or ``"adam"``.
            num_iterations: optimiser steps (L-BFGS: outer iterations of up to 20 evaluations).
            lr: a positive learning rate (default 1.0 for L-BFGS, 0.05 for Adam).
            optimize_noise: also optimise the model noise.
            progress: show a ``tqdm`` progress bar.

        Returns:
            The loss after each iteration.
        """
        return optimize_evidence(self, x, y, noise, method, num_iterations, lr, optimize_noise,
                                 progress)

    def select_noise(self, x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor,
                     grid: Optional[Sequence[float]] = None) -> float:
        r"""Choose the model noise from a grid by the validation MNLL, and refit.

        For every noise :math:`\sigma^2` in ``grid`` (default :math:`2^{-15}, \dots, 2^{15}`)
        the model is conditioned on the training data and scored by the mean negative log
        likelihood of ``y_val`` under :math:`N(\mu(x), \mathrm{var}(x) + \sigma^2)`. The
        statistics are accumulated once; each value costs one factorisation. The smallest
        score wins (the first on ties); :attr:`noise` is then the winner.

        Args:
            x_train, y_train: training data.
            x_val, y_val: validation data (at least one row, same output layout).
            grid: candidate noise variances (positive).

        Returns:
            The selected noise. ``self.noise_scores_`` holds ``(grid, scores)``.
        """
        best, scores = select_noise_on_validation(self, x_train, y_train, x_val, y_val, grid)
        self.noise_scores_ = (scores[0], scores[1])
        return best
