r"""A fitted :class:`~rfgp.RandomFeatureGP` as a BoTorch model (optional extra ``botorch``).

:class:`RandomFeatureModel` exposes the weight-space posterior to BoTorch's acquisition functions
and optimisers. For ``b`` batches of ``q`` points the joint posterior of each batch is

.. math::
    \mu(X) = \Phi(X)\,\mu_w, \qquad \Sigma(X) = \Phi(X)\,B^{-1}\,\Phi(X)^\top
    \quad (B = \Phi^\top S^{-1}\Phi + I),

a rank-``D`` (noise-free, latent) covariance computed from the ``q`` points' features in
:math:`O(q D^2)`, whatever the number of observations; both are differentiable in :math:`X`, so
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
from typing import Any, List, Optional, Union

import torch
from torch import Tensor

try:
    from botorch.models.model import Model
    from botorch.posteriors.gpytorch import GPyTorchPosterior
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "rfgp.botorch needs BoTorch; install it with: pip install 'rfgp[botorch]'"
    ) from error
from gpytorch.distributions import MultivariateNormal

from rfgp._validation import check_tensor
from rfgp.inference.feature_gp import RandomFeatureGP

__all__ = ["RandomFeatureModel"]


class RandomFeatureModel(Model):
    r"""BoTorch ``Model`` around a fitted single-output :class:`~rfgp.RandomFeatureGP`.

    The GP's prior mean is zero: fit it on standardised targets (and compare acquisition
    values on that scale). The posterior is the latent function's; ``observation_noise=True``
    adds the model noise :attr:`rfgp.RandomFeatureGP.noise`, a tensor adds the given noise
    variances.

    Args:
        gp: a fitted :class:`~rfgp.RandomFeatureGP` with one output (targets of shape ``(N,)``
            and a scalar-output kernel). It is used, not copied.

    Attributes:
        gp (RandomFeatureGP): the wrapped model.
        num_outputs (int): 1.
        batch_shape (torch.Size): empty.

    Raises:
        TypeError: if ``gp`` is not a ``RandomFeatureGP``.
        ValueError: if it is not fitted or has several outputs.

    Example:
        >>> from rfgp import RandomFeatureGP
        >>> from rfgp.kernels import FourierFeatureKernel
        >>> x = torch.rand(30, 2, dtype=torch.float64)
        >>> gp = RandomFeatureGP(FourierFeatureKernel(64, seed=0).double(), noise=1e-2)
        >>> model = RandomFeatureModel(gp.fit(x, x.sum(-1)))
        >>> post = model.posterior(torch.rand(5, 3, 2, dtype=torch.float64))  # 5 batches, q = 3
        >>> post.mean.shape, post.mvn.covariance_matrix.shape
        (torch.Size([5, 3, 1]), torch.Size([5, 3, 3]))
    """

    def __init__(self, gp: RandomFeatureGP) -> None:
        if not isinstance(gp, RandomFeatureGP):
            raise TypeError(f"gp must be an rfgp.RandomFeatureGP, got {type(gp).__name__}")
        if not gp.is_fitted:
            raise ValueError("gp must be fitted; call gp.fit(x, y) first")
        num_columns = sum(len(group) for group in gp.factorization_groups)
        if num_columns != 1 or gp.outputs_per_input != 1:
            raise ValueError(
                "RandomFeatureModel supports one output, got a model with "
                f"{num_columns * gp.outputs_per_input} outputs"
            )
        super().__init__()
        self.gp = gp

    @property
    def num_outputs(self) -> int:
        return 1

    @property
    def batch_shape(self) -> torch.Size:
        return torch.Size([])

    def posterior(
        self,
        X: Tensor,
        output_indices: Optional[List[int]] = None,
        observation_noise: Union[bool, Tensor] = False,
        posterior_transform: Any = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        r"""Joint posterior over each batch of ``q`` points.

        Args:
            X: ``(q, d)`` or ``(*b, q, d)`` points.
            output_indices: ``None`` or ``[0]``.
            observation_noise: ``False`` (latent), ``True`` (add the model noise) or a tensor
                of noise variances broadcastable to ``(*b, q, 1)``.
            posterior_transform: optional BoTorch ``PosteriorTransform``.

        Returns:
            ``GPyTorchPosterior`` of a ``MultivariateNormal`` with mean ``(*b, q)`` and
            covariance ``(*b, q, q)`` (rank at most ``D``), differentiable in ``X``.
        """
        check_tensor("X", X, min_dim=2)
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(f"output_indices must be None or [0], got {output_indices!r}")
        batch, q, dim = X.shape[:-2], X.shape[-2], X.shape[-1]
        if q == 0:
            raise ValueError(
                f"X must hold q >= 1 points per batch, got shape {tuple(X.shape)} (q = 0)"
            )
        flat = X.reshape(-1, dim)
        joint = self.gp.posterior(flat)  # over all b q points, lazily low rank
        rows = torch.arange(flat.shape[0], device=X.device).reshape(-1, q)  # (B, q)
        # Only the (q, q) diagonal blocks: O(B q^2 D) from the low-rank factors.
        covariance = joint.lazy_covariance_matrix[rows.unsqueeze(-1), rows.unsqueeze(-2)]
        covariance = covariance.reshape(*batch, q, q)
        mean = joint.mean.reshape(*batch, q)
        if observation_noise is not False:
            if observation_noise is True:
                noise = self.gp.noise.to(mean).expand(*batch, q)
            else:
                check_tensor("observation_noise", observation_noise)
                noise = observation_noise.to(mean).expand(*batch, q, 1)[..., 0]
            covariance = covariance + torch.diag_embed(noise)
        posterior = GPyTorchPosterior(MultivariateNormal(mean, covariance))
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Optional[Tensor] = None, **kwargs: Any
    ) -> RandomFeatureModel:
        r"""A new model conditioned also on ``(X, Y)`` (the original is unchanged).

        Args:
            X: ``(n, d)`` new inputs.
            Y: ``(n, 1)`` new targets (on the scale the model was fitted on).
            noise: ``(n, 1)`` noise variances, needed exactly when the model was fitted with
                a fixed ``noise``.

        Returns:
            A :class:`RandomFeatureModel` around a copy of the GP updated with
            :meth:`rfgp.RandomFeatureGP.update` (equal to refitting on all data).
        """
        check_tensor("X", X, min_dim=2, max_dim=2)
        check_tensor("Y", Y, min_dim=2, max_dim=2)
        if Y.shape != (X.shape[0], 1):
            raise ValueError(
                f"Y must have shape (n, 1) = ({X.shape[0]}, 1), got {tuple(Y.shape)}; batched "
                "fantasies are not supported"
            )
        gp = copy.deepcopy(self.gp)
        # Targets in the layout of the fit: (n,) after a 1-D fit, (n, 1) after a 2-D one.
        one_dimensional = gp.predict(X[:1]).dim() == 1
        targets = Y[:, 0] if one_dimensional else Y
        if noise is not None:
            noise = noise.reshape(-1) if one_dimensional else noise.reshape(-1, 1)
        gp.update(X, targets, noise)
        return RandomFeatureModel(gp)

