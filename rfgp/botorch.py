r"""A fitted :class:`~rfgp.RandomFeatureGP` as a BoTorch model (optional extra ``botorch``).

:class:`RandomFeatureModel` exposes the weight-space posterior to BoTorch's acquisition functions
and optimisers. For ``b`` batches of ``q`` points the joint posterior of each batch is

.. math::
    \mu(X) = \Phi(X)\,\mu_w, \qquad \Sigma(X) = \Phi(X)\,B^{-1}\,\Phi(X)^\top
    \quad (B = \Phi^\top S^{-1}\Phi + I),

a rank-``D`` (noise-free, latent) covariance computed from the ``q`` points' features in
:math:`O(q D^2)`, whatever the number of observations. A model with ``m`` outputs (targets
``(N, m)`` sharing the kernel, or the ``p`` outputs of a vector-field kernel) gives the joint
``(q m) x (q m)`` covariance of each batch. Both are differentiable in :math:`X`, so
analytic acquisition functions (``LogExpectedImprovement``, ``UpperConfidenceBound``), Monte
Carlo ones (``qLogExpectedImprovement``) and ``optimize_acqf`` work on it. New observations are
absorbed by :meth:`RandomFeatureModel.condition_on_observations` through
:meth:`rfgp.RandomFeatureGP.update` (``O(n D^2)`` for ``n`` new points).

Install with ``pip install "rfgp[botorch]"``.

Example:
    >>> from botorch.acquisition import UpperConfidenceBound
    >>> from botorch.optim import optimize_acqf
    >>> from rfgp import RandomFeatureGP
    >>> from rfgp.kernels import FourierFeatureKernel
    >>> x = torch.rand(40, 2, dtype=torch.float64)
    >>> y = -((x - 0.5) ** 2).sum(-1)
    >>> gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=1e-3)
    >>> model = RandomFeatureModel(gp.fit(x, (y - y.mean()) / y.std()))
    >>> bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    >>> point, value = optimize_acqf(UpperConfidenceBound(model, beta=0.1), bounds, q=1,
    ...                              num_restarts=2, raw_samples=32)
    >>> point.shape
    torch.Size([1, 2])
"""

from __future__ import annotations

import copy
import numbers
from typing import Any, List, Optional, Union

import numpy as np
import torch
from torch import Tensor

try:
    from botorch.models.model import Model
    from botorch.posteriors.gpytorch import GPyTorchPosterior
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "rfgp.botorch needs BoTorch; install it with: pip install 'rfgp[botorch]'"
    ) from error
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator import to_linear_operator

from rfgp._validation import check_tensor, describe
from rfgp.inference._feature_gp import RandomFeatureGP

__all__ = ["RandomFeatureModel"]


def _count_outputs(gp: RandomFeatureGP) -> int:
    """Outputs per point of a fitted GP: target columns times outputs per input."""
    columns = sum(len(group) for group in gp.factorization_groups)
    if columns > 1 and gp.outputs_per_input > 1:
        raise ValueError(
            f"RandomFeatureModel supports several target columns ({columns}) or several "
            f"outputs per input ({gp.outputs_per_input}), not both"
        )
    return columns * gp.outputs_per_input


class RandomFeatureModel(Model):
    r"""BoTorch ``Model`` around a fitted :class:`~rfgp.RandomFeatureGP`.

    The GP's prior mean is zero: fit it on standardised targets (and compare acquisition
    values on that scale). The posterior is the latent function's; ``observation_noise=True``
    adds the model noise :attr:`rfgp.RandomFeatureGP.noise`, a tensor adds the given noise
    variances.

    Outputs: a GP fitted on targets of shape ``(N,)`` has one output; on ``(N, m)`` it has
    ``m`` outputs that share the kernel's features and are independent a posteriori (their
    cross-covariance is zero); a vector-field kernel with ``p`` outputs per input has ``p``
    coupled outputs. ``num_outputs`` is ``m`` (or ``p``), and :meth:`posterior` returns a
    ``MultitaskMultivariateNormal`` over ``q`` points and those outputs, as BoTorch's
    multi-output models do.

    Args:
        gp: a fitted :class:`~rfgp.RandomFeatureGP`. It is used, not copied.

    Attributes:
        gp (RandomFeatureGP): the wrapped model.
        num_outputs (int): the outputs per point.
        batch_shape (torch.Size): empty.

    Raises:
        TypeError: if ``gp`` is not a ``RandomFeatureGP``.
        ValueError: if it is not fitted, or has several target columns and several outputs
            per input.

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.rand(30, 2, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=1e-2)
        >>> model = RandomFeatureModel(gp.fit(x, x.sum(-1)))
        >>> post = model.posterior(torch.rand(5, 3, 2, dtype=torch.float64))  # 5 batches, q = 3
        >>> post.mean.shape, post.mvn.covariance_matrix.shape
        (torch.Size([5, 3, 1]), torch.Size([5, 3, 3]))
        >>> two = RandomFeatureModel(RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(),
        ...                                          noise=1e-2).fit(x, x))  # targets (30, 2)
        >>> two.num_outputs, two.posterior(torch.rand(5, 3, 2, dtype=torch.float64)).mean.shape
        (2, torch.Size([5, 3, 2]))
    """

    def __init__(self, gp: RandomFeatureGP) -> None:
        if not isinstance(gp, RandomFeatureGP):
            raise TypeError(f"gp must be an rfgp.RandomFeatureGP, got {type(gp).__name__}")
        if not gp.is_fitted:
            raise ValueError("gp must be fitted; call gp.fit(x, y) first")
        _count_outputs(gp)
        super().__init__()
        self.gp = gp

    @property
    def num_outputs(self) -> int:
        # Read from the GP at every use: it may have been refitted on other targets.
        return _count_outputs(self.gp)

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([])

    @staticmethod
    def _output_list(output_indices: Optional[List[int]], outputs: int) -> List[int]:
        if output_indices is None:
            return list(range(outputs))
        chosen = list(output_indices)
        if not chosen or any(
            not isinstance(i, numbers.Integral) or isinstance(i, (bool, np.bool_))
            or not 0 <= i < outputs
            for i in chosen
        ):
            raise ValueError(
                f"output_indices must be None or a non-empty list of output indices in "
                f"[0, {outputs}), got {output_indices!r}"
            )
        return [int(i) for i in chosen]

    def posterior(
        self,
        X: Tensor,
        output_indices: Optional[List[int]] = None,
        observation_noise: Union[bool, Tensor] = False,
        posterior_transform: Any = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        r"""Joint posterior over each batch of ``q`` points (and the chosen outputs).

        Args:
            X: ``(q, d)`` or ``(*b, q, d)`` points.
            output_indices: ``None`` (all outputs) or a list of output indices.
            observation_noise: ``False`` (latent), ``True`` (add the model noise of each
                chosen output; a GP fitted with fixed noise variances has none) or a tensor
                of finite, non-negative noise variances broadcastable to ``(*b, q, m)`` (``m``
                chosen outputs, in their order).
            posterior_transform: optional BoTorch ``PosteriorTransform``.

        Returns:
            ``GPyTorchPosterior`` with mean ``(*b, q, m)``: of a ``MultivariateNormal`` with
            covariance ``(*b, q, q)`` for one output, else of a
            ``MultitaskMultivariateNormal`` with covariance ``(*b, q m, q m)``; the covariance
            has rank at most ``D`` and everything is differentiable in ``X``.
        """
        check_tensor("X", X, min_dim=2)
        total = self.num_outputs
        outputs = self._output_list(output_indices, total)
        batch, q, dim = X.shape[:-2], X.shape[-2], X.shape[-1]
        if q == 0:
            raise ValueError(
                f"X must hold q >= 1 points per batch, got shape {tuple(X.shape)} (q = 0)"
            )
        flat = X.reshape(-1, dim)
        joint = self.gp.posterior(flat)  # over all b q points, lazily low rank
        points = torch.arange(flat.shape[0], device=X.device).reshape(-1, q)  # (B, q)
        m = len(outputs)
        if total == 1:
            rows, interleaved = points, True
            mean = joint.mean.reshape(*batch, q, 1)
        else:
            interleaved = bool(joint._interleaved)
            tasks = torch.tensor(outputs, device=X.device)
            if interleaved:  # row of (point i, output t) = i * outputs + t
                rows = (points.unsqueeze(-1) * total + tasks).reshape(-1, q * m)
            else:  # row of (point i, output t) = t * points + i
                rows = (tasks.unsqueeze(-1) * flat.shape[0] + points.unsqueeze(-2))
                rows = rows.reshape(-1, m * q)
            mean = joint.mean[:, outputs].reshape(*batch, q, m)
        # Only the diagonal blocks of each batch: O(B (q m)^2 D) from the low-rank factors.
        covariance = joint.lazy_covariance_matrix[rows.unsqueeze(-1), rows.unsqueeze(-2)]
        covariance = covariance.reshape(*batch, q * m, q * m)
        if observation_noise is not False:
            covariance = covariance + torch.diag_embed(
                self._noise_diagonal(observation_noise, mean, outputs, interleaved)
            )
        # Lazily: the joint covariance of q close points is singular to working precision
        # (its rank is at most D), and a dense one would be factorised at once without
        # jitter; as a linear operator its factorisation adds GPyTorch's jitter when needed.
        covariance = to_linear_operator(covariance)
        if m == 1:
            distribution = MultivariateNormal(mean[..., 0], covariance)
        else:
            distribution = MultitaskMultivariateNormal(mean, covariance, interleaved=interleaved)
        posterior = GPyTorchPosterior(distribution)
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def _noise_diagonal(self, observation_noise: Union[bool, Tensor], mean: Tensor,
                        outputs: List[int], interleaved: bool) -> Tensor:
        """The noise variances of the rows of the covariance, shape ``(*b, q m)``."""
        if observation_noise is True:
            state = self.gp._state
            if state is not None and state.layout.fixed:
                raise ValueError(
                    "observation_noise=True adds the model noise, but the GP was fitted with "
                    "fixed noise variances (fit(x, y, noise)), which say nothing of new points; "
                    "pass their noise variances as a tensor"
                )
            # The model noise is a scalar or one value per output of the model: take the
            # requested outputs, in the requested order.
            model_noise = self.gp.noise.to(mean).reshape(-1)
            if model_noise.numel() > 1:
                model_noise = model_noise[outputs]
            noise = model_noise.expand(mean.shape)
        else:
            if isinstance(observation_noise, bool) or not isinstance(observation_noise, Tensor):
                raise TypeError(
                    "observation_noise must be a bool or a tensor of noise variances, got "
                    f"{describe(observation_noise)}"
                )
            check_tensor("observation_noise", observation_noise)
            low = float(observation_noise.min()) if observation_noise.numel() else 0.0
            if low < 0:
                raise ValueError(
                    "observation_noise must hold non-negative noise variances, got minimum "
                    f"{low:.3g}"
                )
            try:
                noise = observation_noise.to(mean).expand(mean.shape)
            except RuntimeError as error:
                raise ValueError(
                    "observation_noise must broadcast to the posterior mean's shape "
                    f"{tuple(mean.shape)}, got {tuple(observation_noise.shape)}"
                ) from error
        if not interleaved:
            noise = noise.transpose(-1, -2)
        return noise.reshape(*mean.shape[:-2], -1)

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Optional[Tensor] = None, **kwargs: Any
    ) -> RandomFeatureModel:
        r"""A new model conditioned also on ``(X, Y)`` (the original is unchanged).

        Args:
            X: ``(n, d)`` new inputs.
            Y: ``(n, m)`` new targets, ``m = num_outputs`` (on the scale the model was
                fitted on).
            noise: ``(n, m)`` noise variances, needed exactly when the model was fitted with
                a fixed ``noise``.

        Returns:
            A :class:`RandomFeatureModel` around a copy of the GP updated with
            :meth:`rfgp.RandomFeatureGP.update` (equal to refitting on all data).
        """
        check_tensor("X", X, min_dim=2, max_dim=2)
        check_tensor("Y", Y, min_dim=2, max_dim=2)
        outputs = self.num_outputs
        if Y.shape != (X.shape[0], outputs):
            raise ValueError(
                f"Y must have shape (n, num_outputs) = ({X.shape[0]}, {outputs}), got "
                f"{tuple(Y.shape)}; batched fantasies are not supported"
            )
        gp = copy.deepcopy(self.gp)
        # Targets in the layout of the fit: (n,) after a 1-D fit, (n, m) otherwise.
        one_dimensional = gp.predict(X[:1]).dim() == 1
        targets = Y[:, 0] if one_dimensional else Y
        if noise is not None:
            noise = noise.reshape(-1) if one_dimensional else noise.reshape(Y.shape)
        gp.update(X, targets, noise)
        return RandomFeatureModel(gp)

